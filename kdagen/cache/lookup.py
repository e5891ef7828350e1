"""Run-time look-up (never tuning): the config an op call runs is the caller's, else the
tuned winner stored for this exact key on the current GPU, else the heuristic."""
from __future__ import annotations

import warnings
from functools import lru_cache

from ..codegen.lower import Plan
from ..config import config_from_dict
from .heuristics import default_config
from .keys import call_bucket, lookup_keys


@lru_cache(maxsize=1)
def _current_gpu():
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        from .gpus import detect_current

        return detect_current()
    except Exception:  # noqa: BLE001 - no GPU information: heuristics only
        return None


@lru_cache(maxsize=8)
def _cache_for(gpu_name: str):
    from .store import TuningCache

    return TuningCache(gpu_name, on_error="warn")


_MEMO: dict = {}


def lookup_winner(plan: Plan, kernel: str, shape: dict, state_dtype: str = "float32"):
    """The cached winner config for this exact key on the current GPU, or None."""
    gpu = _current_gpu()
    if gpu is None or not shape:
        return None
    # memoised per (family, plan, shape bucket, state dtype, GPU): an op call pays a dict look-up,
    # not the key's construction and hashing
    memo_key = (kernel, plan, call_bucket(kernel, shape), state_dtype, gpu.name)
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    cfg = None
    try:
        for key in lookup_keys(plan, kernel, shape, gpu, state_dtype):  # its value heads, then a winner without
            entry = _cache_for(gpu.name).lookup(key)
            if entry is not None:
                cfg = config_from_dict(kernel, entry["config"])
                break
    except Exception as e:  # noqa: BLE001 - a bad cache must never break a forward pass
        warnings.warn(f"kdagen: ignoring tuning cache entry: {e}", stacklevel=3)
    _MEMO[memo_key] = cfg
    return cfg


def resolve(family: str, plan: Plan, explicit, shape: dict, state_dtype: str = "float32"):
    """The config a call of ``family`` runs: ``explicit`` if given, else the tuned winner for
    this plan, ``shape`` ({"T", "B", "N", "HV"}) and ``state_dtype`` (of the state the call
    reads and writes: its initial state or decode pool; float32 without one) on the current
    GPU, else the heuristic.  The recurrent form's key carries the state's layout (``shape``'s
    "state_v_first") and whether the call is a decode step (:func:`~.keys.call_bucket`): a call on
    states laid out [.., V, K] finds only winners timed on that layout (an exported package's table is
    keyed the same way)."""
    if explicit is not None:
        return explicit
    return lookup_winner(plan, family, shape, state_dtype) or default_config(family, plan, shape,
                                                                               state_dtype=state_dtype)
