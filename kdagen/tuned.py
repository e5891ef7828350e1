"""Looking tuned winners up at run time (never tuning): exact cache keys for the current
GPU, the spec, the template sources, head dims, dtypes and the declared shape bucket."""
from __future__ import annotations

import hashlib
import warnings
from functools import lru_cache

from . import __version__
from .config import config_from_dict
from .lower import Plan
from .resources import templates_dir

# kernel family -> templates its generated source comes from
FAMILY_TEMPLATES = {"chunk_fwd": ("_header.py.j2", "_program.py.j2", "chunk_intra.py.j2", "chunk_state.py.j2"),
                    "chunk_bwd": ("_header.py.j2", "_program.py.j2", "chunk_bwd_state.py.j2", "chunk_bwd_dqkw.py.j2",
                                  "chunk_bwd_intra.py.j2"),
                    "recurrent": ("_header.py.j2", "recurrent.py.j2")}


@lru_cache(maxsize=None)
def source_hash(kernel: str) -> str:
    """Hash of the templates (and kdagen version) a family's kernels are rendered from:
    editing a template invalidates every winner tuned with the old one."""
    h = hashlib.sha256(__version__.encode())
    for name in FAMILY_TEMPLATES[kernel]:
        h.update(name.encode())
        h.update((templates_dir() / name).read_bytes())
    return h.hexdigest()[:16]


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
    from .cache import TuningCache

    return TuningCache(gpu_name, on_error="warn")


def cache_key(plan: Plan, kernel: str, shape: dict, gpu, state_dtype: str = "float32"):
    from .cache import CacheKey, shape_bucket

    bucket = shape_bucket(kernel, int(shape["T"]), int(shape["B"]), int(shape["N"]))
    return CacheKey.create(kernel=kernel, spec_hash=plan.spec_hash, source_hash=source_hash(kernel),
                           K=plan.K, V=plan.V, dtype=plan.dtype, state_dtype=state_dtype,
                           shape_bucket=bucket, gpu=gpu)


_MEMO: dict = {}


def lookup_winner(plan: Plan, kernel: str, shape: dict):
    """The cached winner config for this exact key on the current GPU, or None."""
    gpu = _current_gpu()
    if gpu is None or not shape:
        return None
    key = cache_key(plan, kernel, shape, gpu)
    memo_key = key.key_string()
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    cfg = None
    try:
        entry = _cache_for(gpu.name).lookup(key)
        if entry is not None:
            cfg = config_from_dict(kernel, entry["config"])
    except Exception as e:  # noqa: BLE001 - a bad cache must never break a forward pass
        warnings.warn(f"kdagen: ignoring tuning cache entry: {e}", stacklevel=3)
    _MEMO[memo_key] = cfg
    return cfg
