"""Heuristic configs: what the ops run when no tuned winner is cached, and the baseline the
tuner measures its candidates against."""
from __future__ import annotations

from ..codegen.lower import Plan
from ..config import (SEGMENT_MAX_BK, ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig, RecurrentConfig,
                      min_state_block_v)
from .miscompiles import avoid_miscompiles


def default_chunk_config(plan: Plan, shape: dict | None = None) -> ChunkFwdConfig:
    """The inference forward: 64-row chunks of two 32-row halves, the solve on 4 warps with its loads
    issued ahead, a state pass on 32-wide V tiles over 4 warps pipelined 3 deep with v, beta and G_n
    prefetched (docs/decisions/0002-inference-forward-64-row-chunks.md); above K=128 32-row chunks,
    two stages and 8 warps in the solve.  Many short sequences take 32-row chunks without the prefetch
    (docs/decisions/0003-packed-short-sequences-32-row-chunks.md); few long ones the sequence-parallel
    pass on 64-wide tiles (docs/decisions/0004-sequence-parallel-segment-pass.md)."""
    if plan.BK > WIDE_STATE_BK:
        # GLA's heads past 256 (K up to 512: a state row of 512): the pass's [512, BV] float32 state on 16-wide
        # V tiles over 8 warps, its loop not pipelined (sm_90 compile at K=V=512, bf16: 168 registers, no spill,
        # 86 KB shared; two stages 255 registers and 16 B of spill, 32-wide tiles 176 B, 4 warps 296 B).  The
        # solve holds its rows whole ([32, 512] tiles) on 8 warps: 216-308 B of spill a thread (16 warps: as much
        # at 128 registers); a solve that loops over K tiles would not
        return ChunkFwdConfig(chunk_size=32, intra_num_warps=8, state_block_v=min(16, plan.BV), state_num_warps=8,
                              state_num_stages=1, inverse_precision="tf32" if plan.dtype == "float16" else "bf16")
    if plan.BK > 128:
        return ChunkFwdConfig(chunk_size=32, intra_num_warps=8, state_block_v=min(32, plan.BV), state_num_warps=4,
                              state_num_stages=2, inverse_precision="tf32" if plan.dtype == "float16" else "bf16")
    C, bv, prefetch = 64, min(32, plan.BV), True
    if shape and {"N", "HV", "T"} <= set(shape) and _state_programs(plan, shape, 32) >= MANY_PROGRAMS \
            and shape.get("B", 1) * shape["T"] <= SHORT_MEAN_TOKENS * shape["N"]:
        C, prefetch = 32, False
    elif infers_on_32_row_chunks(plan, shape):
        C = 32
    segments = _segments(plan, shape, C, bv)
    if segments:
        bv, prefetch = min(64, plan.BV), False
    return ChunkFwdConfig(chunk_size=C, intra_num_warps=4,
                          state_block_v=bv, state_num_warps=4, state_num_stages=3, state_prefetch=prefetch,
                          inverse_precision="tf32" if plan.dtype == "float16" else "bf16",
                          state_segment_chunks=segments,
                          solve_load_ahead=0 if plan.diag_mode == "scalar" else 2)


def infers_on_32_row_chunks(plan: Plan, shape: dict | None = None) -> bool:
    """Whether a scalar decay's bf16 inference forward (Gated DeltaNet, g given or its in-kernel gate)
    takes 32-row chunks: with many state-pass programs the pass is throughput-bound and the 32-row solve
    is the cheaper (docs/decisions/0005-gdn-inference-32-row-chunks.md).  Other plans: 64 rows."""
    return (plan.decay == "scalar" and plan.dtype == "bfloat16" and plan.BK <= 128 and bool(shape)
            and {"N", "HV"} <= set(shape) and _state_programs(plan, shape, 32) >= SCALAR_DECAY_C32_PROGRAMS)


# A state row wider than this (K > 256: GLA's heads, up to 512) does not fit the state passes' registers on the
# tiles chosen for narrower ones: their [BK, BV] float32 state takes 16-wide V tiles over 8 warps
WIDE_STATE_BK = 256


# infers_on_32_row_chunks: state-pass programs at BV=32 from which 32-row chunks are taken
# (docs/decisions/0005-gdn-inference-32-row-chunks.md)
SCALAR_DECAY_C32_PROGRAMS = 160


# Many short sequences (default_chunk_config): at least this many state-pass programs at BV=32, and
# sequences of at most this many tokens on average (docs/decisions/0003-packed-short-sequences-32-row-chunks.md)
MANY_PROGRAMS = 2048
SHORT_MEAN_TOKENS = 1024


# The sequence-parallel state pass (kdagen/ops/chunk_segments.py): segments of SEGMENT_CHUNKS chunks below
# SEGMENT_PROGRAMS state-pass programs, when the longest sequence holds at least SEGMENT_MIN of them
# (docs/decisions/0004-sequence-parallel-segment-pass.md).
SEGMENT_PROGRAMS = 48
SEGMENT_CHUNKS = 32
SEGMENT_MIN = 4


def _segments(plan: Plan, shape: dict | None, C: int, bv: int) -> int:
    """state_segment_chunks for ``shape`` ({"N", "HV", "T", and "T_max": the longest sequence,
    T when absent}): 0 without a shape, for K > 128 (kdagen.config.SEGMENT_MAX_BK), with
    enough programs, or for short sequences."""
    if not shape or not {"N", "HV", "T"} <= set(shape) or plan.BK > SEGMENT_MAX_BK:
        return 0
    segments_fit = _longest_chunks(shape, C) >= SEGMENT_MIN * SEGMENT_CHUNKS
    return SEGMENT_CHUNKS if _state_programs(plan, shape, bv) < SEGMENT_PROGRAMS and segments_fit else 0


def _state_programs(plan: Plan, shape: dict, bv: int) -> int:
    """The state pass's programs at ``shape`` with V tiles of ``bv``: one per (sequence, value
    head, V tile)."""
    return shape["N"] * shape["HV"] * -(-plan.V // bv)


def _longest_chunks(shape: dict, C: int) -> int:
    """The chunks of ``C`` tokens of the longest sequence ("T_max", else T)."""
    return -(-int(shape.get("T_max", shape["T"])) // C)


def worth_timing(family: str, plan: Plan, config, shape: dict) -> bool:
    """Whether the tuner times ``config`` at ``shape`` ({"N", "HV", "T", optional "T_max"}) at all.
    Only the sequence-parallel state pass is left out: at shapes with at least twice the
    :data:`SEGMENT_PROGRAMS` state-pass programs (at BV=32) under which the heuristic takes it --
    it was slower there -- or with fewer than :data:`SEGMENT_MIN` segments in the longest sequence:
    timed everywhere it doubled a build's state stage (docs/decisions/0004-sequence-parallel-segment-pass.md)."""
    L = getattr(config, "state_segment_chunks", 0)
    if family != "chunk_fwd" or not L:
        return True
    return (_state_programs(plan, shape, 32) < 2 * SEGMENT_PROGRAMS
            and _longest_chunks(shape, config.chunk_size) >= SEGMENT_MIN * L)


# Below about two state-pass programs per SM of a 132-SM GPU the state pass is latency bound: narrower V
# tiles give more programs (docs/decisions/0006-narrow-state-tiles-few-programs.md).
STATE_PROGRAMS_LOW = 256


def _few_state_programs(plan: Plan, shape: dict | None) -> bool | None:
    """Whether a state pass at ``shape`` has fewer than STATE_PROGRAMS_LOW programs on 32-wide V tiles;
    None when the shape does not say (no {"N", "HV"})."""
    if not (shape and "N" in shape and "HV" in shape):
        return None
    return _state_programs(plan, shape, 32) < STATE_PROGRAMS_LOW


def trains_on_64_row_chunks(plan: Plan, shape: dict | None = None) -> bool:
    """Whether the training step runs on 64-row chunks (two 32-row sub-tiles) instead of 32, in bf16 with
    K <= 128 and the backward's folded split: Gated DeltaNet (a scalar decay given as g) at every shape,
    DeltaNet (no decay) with few state programs.  The state passes take half the steps and read and write
    half the per-chunk states; the intra launches cost about the same per row
    (docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md).  Other plans keep 32 (a layer call whose
    gate is launched apart runs the g-given plan's chunks), and so do value heads narrower than the reverse
    state pass's tile on 64-row chunks (:func:`~kdagen.config.min_state_block_v`: V <= 16)."""
    if not (plan.dtype == "bfloat16" and plan.K <= 128 and plan.has_rank1 and plan.structure != "dplr"
            and ChunkBwdConfig.fold_candidate(plan) and plan.BV >= min_state_block_v(64)):
        return False
    return plan.decay == "scalar" or _few_state_programs(plan, shape) is True


def checked_like_bounded(plan: Plan) -> bool:
    """Whether a plan without a gate bound takes the bounded plan's tiles: its diagonal sub-tiles are
    checked in the kernel (a per-channel decay, bf16/fp32 factors: codegen.render diag_checked) and
    their element-wise fallback runs one column at a time on the fast path's [BC, BK] tiles, so the
    narrower tiles the [BC, BC, BK] element-wise products needed are not.  With a rank-1 part (KDA,
    general DPLR) only; GLA keeps its 32-wide intra tile (docs/decisions/0012-bounded-tiles-for-checked-diagonal.md)."""
    return (plan.diag_mode == "elementwise" and plan.decay == "channel" and plan.dtype != "float16"
            and plan.has_rank1)


def checks_gate_bound(plan: Plan) -> bool:
    """The heuristic configs' check_gate_bound: a promised bound checked by repair launches; general DPLR
    checks in its kernels, dearer, so there the promise is trusted
    (docs/decisions/0013-gate-bound-checked-by-repair-launches.md)."""
    return plan.structure != "dplr"


def default_train_config(plan: Plan, shape: dict | None = None) -> ChunkTrainConfig:
    """The forward of a training call.  ``shape``: optional {"N": sequences, "HV": value heads}."""
    # C=32 with the whole K row in one intra tile and a 32-wide V tile on 2 warps in the state
    # pass: the fastest stage-by-stage combination of a tuning sweep at (1, 8192, 96, 128).
    sub = 16
    check = checks_gate_bound(plan)
    if plan.diag_mode == "elementwise" and not checked_like_bounded(plan):
        bk = 32  # the element-wise diagonal holds a [BC, BC, BK] tile
    elif plan.diag_mode == "factorised" and check and not plan.gate_in_kernel and not plan.has_rank1:
        # GLA with a promised bound, checked: its 32-wide tile as without a bound
        # (docs/decisions/0013-gate-bound-checked-by-repair-launches.md)
        bk = min(32, plan.BK)
    else:
        bk = min(128, plan.BK)
    bv, warps = min(32, plan.BV), (2 if plan.K <= 128 else 4)
    if plan.BV >= 32 and _few_state_programs(plan, shape):
        bv, warps = 16, 4
    # The state pass's loop pipelined three deep (half precision, K <= 128); G_n is always loaded a chunk
    # ahead, state_prefetch is U's (docs/decisions/0007-training-state-pass-three-stages.md).
    half = plan.dtype in ("bfloat16", "float16")
    stages = 3 if half and plan.K <= 128 else 2
    # General DPLR's state pass holds twice the tiles: two stages on 32-wide tiles
    # (docs/decisions/0007-training-state-pass-three-stages.md)
    if plan.structure == "dplr" and bv >= 32:
        stages = 2
    # The intra launch's row-block loads issued together at the top (intra_load_ahead), half precision
    # (docs/decisions/0008-training-intra-loads-ahead.md).
    # The output out of the state pass (split_output, FLA's split), half precision, K <= 128, not general
    # DPLR; 64-wide pass tiles with many programs (docs/decisions/0009-split-output-launch.md).
    out = {}
    if half and plan.K <= 128 and plan.structure != "dplr":
        many = _few_state_programs(plan, shape) is False
        bv, warps, stages = min(64 if many else 32, plan.BV), 4, 3
        out = dict(split_output=True, out_block_v=min(128, plan.BV), out_block_k=min(64, plan.BK), out_num_warps=4,
                   out_num_stages=2)
    # A per-channel in-kernel gate (KDA's layer call) in launches of its own (gate_launch), half precision
    # (docs/decisions/0010-gate-launched-apart.md).
    if half and ChunkTrainConfig.gate_launchable(plan):
        out["gate_launch"] = True
    if plan.BK > WIDE_STATE_BK:
        # the [512, BV] state on 16-wide V tiles over 8 warps, its loop not pipelined (sm_90 compile at K=V=512,
        # bf16: 175 registers, no spill, 86 KB shared; two stages 255 registers, and 24 B of spill in fp16, whose
        # per-chunk states are float32; 4 warps spill 252 B)
        bv, warps, stages = min(16, plan.BV), 8, 1
    chunk = 32
    if trains_on_64_row_chunks(plan, shape):
        chunk, sub = 64, 32
    return ChunkTrainConfig(
        chunk_size=chunk, sub_chunk=sub, intra_block_k=bk, intra_num_warps=4, intra_num_stages=2,
        state_block_v=bv, state_num_warps=warps, state_num_stages=stages, intra_load_ahead=half,
        check_gate_bound=check, inverse_precision=_train_inverse_precision(plan),
        diag_precision=_train_diag_precision(plan), **out,
    )


def _train_inverse_precision(plan: Plan) -> str:
    """The training launches' triangular inverse (the forward's intra launch, the backward's wy
    launch: (I + A_kk)^-1 and its gradient) on tf32 dots for half-precision plans, fp32 FMAs ("ieee")
    otherwise.  Its result is used in half precision (T is kept and read as the input dtype; the
    gradient tiles are rounded to it for the next dots), so tf32's 10-bit operands are below that
    rounding (docs/decisions/0014-training-inverse-tf32.md).  General DPLR (its own intra templates,
    unmeasured) keeps fp32."""
    return "tf32" if plan.dtype in ("bfloat16", "float16") and plan.structure != "dplr" else "ieee"


def _train_diag_precision(plan: Plan) -> str:
    """The training launches' factorised diagonal sub-tiles (the forward's intra launch and the intra
    gradients): fp32 operands on tf32 dots ("tf32") for bf16 plans whose diagonal is factorised (a per-channel
    gate with a bound, promised or the in-kernel gate's) with a rank-1 part, the input dtype otherwise
    (docs/decisions/0015-diag-precision-tf32.md)."""
    factorised = plan.decay == "channel" and plan.diag_mode == "factorised" and plan.structure != "dplr"
    return "tf32" if plan.dtype == "bfloat16" and factorised and plan.has_rank1 else "input"


# A half-width (bf16/fp16) pool: from PERSISTENT_ITEMS items on, persistent programs whose item loop Triton
# pipelines, with the loaded-state readout (docs/decisions/0021-decode-half-pool-persistent.md).
PERSISTENT_ITEMS = 4096


def default_recurrent_config(plan: Plan, state_dtype: str = "float32", shape: dict | None = None) -> RecurrentConfig:
    """``state_dtype``: of the state the call reads and writes (its decode pool); ``shape``:
    optional {"N": sequences, "HV": value heads, "state_v_first": the state laid out [.., V, K], "P": the
    state pool's slots (0 without a pool), "B", "T": the call's batch and tokens per batch row}.
    A float32 pool moves fastest with
    BV=64 on 2 warps; a half-width pool, half the bytes per program, with BV=32 on one warp and
    the loaded-state readout for a few items, and pipelined persistent programs (above) for many;
    a float32 state with few (sequence, head) pairs, narrower tiles on one warp (below;
    docs/decisions/0021-decode-half-pool-persistent.md, 0022-decode-fp32-tiles-by-pairs.md).
    One warp at BV >= 64 spills registers and collapses."""
    shape = shape or {}
    if plan.K > 128:
        return RecurrentConfig(block_v=min(32, plan.BV), num_warps=4, num_stages=1)
    if state_dtype in ("bfloat16", "float16"):
        items = shape.get("N", 0) * shape.get("HV", 0) * -(-plan.V // min(64, plan.BV))
        if items >= PERSISTENT_ITEMS:
            return RecurrentConfig(block_v=min(64, plan.BV), num_warps=2, num_stages=2, readout="loaded",
                                   programs_per_sm=16 if items >= 4 * PERSISTENT_ITEMS else 4)
        return RecurrentConfig(block_v=min(32, plan.BV), num_warps=1, num_stages=1, readout="loaded")
    # A float32 state with few (sequence, head) pairs: a decode step is one short program per V tile,
    # latency bound, so narrower tiles (more programs, fewer registers each) finish first
    # (docs/decisions/0022-decode-fp32-tiles-by-pairs.md).
    pairs = shape.get("N", 0) * shape.get("HV", 0)
    kda_like = plan.decay == "channel" and plan.has_rank1 and plan.structure != "dplr"
    kda_v_first = kda_like and shape.get("state_v_first")
    if kda_v_first and pairs and pairs <= SOME_PAIRS:
        # a [V, K] state (state_v_first), where a V tile of BV rows is one contiguous block: narrower tiles
        # than on [K, V] (docs/decisions/0025-decode-vk-pool.md)
        return RecurrentConfig(block_v=min(4 if pairs <= FEW_PAIRS else 8, plan.BV), num_warps=1, num_stages=1,
                               readout="loaded")
    decode = shape.get("B", 0) * shape.get("T", 0) <= shape.get("N", 0)
    if (kda_v_first and pairs > SOME_PAIRS and shape.get("P", 0) and decode
            and slot_grid(shape.get("N", 0), shape.get("HV", 0), shape.get("P", 0))):
        # KDA's fp32 pool laid out [V, K] with many pairs, a decode step's call (no more tokens than sequences), on
        # the slot grid: 8-row tiles (one contiguous 4 KB block of whole K columns) on one warp, with the lean body
        # where the tile divides K and V (a slot's program holds the step alone; row 0's programs run padding,
        # other lengths and shared slots).  A call with more tokens than sequences is not a decode step: row 0
        # would run its longer items one at a time, so it takes the choices below
        # (docs/decisions/0026-lean-decode-step-vk-fp32.md).
        bv = min(8, plan.BV)
        lean = plan.BK == plan.K and plan.V % bv == 0
        return RecurrentConfig(block_v=bv, num_warps=1, num_stages=1, readout="loaded", lean=lean)
    if pairs and pairs <= FEW_PAIRS:  # (DPLR measured with the updated readout)
        return RecurrentConfig(block_v=min(16, plan.BV), num_warps=1, num_stages=1,
                               readout="updated" if plan.structure == "dplr" else "loaded")
    if plan.structure == "dplr" and pairs:
        return RecurrentConfig(block_v=min(32, plan.BV), num_warps=2, num_stages=1)
    if pairs and pairs <= SOME_PAIRS:
        return RecurrentConfig(block_v=min(32, plan.BV), num_warps=1, num_stages=1, readout="loaded")
    # Many pairs: KDA's (a per-channel decay and the delta rule) with the loaded readout; the other structures
    # keep the updated readout they were measured with (docs/decisions/0023-decode-loaded-readout.md).
    return RecurrentConfig(block_v=min(64, plan.BV), num_warps=2, num_stages=1,
                           readout="loaded" if kda_like else "updated")


def slot_grid(n_seqs: int, n_heads: int, n_slots: int) -> bool:
    """Whether a decode step on a state pool puts its programs over the pool's slots rather than over
    the batch (templates/recurrent.py.j2's SLOT_GRID; one-item programs only): each program then
    finds its sequence by a scan of the slot indices, and the state streams in address order
    whatever order the batch holds its slots in.  Taken with many (sequence, value head) pairs, at
    most SLOT_GRID_MAX_SEQS sequences (the scan's width) and a pool of at most SLOT_GRID_MAX_RATIO
    slots per sequence (a row per slot: the unused ones are programs that only scan)."""
    return (n_seqs * n_heads >= SLOT_GRID_MIN_PAIRS and n_seqs <= SLOT_GRID_MAX_SEQS
            and n_slots <= SLOT_GRID_MAX_RATIO * n_seqs)


# The slot grid's thresholds (docs/decisions/0024-decode-slot-grid-and-pdl.md).
SLOT_GRID_MIN_PAIRS = 4096
SLOT_GRID_MAX_SEQS = 1024
SLOT_GRID_MAX_RATIO = 2


# float32 decode states (default_recurrent_config): (sequence, value head) pairs up to which the
# 16-wide tile on one warp is taken (B=1 at H=32: 32 pairs), and the 32-wide one (B=16: 512)
# (docs/decisions/0022-decode-fp32-tiles-by-pairs.md)
FEW_PAIRS = 64
SOME_PAIRS = 1024


def default_chunk_bwd_config(plan: Plan, shape: dict | None = None, chunking: tuple[int, int] = (32, 16)
                             ) -> ChunkBwdConfig:
    """The backward's heuristic config; ``shape`` (optional {"N", "HV"}) picks the reverse state
    pass's V tile by its program count; ``chunking``: the training forward's (C, BC)."""
    # The reverse state pass holds only dS [K, BV] (fp32) and does three dots per chunk; the
    # chunk-parallel launch holds three [C, K] fp32 accumulators: half precision with K <= 128, dqkw on
    # [128, 64] tiles of (K, V), the intra gradients on 4 warps (docs/decisions/0016-backward-tiles.md).
    # fp16 keeps the per-chunk states in fp32 (its range is 6.5e4).
    # Recompute mode (chunk_bwd_rerun, one warp) and the intra gradients as two launches (chunk_bwd_wy, then
    # dq, dk, dg per K tile) where the chunk holds two sub-tiles (docs/decisions/0017-recompute-mode-split-intra.md).
    # The reverse state pass loads G_n and A_qk a chunk ahead and is pipelined three deep; 32-wide V tiles
    # with few programs, 64-wide with many (docs/decisions/0018-reverse-state-pass.md).
    half = plan.dtype in ("bfloat16", "float16") and plan.K <= 128
    state_bv, dqkw_bk, dqkw_bv = min(32, plan.BV), min(64, plan.BK), min(32, plan.BV)
    state = dict(state_num_stages=2)
    intra = dict(intra_block_k=min(32, plan.BK), intra_block_v=min(32, plan.BV), intra_num_warps=4)
    rerun_warps, state_warps = 4, 4
    if half:
        state = dict(state_num_stages=3, state_prefetch=True)
        dqkw_bk, dqkw_bv = min(128, plan.BK), min(64, plan.BV)
        few = _few_state_programs(plan, shape)
        if few is not None:
            state_bv = min(32 if few else 64, plan.BV)
            if few and chunking[0] == 32:  # four stages with few programs (docs/decisions/0018-reverse-state-pass.md);
                # on 64-row chunks four stages exceed shared memory (248 KB at BV=32)
                state["state_num_stages"] = 4
            if few is False and chunking[0] == 64 and trains_on_64_row_chunks(plan, shape):
                # Gated DeltaNet's 64-row chunks with many programs: the reverse pass on 8 warps (64-wide tiles on
                # 4 spill; docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md)
                state_warps = 8
        if chunking[0] == 2 * chunking[1]:
            intra.update(intra_split=True, intra_block_v=min(64, plan.BV), intra_num_warps=2)
            if plan.diag_mode == "elementwise" and plan.has_rank1 and not checked_like_bounded(plan):
                # element-wise diagonal tiles (a per-channel gate without a bound, whose checked
                # diagonal keeps them as the fallback, or fp16, whose factors cannot hold a bound's
                # span): the intra gradients spill 10 KB on 2 warps (584 B / 1 KB on 4, bf16 / fp16)
                # (docs/decisions/0019-elementwise-diagonal-backward-4-warps.md)
                intra["intra_num_warps"] = 4
            if ChunkBwdConfig.fold_candidate(plan) and plan.has_rank1:
                # no decay (DeltaNet): the split's second launch folded into dqkw and the wy launch
                # (ChunkBwdConfig.folds_intra), the wy launch's K loop on 64-wide tiles; a scalar decay given as g
                # (Gated DeltaNet) folds the same way (docs/decisions/0020-intra-backward-folded.md)
                intra.update(intra_fold=True, intra_block_k=min(64, plan.BK))
            # the re-run on one warp (docs/decisions/0017-recompute-mode-split-intra.md)
            rerun_warps = 1
    if plan.BK > WIDE_STATE_BK:
        # dS [512, BV] on 16-wide V tiles over 8 warps, its loop not pipelined (sm_90 compile at K=V=512, bf16: 174
        # registers, no spill, 86 KB shared; two stages 255 registers, and 48 B of spill in fp16, whose per-chunk
        # states are float32; 32-wide tiles on 4 warps spill 872 B)
        state_bv, state_warps, state["state_num_stages"] = min(16, plan.BV), 8, 1
    # 64-row chunks: the reverse pass's 16-wide tile gave wrong gradients (docs/decisions/0028-reverse-pass-min-tile.md)
    state_bv = max(state_bv, min_state_block_v(chunking[0]))
    return ChunkBwdConfig(
        chunk_size=chunking[0], sub_chunk=chunking[1], state_block_v=state_bv, state_num_warps=state_warps, **state,
        dqkw_block_k=dqkw_bk, dqkw_block_v=dqkw_bv, dqkw_num_warps=4, dqkw_num_stages=2,
        intra_num_stages=2, rerun_block_k=min(64, plan.BK), rerun_num_warps=rerun_warps, **intra,
        state_dtype="fp32" if plan.dtype == "float16" else "input",
        check_gate_bound=checks_gate_bound(plan), inverse_precision=_train_inverse_precision(plan),
        diag_precision=_train_diag_precision(plan),
    )


def default_config(family: str, plan: Plan, shape: dict | None = None,
                   train_config: ChunkTrainConfig | None = None, state_dtype: str = "float32"):
    """The heuristic config of a family at a call's ``shape`` ({"N", "HV", ...}, optional); the
    backward's takes the chunk lengths of ``train_config`` (default: the training forward's
    heuristic); the recurrent form's depends on the ``state_dtype`` of its pool."""
    if family == "chunk_fwd":
        return default_chunk_config(plan, shape)
    if family == "chunk_train":
        return avoid_miscompiles(family, plan, default_train_config(plan, shape))
    if family == "chunk_bwd":
        fwd = train_config or default_train_config(plan, shape)
        return avoid_miscompiles(family, plan, default_chunk_bwd_config(plan, shape, (fwd.chunk_size, fwd.sub_chunk)))
    if family == "recurrent":
        return default_recurrent_config(plan, state_dtype, shape)
    raise ValueError(f"unknown kernel family {family!r}")
