"""Runtime: from (spec, shapes, dtype) to launchable kernels and their config.

Configs come from, in order: an explicit ``config`` argument, a tuned winner in the cache
for this exact key, the heuristic default.  The runtime never tunes.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .codegen import GeneratedSource, render
from .config import ChunkBwdConfig, ChunkFwdConfig, RecurrentConfig
from .heuristics import default_chunk_bwd_config, default_chunk_config, default_recurrent_config
from .kernels import load
from .lower import Plan, lower
from .spec import Recurrence
from .tuned import lookup_winner


@dataclass(frozen=True)
class Built:
    plan: Plan
    config: Any
    sources: tuple[GeneratedSource, ...]
    fns: tuple[Any, ...]


@lru_cache(maxsize=256)
def plan_for(spec: Recurrence, K: int, V: int, dtype: str, form: str, gate_in_kernel: bool) -> Plan:
    """:func:`kdagen.lower.lower`, memoised (the ops call it on every call)."""
    return lower(spec, K, V, dtype, form, gate_in_kernel)


def lookup_config(plan: Plan, kernel: str, shape_hint: dict | None = None):
    """Tuned winner for this exact key if cached, else None."""
    return lookup_winner(plan, kernel, shape_hint or {})


@lru_cache(maxsize=256)
def build(plan: Plan, config) -> Built:
    if isinstance(config, ChunkFwdConfig):
        kinds = ("chunk_intra", "chunk_state")
    elif isinstance(config, RecurrentConfig):
        kinds = ("recurrent",)
    else:
        raise TypeError(f"no kernels take a {type(config).__name__}")
    srcs = tuple(render(kind, plan, config) for kind in kinds)
    return Built(plan, config, srcs, tuple(load(s) for s in srcs))


def chunk_kernels(plan: Plan, config: ChunkFwdConfig | None, shape_hint: dict | None = None) -> Built:
    if config is None:
        config = lookup_config(plan, "chunk_fwd", shape_hint) or default_chunk_config(plan, shape_hint)
    return build(plan, config)


def recurrent_kernels(plan: Plan, config: RecurrentConfig | None, shape_hint: dict | None = None) -> Built:
    if config is None:
        config = lookup_config(plan, "recurrent", shape_hint) or default_recurrent_config(plan)
    return build(plan, config)


# --- backward ------------------------------------------------------------------------
CHUNK_BWD_KINDS = ("chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra")


@lru_cache(maxsize=256)
def _build_chunk_bwd(plan: Plan, config: ChunkBwdConfig, gate_grads: tuple[tuple[str, str], ...]) -> Built:
    srcs = tuple(render(kind, plan, config, dict(gate_grads)) for kind in CHUNK_BWD_KINDS)
    return Built(plan, config, srcs, tuple(load(s) for s in srcs))


def chunk_bwd_kernels(plan: Plan, config: ChunkBwdConfig | None, gate_grads: dict[str, str] | None = None) -> Built:
    """The three backward kernels (reverse state pass, chunk-parallel products over V,
    intra-chunk gradients) for ``config`` (the op resolves tuned winners; here: the heuristic
    when None)."""
    if config is None:
        config = default_chunk_bwd_config(plan)
    return _build_chunk_bwd(plan, config, tuple(sorted((gate_grads or {}).items())))
