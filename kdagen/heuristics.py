"""Heuristic configs: what the runtime uses when no tuned winner is cached."""
from __future__ import annotations

from .config import ChunkBwdConfig, ChunkFwdConfig, RecurrentConfig
from .lower import Plan


def default_chunk_config(plan: Plan) -> ChunkFwdConfig:
    # H200 sweep of 2026-11-30 (bench/RESULTS.md) at (1, 8192, 96, 128): C=32 with the whole
    # K row in one intra tile and a 32-wide V tile on 2 warps in the state pass was the best
    # stage-by-stage combination measured (intra 1.52 ms, state 0.86 ms).
    sub = 16
    if plan.diag_mode == "elementwise":
        bk = 32  # the element-wise diagonal holds a [BC, BC, BK] tile
    else:
        bk = min(128, plan.BK)
    bv = min(32, plan.BV)
    return ChunkFwdConfig(
        chunk_size=32, sub_chunk=sub, intra_block_k=bk, intra_num_warps=4, intra_num_stages=2,
        state_block_v=bv, state_num_warps=2 if plan.K <= 128 else 4, state_num_stages=2,
    )


def default_recurrent_config(plan: Plan) -> RecurrentConfig:
    # H200 2026-11-30 (bench/RESULTS.md): K=V=128, BV=64 with 4 warps moved the state at
    # 94% of copy bandwidth at B=256; 1 warp at BV>=64 collapses (register spills)
    bv = min(64, plan.BV) if plan.K <= 128 else min(32, plan.BV)
    return RecurrentConfig(block_v=bv, num_warps=4, num_stages=1)


def default_chunk_bwd_config(plan: Plan) -> ChunkBwdConfig:
    # Not tuned yet (no GPU sweep of the backward): the forward's default chunking, V tiles of
    # 32 in the reverse state pass (dS [K, BV] and S [K, BV] both live in registers) and
    # 32-wide K/V tiles in the intra-chunk gradient launch, whose diagonal sub-tiles are
    # element-wise [BC, BC, BK] products.
    return ChunkBwdConfig(
        chunk_size=32, sub_chunk=16, state_block_v=min(32, plan.BV), state_num_warps=4, state_num_stages=2,
        intra_block_k=min(32, plan.BK), intra_block_v=min(32, plan.BV), intra_num_warps=4, intra_num_stages=2,
    )
