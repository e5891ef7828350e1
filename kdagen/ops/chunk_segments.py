"""The sequence-parallel state pass of the inference forward (``ChunkFwdConfig.state_segment_chunks``
= L > 0): three launches in place of :mod:`kdagen.ops.chunk_fwd`'s one pass, for calls with too few
(sequence, value head, V tile) programs to fill the GPU and long sequences (the one pass is then
latency bound: each program walks every chunk of its sequence).  Nothing here validates or runs.

The algebra.  The pass (templates/chunk_pass.py.j2) maps the state entering chunk c to the state
leaving it affinely, S' = M_c S + E_c, with (exp2: G_n is in log2 units)

    general (KDA):       X = beta v - bk S,           S' = D_c S + kgL^T X
                         M_c = D_c - kgL^T bk,         E_c = kgL^T (beta v),   D_c = Diag(exp2 G_n)
    scalar decay (GDN):  bk = bs * k (rows scaled):    M_c = D_c - kgL^T (bs * k), D_c = exp2(g_n) I
    no decay (DeltaNet): D_c = I:                      M_c = I - kgL^T bk
    no rank-1 (GLA):     X = v:                        M_c = D_c,              E_c = kgL^T v

and o of the chunk depends only on S entering it (o = qg S + P X).  A sequence's chunks are cut
into segments of L chunks (the last one of a sequence may be shorter; segments never cross a
sequence boundary; an empty sequence has none).  For segment j with chunks c_1 .. c_m:

    M_j = M_{c_m} ... M_{c_1}   (K x K)       E_j = the state after its chunks from S = 0  (K x V)
    S_{j+1} = M_j S_j + E_j,    S_0 = the initial state (or 0); the last S_{j+1} is the final state.

Launches (all float32 state tiles, [K, V] scratch whatever the caller's state layout):

A. ``chunk_seg_state``, grid (cdiv(V, BV) + cdiv(K, BV), segments x HV): the pass's recurrence
   without o over one segment, T <- D_c T + kgL^T (W - bk T): the V tiles take W = beta v from
   T = 0 (E_j -> he), the K tiles W = 0 from the identity's columns (M_j -> hm), i.e. the
   transition tiled over its columns like V.
B. ``chunk_seg_combine``, grid (cdiv(V, BV), N x HV): the chain above, one step per segment,
   writing S_j to hseg [segments, HV, K, V] and the final state to ht.  One small kernel, not a
   host loop (a launch costs several us of host time: docs/decisions/0004-sequence-parallel-segment-pass.md).
C. ``chunk_seg_pass``, grid (cdiv(V, BV), segments x HV): chunk_pass per segment, from hseg[j]
   (templates/chunk_seg_pass.py.j2, chunk_pass's walk over a segment): o and, when asked, the per-chunk
   states.

Precision.  M_j and E_j are accumulated in float32 in registers, with the pass's dot operands
(the input dtype for bf16/fp16 inputs, exact fp32 for fp32 inputs): the same rounding per chunk as
the one pass applies to S.  B's product M_j S_j takes float32 operands: exact (ieee) for fp32 inputs,
tf32 otherwise (10 mantissa bits, finer than the bf16 operands every chunk's dots already take;
M_j is a product of contractions for beta in [0, 2] and unit-norm k, so its error does not grow
along the chain).  A tf32 product costs a few us per segment step where an ieee one
would cost ~tens of us (the 128 x 128 x BV dot off the tensor cores).

The segment schedule: fixed length -- NS = ceil(ceil(T / C) / L) segments per sequence, segment s
is segment s % NS of sequence s // NS (nothing is built or read on the host); varlen -- built from
the host-side offsets (:func:`kdagen.ops.schedule.segment_schedule`) and copied to the device once,
or from device-only offsets on the device over a bound (the surplus segments return at once).
"""
from __future__ import annotations

import torch
import triton

from ..kernels import Launch, dummy_pointer
from .schedule import SCHEDULE, segment_schedule


def _seg_state_launch(built, pass_args: dict, pass_constexprs: dict, *, plan, config, he, hm, seg_indices, NS: int,
                      L: int, segments: int) -> Launch:
    """Launch A over ``segments`` segments of ``L`` chunks (``NS`` per sequence where the call has fixed
    length; ``seg_indices`` where it is packed), from the arguments of the pass it walks like (chunk_pass's, or
    chunk_seg_pass's: the solve's outputs, the schedule, the tiles), into ``he`` and ``hm``."""
    a, k = pass_args, pass_constexprs
    scalar = plan.diag_mode == "scalar"
    rows = dict(k=a["k"], bs=a["bs"]) if scalar else dict(bk=a["bk"])
    args = dict(v=a["v"], beta=a["beta"], **rows, kgl=a["kgl"], gn=a["gn"], he=he, hm=hm, cu_seqlens=a["cu_seqlens"],
                chunk_offsets=a["chunk_offsets"], seg_indices=seg_indices, T=a["T"], NT=a["NT"], NS=NS)
    const = dict(**(dict(H=k["H"]) if scalar else {}), HV=k["HV"], K=k["K"], V=k["V"], BT=k["BT"], BK=k["BK"],
                 BV=k["BV"], SEG_CHUNKS=L, IS_VARLEN=k["IS_VARLEN"], BETA_SIGMOID=k["BETA_SIGMOID"],
                 BETA_SCALE=k["BETA_SCALE"], LOOP_STAGES=config.state_num_stages)
    grid = (triton.cdiv(k["V"], k["BV"]) + triton.cdiv(k["K"], k["BV"]), segments * k["HV"])
    return Launch("chunk_seg_state", built.fn("chunk_seg_state"), grid, args, const, config.state_num_warps, 1)


def segment_launches(built, *, seqlens, dims, plan, config, C: int, bv: int, pass_args: dict,
                     pass_constexprs: dict, flags: dict, initial_state, ht, dev) -> tuple[Launch, Launch, Launch]:
    """Launches A, B and C (module docstring) for the pass :func:`~.chunk_fwd.prepare_chunk_fwd`
    describes by ``pass_args`` / ``pass_constexprs``."""
    B, T, HV, K, V, N = dims.B, dims.T, dims.HV, dims.K, dims.V, dims.N
    L = config.state_segment_chunks
    cu = pass_args["cu_seqlens"] if flags["IS_VARLEN"] else None
    NS_total, NS, seg_indices, seg_offsets = segment_schedule(seqlens, B, T, C, L, dev, cu, built.fns[SCHEDULE])
    dummy = dummy_pointer(dev)
    n = max(NS_total, 1)
    he = torch.empty(n, HV, K, V, dtype=torch.float32, device=dev)
    hm = torch.empty(n, HV, K, K, dtype=torch.float32, device=dev)
    hseg = torch.empty(n, HV, K, V, dtype=torch.float32, device=dev)
    seg_idx = seg_indices if seg_indices is not None else dummy
    seg_state = _seg_state_launch(built, pass_args, pass_constexprs, plan=plan, config=config, he=he, hm=hm,
                                  seg_indices=seg_idx, NS=NS, L=L, segments=NS_total)
    b_args = dict(hm=hm, he=he, hseg=hseg, h0=initial_state if initial_state is not None else dummy,
                  ht=ht if ht is not None else dummy, cu_seqlens=pass_args["cu_seqlens"],
                  seg_offsets=seg_offsets if seg_offsets is not None else dummy, NS=NS)
    b_const = dict(HV=HV, K=K, V=V, BT=C, BK=plan.BK, BV=bv, SEG_CHUNKS=L, USE_H0=initial_state is not None,
                   STORE_HT=ht is not None, STATE_V_FIRST=pass_constexprs["STATE_V_FIRST"],
                   IS_VARLEN=flags["IS_VARLEN"])
    seg_combine = Launch("chunk_seg_combine", built.fns[3], (triton.cdiv(V, bv), N * HV), b_args, b_const,
                         config.state_num_warps, 1)
    # chunk_pass's arguments in chunk_seg_pass's signature's order: hseg for h0 and ht, the segments
    c_args = {}
    for name, a in pass_args.items():
        if name == "h0":
            c_args["hseg"] = hseg
        elif name == "T":
            c_args["seg_indices"] = seg_idx
            c_args["T"] = a
        elif name == "NT":
            c_args.update(NT=a, NS=NS)
        elif name != "ht":
            c_args[name] = a
    c_const = {}
    for name, c in pass_constexprs.items():
        if name == "USE_H0":
            c_const["SEG_CHUNKS"] = L
        elif name != "STORE_HT":
            c_const[name] = c
    seg_pass = Launch("chunk_seg_pass", built.fns[4], (triton.cdiv(V, bv), NS_total * HV), c_args, c_const,
                      config.state_num_warps, 1)
    return seg_state, seg_combine, seg_pass


WHOLE_SEQUENCE = 1 << 24  # SEG_CHUNKS of a segment that is a whole sequence (up to 2^30 tokens at 64-row chunks)


def sequence_transition_launch(built, walk: Launch, seqs: tuple[int, ...] | None, *, plan, config, dev,
                               seqlens: list[int] | None = None):
    """Launch A over the segments of whole sequences, for context parallelism's pieces (:mod:`kdagen.ops.cp`):
    ``(launch, he, hm, groups)`` -- each segment's end state from a zero start ``he`` [S, HV, K, V] and its
    transition ``hm`` [S, HV, K, K] (float32); ``groups`` (n, NS): the segments of each sequence in order
    (:func:`fold_segments` folds them into each sequence's).  The segments are the forward's
    (``config.state_segment_chunks`` chunks: the sequence-parallel pass, chosen for few programs), else whole
    sequences.  ``walk``: the forward's pass (chunk_pass or chunk_seg_pass), whose arguments name the solve's
    outputs and the call's schedule; ``seqs``: the packed call's sequences to cover (in that order; each must
    hold tokens: an empty one's program returns before writing) with ``seqlens`` its host offsets (without
    them, whole sequences), or None for a fixed-length call's every row."""
    a, k = walk.args, walk.constexprs
    HV, K, V, C = k["HV"], k["K"], k["V"], k["BT"]
    varlen = k["IS_VARLEN"]
    if varlen == (seqs is None):
        raise ValueError("sequence_transition_launch: a packed call names its sequences, a fixed-length one none")
    L = config.state_segment_chunks or WHOLE_SEQUENCE
    if varlen:
        if seqlens is None:
            L = WHOLE_SEQUENCE
        counts = [1 if L == WHOLE_SEQUENCE else triton.cdiv(triton.cdiv(seqlens[s + 1] - seqlens[s], C), L)
                  for s in seqs]
        NS = max(counts, default=1)
        # each sequence padded to NS segments: a segment past its sequence's end returns at once, so its rows
        # are set here to the identity's piece (E = 0, M = I), which folding leaves out
        idx = [[s, j] for s in seqs for j in range(NS)]
        seg_idx = torch.tensor(idx, dtype=torch.int32).to(dev)
        n = len(seqs)
    else:
        NS = 1 if L == WHOLE_SEQUENCE else triton.cdiv(a["NT"], L)
        n = a["o"].shape[0]  # the rows
        seg_idx = dummy_pointer(dev)
    he = torch.zeros(max(n * NS, 1), HV, K, V, dtype=torch.float32, device=dev)
    hm = torch.eye(K, dtype=torch.float32, device=dev).repeat(max(n * NS, 1), HV, 1, 1)
    launch = _seg_state_launch(built, a, k, plan=plan, config=config, he=he, hm=hm, seg_indices=seg_idx, NS=NS, L=L,
                               segments=n * NS)
    return launch, he, hm, (n, NS)


def fold_segments(he: torch.Tensor, hm: torch.Tensor, groups: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's (end state from zero, transition) from its segments' (``groups`` = (n, NS): n sequences
    of NS segments each, in order, as :func:`sequence_transition_launch` lays them out): pairs of neighbours
    folded, (M2, E2) after (M1, E1) = (M2 M1, M2 E1 + E2), log2(NS) levels of batched float32 products.
    Returns ``(he [n, HV, K, V], hm [n, HV, K, K])``."""
    n, NS = groups
    E, M = he.view(n, NS, *he.shape[1:]), hm.view(n, NS, *hm.shape[1:])
    while E.shape[1] > 1:
        if E.shape[1] % 2:  # an odd one out goes on unchanged: paired with the identity's piece
            E = torch.cat([E, torch.zeros_like(E[:, :1])], dim=1)
            M = torch.cat([M, torch.eye(M.shape[-1], dtype=M.dtype, device=M.device).expand_as(M[:, :1])], dim=1)
        E1, E2, M1, M2 = E[:, 0::2], E[:, 1::2], M[:, 0::2], M[:, 1::2]
        E, M = torch.matmul(M2, E1) + E2, torch.matmul(M2, M1)
    return E[:, 0], M[:, 0]
