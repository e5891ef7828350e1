"""Configs kept clear of what Triton 3.6 compiles wrongly for sm_90, and the one place that makes a
resolved config legal for the GPU it runs on (:func:`legal`: fitted to its shared memory, then clear
of the miscompiles below).

The interpreter cannot see either: it runs no software pipeline.  Both were found on an sm_90 GPU by the
GPU sweep (``tests/gpu/sweep.py``) and FLA's own op tests run with kdagen's ops
(``tests/gpu/run_fla_op_tests.py``); docs/decisions/0001-unpipelined-loops.md has the measurements.

- **float32 backward, the chunk-parallel ``chunk_bwd_dqkw`` launch pipelined two deep**: dq, dk and
  dg came out 40-110% wrong against float64 for every member (dv and dh0 exact), and differed from
  run to run and between state layouts.  One stage gives the float64 answer to 5e-7.
- **General DPLR, a loop over K tiles whose last tile is partial** (K not a multiple of the tile,
  more than one tile: K = 40, 60, 80, 100, 120, 200 at 32-wide tiles), pipelined: ``CUDA error:
  misaligned address`` in float16, which loses the CUDA context.  One stage, or one tile covering
  K, runs it exactly.  DPLR's K-looped launches (the intra launch, which the backward re-runs, the
  backward's intra and dqkw launches) are not pipelined there.
"""
from __future__ import annotations

from ..codegen.lower import Plan
from ..config import ChunkBwdConfig, ChunkTrainConfig
from . import smem


def _partial_tiles(K: int, BK: int) -> bool:
    """A loop over K in tiles of BK that runs more than once and ends on a partial tile."""
    return K > BK and K % BK != 0


def avoid_miscompiles(family: str, plan: Plan, config):
    """``config`` with the pipelining that Triton 3.6 miscompiles for ``plan`` taken out (the module's
    list); ``config`` itself where none applies."""
    if config is None:
        return config
    dplr = plan.structure == "dplr"
    if isinstance(config, ChunkTrainConfig):
        if dplr and config.intra_num_stages > 1 and _partial_tiles(plan.K, min(config.intra_block_k, plan.BK)):
            config = config.replace(intra_num_stages=1)
        return config
    if isinstance(config, ChunkBwdConfig):
        if config.dqkw_num_stages > 1 and (
                plan.dtype == "float32" or (dplr and _partial_tiles(plan.K, min(config.dqkw_block_k, plan.BK)))):
            config = config.replace(dqkw_num_stages=1)
        if dplr and config.intra_num_stages > 1 and _partial_tiles(plan.K, min(config.intra_block_k, plan.BK)):
            config = config.replace(intra_num_stages=1)
        return config
    return config


def legal(family: str, plan: Plan, config):
    """A config the caller did not give, made legal for the GPU the call runs on: fitted to its shared
    memory (:func:`kdagen.cache.smem.fit`), then clear of Triton's miscompiles (:func:`avoid_miscompiles`)."""
    return avoid_miscompiles(family, plan, smem.fit(family, plan, config))
