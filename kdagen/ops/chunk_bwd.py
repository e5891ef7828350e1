"""The backward of `chunk_kda`: three launches after the forward's intermediates are at hand.

0. (``store_intermediates=False``, the default) the forward's intra launch is re-run to
   rebuild qg, kg, W, U, A_qk and G_n; with ``store_intermediates=True`` the forward keeps them.
1. reverse state pass (grid: V tiles x sequences x value heads) walks the chunks of each
   sequence last to first with dS in registers; writes dU, dh0 and dS per chunk (dhs).
2. chunk-parallel products over V (grid: chunks x value heads x K tiles) from the stored
   states, dhs and V' (which the forward's state pass also writes when training): dqg, dkg,
   dW, dA_qk and dgamma_n, written once.
3. intra-chunk gradients (grid: chunks x value heads) recompute G, A_kk, (I + A_kk)^-1 from
   q, k, g, beta and write dq, dk (per value head), dv, dbeta and dg (dz for an in-kernel
   gate, plus per-chunk partials of dA_log / ddt_bias).

Only the sequential recurrence is in launch 1 (three dots per chunk); everything that can
run per chunk is in 2 and 3.  What is left to torch: the GVA sum of dq/dk over the value
heads sharing a q/k head, the sums of the gate-parameter partials, and dtype casts.  The
forward saves its inputs (after the host pre-processing, which autograd differentiates) and
the state entering every chunk, [NT_total, HV, K, V], in ``ChunkBwdConfig.state_dtype``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import sympy as sp
import torch
import triton

from .. import spec as S
from ..config import ChunkBwdConfig, ChunkFwdConfig
from ..heuristics import default_chunk_bwd_config
from ..lower import GATE_NAMES, Plan
from ..runtime import chunk_bwd_kernels, lookup_config, plan_for
from ..triton_printer import to_triton
from ..validate import check_inputs
from .common import DTYPE_NAMES, preprocess, select_spec

INTERMEDIATES = ("qg", "kg", "w", "u", "aqk", "gn")  # what the forward's intra launch writes
KEPT_INTERMEDIATES = ("qg", "kg", "w", "aqk", "gn")  # what the backward reads (V' replaces U)
_INPUT_NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")

# ------------------------------------------------------------------------------ config
_OVERRIDE: list[ChunkBwdConfig] = []


@contextlib.contextmanager
def chunk_bwd_config(config: ChunkBwdConfig):
    """Use ``config`` for the backward of every chunk_kda called (forward) inside the block.

    chunk_kda's signature has no backward config; its ``chunk_size``/``sub_chunk`` are
    always replaced by the forward's."""
    if not isinstance(config, ChunkBwdConfig):
        raise TypeError(f"chunk_bwd_config takes a ChunkBwdConfig, got {type(config).__name__}")
    _OVERRIDE.append(config)
    try:
        yield config
    finally:
        _OVERRIDE.pop()


def resolve_bwd_config(plan: Plan, config: ChunkBwdConfig | None = None,
                       shape_hint: dict | None = None) -> ChunkBwdConfig:
    """An explicit config, else the innermost ``chunk_bwd_config`` block's, else the tuned
    winner cached for this GPU and shape, else the heuristic."""
    if config is not None:
        return config
    if _OVERRIDE:
        return _OVERRIDE[-1]
    return lookup_config(plan, "chunk_bwd", shape_hint) or default_chunk_bwd_config(plan)


def _shape_hint(q: torch.Tensor, v: torch.Tensor, cu_seqlens) -> dict:
    B, T = q.shape[0], q.shape[1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    return {"T": T, "B": B, "N": N, "HV": v.shape[2]}


# ------------------------------------------------------------------------------ gate
def gate_grad_exprs(spec: S.Recurrence, plan: Plan) -> dict[str, str]:
    """Triton text of dg/dz, dg/dA_log and dg/dt_bias for an in-kernel gate (sympy derivatives
    of the spec's gate, printed with the kernel's variable names); {} for a given g."""
    if not plan.gate_in_kernel:
        return {}
    expr = spec.gate.substituted
    out = {"gate_dz": to_triton(sp.diff(expr, S.z), GATE_NAMES)}
    if plan.gate_has_A:
        out["gate_dA"] = to_triton(sp.diff(expr, S.A_log), GATE_NAMES)
    if plan.gate_has_bias:
        out["gate_dbias"] = to_triton(sp.diff(expr, S.dt_bias), GATE_NAMES)
    return out


# ------------------------------------------------------------------------------ launches
@dataclass
class BwdMeta:
    """What the backward needs besides tensors (kept on the autograd ctx)."""

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int
    NT: int  # chunks per sequence (fixed-length batches)
    NT_total: int
    C: int
    scale: float
    plan: Plan
    gate_grads: dict[str, str]
    config: ChunkBwdConfig
    is_varlen: bool
    cu_seqlens: torch.Tensor  # or the dummy
    chunk_indices: torch.Tensor  # or the dummy
    chunk_offsets: torch.Tensor  # or the dummy
    fwd_intra: Any  # the forward intra Launch with its tensor arguments taken out
    inter_dtype: torch.dtype


def _meta(launches, spec, plan: Plan, config: ChunkBwdConfig) -> BwdMeta:
    """What the backward needs from the forward's launches; ``config`` takes the forward's
    chunk lengths."""
    from ..kernels import Launch

    intra, state = launches
    a = intra.args
    B, T, H, K = a["q"].shape
    HV, V = a["v"].shape[2], a["v"].shape[3]
    C, BC = intra.constexprs["BT"], intra.constexprs["BC"]
    if (config.chunk_size, config.sub_chunk) != (C, BC):
        config = config.replace(chunk_size=C, sub_chunk=BC)
    stripped = {n: (None if n in _INPUT_NAMES or n in INTERMEDIATES else x) for n, x in a.items()}
    return BwdMeta(
        B=B, T=T, H=H, HV=HV, K=K, V=V, N=state.grid[1] // HV, NT=a["NT"], NT_total=intra.grid[0], C=C,
        scale=a["scale"], plan=plan, gate_grads=gate_grad_exprs(spec, plan), config=config,
        is_varlen=intra.constexprs["IS_VARLEN"],
        cu_seqlens=a["cu_seqlens"], chunk_indices=a["chunk_indices"], chunk_offsets=state.args["chunk_offsets"],
        fwd_intra=Launch(intra.fn, intra.grid, stripped, intra.constexprs, intra.num_warps, intra.num_stages),
        inter_dtype=a["qg"].dtype)


def rerun_forward_intra(meta: BwdMeta, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Recompute qg, kg, W, A_qk and G_n with the forward's own intra launch.  U is not
    rebuilt (``STORE_U=False``): the backward reads V', which the forward's state pass kept."""
    launch, inter = rerun_intra_launch(meta, inputs)
    launch()
    return inter


def rerun_intra_launch(meta: BwdMeta, inputs: dict[str, torch.Tensor]):
    """(the launch, the intermediates it writes) of :func:`rerun_forward_intra`, not run."""
    from ..kernels import Launch, dummy_pointer

    B, T, HV, K, C = meta.B, meta.T, meta.HV, meta.K, meta.C
    dev = inputs["q"].device
    qg = torch.empty(B, T, HV, K, dtype=meta.inter_dtype, device=dev)
    inter = dict(qg=qg, kg=torch.empty_like(qg), w=torch.empty_like(qg), u=dummy_pointer(dev),
                 aqk=torch.empty(B, T, HV, C, dtype=meta.inter_dtype, device=dev),
                 gn=torch.empty(max(meta.NT_total, 1), HV, K, dtype=torch.float32, device=dev))
    fi = meta.fwd_intra
    args = {}
    for n, x in fi.args.items():  # the forward's argument order
        args[n] = inputs[n] if n in _INPUT_NAMES else inter[n] if n in INTERMEDIATES else x
    return Launch(fi.fn, fi.grid, args, {**fi.constexprs, "STORE_U": False}, fi.num_warps, fi.num_stages), inter


def prepare_chunk_bwd(meta: BwdMeta, inputs: dict[str, torch.Tensor], inter: dict[str, torch.Tensor],
                      hs: torch.Tensor, vn: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, need_dh0: bool,
                      built=None):
    """Allocate the gradient buffers and describe the three backward launches (run or compile)."""
    from ..kernels import Launch, dummy_pointer

    plan, cfg = meta.plan, meta.config
    if built is None:
        built = chunk_bwd_kernels(plan, cfg, meta.gate_grads)
    B, T, H, HV, K, V, N, C = meta.B, meta.T, meta.H, meta.HV, meta.K, meta.V, meta.N, meta.C
    q = inputs["q"]
    dev = q.device
    f32 = torch.float32
    NTt = max(meta.NT_total, 1)
    bv = min(cfg.state_block_v, plan.BV)
    NV = triton.cdiv(V, bv)
    dummy = dummy_pointer(dev)
    # dU in the dot dtype: both launches that read it cast it to that dtype on load, so storing
    # it rounded is bit-identical for them and halves its traffic
    du = torch.empty(B, T, HV, V, dtype=q.dtype, device=dev)
    dhs = torch.empty(NTt, HV, K, V, dtype=hs.dtype, device=dev)
    dh0 = torch.empty(N, HV, K, V, dtype=f32, device=dev) if need_dh0 else None
    state_args = dict(qg=inter["qg"], kg=inter["kg"], w=inter["w"], aqk=inter["aqk"], gn=inter["gn"],
                      do=do, dht=dht if dht is not None else dummy,
                      du=du, dhs=dhs, dh0=dh0 if dh0 is not None else dummy,
                      cu_seqlens=meta.cu_seqlens, chunk_offsets=meta.chunk_offsets, T=T, NT=meta.NT)
    state = Launch(built.fns[0], (NV, N * HV), state_args,
                   dict(HV=HV, K=K, V=V, BT=C, BK=plan.BK, BV=bv, USE_DHT=dht is not None,
                        STORE_DH0=need_dh0, IS_VARLEN=meta.is_varlen),
                   cfg.state_num_warps, cfg.state_num_stages)
    dqg = torch.empty(B, T, HV, K, dtype=f32, device=dev)
    dkg = torch.empty_like(dqg)
    dw = torch.empty(B, T, HV, K, dtype=q.dtype, device=dev)  # a dot operand only, like dU
    daqk = torch.empty(B, T, HV, C, dtype=f32, device=dev)
    dgn = torch.empty(NTt, HV, K, dtype=f32, device=dev)
    dqkw_args = dict(vn=vn, hs=hs, dhs=dhs, du=du, do=do, dqg=dqg, dkg=dkg, dw=dw, daqk=daqk, dgn=dgn,
                     cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT)
    bk = min(cfg.dqkw_block_k, plan.BK)
    dqkw = Launch(built.fns[1], (meta.NT_total, HV, triton.cdiv(K, bk)), dqkw_args,
                  dict(HV=HV, K=K, V=V, BT=C, BK=bk, BV=min(cfg.dqkw_block_v, plan.BV), IS_VARLEN=meta.is_varlen),
                  cfg.dqkw_num_warps, cfg.dqkw_num_stages)
    # dq, dk and dbeta in the inputs' dtypes: the kernel rounds its fp32 values on store as
    # .to() would, so the result is bit-identical without a conversion pass (three copy kernels,
    # 0.28 ms of fwd+bwd at (1, 8192, 96, 128), run 11).  With GVA, dq and dk stay fp32 until the
    # sum over a q/k head's value heads.
    dqk_dtype = q.dtype if HV == H else f32
    dq = torch.empty(B, T, HV, K, dtype=dqk_dtype, device=dev)
    dk = torch.empty_like(dq)
    dg = torch.empty(B, T, HV, K, dtype=f32, device=dev)
    dv = torch.empty(B, T, HV, V, dtype=inputs["v"].dtype, device=dev)
    dbeta = torch.empty(B, T, HV, dtype=inputs["beta"].dtype, device=dev)
    dA_part = torch.empty(NTt, HV, K, dtype=f32, device=dev) if plan.gate_has_A else None
    dbias_part = torch.empty(NTt, HV, K, dtype=f32, device=dev) if plan.gate_has_bias else None
    intra_args = dict(q=q, k=inputs["k"], v=inputs["v"], g=inputs["g"], beta=inputs["beta"])
    if plan.gate_has_A:
        intra_args["A_log"] = inputs["A_log"]
    if plan.gate_has_bias:
        intra_args["dt_bias"] = inputs["dt_bias"]
    intra_args.update(du=du, dqg=dqg, dkg=dkg, dw=dw, daqk=daqk, dgn=dgn, dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta)
    if dA_part is not None:
        intra_args["dA_part"] = dA_part
    if dbias_part is not None:
        intra_args["dbias_part"] = dbias_part
    intra_args.update(cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT,
                      scale=float(meta.scale))
    intra = Launch(built.fns[2], (meta.NT_total, HV), intra_args,
                   dict(H=H, HV=HV, K=K, V=V, BT=C, BC=cfg.sub_chunk, BK=min(cfg.intra_block_k, plan.BK),
                        BV=min(cfg.intra_block_v, plan.BV), IS_VARLEN=meta.is_varlen),
                   cfg.intra_num_warps, cfg.intra_num_stages)
    outputs = dict(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta, dh0=dh0, dA_part=dA_part, dbias_part=dbias_part)
    return (state, dqkw, intra), outputs


def training_forward_launches(q, k, v, g, beta, *, scale, initial_state, output_final_state, use_gate_in_kernel,
                              safe_gate, lower_bound, cu_seqlens, A_log, dt_bias, config, bwd_config):
    """The forward launches of a training call -- also writing the per-chunk states (in the
    backward config's ``state_dtype``) and V' -- with the backward's ``BwdMeta``.  The backward
    config is resolved once here: explicit, else a ``chunk_bwd_config`` block's, else the
    cached winner for this GPU and shape, else the heuristic."""
    from .chunk import chunk_kda_launches

    spec = select_spec(use_gate_in_kernel, safe_gate, lower_bound, A_log is not None, dt_bias is not None)
    plan = plan_for(spec, q.shape[-1], v.shape[-1], DTYPE_NAMES[q.dtype], "chunk", use_gate_in_kernel)
    bwd_config = resolve_bwd_config(plan, bwd_config, _shape_hint(q, v, cu_seqlens))
    launches, outs = chunk_kda_launches(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate, lower_bound=lower_bound,
        return_intermediate_states=True, cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, config=config,
        state_dtype=q.dtype if bwd_config.state_dtype == "input" else torch.float32, store_vn=True)
    return launches, outs, _meta(launches, spec, plan, bwd_config)


def chunk_kda_bwd_launches(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                           use_gate_in_kernel=False, safe_gate=False, lower_bound=None, cu_seqlens=None,
                           A_log=None, dt_bias=None, config: ChunkFwdConfig | None = None,
                           bwd_config: ChunkBwdConfig | None = None, do=None, dht=None, with_rerun=False):
    """Describe the forward launches and the backward launches of chunk_kda (nothing runs;
    for compile-only checks, tests and the benchmark): (fwd_launches, bwd_launches, bwd_outputs).

    The backward reads the intermediates and per-chunk states the forward launches write
    (run those first); ``do`` / ``dht`` default to zeros.  No host pre-processing, and dq/dk
    in the outputs are per value head (not yet summed over GVA groups).  ``with_rerun``: the
    forward launches end with the backward's re-run of the intra launch (when the config
    recomputes rather than stores the intermediates), for compiling everything a training
    step runs."""
    fwd, (o, ht, hs), meta = training_forward_launches(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate, lower_bound=lower_bound, cu_seqlens=cu_seqlens,
        A_log=A_log, dt_bias=dt_bias, config=config, bwd_config=bwd_config)
    a = fwd[0].args
    inputs = {n: a.get(n) for n in _INPUT_NAMES}
    inter = {n: a[n] for n in INTERMEDIATES}
    if do is None:
        do = torch.zeros_like(o)
    if dht is None and output_final_state:
        dht = torch.zeros_like(ht)
    bwd, outs = prepare_chunk_bwd(meta, inputs, inter, hs, fwd[1].args["vn"], do.contiguous(),
                                  None if dht is None else dht.contiguous(), initial_state is not None)
    if with_rerun and not meta.config.store_intermediates:
        fwd = list(fwd) + [rerun_intra_launch(meta, inputs)[0]]
    return fwd, bwd, outs


# ------------------------------------------------------------------------------ autograd
@dataclass(frozen=True)
class _Opts:
    scale: float | None
    output_final_state: bool
    use_gate_in_kernel: bool
    safe_gate: bool
    lower_bound: float | None
    cu_seqlens: torch.Tensor | None
    config: ChunkFwdConfig | None


def chunk_kda_with_grad(q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                        use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                        return_intermediate_states, cu_seqlens, A_log, dt_bias, config):
    """chunk_kda when some input requires grad: validate, pre-process with torch ops (so
    autograd differentiates the l2-norm / sigmoid), then the autograd Function."""
    from .chunk import _ChunkKDAFunction

    check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                 A_log=A_log, dt_bias=dt_bias, gate_in_kernel=use_gate_in_kernel)
    select_spec(use_gate_in_kernel, safe_gate, lower_bound, A_log is not None, dt_bias is not None)
    if return_intermediate_states:
        raise ValueError(
            "chunk_kda: return_intermediate_states=True is inference-only (prefix caching) and has no "
            "backward; call it under torch.no_grad() / torch.inference_mode() or detach the inputs")
    q, k, beta = preprocess(q, k, beta, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    opts = _Opts(scale, output_final_state, use_gate_in_kernel, safe_gate, lower_bound, cu_seqlens, config)
    return _ChunkKDAFunction.apply(q, k, v, g, beta, initial_state, A_log, dt_bias, opts)


def fwd_for_grad(ctx, q, k, v, g, beta, initial_state, A_log, dt_bias, opts: _Opts):
    """Forward of the autograd Function: the forward launches, also writing the per-chunk states
    (in the backward config's ``state_dtype``)."""
    launches, (o, ht, hs), meta = training_forward_launches(
        q, k, v, g, beta, scale=opts.scale, initial_state=initial_state, output_final_state=opts.output_final_state,
        use_gate_in_kernel=opts.use_gate_in_kernel, safe_gate=opts.safe_gate, lower_bound=opts.lower_bound,
        cu_seqlens=opts.cu_seqlens, A_log=A_log, dt_bias=dt_bias, config=opts.config, bwd_config=None)
    for launch in launches:
        launch()
    a = launches[0].args
    saved = [a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state, a.get("A_log"), a.get("dt_bias"), hs,
             launches[1].args["vn"]]
    if meta.config.store_intermediates:
        saved += [a[n] for n in KEPT_INTERMEDIATES]
    ctx.save_for_backward(*saved)
    ctx.meta = meta
    ctx.shapes = dict(A_log=None if A_log is None else (A_log.shape, A_log.dtype),
                      dt_bias=None if dt_bias is None else (dt_bias.shape, dt_bias.dtype),
                      q=(q.dtype,), k=(k.dtype,), g=(g.dtype,), beta=(beta.dtype,))
    return o, ht


def bwd_for_grad(ctx, do, dht):
    """Backward of the autograd Function: grads of (q, k, v, g, beta, initial_state, A_log, dt_bias)."""
    meta: BwdMeta = ctx.meta
    saved = ctx.saved_tensors
    q, k, v, g, beta, h0, A_log, dt_bias, hs, vn = saved[:10]
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
    if meta.config.store_intermediates:
        inter = dict(zip(KEPT_INTERMEDIATES, saved[10:]))
    else:
        inter = rerun_forward_intra(meta, inputs)
    if do is None:
        do = torch.zeros(meta.B, meta.T, meta.HV, meta.V, dtype=v.dtype, device=v.device)
    need = ctx.needs_input_grad
    need_dh0 = h0 is not None and need[5]
    launches, out = prepare_chunk_bwd(meta, inputs, inter, hs, vn, do.contiguous(),
                                      None if dht is None else dht.contiguous(), need_dh0)
    for launch in launches:
        launch()
    B, T, H, HV, K = meta.B, meta.T, meta.H, meta.HV, meta.K
    dq, dk = out["dq"], out["dk"]
    if HV != H:  # GVA: value heads hv of one q/k head h are h * (HV // H) ... (h + 1) * (HV // H) - 1
        dq = dq.view(B, T, H, HV // H, K).sum(3)
        dk = dk.view(B, T, H, HV // H, K).sum(3)
    sh = ctx.shapes
    dA_log = ddt_bias = None
    if out["dA_part"] is not None:
        shape, dtype = sh["A_log"]
        dA_log = out["dA_part"].sum((0, 2)).reshape(shape).to(dtype)
    if out["dbias_part"] is not None:
        shape, dtype = sh["dt_bias"]
        ddt_bias = out["dbias_part"].sum(0).reshape(shape).to(dtype)
    dh0 = out["dh0"].to(h0.dtype) if need_dh0 else None
    grads = (dq.to(sh["q"][0]), dk.to(sh["k"][0]), out["dv"], out["dg"].to(sh["g"][0]),
             out["dbeta"].to(sh["beta"][0]), dh0, dA_log, ddt_bias)
    return tuple(x if n else None for x, n in zip(grads, need[:8]))
