"""The backward of `fused_recurrent_kda`: one launch (``templates/recurrent_bwd.py.j2``; general DPLR's
``recurrent_bwd_dplr.py.j2``), then the host adds the per-V-tile partial sums.

The algebra, per token t of a sequence (q~ = scale q, D_t = Diag(exp g_t), S = S_{t-1}):

    forward    S' = D_t S,   r = S'^T k_t,   u = beta_t (v_t - r),   S_t = S' + k_t u^T,
               o_t = S_t^T q~_t
    backward   (dS = dL/dS_t, dht after the last token)
               dS  += q~_t do_t^T                 dq_t    = scale S_t do_t
               du   = dS^T k_t                    dk_t    = dS u - beta_t S' du
               dv_t = beta_t du                   dbeta_t = du . (v_t - r)
               dS'  = dS - beta_t k_t du^T        dg_t    = rowsum(dS' * S')
               dS  <- D_t dS'                     (= dL/dS_{t-1}; after the first token, dh0)

With the in-kernel gate g = f(z; A_log, dt_bias): dz = dg f_z, dA_log = sum dg f_A,
ddt_bias = sum dg f_bias, with sympy's derivatives of the spec's gate (``Plan.gate_dz`` ...),
as in the chunk form's backward.  The l2-norm of q/k and the beta sigmoid are torch ops before
the autograd Function (:func:`kdagen.ops.inputs.preprocess`), which autograd differentiates:
the chunk op's training path does the same.

The reverse walk needs S_{t-1} at every token.  Recovering it from S_t would divide by exp(g)
(unbounded for strong decays, undefined at g = -inf), so the states are recomputed forwards
instead: the kernel walks the sequence once from h0, keeping the state entering each segment
of ``segment`` tokens (one [K, V] checkpoint per segment, float32), then walks the segments
last to first, recomputing each segment's states from its checkpoint into a per-program
scratch of ``segment`` states and stepping back through them.  The forward launch stores
nothing for the backward.  Work: two forward walks and one backward walk; memory: one state
per segment and ``segment`` states per (sequence, value head).

Grid: (V tiles, sequences x value heads).  The state's columns evolve independently, so every
V tile is exact on its own; the gradients that contract over V (dq, dk, dg, dbeta, dA_log,
ddt_bias) are written per V tile and added here, then dq/dk over the value heads of a q/k head
(GVA).

General DPLR (``plan.structure == "dplr"``, FLA's convention S_t = D S + b (a^T S) + k v^T) reads a
and b instead of beta and writes da, db (per V tile, added here) instead of dbeta
(:func:`backward_dplr`; the algebra is in the template's header).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton

from ..cache.heuristics import WIDE_STATE_BK
from ..codegen.lower import Plan
from ..config import RecurrentBwdConfig
from ..kernels import Launch, build, dummy_pointer
from .inputs import Dims, state_shape
from .schedule import chunk_schedule, to_device

_OVERRIDE: list[RecurrentBwdConfig] = []


@contextlib.contextmanager
def recurrent_bwd_config(config: RecurrentBwdConfig):
    """Use ``config`` for the backward of every fused_recurrent_kda called (forward) inside the
    block (the op's signature has no backward config)."""
    if not isinstance(config, RecurrentBwdConfig):
        raise TypeError(f"recurrent_bwd_config takes a RecurrentBwdConfig, got {type(config).__name__}")
    _OVERRIDE.append(config)
    try:
        yield config
    finally:
        _OVERRIDE.pop()


def current_config(plan: Plan | None = None) -> RecurrentBwdConfig:
    """The backward config of a call made now: the innermost :func:`recurrent_bwd_config`, or
    the default (not tuned) for ``plan``: RecurrentBwdConfig's, or for a state row wider than 256
    (GLA's heads up to 512) 16-wide V tiles over 8 warps -- the program holds S [BK, BV] and dS
    [BK, BV] in float32 (sm_90 compile at K=V=512, bf16: 217 registers, no spill; the default 32
    over 4 warps spills 13.5 KB, 16 over 4 272 B, 32 over 8 268 B)."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    if plan is not None and plan.BK > WIDE_STATE_BK:
        return RecurrentBwdConfig(block_v=16, num_warps=8)
    return RecurrentBwdConfig()


@dataclass(frozen=True)
class RecurrentBwdMeta:
    """What the backward needs besides the saved tensors (kept on the autograd ctx)."""

    dims: Dims
    seqlens: list[int] | None  # cu_seqlens on the host (the segment schedule is built from it)
    cu_seqlens: torch.Tensor | None
    scale: float
    plan: Plan
    config: RecurrentBwdConfig
    state_v_first: bool


def prepare_recurrent_bwd(meta: RecurrentBwdMeta, inputs: dict, initial_state, do, dht, need_dh0: bool):
    """Allocate the gradient buffers and describe the launch: ``(launch, partials)``.
    ``inputs``: q, k, v, g, beta (as the forward kernel read them) and A_log / dt_bias; general
    DPLR's: q, k, v, g, a, b (its partials hold da, db instead of dbeta)."""
    d, plan, cfg = meta.dims, meta.plan, meta.config
    B, T, H, HV, K, V, N = d.B, d.T, d.H, d.HV, d.K, d.V, d.N
    q = inputs["q"]
    dev, f32 = q.device, torch.float32
    bv = min(cfg.block_v, plan.BV)
    NV = triton.cdiv(V, bv)
    # no segment longer than the longest sequence: the scratch holds `segment` states per program
    longest = T if meta.seqlens is None else max(b - a for a, b in zip(meta.seqlens, meta.seqlens[1:]))
    BT = min(cfg.segment, triton.next_power_of_2(max(longest, 1)))
    NT_total, _, chunk_offsets = chunk_schedule(meta.seqlens, B, T, BT, dev)
    dummy = dummy_pointer(dev)
    ck = torch.empty(max(NT_total, 1), HV, K, V, dtype=f32, device=dev)
    scr = torch.empty(N * HV, BT, K, V, dtype=f32, device=dev)
    TT = B * T
    dq = torch.empty(NV, TT, HV, K, dtype=f32, device=dev)
    dk = torch.empty_like(dq)
    # dg: per channel, one per token for a scalar decay (summed over the channels in the kernel), none
    # without a decay
    dg = (torch.empty_like(dq) if plan.decay == "channel" else torch.empty(NV, TT, HV, dtype=f32, device=dev)
          if plan.decay == "scalar" else dummy)
    dplr = plan.structure == "dplr"
    dbeta = torch.empty(NV, TT, HV, dtype=f32, device=dev) if plan.has_rank1 and not dplr else None  # no beta
    da, db = (torch.empty_like(dq), torch.empty_like(dq)) if dplr else (None, None)  # DPLR's a, b: per channel
    dv = torch.empty(B, T, HV, V, dtype=inputs["v"].dtype, device=dev)
    dh0 = torch.empty(state_shape(N, HV, K, V, meta.state_v_first), dtype=f32, device=dev) if need_dh0 else None
    dA_part = torch.empty(NV, N, HV, K, dtype=f32, device=dev) if plan.gate_has_A else None
    dbias_part = torch.empty(NV, N, HV, K, dtype=f32, device=dev) if plan.gate_has_bias else None
    args = {n: inputs[n] for n in (("q", "k", "v", "g", "a", "b") if dplr else ("q", "k", "v", "g", "beta"))}
    if plan.gate_has_A:
        args["A_log"] = inputs["A_log"]
    if plan.gate_has_bias:
        args["dt_bias"] = inputs["dt_bias"]
    args.update(do=do, dht=dht if dht is not None else dummy, h0=initial_state if initial_state is not None else dummy,
                ck=ck, scr=scr, dq=dq, dk=dk, dv=dv, dg=dg)
    if dplr:
        args.update(da=da, db=db)
    else:
        args["dbeta"] = dbeta if dbeta is not None else dummy
    args["dh0"] = dh0 if dh0 is not None else dummy
    if dA_part is not None:
        args["dA_part"] = dA_part
    if dbias_part is not None:
        args["dbias_part"] = dbias_part
    cu = meta.cu_seqlens
    args.update(cu_seqlens=to_device(cu, dev) if cu is not None else dummy,
                chunk_offsets=chunk_offsets if chunk_offsets is not None else dummy,
                T=T, TT=TT, NT=triton.cdiv(T, BT), scale=float(meta.scale))
    launch = Launch("recurrent_bwd", build(plan, cfg).fns[0], (NV, N * HV), args,
                    dict(H=H, HV=HV, K=K, V=V, BT=BT, BK=plan.BK, BV=bv, USE_H0=initial_state is not None,
                         USE_DHT=dht is not None, STORE_DH0=need_dh0, IS_VARLEN=cu is not None,
                         STATE_V_FIRST=meta.state_v_first),
                    cfg.num_warps, cfg.num_stages)
    partials = dict(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta, dh0=dh0, dA_part=dA_part, dbias_part=dbias_part)
    if dplr:
        partials.update(da=da, db=db)
    return launch, partials


def backward(meta: RecurrentBwdMeta, saved, like: dict, need: tuple[bool, ...], do, dht):
    """Grads of (q, k, v, g, beta, initial_state, A_log, dt_bias) -- None where ``need`` says
    no -- from the saved inputs and the upstream gradients of o and the final state; each in
    the (shape, dtype) ``like`` gives for its input."""
    q, k, v, g, beta, h0, A_log, dt_bias = saved
    d = meta.dims
    if do is None:
        do = torch.zeros(d.B, d.T, d.HV, d.V, dtype=v.dtype, device=v.device)
    need_dh0 = h0 is not None and need[5]
    launch, out = prepare_recurrent_bwd(meta, dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias),
                                        h0, do.contiguous(), None if dht is None else dht.contiguous(), need_dh0)
    launch()
    B, T, H, HV, K = d.B, d.T, d.H, d.HV, d.K
    dq, dk = out["dq"].sum(0).view(B, T, HV, K), out["dk"].sum(0).view(B, T, HV, K)
    if HV != H:  # GVA: value heads h * (HV // H) ... (h + 1) * (HV // H) - 1 read q/k head h
        dq = dq.view(B, T, H, HV // H, K).sum(3)
        dk = dk.view(B, T, H, HV // H, K).sum(3)
    # (a scalar decay's dg is summed over the channels in the kernel; no decay, no dg)
    dg = out["dg"].sum(0).view(B, T, HV, *(() if meta.plan.decay == "scalar" else (K,))) \
        if meta.plan.decay != "identity" else out["dg"]
    dbeta = out["dbeta"].sum(0).view(B, T, HV).to(like["beta"][1]) if out["dbeta"] is not None else None
    dA_log = ddt_bias = None
    if out["dA_part"] is not None:
        shape, dtype = like["A_log"]
        dA_log = out["dA_part"].sum((0, 1, 3)).reshape(shape).to(dtype)
    if out["dbias_part"] is not None:
        shape, dtype = like["dt_bias"]
        ddt_bias = out["dbias_part"].sum((0, 1)).reshape(shape).to(dtype)
    dh0 = out["dh0"].to(h0.dtype) if need_dh0 else None
    grads = (dq.to(like["q"][1]), dk.to(like["k"][1]), out["dv"], dg.to(like["g"][1]), dbeta,
             dh0, dA_log, ddt_bias)
    return tuple(x if n else None for x, n in zip(grads, need[:8]))


def backward_dplr(meta: RecurrentBwdMeta, saved, like: dict, need: tuple[bool, ...], do, dht):
    """General DPLR's grads of (q, k, v, gk, a, b, initial_state) -- None where ``need`` says no --
    each in the (shape, dtype) ``like`` gives for its input."""
    q, k, v, g, a, b, h0 = saved
    d = meta.dims
    if do is None:
        do = torch.zeros(d.B, d.T, d.HV, d.V, dtype=v.dtype, device=v.device)
    need_dh0 = h0 is not None and need[6]
    launch, out = prepare_recurrent_bwd(meta, dict(q=q, k=k, v=v, g=g, a=a, b=b), h0, do.contiguous(),
                                        None if dht is None else dht.contiguous(), need_dh0)
    launch()
    B, T, H, HV, K = d.B, d.T, d.H, d.HV, d.K
    dq, dk = out["dq"].sum(0).view(B, T, HV, K), out["dk"].sum(0).view(B, T, HV, K)
    if HV != H:  # GVA: value heads h * (HV // H) ... (h + 1) * (HV // H) - 1 read q/k head h
        dq = dq.view(B, T, H, HV // H, K).sum(3)
        dk = dk.view(B, T, H, HV // H, K).sum(3)
    per_head = {n: out["d" + n].sum(0).view(B, T, HV, K).to(like[n][1]) for n in ("g", "a", "b")}
    dh0 = out["dh0"].to(h0.dtype) if need_dh0 else None
    grads = (dq.to(like["q"][1]), dk.to(like["k"][1]), out["dv"], per_head["g"], per_head["a"], per_head["b"], dh0)
    return tuple(x if n else None for x, n in zip(grads, need[:7]))
