"""Heuristic configs: what the ops run when no tuned winner is cached, and the baseline the
tuner measures its candidates against."""
from __future__ import annotations

from ..codegen.lower import Plan
from ..config import ChunkBwdConfig, ChunkFwdConfig, RecurrentConfig


# Below about two state-pass programs per SM of a 132-SM GPU the state pass is latency bound
# (each program walks all chunks of its sequence): narrower V tiles give more programs.  On the
# H200 at C=32, (2, 16384, 16, 128) -- 128 programs at BV=32 -- takes 1.09 ms at BV=16 on 4 warps
# against 1.27 ms at BV=32 on 2; with 384 programs, (1, 8192, 96, 128), BV=16 is slower (1.62 vs
# 0.85 ms) (bench/RESULTS.md, run 2).
STATE_PROGRAMS_LOW = 256


def default_chunk_config(plan: Plan, shape: dict | None = None) -> ChunkFwdConfig:
    """``shape``: optional {"N": sequences, "HV": value heads} of the call."""
    # C=32 with the whole K row in one intra tile and a 32-wide V tile on 2 warps in the state
    # pass: the fastest stage-by-stage combination of the H200 sweep at (1, 8192, 96, 128)
    # (intra 1.52 ms, state 0.86 ms; bench/RESULTS.md).
    sub = 16
    if plan.diag_mode == "elementwise":
        bk = 32  # the element-wise diagonal holds a [BC, BC, BK] tile
    else:
        bk = min(128, plan.BK)
    bv, warps = min(32, plan.BV), (2 if plan.K <= 128 else 4)
    if shape and "N" in shape and "HV" in shape and plan.BV >= 32:
        if shape["N"] * shape["HV"] * -(-plan.V // 32) < STATE_PROGRAMS_LOW:
            bv, warps = 16, 4
    return ChunkFwdConfig(
        chunk_size=32, sub_chunk=sub, intra_block_k=bk, intra_num_warps=4, intra_num_stages=2,
        state_block_v=bv, state_num_warps=warps, state_num_stages=2,
    )


def default_recurrent_config(plan: Plan) -> RecurrentConfig:
    # K=V=128: BV=64 on 4 warps moves the state at 94% of copy bandwidth at B=256 on the H200;
    # 1 warp at BV >= 64 spills registers and collapses (bench/RESULTS.md)
    bv = min(64, plan.BV) if plan.K <= 128 else min(32, plan.BV)
    return RecurrentConfig(block_v=bv, num_warps=4, num_stages=1)


def default_chunk_bwd_config(plan: Plan) -> ChunkBwdConfig:
    # The reverse state pass holds only dS [K, BV] (fp32) and does three dots per chunk; the
    # chunk-parallel launch holds three [C, K] fp32 accumulators.  Tuned winners differ from
    # these in those two launches' tiles and are 6-14% faster on the backward (bench/RESULTS.md).
    # The intra-chunk gradients run on 4 warps: on the H200, bf16, K=V=128, 4.29 / 2.84 ms against
    # 8 warps' 7.91 / 5.24 ms at (1, 8192, 96, 128) / (2, 16384, 16, 128), despite 32 bytes of
    # spill against none (two programs per SM instead of one; bench/RESULTS.md, run 9).  fp16
    # keeps the per-chunk states in fp32 (its range is 6.5e4).
    return ChunkBwdConfig(
        chunk_size=32, sub_chunk=16, state_block_v=min(32, plan.BV), state_num_warps=4, state_num_stages=2,
        dqkw_block_k=min(64, plan.BK), dqkw_block_v=min(32, plan.BV), dqkw_num_warps=4, dqkw_num_stages=2,
        intra_block_k=min(32, plan.BK), intra_block_v=min(32, plan.BV), intra_num_warps=4, intra_num_stages=2,
        state_dtype="fp32" if plan.dtype == "float16" else "input",
    )


def default_config(family: str, plan: Plan, shape: dict | None = None, fwd_config: ChunkFwdConfig | None = None):
    """The heuristic config of a family at a call's ``shape`` ({"N", "HV", ...}, optional); the
    backward's takes the chunk lengths of ``fwd_config`` (default: the forward's heuristic)."""
    if family == "chunk_fwd":
        return default_chunk_config(plan, shape)
    if family == "chunk_bwd":
        fwd = fwd_config or default_chunk_config(plan, shape)
        return default_chunk_bwd_config(plan).replace(chunk_size=fwd.chunk_size, sub_chunk=fwd.sub_chunk)
    if family == "recurrent":
        return default_recurrent_config(plan)
    raise ValueError(f"unknown kernel family {family!r}")
