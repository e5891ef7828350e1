"""Shared memory: what a config's largest launches stage, against what the GPU a call runs on holds.

Triton software-pipelines a kernel's loop ``num_stages`` deep: every tile the loop loads is
buffered in shared memory once per stage, and the tiles that feed a tensor-core dot from
registers (the carried state) take one more buffer.  :func:`estimate` counts those tiles for the
launches whose loops stage tiles of a whole chunk -- the state passes (``chunk_pass``,
``chunk_state``, ``chunk_bwd_state``) and the backward's chunk-parallel ``chunk_bwd_dqkw`` --
which are the launches that reach the limit (each is an upper bound: Triton's allocator reuses
some buffers, never more than this many).  Launches that hold at most a few sub-tiles (the solve,
the intra launches, the output launch, decode) are far below every GPU's limit at the tiles the
configs take and are not estimated.

:func:`fit` steps a config that does not fit down, deterministically, one launch at a time: fewer
pipeline stages (to 2), then narrower V tiles (to 16, or the reverse pass's
:func:`~kdagen.config.min_state_block_v`), then narrower K tiles where the launch tiles K; the chunk
length is never changed (a caller may have pinned it, and the training forward and the backward
share it).  :func:`limit` is the limit of the GPU the calls run on (:func:`target` for builds for
another GPU).
"""
from __future__ import annotations

import contextlib
from functools import lru_cache

from ..codegen.lower import Plan
from ..config import ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig, min_state_block_v

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# where no GPU is present (the interpreter) and no target is set: nothing to fit
_TARGET: list = []


@contextlib.contextmanager
def target(profile):
    """Fit configs to ``profile`` (a :class:`~kdagen.cache.gpus.GpuProfile`) inside the block: builds and
    compile checks for a GPU that is not the one present."""
    _TARGET.append(profile)
    try:
        yield profile
    finally:
        _TARGET.pop()


@lru_cache(maxsize=1)
def _current_limit() -> int | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        from .gpus import detect_current

        p = detect_current()
        return None if p is None else int(p.smem_per_block_bytes)
    except Exception:  # noqa: BLE001 - no GPU information: no limit to fit
        return None


def limit() -> int | None:
    """Bytes of shared memory one block may take on the GPU configs are fitted to: :func:`target`'s,
    else the current CUDA device's (its opt-in limit), else None (no GPU: nothing is fitted)."""
    if _TARGET:
        return int(_TARGET[-1].smem_per_block_bytes)
    return _current_limit()


def _storage(name: str, plan: Plan) -> int:
    """Bytes of an element stored as a config's ``state_dtype`` says."""
    if name in ("fp32", "float32"):
        return 4
    return _BYTES[plan.dtype]


def estimate(family: str, plan: Plan, config) -> dict[str, int]:
    """Upper bounds of the shared memory (bytes) of ``config``'s loop-pipelined launches on ``plan``, by
    kernel kind (the kinds it does not estimate are left out)."""
    e = _BYTES[plan.dtype]
    BK, dplr, rank1 = plan.BK, plan.structure == "dplr", plan.has_rank1
    decay = plan.decay != "identity"
    out = {}
    if family == "chunk_fwd" and isinstance(config, ChunkFwdConfig):
        # chunk_pass: per stage bk, qg, kgL (a scalar decay: k, q, kgL) [BT, BK], P [BT, BT] (fp32 at most), v
        # [BT, BV], G_n and beta and the row scales; once: the state and X as dot operands
        C, bv = config.chunk_size, min(config.state_block_v, plan.BV)
        stage = 3 * C * BK * e + 4 * C * C + C * bv * e + (4 * BK if decay else 0) + 3 * 4 * C
        out["chunk_pass"] = max(config.state_num_stages, 1) * stage + (BK + C) * bv * e
    if family == "chunk_train" and isinstance(config, ChunkTrainConfig):
        # chunk_state: per stage W, kg, qg (with the output), kgv (DPLR) [BT, BK] and A_qk, A_qv [BT, BT] in the
        # input dtype; U and v (DPLR) [BT, BV]; G_n.  Once: the state and V' as dot operands
        C, bv, i = config.chunk_size, min(config.state_block_v, plan.BV), e
        write_o = not config.split_output
        k_tiles = int(rank1) + 1 + int(write_o) + int(dplr)
        t_tiles = int(write_o) * (1 + int(dplr))
        stage = k_tiles * C * BK * i + t_tiles * C * C * i + C * bv * (i + (e if dplr else 0)) + 4 * BK + 4 * C
        out["chunk_state"] = max(config.state_num_stages, 1) * stage + (BK + C) * bv * e
    if family == "chunk_bwd" and isinstance(config, ChunkBwdConfig):
        C = config.chunk_size
        bv = min(config.state_block_v, plan.BV)
        # chunk_bwd_state: per stage W, qg, kg, kgv (DPLR) [BT, BK] and A_qk, A_qv [BT, BT] as stored (the input
        # dtype), dO [BT, BV], G_n; once: dS as a dot operand
        k_tiles = int(rank1) + 2 + int(dplr)
        stage = (k_tiles * C * BK * e + (1 + int(dplr)) * C * C * e
                 + C * bv * e + 4 * BK + 4 * C)
        out["chunk_bwd_state"] = max(config.state_num_stages, 1) * stage + BK * bv * e
        # chunk_bwd_dqkw: per stage the [BK, BV] tiles of S and dS (in the per-chunk states' dtype) and the [BT, BV]
        # tiles of V' (fp32 at most), dU, dO (and v for DPLR) in the input dtype
        s = _storage(config.state_dtype, plan)
        bk, bv2 = min(config.dqkw_block_k, BK), min(config.dqkw_block_v, plan.BV)
        stage = 2 * bk * bv2 * s + C * bv2 * (4 + (2 + int(dplr)) * e)
        out["chunk_bwd_dqkw"] = max(config.dqkw_num_stages, 1) * stage
    return out


def fits(family: str, plan: Plan, config, smem_limit: int | None = None) -> bool:
    """Whether every estimated launch of ``config`` fits ``smem_limit`` (default :func:`limit`; None: yes)."""
    lim = limit() if smem_limit is None else smem_limit
    return lim is None or all(b <= lim for b in estimate(family, plan, config).values())


def _steps(family: str, plan: Plan, config, kind: str):
    """The next smaller config for the launch ``kind`` of ``config``, or None when it is at its smallest."""
    if kind in ("chunk_pass", "chunk_state", "chunk_bwd_state"):
        if config.state_num_stages > 2:
            return config.replace(state_num_stages=config.state_num_stages - 1)
        floor = min_state_block_v(config.chunk_size) if kind == "chunk_bwd_state" else 16
        bv = min(config.state_block_v, plan.BV)
        if bv // 2 >= floor:
            return config.replace(state_block_v=bv // 2)
        if config.state_num_stages > 1:
            return config.replace(state_num_stages=1)
        return None
    stages = {"chunk_intra": "intra_num_stages", "chunk_out": "out_num_stages", "chunk_bwd_intra": "intra_num_stages",
              "chunk_bwd_wy": "intra_num_stages"}.get(kind)
    if stages is not None and hasattr(config, stages):
        return config.replace(**{stages: getattr(config, stages) - 1}) if getattr(config, stages) > 1 else None
    if kind == "chunk_bwd_dqkw":
        if config.dqkw_num_stages > 1:
            return config.replace(dqkw_num_stages=config.dqkw_num_stages - 1)
        if min(config.dqkw_block_v, plan.BV) > 16:
            return config.replace(dqkw_block_v=min(config.dqkw_block_v, plan.BV) // 2)
        if min(config.dqkw_block_k, plan.BK) > 16:
            return config.replace(dqkw_block_k=min(config.dqkw_block_k, plan.BK) // 2)
        return None
    return None


def step_down(family: str, plan: Plan, config, kind: str | None = None):
    """The next config down from ``config`` for its launch ``kind`` (default: its largest estimated launch),
    or None when there is none."""
    if kind is None:
        est = estimate(family, plan, config)
        if not est:
            return None
        kind = max(est, key=est.get)
    try:
        return _steps(family, plan, config, kind)
    except Exception:  # noqa: BLE001 - a step the config refuses: no smaller config this way
        return None


def fit(family: str, plan: Plan, config, smem_limit: int | None = None):
    """``config`` stepped down (:func:`step_down`) until every estimated launch fits ``smem_limit``
    (default :func:`limit`); ``config`` itself when it fits, there is no limit, or it has no smaller
    step (the run-time fallback, :mod:`kdagen.ops.fallback`, has the last word)."""
    lim = limit() if smem_limit is None else smem_limit
    if lim is None or config is None:
        return config
    for _ in range(32):
        over = {k: b for k, b in estimate(family, plan, config).items() if b > lim}
        if not over:
            return config
        nxt = step_down(family, plan, config, max(over, key=over.get))
        if nxt is None:
            return config
        config = nxt
    return config
