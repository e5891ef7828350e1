"""Heuristic configs: what the ops run when no tuned winner is cached, and the baseline the
tuner measures its candidates against."""
from __future__ import annotations

from ..codegen.lower import Plan
from ..config import (SEGMENT_MAX_BK, ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig, RecurrentConfig,
                      min_state_block_v)
from .miscompiles import avoid_miscompiles


def default_chunk_config(plan: Plan, shape: dict | None = None) -> ChunkFwdConfig:
    """The inference forward.  On the H200 (bf16, K=V=128, bench/RESULTS.md, runs 23-26): chunks of
    64 rows built from two 32-row halves, the solve on 4 warps, and a state pass with 32-wide V
    tiles on 4 warps, pipelined 3 deep with v, beta and G_n prefetched, were the fastest
    measured at (1, 8192, 96), (2, 16384, 16), (4, 4096, 32) and (8, 1024, 8, K=V=64); the
    64-row state pass takes half the sequential steps of a 32-row one (0.53 against 0.81 ms at
    (1, 8192, 96)).  Above K=128 a row of the state pass's tiles is twice as wide: 32-row
    chunks, two pipeline stages (their shared memory) and 8 warps in the solve.

    The solve issues each half's loads together and the second half's before the first half's
    inverse (``solve_load_ahead=2``): 0.966 / 0.660 / 0.660 ms against 1.073 / 0.708 / 0.708 ms
    with the loads where they are read, at the three shapes above (run 50).  With it, the KDA
    layer's call (raw q/k with the l2-norm, the raw gate with A_log and dt_bias, the raw beta, all
    in the kernel) also takes 64-row chunks: 1.753 / 1.184 / 1.185 ms against 32-row chunks'
    1.792 / 1.310 / 1.127 ms (without the early loads, 32-row chunks had won; run 34).

    Many short sequences (a packed batch: many state-pass programs, each walking few chunks) take
    32-row chunks: fewer padded rows in each sequence's last chunk and a solve with no coupling of
    halves, while the pass's extra steps are few.  64 sequences of 512 tokens on average, H=32:
    solve 1.221 + pass 1.067 ms against 1.383 + 0.992 with 64-row chunks and 64-wide V tiles
    (the best of those) and 1.383 + 1.113 at BV=32 (runs 50 and 52).  Their pass does not
    prefetch the next chunk's v, beta and G_n by hand: 0.965 against 1.067 ms (run 58; at 64-row
    chunks the prefetch wins, 0.533 against 0.805 ms at (1, 8192, 96)).

    The sequence-parallel pass (few long sequences, :func:`_segments`) takes 64-wide V tiles
    without the prefetch: (1, 65536, 8) 1.474 against 1.573 ms with 32-wide ones (run 58)."""
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
    takes 32-row chunks: with more state-pass programs than one per SM the pass is throughput-bound, and
    the 32-row solve costs 37% less than the 64-row one (its halves are not coupled) while the pass costs
    ~20% more.  H200, bf16, K=V=128, same process (bench/RESULTS.md, runs 147-149; state programs at
    BV=32 in brackets): (2, 16384, 16) [128] 0.750 ms at 64 rows against 0.920 at 32; (1, 8192, 48) [192]
    0.663 against 0.646; (1, 8192, 64) [256] 0.787 / 0.740; (4, 4096, 32) [512] 0.766 / 0.730;
    (1, 8192, 96) [384] 1.194 / 1.164; (2, 8192, 96) [768] 2.359 / 2.107; (1, 16384, 192) [768] 4.744 /
    4.226.  KDA (a per-channel decay), DeltaNet, fp16 and fp32: unmeasured, 64 rows."""
    return (plan.decay == "scalar" and plan.dtype == "bfloat16" and plan.BK <= 128 and bool(shape)
            and {"N", "HV"} <= set(shape) and _state_programs(plan, shape, 32) >= SCALAR_DECAY_C32_PROGRAMS)


# A state row wider than this (K > 256: GLA's heads, up to 512) does not fit the state passes' registers on the
# tiles chosen for narrower ones: their [BK, BV] float32 state takes 16-wide V tiles over 8 warps
WIDE_STATE_BK = 256


# infers_on_32_row_chunks: state-pass programs at BV=32 from which 32-row chunks are taken (between 128,
# where 64 rows won by 23%, and 192, where 32 rows won by 2.6%; a 132-SM GPU)
SCALAR_DECAY_C32_PROGRAMS = 160


# Many short sequences (default_chunk_config): at least this many state-pass programs at BV=32
# (16 per SM of a 132-SM GPU), and sequences of at most this many tokens on average
MANY_PROGRAMS = 2048
SHORT_MEAN_TOKENS = 1024


# The sequence-parallel state pass (kdagen/ops/chunk_segments.py): with few state-pass programs
# each walks all chunks of a long sequence alone.  Measured on the H200 (bench/RESULTS.md, run 46,
# bf16, K=V=128, forward op): (1, 65536, 8, 128) -- 32 programs at BV=32 -- 2.03 ms in one pass
# (1.88 at BV=16), 1.79 ms with segments of 16 chunks and 1.65 ms with 32; with 64 programs
# (1, 32768, 16, 128) segments are slower (1.73 against 1.40 ms), and with 128 (2, 16384, 16,
# 128) too (1.62 against 1.06).  So: segments of SEGMENT_CHUNKS chunks below SEGMENT_PROGRAMS
# programs, when the longest sequence holds at least SEGMENT_MIN of them.
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
    it was slower at 64 and 128 programs (run 46) -- or with fewer than :data:`SEGMENT_MIN`
    segments in the longest sequence.  Left in, it doubled the forward's state stage at every
    shape (96 candidates, ~75 s of a build's time per shape on the H200, run 60)."""
    L = getattr(config, "state_segment_chunks", 0)
    if family != "chunk_fwd" or not L:
        return True
    return (_state_programs(plan, shape, 32) < 2 * SEGMENT_PROGRAMS
            and _longest_chunks(shape, config.chunk_size) >= SEGMENT_MIN * L)


# Below about two state-pass programs per SM of a 132-SM GPU the state pass is latency bound
# (each program walks all chunks of its sequence): narrower V tiles give more programs.  On the
# H200 at C=32, (2, 16384, 16, 128) -- 128 programs at BV=32 -- takes 1.09 ms at BV=16 on 4 warps
# against 1.27 ms at BV=32 on 2; with 384 programs, (1, 8192, 96, 128), BV=16 is slower (1.62 vs
# 0.85 ms) (bench/RESULTS.md, run 2).
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
    half the per-chunk states; the intra launches cost about the same per row.  H200, bf16, K=V=128, same
    process as FLA 0.6.0 (bench/RESULTS.md, runs 135-142): GDN (2, 16384, 16) 3.880 -> 3.403 ms (FLA 3.644),
    (1, 8192, 96) 5.299 -> 5.009 ms with the reverse pass on 8 warps (FLA 5.287), bf16 errors against
    float64 the same or lower (o 3.32 -> 3.09e-3, dg 2.86 -> 2.47e-3); DeltaNet (2, 16384, 16) 2.989 ->
    2.914 ms (FLA 3.016), but (1, 8192, 96) 4.196 -> 4.336-4.514 (its errors 1-3% higher at 64 rows).
    fp16 (per-chunk states in fp32), fp32, KDA and the in-kernel gates' plans: unmeasured at 64 rows in
    this design; they keep 32 (a layer call whose gate is launched apart runs the g-given plan's chunks)."""
    if not (plan.dtype == "bfloat16" and plan.K <= 128 and plan.has_rank1 and plan.structure != "dplr"
            and ChunkBwdConfig.fold_candidate(plan)):
        return False
    return plan.decay == "scalar" or _few_state_programs(plan, shape) is True


def checked_like_bounded(plan: Plan) -> bool:
    """Whether a plan without a gate bound takes the bounded plan's tiles: its diagonal sub-tiles are
    checked in the kernel (a per-channel decay, bf16/fp32 factors: codegen.render diag_checked) and
    their element-wise fallback runs one column at a time on the fast path's [BC, BK] tiles, so the
    narrower tiles the [BC, BC, BK] element-wise products needed are not.  With a rank-1 part (KDA,
    general DPLR) the bounded tiles were faster on the H200: KDA 11.06 -> 9.91 ms and 8.07 -> 7.30 ms,
    DPLR 18.41 -> 17.58 and 11.56 -> 11.34 at (1, 8192, 96, 128) / (2, 16384, 16, 128); GLA (no rank-1
    part) kept its 32-wide intra tile, 6.65 against 6.82 ms (bench/RESULTS.md, run 86)."""
    return (plan.diag_mode == "elementwise" and plan.decay == "channel" and plan.dtype != "float16"
            and plan.has_rank1)


def checks_gate_bound(plan: Plan) -> bool:
    """The heuristic configs' check_gate_bound: a promised bound checked by repair launches (KDA's
    branch: 0.2-0.8% of the bf16 step, bench/RESULTS.md runs 91-92); general DPLR checks in its kernels
    (5-7%, run 86), so there the promise is trusted."""
    return plan.structure != "dplr"


def default_train_config(plan: Plan, shape: dict | None = None) -> ChunkTrainConfig:
    """The forward of a training call.  ``shape``: optional {"N": sequences, "HV": value heads}."""
    # C=32 with the whole K row in one intra tile and a 32-wide V tile on 2 warps in the state
    # pass: the fastest stage-by-stage combination of the H200 sweep at (1, 8192, 96, 128)
    # (intra 1.52 ms, state 0.86 ms; bench/RESULTS.md).
    sub = 16
    check = checks_gate_bound(plan)
    if plan.diag_mode == "elementwise" and not checked_like_bounded(plan):
        bk = 32  # the element-wise diagonal holds a [BC, BC, BK] tile
    elif plan.diag_mode == "factorised" and check and not plan.gate_in_kernel and not plan.has_rank1:
        # GLA with a promised bound, checked: its 32-wide tile as without a bound (run 91: 6.70 ms checked
        # on the 128-wide tile, 6.56 on the 32-wide without a bound, 6.49 trusted on the 128-wide)
        bk = min(32, plan.BK)
    else:
        bk = min(128, plan.BK)
    bv, warps = min(32, plan.BV), (2 if plan.K <= 128 else 4)
    if plan.BV >= 32 and _few_state_programs(plan, shape):
        bv, warps = 16, 4
    # The state pass's loop pipelined three deep (half precision, K <= 128): 1.168 -> 1.070 ms at
    # (1, 8192, 96, 128) and 1.235 -> 1.020 ms at (2, 16384, 16, 128); loading U and G_n a chunk ahead
    # by hand (state_prefetch) gains alone 0 / 7% and loses with three stages (1.392 / 1.046 ms)
    # (bench/RESULTS.md, run 76).  (G_n alone is now always loaded a chunk ahead; state_prefetch is U's.)
    half = plan.dtype in ("bfloat16", "float16")
    stages = 3 if half and plan.K <= 128 else 2
    # General DPLR's state pass holds twice the tiles (U and V, two sets of products): three stages on the
    # 32-wide tile took its forward from 3.83 to 5.54 ms at (1, 8192, 96, 128) (2 stages: 3.83); on the
    # 16-wide tile of few programs they still gain (2.52 against 2.77 ms at (2, 16384, 16, 128); run 89)
    if plan.structure == "dplr" and bv >= 32:
        stages = 2
    # The intra launch's row-block loads issued together at the top (intra_load_ahead), half precision
    # (they wait in the loaded dtype): 1.913 -> 1.879 ms at (1, 8192, 96, 128) and 1.284 -> 1.241 ms at
    # (2, 16384, 16, 128), bit-identical outputs (bench/RESULTS.md, run 83; fp32 inputs unmeasured)
    # The output out of the state pass (split_output, FLA's split): the pass without qg, A_qk and its two
    # output products is 2.3x faster, and the chunk-parallel output launch costs less than it saves.  bf16,
    # K=V=128, C=32, H200 (bench/RESULTS.md, run 97), ms: DeltaNet at (2, 16384, 16) fused pass 1.001 ->
    # states-only 0.437 (32-wide V tiles, 4 warps, 3 stages; 16 / 4 / 3: 0.568) + output 0.243 (BV=128,
    # BK=64); at (1, 8192, 96) 1.141 -> 0.590 + 0.361; KDA at (2, 16384, 16) 1.026 -> 0.608 + 0.242.
    # Half precision, K <= 128, every member but general DPLR (its pass holds the raw values' terms too:
    # unmeasured); fp32 unmeasured.  Since G_n is loaded a chunk ahead (run 100), 64-wide tiles win with
    # many programs: KDA at (1, 8192, 96) 0.580 -> 0.555 ms (run 102; run 100: 0.575 -> 0.555); with few,
    # 32 stays (0.447 against 0.609).
    out = {}
    if half and plan.K <= 128 and plan.structure != "dplr":
        many = _few_state_programs(plan, shape) is False
        bv, warps, stages = min(64 if many else 32, plan.BV), 4, 3
        out = dict(split_output=True, out_block_v=min(128, plan.BV), out_block_k=min(64, plan.BK), out_num_warps=4,
                   out_num_stages=2)
    # A per-channel in-kernel gate (KDA's layer call) in launches of its own (gate_launch): g once in fp32,
    # the plain plan's launches on it, dz / dA_log / ddt_bias from dg.  bf16, K=V=128, H200 (bench/RESULTS.md,
    # run 117, same process as FLA): (2, 16384, 16) 6.981 -> 6.674 ms, (1, 8192, 96) 10.096 -> 9.640 ms; peak
    # 3.53 -> 3.75 and 5.28 -> 5.63 GiB (FLA 3.77 / 5.66); every gradient bit-identical but ddt_bias (1e-7,
    # its sum's order).  Half precision (fp32 unmeasured).
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
    rounding: run 106 (H200, bf16, K=V=128) measured every bf16 gradient error against float64
    unchanged to three digits, and the step 8.229 -> 8.034 ms at (1, 8192, 96, 128) (the forward's
    FMA dots: 448 of its intra launch's 5,248 instructions per warp; the wy launch's 1,418 of 3,736).
    General DPLR (its own intra templates, unmeasured) keeps fp32."""
    return "tf32" if plan.dtype in ("bfloat16", "float16") and plan.structure != "dplr" else "ieee"


def _train_diag_precision(plan: Plan) -> str:
    """The training launches' factorised diagonal sub-tiles (the forward's intra launch and the intra
    gradients): fp32 operands on tf32 dots ("tf32") for bf16 plans whose diagonal is factorised (a per-channel
    gate with a bound, promised or the in-kernel gate's), the input dtype otherwise.  Issue 17's error bar:
    with bf16 factors of up to exp(|g_min| BC) dv, dbeta and dg were 1.17x, 1.11x and 1.41x FLA's (run 107);
    with fp32 factors every gradient is at or below 1.09x FLA's at three input seeds (run 108: dg 1.06 / 1.00
    / 1.07x, dh0 1.09 / 0.89 / 1.09x, dq, dk, dv, dbeta <= 1.02x), for 1.42 -> 1.33x and 1.38 -> 1.30x FLA's
    speed in the training step and 1.34 -> 1.26x in the layer call at (1, 8192, 96, 128) (bench/RESULTS.md,
    runs 107-108).  Unbounded gates (element-wise diagonal, checked), fp16 (its factors cannot hold a span:
    element-wise), GLA (no rank-1 part) and general DPLR (its own templates) are unmeasured and keep the input
    dtype."""
    factorised = plan.decay == "channel" and plan.diag_mode == "factorised" and plan.structure != "dplr"
    return "tf32" if plan.dtype == "bfloat16" and factorised and plan.has_rank1 else "input"


# A half-width (bf16/fp16) pool moves half the bytes per program for the same work: with one
# item per program it stays latency bound (run 30: 60% of copy at best).  Persistent programs
# whose item loop Triton pipelines (num_stages 2: the next item's state tile loaded
# asynchronously into shared memory, not held in registers) and the readout from the loaded
# state: at B=256, H=32, K=V=128 on the H200, BV=64 on 2 warps, 163.5 us (77% of copy) with 4
# programs per SM and 160.1 with 16 (about 8 items each; at B=64, 4,096 items, 4 per SM is the
# faster: 43.4 against 45.6 us), against 181.5 for the hand prefetch into registers (BV=64, 4 warps,
# 2 per SM) and 192.3 for one item per program (bench/RESULTS.md, runs 44-46 and 64-67); with few items (B=16: 1,024)
# the one-item grid on one warp stays close to the best (10.6 against 10.9 us).  A float32 pool
# is at 93% of copy with one item per program, BV=64 on 2 warps (271.0 us at B=256, 16.1 at B=16,
# against 274.2 / 17.5 on 4 warps); pipelining it loses (293.6 us).
PERSISTENT_ITEMS = 4096


def default_recurrent_config(plan: Plan, state_dtype: str = "float32", shape: dict | None = None) -> RecurrentConfig:
    """``state_dtype``: of the state the call reads and writes (its decode pool); ``shape``:
    optional {"N": sequences, "HV": value heads, "state_v_first": the state laid out [.., V, K], "P": the
    state pool's slots (0 without a pool), "B", "T": the call's batch and tokens per batch row}.
    K=V=128 on the H200 (bench/RESULTS.md, runs 30, 44-46 and 64-65, a packed decode step from
    graph replay): a float32 pool moves fastest with
    BV=64 on 2 warps; a half-width pool, half the bytes per program, with BV=32 on one warp and
    the loaded-state readout for a few items, and pipelined persistent programs (above) for many;
    a float32 state with few (sequence, head) pairs, narrower tiles on one warp (below; runs 93-94).
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
    # latency bound, so narrower tiles (more programs, fewer registers each) finish first.  H=32, K=V=128,
    # one token per sequence, CUDA graph of 10 steps (bench/RESULTS.md, runs 93-94): KDA's pool at B=1
    # 4.0 us on the 64-wide tile / 2 warps, 3.5 on 16 / 1 warp (loaded readout); at B=16 16.1-16.6 against
    # 15.3 on 32 / 1 warp; general DPLR (a fresh final state) at B=1 4.12 against 3.41 us on 16 / 1 warp
    # (FLA 3.73), at B=256 295.5 against 275.0 on 32 / 2 warps (FLA 479.9).  KDA at B=256 keeps 64 / 2.
    pairs = shape.get("N", 0) * shape.get("HV", 0)
    kda_like = plan.decay == "channel" and plan.has_rank1 and plan.structure != "dplr"
    kda_v_first = kda_like and shape.get("state_v_first")
    if kda_v_first and pairs and pairs <= SOME_PAIRS:
        # a [V, K] state (state_v_first), where a V tile of BV rows is one contiguous block: narrower tiles
        # than on [K, V] (bench/RESULTS.md, run 169, KDA, H=32, K=V=128, packed, graph replay): B=1 2.59 us
        # on 4 / 1 warp against 2.94 on the [K, V] choice 16 / 1 (and [K, V]'s own 2.87); B=16 13.91 on 8 / 1
        # against 15.05-15.34 on 32 / 1 ([K, V]: 13.54-13.74).  Many pairs: below (with the general body every
        # narrower [V, K] tile was slower than 64 / 2 at B=256, 283.8-573.7 against 270.8 us: issue-bound, run
        # 169; the lean body's 8 / 1 step is not).
        return RecurrentConfig(block_v=min(4 if pairs <= FEW_PAIRS else 8, plan.BV), num_warps=1, num_stages=1,
                               readout="loaded")
    decode = shape.get("B", 0) * shape.get("T", 0) <= shape.get("N", 0)
    if (kda_v_first and pairs > SOME_PAIRS and shape.get("P", 0) and decode
            and slot_grid(shape.get("N", 0), shape.get("HV", 0), shape.get("P", 0))):
        # KDA's fp32 pool laid out [V, K] with many pairs, a decode step's call (no more tokens than sequences), on
        # the slot grid: 8-row tiles (one contiguous 4 KB block of whole K columns) on one warp, with the lean body
        # where the tile divides K and V (a slot's program holds the step alone; row 0's programs run padding,
        # other lengths and shared slots).  A call with more tokens than sequences is not a decode step: row 0
        # would run its longer items one at a time, so it takes the choices below.  H=32, K=V=128, B=256, packed,
        # graph replay, one process (bench/RESULTS.md, session 41, runs 211-214): on an H200 lean 8 / 1 steps at
        # 97.1-97.4% of copy as the compiler allocates it, against 96.4-96.5% under a 72-register cap, 93.6-94.1%
        # for the general body's 8 / 1 and for 64 / 2, and the [K, V] pool's default 95.2-95.4%; on an H100 (run
        # 207) uncapped 98.0%, cap 72 97.7%, 64 / 2 98.0%.
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
    # Many pairs: KDA's (a per-channel decay and the delta rule) with the loaded readout, 272.5 against the
    # updated readout's 275.3 us at B=256 with the slots scrambled, 268.7 against 274.9 with them in order (an
    # fp32 pool; bench/RESULTS.md, run 161, one process); the other structures keep the updated readout they
    # were measured with.
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


# H=32, K=V=128, fp32 pool, packed step, one process (bench/RESULTS.md, run 164; µs, slot grid / batch grid):
# B=256 over 260 slots scrambled 268.6 / 273.0 (94.7 / 93.1% of copy), in batch order 268.4 / 269.0; B=512
# 530.1 / 539.5 (95.9 / 94.3%); B=256 over 512 slots with a third of the sequences padding 186.0 / 185.8;
# B=64 (2,048 pairs) 72.8 / 72.9 scrambled, 72.7 / 72.3 in order; B=16 (512 pairs) 16.6 / 15.6 (one wave:
# the scan is latency, the order nothing).  B=128: the probe's slot-grid kernel 93.5% against the op's
# 91.4% (run 163).
SLOT_GRID_MIN_PAIRS = 4096
SLOT_GRID_MAX_SEQS = 1024
SLOT_GRID_MAX_RATIO = 2


# float32 decode states (default_recurrent_config): (sequence, value head) pairs up to which the
# 16-wide tile on one warp is taken (B=1 at H=32: 32 pairs), and the 32-wide one (B=16: 512)
FEW_PAIRS = 64
SOME_PAIRS = 1024


def default_chunk_bwd_config(plan: Plan, shape: dict | None = None, chunking: tuple[int, int] = (32, 16)
                             ) -> ChunkBwdConfig:
    """The backward's heuristic config; ``shape`` (optional {"N", "HV"}) picks the reverse state
    pass's V tile by its program count; ``chunking``: the training forward's (C, BC)."""
    # The reverse state pass holds only dS [K, BV] (fp32) and does three dots per chunk; the
    # chunk-parallel launch holds three [C, K] fp32 accumulators.  On the H200, bf16, K=V=128,
    # `kdagen build` picked at each of its three shapes (bench/RESULTS.md, run 63) the chunk-parallel
    # launch on [128, 64] tiles of (K, V), and the state pass on 64-wide V tiles with >= 256 programs at
    # BV=32, 16-wide below (run 2's reason: few programs; 32-wide since run 100, below): 6.33 / 4.80 /
    # 4.14 ms against 7.25 / 5.13 / 4.66 ms for 64 x 32 and BV=32 at (1, 8192, 96), (2, 16384, 16),
    # (4, 4096, 32); those tiles are the defaults for half-precision inputs with K <= 128 (fp32 tiles
    # are twice the bytes: unmeasured).
    # The intra-chunk gradients run on 4 warps: 4.29 / 2.84 ms against 8 warps' 7.91 / 5.24 ms at
    # (1, 8192, 96, 128) / (2, 16384, 16, 128), despite 32 bytes of spill against none (two programs
    # per SM instead of one; run 9).  fp16 keeps the per-chunk states in fp32 (its range is 6.5e4).
    #
    # Recompute mode rebuilds qg, kg, W and G_n from the A_qk and T the forward kept (chunk_bwd_rerun)
    # and the intra-chunk gradients run as two launches (chunk_bwd_wy: dE, T, dv, dbeta; then dq, dk,
    # dg per K tile): at (1, 8192, 96, 128), bf16, re-run 1.89 -> 0.65 ms on 2 warps and the intra
    # gradients 4.24 -> 1.02 + 2.59 ms on 2 warps with 64-wide V tiles in the first (2, 16384, 16, 128:
    # 1.27 -> 0.43 and 2.80 -> 0.69 + 1.72; bench/RESULTS.md, runs 70-71).  fp32 and K > 128: unmeasured,
    # the fused launch and 4 warps stay; so do chunks of four sub-tiles (C=64: the split is slower
    # there, 3.29 + 5.97 ms at the first shape, and gave non-finite gradients on the H200, run 73-75).
    #
    # The reverse state pass loads G_n one chunk ahead and its loop is pipelined three deep (half
    # precision, K <= 128): 0.910 -> 0.817 ms (BV=64) at (1, 8192, 96, 128) and 1.216 -> 0.941 ms
    # (BV=16) at (2, 16384, 16, 128); three stages alone 0.879 / 1.020, the prefetch alone 0.824 / 1.134
    # (bench/RESULTS.md, run 76).  Since A_qk's tile is loaded ahead too (run 100: before, it was a
    # synchronous load on every chunk's path), 32-wide tiles beat 16-wide ones with few programs: KDA
    # 0.834 -> 0.682 ms and DeltaNet 0.771 -> 0.613 at (2, 16384, 16, 128) (16-wide before the change:
    # 0.958 / 0.915); with many, 64 stays (0.670 against 1.054 for 32 at (1, 8192, 96, 128)).
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
            if few and chunking[0] == 32:  # four stages: 0.683 -> 0.657 ms (KDA), 0.614 -> 0.597 (DeltaNet)
                # at (2, 16384, 16, 128); with many programs they lose (0.671 -> 0.825; run 102); on 64-row
                # chunks four stages exceed shared memory (248 KB at BV=32)
                state["state_num_stages"] = 4
            if few is False and chunking[0] == 64 and trains_on_64_row_chunks(plan, shape):
                # Gated DeltaNet's 64-row chunks with many programs: the reverse pass on 8 warps (64-wide tiles on
                # 4 spill 16 bytes at 255 registers): 1.240 -> 0.821 ms at (1, 8192, 96, 128), 32-wide tiles on 4
                # warps 0.923 (run 139); with few programs 32-wide tiles on 4 warps stay (0.584 against 0.670)
                state_warps = 8
        if chunking[0] == 2 * chunking[1]:
            intra.update(intra_split=True, intra_block_v=min(64, plan.BV), intra_num_warps=2)
            if plan.diag_mode == "elementwise" and plan.has_rank1 and not checked_like_bounded(plan):
                # element-wise diagonal tiles (a per-channel gate without a bound, whose checked
                # diagonal keeps them as the fallback, or fp16, whose factors cannot hold a bound's
                # span): the intra gradients spill 10 KB on 2 warps (584 B / 1 KB on 4, bf16 / fp16):
                # 22.23 -> 11.98 ms at (1, 8192, 96, 128), 15.45 -> 8.71 ms at (2, 16384, 16, 128) for
                # the whole step (bench/RESULTS.md, run 85); BK=16 on 4 warps 15.27 / 11.12
                intra["intra_num_warps"] = 4
            if ChunkBwdConfig.fold_candidate(plan) and plan.has_rank1:
                # no decay (DeltaNet): the split's second launch folded into dqkw and the wy launch
                # (ChunkBwdConfig.folds_intra), the wy launch's K loop on 64-wide tiles.  The whole step at
                # (1, 8192, 96, 128) 5.213 -> 4.640 ms, every bf16 gradient's error against float64 the same
                # to 3 digits (bench/RESULTS.md, run 115; FLA 4.551 ms in run 111).  A scalar decay given as g
                # (Gated DeltaNet) folds the same way (session 26)
                intra.update(intra_fold=True, intra_block_k=min(64, plan.BK))
            # the re-run on one warp: 0.657 -> 0.584 / 0.433 -> 0.410 ms (run 78; run 73: 0.659 -> 0.588)
            rerun_warps = 1
    if plan.BK > WIDE_STATE_BK:
        # dS [512, BV] on 16-wide V tiles over 8 warps, its loop not pipelined (sm_90 compile at K=V=512, bf16: 174
        # registers, no spill, 86 KB shared; two stages 255 registers, and 48 B of spill in fp16, whose per-chunk
        # states are float32; 32-wide tiles on 4 warps spill 872 B)
        state_bv, state_warps, state["state_num_stages"] = min(16, plan.BV), 8, 1
    # 64-row chunks: the reverse pass's 16-wide tile gave wrong gradients on the H200 (min_state_block_v)
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
