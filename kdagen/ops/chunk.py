"""`chunk_kda`: the chunkwise form (prefill and training) -- two launches.

1. intra  (grid: chunks x value heads)   -> qg, kg, W, U, A_qk, G_n
2. state  (grid: V tiles x sequences x value heads) walks the chunks of each sequence,
   fusing V' = U - W S, O and the state update; per-chunk states are not written unless
   ``return_intermediate_states=True``.
"""
from __future__ import annotations

import torch
import triton

from ..config import ChunkFwdConfig
from ..kernels import Launch, dummy_pointer
from ..runtime import chunk_kernels, plan_for
from ..validate import check_inputs, check_runnable
from .common import DTYPE_NAMES, check_kwargs, preprocess, select_spec

def chunk_schedule(seqlens: list[int] | None, B: int, T: int, C: int, device):
    """(number of chunks, chunk_indices [NT,2] int32 or None, chunk_offsets [N] int32 or None).

    chunk_indices[i] = (sequence, chunk within it) of global chunk i; chunk_offsets[n] = the
    global index of sequence n's first chunk.  Built with tensor ops on the host (a packed
    batch can hold thousands of sequences) and copied to the device once."""
    if seqlens is None:
        return B * triton.cdiv(T, C), None, None
    cu = torch.tensor(seqlens, dtype=torch.int64)
    nchunks = (cu[1:] - cu[:-1] + C - 1) // C
    offsets = torch.cumsum(nchunks, 0) - nchunks
    total = int(nchunks.sum())
    seq = torch.repeat_interleave(torch.arange(len(nchunks)), nchunks)
    within = torch.arange(total) - torch.repeat_interleave(offsets, nchunks)
    idx = torch.stack([seq, within], 1) if total else torch.zeros(1, 2, dtype=torch.int64)
    return total, idx.to(device=device, dtype=torch.int32), offsets.to(device=device, dtype=torch.int32)


def prepare_chunk_fwd(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens,
                      seqlens, dims, plan, config: ChunkFwdConfig, built, A_log=None, dt_bias=None,
                      return_intermediate_states=False, state_dtype=torch.float32, store_vn=False):
    """Allocate outputs and describe both launches (used for running and compile-only).
    ``state_dtype``: storage of the per-chunk states (float32 for callers; the training
    forward may keep them in the input dtype for its backward).  ``store_vn``: the state
    pass also writes V' = U - W S (the backward's, in the intermediates' dtype) to the
    state launch's ``vn`` argument."""
    B, T, H, HV, K, V, N = dims.B, dims.T, dims.H, dims.HV, dims.K, dims.V, dims.N
    C = config.chunk_size
    dev = q.device
    NT_total, chunk_indices, chunk_offsets = chunk_schedule(seqlens, B, T, C, dev)
    NT = triton.cdiv(T, C)
    inter = q.dtype if config.intermediates == "input" else torch.float32
    qg = torch.empty(B, T, HV, K, dtype=inter, device=dev)
    kg = torch.empty_like(qg)
    w = torch.empty_like(qg)
    u = torch.empty(B, T, HV, V, dtype=inter, device=dev)
    aqk = torch.empty(B, T, HV, C, dtype=inter, device=dev)
    gn = torch.empty(max(NT_total, 1), HV, K, dtype=torch.float32, device=dev)
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    hs = (torch.empty(max(NT_total, 1), HV, K, V, dtype=state_dtype, device=dev)
          if return_intermediate_states else None)
    vn = torch.empty(B, T, HV, V, dtype=inter, device=dev) if store_vn else None
    dummy = dummy_pointer(dev)
    cu = cu_seqlens.to(dev) if cu_seqlens is not None else dummy
    intra_args = dict(q=q, k=k, v=v, g=g, beta=beta)
    if plan.gate_has_A:
        intra_args["A_log"] = A_log
    if plan.gate_has_bias:
        intra_args["dt_bias"] = dt_bias
    intra_args.update(qg=qg, kg=kg, w=w, u=u, aqk=aqk, gn=gn, cu_seqlens=cu,
                      chunk_indices=chunk_indices if chunk_indices is not None else dummy,
                      T=T, NT=NT, scale=float(scale))
    bk = min(config.intra_block_k, plan.BK)
    intra = Launch(built.fns[0], (NT_total, HV), intra_args,
                   dict(H=H, HV=HV, K=K, V=V, BT=C, BC=config.sub_chunk, BK=bk,
                        BV=min(64, plan.BV), IS_VARLEN=cu_seqlens is not None, STORE_U=True),
                   config.intra_num_warps, config.intra_num_stages)
    bv = min(config.state_block_v, plan.BV)
    state_args = dict(qg=qg, kg=kg, w=w, u=u, aqk=aqk, gn=gn, o=o,
                      h0=initial_state if initial_state is not None else dummy,
                      ht=ht if ht is not None else dummy, hs=hs if hs is not None else dummy,
                      vn=vn if vn is not None else dummy,
                      cu_seqlens=cu, chunk_offsets=chunk_offsets if chunk_offsets is not None else dummy,
                      T=T, NT=NT)
    state = Launch(built.fns[1], (triton.cdiv(V, bv), N * HV), state_args,
                   dict(HV=HV, K=K, V=V, BT=C, BK=plan.BK, BV=bv, USE_H0=initial_state is not None,
                        STORE_HT=output_final_state, STORE_HS=return_intermediate_states, STORE_VN=store_vn,
                        IS_VARLEN=cu_seqlens is not None),
                   config.state_num_warps, config.state_num_stages)
    return (intra, state), (o, ht, hs)


def chunk_kda_launches(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                       allow_neg_eigval=False, safe_gate=False, lower_bound=None, return_intermediate_states=False,
                       cu_seqlens=None, A_log=None, dt_bias=None, config=None, state_dtype=torch.float32,
                       store_vn=False):
    """Validate, lower, generate and describe the launches of chunk_kda without running them
    (the op runs them; the benchmark times them one by one; compile-only checks compile them).
    ``state_dtype``: dtype of the per-chunk states of ``return_intermediate_states``;
    ``store_vn``: also write V' for the backward (see prepare_chunk_fwd)."""
    dims, seqlens = check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                 cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias,
                                 gate_in_kernel=use_gate_in_kernel)
    spec = select_spec(use_gate_in_kernel, safe_gate, lower_bound, A_log is not None, dt_bias is not None)
    if scale is None:
        scale = dims.K ** -0.5
    q, k, beta = preprocess(q, k, beta, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    plan = plan_for(spec, dims.K, dims.V, DTYPE_NAMES[q.dtype], "chunk", use_gate_in_kernel)
    built = chunk_kernels(plan, config, {"T": dims.T, "B": dims.B, "N": dims.N, "HV": dims.HV})
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    if A_log is not None:
        A_log = A_log.contiguous()
    if dt_bias is not None:
        dt_bias = dt_bias.contiguous()
    return prepare_chunk_fwd(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, seqlens=seqlens, dims=dims, plan=plan, config=built.config, built=built,
        A_log=A_log, dt_bias=dt_bias, return_intermediate_states=return_intermediate_states,
        state_dtype=state_dtype, store_vn=store_vn)


class _ChunkKDAFunction(torch.autograd.Function):
    """chunk_kda with gradients (kdagen.ops.chunk_bwd): the forward launches also write the
    per-chunk states, which the backward's reverse state pass reads.  Used only when some
    input requires grad; the inputs are already validated and pre-processed."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, A_log, dt_bias, opts):
        from .chunk_bwd import fwd_for_grad

        return fwd_for_grad(ctx, q, k, v, g, beta, initial_state, A_log, dt_bias, opts)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dht):
        from .chunk_bwd import bwd_for_grad

        return bwd_for_grad(ctx, do, dht) + (None,)


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    return_intermediate_states: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    config: ChunkFwdConfig | None = None,
    **kwargs,
):
    """Chunkwise KDA with flash-linear-attention's signature and layout.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K] (log decay, or the raw gate input
    with ``use_gate_in_kernel``); beta: [B, T, HV]; initial_state: [N, HV, K, V].
    Returns ``(o, final_state)`` -- o [B, T, HV, V] in v's dtype, final_state float32
    [N, HV, K, V] or None -- and with ``return_intermediate_states=True`` also the float32
    states entering each chunk, [NT_total, HV, K, V].
    ``config`` overrides the tuned/heuristic kernel config.
    """
    check_kwargs("chunk_kda", kwargs)
    if isinstance(q, torch.Tensor):
        check_runnable(q)
    if torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v, g, beta, initial_state, A_log, dt_bias)):
        from .chunk_bwd import chunk_kda_with_grad

        return chunk_kda_with_grad(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
            safe_gate=safe_gate, lower_bound=lower_bound, return_intermediate_states=return_intermediate_states,
            cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, config=config)
    launches, (o, ht, hs) = chunk_kda_launches(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        safe_gate=safe_gate, lower_bound=lower_bound, return_intermediate_states=return_intermediate_states,
        cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, config=config)
    for launch in launches:
        launch()
    if return_intermediate_states:
        return o, ht, hs
    return o, ht
