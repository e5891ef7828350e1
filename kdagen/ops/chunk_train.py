"""The forward of a training call of `chunk_kda`, described as two launches (nothing here
validates or runs):

1. intra  (grid: chunks x value heads)   -> qg, kg, W, U, A_qk, G_n
2. state  (grid: V tiles x sequences x value heads) walks the chunks of each sequence,
   fusing V' = U - W S, O and the state update, and keeps the state entering every chunk and
   V' for the backward.

The backward rebuilds what it reads of launch 1 from the A_qk and T it keeps (``store_t``; general
DPLR re-runs launch 1; :mod:`kdagen.ops.chunk_bwd`).  An
inference call runs :mod:`kdagen.ops.chunk_fwd` instead -- except general DPLR's
(``plan.structure == "dplr"``, :mod:`kdagen.ops.dplr`), which runs these two launches for
inference too: its intra launch also writes A_qk (``aqv``) and k exp(G_n - G) (``kgv``), and its
state pass adds their terms on the raw values, O += A_qk V and S += kgv^T V.
"""
from __future__ import annotations

import torch
import triton

from ..config import ChunkTrainConfig
from ..kernels import Launch, dummy_pointer, has_repair
from .inputs import state_shape
from .schedule import chunk_schedule, to_device


def prepare_chunk_train(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens,
                      seqlens, dims, plan, config: ChunkTrainConfig, built, A_log=None, dt_bias=None,
                      return_intermediate_states=False, state_dtype=torch.float32, store_vn=False,
                      state_v_first=False, a=None, b=None, store_t=False):
    """Allocate outputs and describe both launches (used for running and compile-only).
    ``state_dtype``: storage of the per-chunk states (float32 for callers; the training
    forward may keep them in the input dtype for its backward).  ``store_vn``: the state
    pass also writes V' = U - W S (the backward's, in the intermediates' dtype) to the
    state launch's ``vn`` argument.  ``state_v_first``: the initial and final states are stored
    [.., V, K] (the per-chunk states stay [K, V]: they are the backward's).  ``store_t``: the intra
    launch also writes T = (I + A_kk)^-1 Diag(beta) in the dot dtype, [B, T, HV, C] as A_qk (``td``;
    a plan with a rank-1 part), from which the backward's chunk_bwd_rerun rebuilds W.

    General DPLR (``plan.structure == "dplr"``): ``a`` and ``b`` ([B, T, HV, K], the read and
    write vectors) replace ``beta``, which is not read; the intra launch also writes ``aqv``
    (A_qk, [B, T, HV, C]) and ``kgv`` (k exp(G_n - G), [B, T, HV, K]), and the state pass reads
    them with v (the raw values' terms)."""
    B, T, H, HV, K, V, N = dims.B, dims.T, dims.H, dims.HV, dims.K, dims.V, dims.N
    C = config.chunk_size
    dev = q.device
    if cu_seqlens is not None and seqlens is None:  # the backward's schedule and buffers need the lengths
        raise ValueError("a training call with cu_seqlens needs the offsets on the host (read once per call)")
    NT_total, chunk_indices, chunk_offsets = chunk_schedule(seqlens, B, T, C, dev)
    NT = triton.cdiv(T, C)
    inter = q.dtype  # W, U, qg, kg and A_qk between the launches: the input dtype
    dummy = dummy_pointer(dev)
    if plan.qk_from_inputs:  # qg and kg are not written (no decay: q scale and k; a scalar decay: q, k times
        # exp(G), exp(G_n - G) per row, formed by their readers from g): the state and output launches read q, k
        qg = kg = dummy
    else:
        kg = torch.empty(B, T, HV, K, dtype=inter, device=dev)
        qg = torch.empty(B, T, HV, K, dtype=inter, device=dev)
    if plan.has_rank1:
        w = torch.empty(B, T, HV, K, dtype=inter, device=dev)
        u = torch.empty(B, T, HV, V, dtype=inter, device=dev)
    else:  # no rank-1 part: W = 0 is never formed, and U = V (the state launch reads v as u)
        w, u = dummy, v
    # zeros: the launch writes the lower [BC, BC] blocks only, and a training call returns aqk (and td)
    # to the backward as outputs (the library op's contract: deterministic, no uninitialised memory)
    aqk = torch.zeros(B, T, HV, C, dtype=inter, device=dev)
    gn = torch.empty(max(NT_total, 1), HV, K, dtype=torch.float32, device=dev)
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    ht = torch.empty(state_shape(N, HV, K, V, state_v_first), dtype=torch.float32, device=dev) if output_final_state else None
    hs = (torch.empty(max(NT_total, 1), HV, K, V, dtype=state_dtype, device=dev)
          if return_intermediate_states else None)
    vn = torch.empty(B, T, HV, V, dtype=inter, device=dev) if store_vn else None
    cu = to_device(cu_seqlens, dev) if cu_seqlens is not None else dummy
    dplr = plan.structure == "dplr"
    if dplr:
        aqv = torch.empty_like(aqk)
        kgv = torch.empty_like(kg)
        intra_args = dict(q=q, k=k, v=v, g=g, a=a, b=b)
    else:
        intra_args = dict(q=q, k=k, v=v, g=g, beta=beta)
    if plan.gate_has_A:
        intra_args["A_log"] = A_log
    if plan.gate_has_bias:
        intra_args["dt_bias"] = dt_bias
    intra_args.update(qg=qg, kg=kg, w=w, u=u, aqk=aqk, **(dict(aqv=aqv, kgv=kgv) if dplr else {}), gn=gn)
    store_t = store_t and plan.has_rank1 and not dplr
    if not dplr:
        intra_args["td"] = torch.zeros(B, T, HV, C, dtype=q.dtype, device=dev) if store_t else dummy
    repair = has_repair(built.fn("chunk_intra"))
    if repair:  # one flag per (chunk, value head): a diagonal sub-tile spans over the limit (the repair launch's)
        intra_args["bad"] = torch.empty(max(NT_total, 1), HV, dtype=torch.int8, device=dev)
    intra_args.update(cu_seqlens=cu,
                      chunk_indices=chunk_indices if chunk_indices is not None else dummy,
                      T=T, NT=NT, scale=float(scale))
    bk = min(config.intra_block_k, plan.BK)
    intra = Launch("chunk_intra", built.fn("chunk_intra"), (NT_total, HV), intra_args,
                   dict(H=H, HV=HV, K=K, V=V, BT=C, BC=config.sub_chunk, BK=bk,
                        BV=min(64, plan.BV), IS_VARLEN=cu_seqlens is not None, STORE_U=plan.has_rank1,
                        **({} if dplr else dict(STORE_T=store_t))),
                   config.intra_num_warps, config.intra_num_stages)
    if repair:
        intra = intra.with_repair()
    bv = min(config.state_block_v, plan.BV)
    # (no decay: the inputs q and k where qg and kg would be, with the scale and their head count)
    rq, kq = (q, k) if plan.qk_from_inputs else (qg, kg)
    raw = dict(scale=float(scale)) if plan.qk_from_inputs else {}
    raw_h = dict(H=H) if plan.qk_from_inputs else {}
    rows = dict(g=g) if plan.qk_row_scaled else {}  # (the row factors' gate)
    state_args = dict(qg=rq, kg=kq, w=w, u=u, aqk=aqk, gn=gn, **rows, **(dict(v=v, aqv=aqv, kgv=kgv) if dplr else {}), o=o,
                      h0=initial_state if initial_state is not None else dummy,
                      ht=ht if ht is not None else dummy, hs=hs if hs is not None else dummy,
                      vn=vn if vn is not None else dummy,
                      cu_seqlens=cu, chunk_offsets=chunk_offsets if chunk_offsets is not None else dummy,
                      T=T, NT=NT, **raw)
    split = output_split(config, return_intermediate_states, store_vn)
    state = Launch("chunk_state", built.fn("chunk_state"), (triton.cdiv(V, bv), N * HV), state_args,
                   dict(**raw_h, HV=HV, K=K, V=V, BT=C, BK=plan.BK, BV=bv, USE_H0=initial_state is not None,
                        STORE_HT=output_final_state, STORE_HS=return_intermediate_states, STORE_VN=store_vn,
                        WRITE_O=not split, IS_VARLEN=cu_seqlens is not None, STATE_V_FIRST=bool(state_v_first)),
                   config.state_num_warps, config.state_num_stages)
    if not split:
        return (intra, state), (o, ht, hs)
    obv = min(config.out_block_v, plan.BV)
    out_args = dict(qg=rq, hs=hs, aqk=aqk, vn=vn, **rows, **(dict(v=v, aqv=aqv) if dplr else {}), o=o, cu_seqlens=cu,
                    chunk_indices=chunk_indices if chunk_indices is not None else dummy,
                    chunk_offsets=chunk_offsets if chunk_offsets is not None else dummy, T=T, NT=NT, **raw)
    out = Launch("chunk_out", built.fn("chunk_out"), (triton.cdiv(V, obv), NT_total, HV), out_args,
                 dict(**raw_h, HV=HV, K=K, V=V, BT=C, BK=min(config.out_block_k, plan.BK), BV=obv,
                      IS_VARLEN=cu_seqlens is not None),
                 config.out_num_warps, config.out_num_stages)
    return (intra, state, out), (o, ht, hs)


def output_split(config: ChunkTrainConfig, stores_states: bool, stores_vn: bool) -> bool:
    """Whether the call's output comes from the chunk-parallel launch (``config.split_output``): only
    where the state pass keeps what it reads, the per-chunk states and V' (a training call); any other
    call of the config runs the fused pass."""
    return bool(config.split_output and stores_states and stores_vn)
