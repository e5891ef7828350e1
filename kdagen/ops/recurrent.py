"""`fused_recurrent_kda`: the recurrent form (decode) -- one launch per call over all
sequences, value heads and V tiles; float32 state in registers; optional in-place update
of a state pool addressed by per-sequence slots."""
from __future__ import annotations

import torch
import triton

from ..cache.lookup import resolve
from ..codegen.lower import lower
from ..config import RecurrentConfig
from ..dtypes import dtype
from ..kernels import Launch, build, dummy_pointer, launch
from .inputs import check_inputs, check_kwargs, check_runnable, preprocess, select_spec


def _outputs_and_args(q, k, v, g, beta, *, scale, initial_state, output_final_state, state_indices, out,
                      dims, cu_seqlens=None, A_log=None, dt_bias=None):
    """Allocate o (and the final state) and lay out the kernel's non-constexpr arguments."""
    dev = q.device
    o = out if out is not None else torch.empty(v.shape, dtype=v.dtype, device=dev)
    if state_indices is not None:
        ht = initial_state  # the pool, updated in place
    elif output_final_state:
        ht = torch.empty(dims.N, dims.HV, dims.K, dims.V, dtype=torch.float32, device=dev)
    else:
        ht = None
    dummy = dummy_pointer(dev)
    args = dict(q=q, k=k, v=v, g=g, beta=beta)
    if A_log is not None:
        args["A_log"] = A_log
    if dt_bias is not None:
        args["dt_bias"] = dt_bias
    args.update(o=o, h0=initial_state if initial_state is not None else dummy,
                ht=ht if ht is not None else dummy,
                state_indices=state_indices if state_indices is not None else dummy,
                cu_seqlens=cu_seqlens.to(dev) if cu_seqlens is not None else dummy,
                T=dims.T, P=initial_state.shape[0] if initial_state is not None else dims.N, scale=float(scale))
    return o, ht, args


def prepare_recurrent(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens,
                      state_indices, dims, plan, built, A_log=None, dt_bias=None, out=None):
    H, HV, K, V, N = dims.H, dims.HV, dims.K, dims.V, dims.N
    cfg: RecurrentConfig = built.config
    o, ht, args = _outputs_and_args(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        state_indices=state_indices, out=out, dims=dims, cu_seqlens=cu_seqlens,
        A_log=A_log if plan.gate_has_A else None, dt_bias=dt_bias if plan.gate_has_bias else None)
    bv = min(cfg.block_v, plan.BV)
    launch = Launch("recurrent", built.fns[0], (triton.cdiv(V, bv), N * HV), args,
                    dict(H=H, HV=HV, K=K, V=V, BK=plan.BK, BV=bv, USE_H0=initial_state is not None,
                         STORE_HT=ht is not None, USE_INDICES=state_indices is not None,
                         IS_VARLEN=cu_seqlens is not None),
                    cfg.num_warps, cfg.num_stages)
    return launch, (o, ht)


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: RecurrentConfig | None = None,
    **kwargs,
):
    """Recurrent KDA (decode) with flash-linear-attention's signature and layout.

    Same tensors as :func:`kdagen.chunk_kda`.  With ``ssm_state_indices`` ([N] int),
    ``initial_state`` is a state pool [P, HV, K, V] (float32, or bf16/fp16 to halve the
    traffic): sequence n reads slot ``ssm_state_indices[n]`` and its final state is
    written back to that slot in place (a negative slot is padding: skipped, o = 0; a slot
    >= P is treated the same way, so a bad index never writes outside the pool -- slots are
    not read back to the host, which would cost a synchronisation per token);
    the pool is returned as the final state.  Otherwise the final state is a new float32
    [N, HV, K, V] tensor when ``output_final_state``.
    """
    check_kwargs("fused_recurrent_kda", kwargs)
    simple = (cu_seqlens is None and config is None and not kwargs and not use_qk_l2norm_in_kernel
              and not use_beta_sigmoid_in_kernel and not use_gate_in_kernel and not allow_neg_eigval
              and A_log is None and dt_bias is None
              and all(isinstance(x, torch.Tensor) for x in (q, k, v, g, beta))
              and all(x is None or isinstance(x, torch.Tensor) for x in (initial_state, ssm_state_indices, out)))
    if simple:
        sig = _signature(q, k, v, g, beta, scale, initial_state, output_final_state, ssm_state_indices,
                         out, lower_bound)
        hit = _FAST.get(sig)
        if hit is not None:
            return _fast_call(hit, q, k, v, g, beta, initial_state, output_final_state, ssm_state_indices, out)
    launch, (o, ht), (scale, dims) = fused_recurrent_kda_launch(
        q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, cu_seqlens=cu_seqlens,
        ssm_state_indices=ssm_state_indices, out=out, config=config)
    launch()
    # the fast path passes the caller's tensors as they are, so only contiguous ones qualify
    if simple and all(x.is_contiguous() for x in (q, k, v, g, beta)):
        _FAST[sig] = (launch.fn, launch.grid, launch.constexprs, launch.num_warps, launch.num_stages,
                      float(scale), dims)
    return o, ht  # the launch description already leaves out a final state nobody asked for


def fused_recurrent_kda_launch(q, k, v, g, beta, *, A_log=None, dt_bias=None, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                               cu_seqlens=None, ssm_state_indices=None, out=None,
                               config: RecurrentConfig | None = None):
    """Validate, plan, build and describe the one launch of :func:`fused_recurrent_kda`
    (nothing runs): ``(launch, (o, final_state), (scale, dims))``.  Calling ``launch()``
    again rewrites the same outputs; the tuner times it this way, without the op's Python
    work, and under CUDA-graph replay as a decode loop runs it."""
    dims, _ = check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                           state_indices=ssm_state_indices, A_log=A_log, dt_bias=dt_bias,
                           gate_in_kernel=use_gate_in_kernel)
    check_runnable(q)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in (q, k, v, g, beta, initial_state, A_log, dt_bias)):
        raise RuntimeError("fused_recurrent_kda is forward-only (decode): its output carries no gradient. "
                           "Use chunk_kda for training, or call it under torch.no_grad()/inference_mode()")
    spec = select_spec(use_gate_in_kernel, False, lower_bound, A_log is not None, dt_bias is not None)
    if scale is None:
        scale = dims.K ** -0.5
    q, k, beta = preprocess(q, k, beta, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "recurrent", use_gate_in_kernel)
    state = "float32" if initial_state is None else dtype(initial_state.dtype).name  # a pool may be bf16
    built = build(plan, resolve("recurrent", plan, config, {"T": dims.T, "B": dims.B, "N": dims.N}, state))
    if out is not None and (tuple(out.shape) != tuple(v.shape) or out.dtype != v.dtype or out.device != v.device):
        raise ValueError(f"out must match v: shape {tuple(v.shape)}, dtype {v.dtype}, device {v.device}")
    q, k, v, g, beta = (x if x.is_contiguous() else x.contiguous() for x in (q, k, v, g, beta))
    launch, (o, ht) = prepare_recurrent(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, state_indices=ssm_state_indices, dims=dims, plan=plan, built=built,
        A_log=A_log, dt_bias=dt_bias, out=out)
    return launch, (o, ht if (output_final_state or ssm_state_indices is not None) else None), (scale, dims)


# --- the per-token fast path -------------------------------------------------------------
# A decode loop calls this op once per token with the same geometry.  The first call of a
# geometry is validated, planned and built in full; its launch description is kept under a
# signature of everything validation looked at (shapes, dtypes, devices, contiguity, flags),
# so later calls with the same signature only allocate outputs and launch.  Any difference
# in the signature -- including a bad shape -- takes the full, validating path.
_FAST: dict = {}


def _t(x):
    return None if x is None else (tuple(x.shape), x.dtype, x.device, x.is_contiguous(), x.requires_grad)


def _signature(q, k, v, g, beta, scale, initial_state, output_final_state, state_indices, out, lower_bound):
    return (_t(q), _t(k), _t(v), _t(g), _t(beta), _t(initial_state), _t(state_indices), _t(out),
            scale, bool(output_final_state), lower_bound, torch.is_grad_enabled())


def _fast_call(hit, q, k, v, g, beta, initial_state, output_final_state, state_indices, out):
    fn, grid, constexprs, num_warps, num_stages, scale, dims = hit
    o, ht, args = _outputs_and_args(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                    output_final_state=output_final_state, state_indices=state_indices,
                                    out=out, dims=dims)
    launch(fn, grid, args, constexprs, num_warps, num_stages)
    return o, (ht if (output_final_state or state_indices is not None) else None)
