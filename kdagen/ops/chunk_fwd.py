"""The forward of an inference call of `chunk_kda`, described as two launches (nothing here
validates or runs):

1. solve (grid: chunks x value heads) -> qg, bk, kgL, P, G_n.  Each chunk's triangular system
   is solved where its q, k, g and beta are loaded; v is not read.  The l2-norm of q and k,
   the in-kernel gate and the beta sigmoid are computed here, from the raw inputs.
2. pass  (grid: V tiles x sequences x value heads) walks the chunks of each sequence with the
   state in registers: X = beta v - bk S, o = qg S + P X, S <- exp(G_n) S + kgL^T X.

Per chunk (L = (I + A_kk)^-1, G the gate's cumulated sum within the chunk):
    qg = scale q exp(G),  bk = beta k exp(G),  kgL = L^T (k exp(G_n - G)),  P = A_qk L
which is the chunkwise form of DESIGN.md with U = L beta V and W = L (beta exp(G) k) folded
into the pass: V' = U - W S = L X, so A_qk V' = P X and kg^T V' = kgL^T X.

With ``config.state_segment_chunks`` = L > 0 the pass is sequence parallel: three launches in its
place (:mod:`kdagen.ops.chunk_segments`, whose docstring has the algebra) -- segments of L chunks
get their transition and zero-start end state in parallel (chunk_seg_state), a short pass chains
them from the initial state (chunk_seg_combine, which writes the final state), and the pass
proper walks each segment from the state entering it (chunk_seg_pass).
"""
from __future__ import annotations

import torch
import triton

from ..config import ChunkFwdConfig
from ..kernels import Launch, dummy_pointer
from .chunk_segments import segment_launches
from .inputs import state_shape
from .schedule import SCHEDULE, chunk_schedule, to_device


def prepare_chunk_fwd(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens,
                      seqlens, dims, plan, config: ChunkFwdConfig, built, A_log=None, dt_bias=None,
                      return_intermediate_states=False, l2norm=False, beta_sigmoid=False, beta_scale=1.0,
                      state_v_first=False):
    """Allocate the outputs and describe both launches (to run them, time them, or compile them
    for another GPU).  ``l2norm``, ``beta_sigmoid``/``beta_scale``: q/k are raw and normalised
    by the solve, beta is raw and ``beta_scale * sigmoid(beta)`` is used (FLA's in-kernel flags).
    With ``return_intermediate_states`` the pass also writes the float32 state entering each
    chunk, [NT_total, HV, K, V].  ``state_v_first``: the initial, final and per-chunk states are
    stored [.., V, K] (the kernel's loads and stores address them so; nothing is transposed).

    Returns ``(launches, (o, ht, hs))``: launches ``(solve, pass)``, or with
    ``config.state_segment_chunks`` > 0 ``(solve, seg_state, seg_combine, seg_pass)`` (passes A, B
    and C of :mod:`kdagen.ops.chunk_segments`); run them in order."""
    B, T, H, HV, K, V, N = dims.B, dims.T, dims.H, dims.HV, dims.K, dims.V, dims.N
    C = config.chunk_size
    dev = q.device
    cu = to_device(cu_seqlens, dev) if cu_seqlens is not None else None
    NT_total, chunk_indices, chunk_offsets = chunk_schedule(seqlens, B, T, C, dev, cu, built.fns[SCHEDULE])
    NT = triton.cdiv(T, C)
    scalar = plan.diag_mode == "scalar"
    if scalar:  # a decay shared by the channels: qg and bk are row scales of q and k (chunk_solve_scalar.py.j2)
        qg = torch.empty(B, T, HV, dtype=torch.float32, device=dev)
        bk = torch.empty_like(qg)
    else:
        qg = torch.empty(B, T, HV, K, dtype=q.dtype, device=dev)
        bk = torch.empty_like(qg)
    kgl = torch.empty(B, T, HV, K, dtype=q.dtype, device=dev)
    pm = torch.empty(B, T, HV, C, dtype=q.dtype, device=dev)
    gn = torch.empty(max(NT_total, 1), HV, K, dtype=torch.float32, device=dev)
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    ht = torch.empty(state_shape(N, HV, K, V, state_v_first), dtype=torch.float32, device=dev) if output_final_state else None
    hs = (torch.empty(state_shape(max(NT_total, 1), HV, K, V, state_v_first), dtype=torch.float32, device=dev)
          if return_intermediate_states else None)
    dummy = dummy_pointer(dev)
    cu = cu if cu is not None else dummy
    flags = dict(IS_VARLEN=cu_seqlens is not None, BETA_SIGMOID=bool(beta_sigmoid), BETA_SCALE=float(beta_scale))
    solve_args = dict(q=q, k=k, g=g, beta=beta)
    if plan.gate_has_A:
        solve_args["A_log"] = A_log
    if plan.gate_has_bias:
        solve_args["dt_bias"] = dt_bias
    solve_args.update(**(dict(qs=qg, bs=bk) if scalar else dict(qg=qg, bk=bk)), kgl=kgl, pm=pm, gn=gn, cu_seqlens=cu,
                      chunk_indices=chunk_indices if chunk_indices is not None else dummy,
                      T=T, NT=NT, scale=float(scale))
    solve = Launch("chunk_solve", built.fns[0], (NT_total, HV), solve_args,
                   dict(H=H, HV=HV, K=K, BT=C, BH=min(C, 32), BC=config.sub_chunk, BK=plan.BK,
                        L2NORM=bool(l2norm), **flags),
                   config.intra_num_warps, config.intra_num_stages)
    bv = min(config.state_block_v, plan.BV)
    rows = dict(q=q, k=k, qs=qg, bs=bk) if scalar else dict(qg=qg, bk=bk)
    pass_args = dict(v=v, beta=beta, **rows, kgl=kgl, pm=pm, gn=gn, o=o,
                     h0=initial_state if initial_state is not None else dummy,
                     ht=ht if ht is not None else dummy, hs=hs if hs is not None else dummy,
                     cu_seqlens=cu, chunk_offsets=chunk_offsets if chunk_offsets is not None else dummy,
                     T=T, NT=NT)
    pass_const = dict(**(dict(H=H) if scalar else {}), HV=HV, K=K, V=V, BT=C, BH=min(C, 32), BK=plan.BK, BV=bv,
                      USE_H0=initial_state is not None,
                      STORE_HT=output_final_state, STORE_HS=return_intermediate_states,
                      STATE_V_FIRST=bool(state_v_first),
                      LOOP_STAGES=config.state_num_stages, **flags)
    if config.state_segment_chunks:
        segments = segment_launches(built, seqlens=seqlens, dims=dims, plan=plan, config=config, C=C, bv=bv,
                                    pass_args=pass_args, pass_constexprs=pass_const, flags=flags,
                                    initial_state=initial_state, ht=ht, dev=dev)
        return (solve, *segments), (o, ht, hs)
    state = Launch("chunk_pass", built.fns[1], (triton.cdiv(V, bv), N * HV), pass_args, pass_const,
                   config.state_num_warps, 1)
    return (solve, state), (o, ht, hs)
