"""Cache keys: exact keys of tuned winners -- every field must match -- and the one declared
bucketing function of call shapes (:func:`shape_bucket`)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from ..dtypes import dtype
from ..version import __version__
from .heuristics import slot_grid

# --------------------------------------------------------------------------- versions


def environment_versions() -> dict[str, str]:
    """Versions that invalidate tuned results: triton, torch, CUDA runtime, kdagen."""
    try:
        import triton

        triton_v = str(triton.__version__)
    except ImportError:  # pragma: no cover
        triton_v = "none"
    try:
        import torch

        torch_v = str(torch.__version__)
        cuda_v = str(torch.version.cuda) if torch.version.cuda else "none"
    except ImportError:  # pragma: no cover
        torch_v, cuda_v = "none", "none"
    return {"triton_version": triton_v, "torch_version": torch_v,
            "cuda_version": cuda_v, "kdagen_version": __version__}


# --------------------------------------------------------------------------- key


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


# Bucketing bounds.  Below/above these, shapes share the end bucket.
TOKEN_BUCKET_MIN = 1 << 8
TOKEN_BUCKET_MAX = 1 << 20
SEQ_BUCKET_MAX_CHUNK = 64
SEQ_BUCKET_MAX_RECURRENT = 1024


def _token_bucket(tokens: int) -> int:
    """A token count's bucket: rounded up to a power of two, clamped to [TOKEN_BUCKET_MIN, TOKEN_BUCKET_MAX]."""
    return min(max(_pow2_ceil(tokens), TOKEN_BUCKET_MIN), TOKEN_BUCKET_MAX)


def shape_bucket(kind: str, T: int, batch: int, num_seqs: int) -> str:
    """THE bucketing function of the cache (the only inexact part of a key).

    ``T`` is tokens per sequence for a padded batch, or the total token count of a packed
    (varlen) batch with ``batch == 1``; ``num_seqs`` is the number of independent
    sequences (``batch`` when padded, ``len(cu_seqlens) - 1`` when packed).

    * ``chunk_fwd``, ``chunk_bwd`` and ``chunk_train`` (general DPLR's chunk forward): ``t<N>_s<M>`` with N = total tokens (T*batch) rounded up to a power
      of two and clamped to [2^8, 2^20], M = num_seqs rounded up to a power of two and
      capped at 64 (sequence count sets the state pass's grid, so it is kept apart).
    * ``recurrent``: ``s<M>`` with M = num_seqs rounded up to a power of two, capped at
      1024 (one launch covers one step of every sequence; T does not matter).  A call's key adds the
      state layout and whether it is a decode step to it (:func:`call_bucket`).

    Head dims K and V are separate key fields and are never bucketed.
    """
    for name, v in (("T", T), ("batch", batch), ("num_seqs", num_seqs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"shape_bucket: {name} must be a positive int, got {v!r}")
    if kind in ("chunk_fwd", "chunk_bwd", "chunk_train"):
        tokens = _token_bucket(T * batch)
        seqs = min(_pow2_ceil(num_seqs), SEQ_BUCKET_MAX_CHUNK)
        return f"t{tokens}_s{seqs}"
    if kind == "recurrent":
        return f"s{min(_pow2_ceil(num_seqs), SEQ_BUCKET_MAX_RECURRENT)}"
    raise ValueError(f"shape_bucket: unknown kernel kind {kind!r}; known: chunk_fwd, chunk_bwd, chunk_train, recurrent")


# A call's bucket also says how many value heads it has (``_h<n>``, a power of two, capped): the heuristics branch
# on the programs (the chunk forms' state pass: sequences x value heads x tiles; the decode step: its (sequence,
# value head) pairs), so a winner timed at one head count is found only by calls of that count -- the tuner times
# each form at the model's heads (the chunk shapes' H, decode's --decode-heads).  A winner stored before the heads
# were keyed (no ``_h``) is found by a call of any count (:func:`lookup_buckets`: the bucket with the heads first,
# then the one without).
HEADS_SUFFIX = "_h"
HEADS_BUCKET_MAX = 256

# The recurrent form's bucket also says what its heuristic branches on besides the sequences (kdagen.cache.
# heuristics' Features): the state's layout and whether the call is a decode step.  The bare bucket (every
# cache written before these suffixes) is the layout and call the tuner has always timed: [.., K, V] states,
# one token per sequence.
V_FIRST_SUFFIX = "_vk"  # states laid out [.., V, K] (state_v_first)
TOKENS_SUFFIX = "_tokens"  # more tokens than sequences: not a decode step
TOKEN_SLOTS_SUFFIX = "_slots"  # speculative decoding: a pool slot per token, the kernel's token_slots form
SLOT_GRID_SUFFIX = "_grid"  # a decode step on a state pool whose programs go over the pool's slots (heuristics.slot_grid)
# The inference forward's bucket says the longest sequence of a packed call (``_l`` and its tokens, a power of two)
# where it is not the bucket of the mean length -- the only case where it tells more than the tokens and
# sequences: the sequence-parallel state pass is chosen by the longest sequence's chunks (heuristics.Features.
# segments).  The tuner times sequences of one length, so its winners carry no ``_l`` and a call packed
# unevenly (one long sequence among short ones) gets the heuristic, which reads its longest sequence.
LONGEST_SUFFIX = "_l"


def call_bucket(kind: str, shape: dict, heads: bool = True) -> str:
    """The bucket of a call ``shape`` ({"T", "B", "N"}, optionally "HV", and for the recurrent form optionally
    "state_v_first"): :func:`shape_bucket`'s, then (``heads`` and "HV" given) :data:`HEADS_SUFFIX` and the value
    heads rounded up to a power of two, and for the recurrent form
    :data:`V_FIRST_SUFFIX` on a
    [.., V, K] state and :data:`TOKENS_SUFFIX` where the call has more tokens than sequences (B * T > N),
    so that a winner is found only by calls of the state layout and step it was timed on;
    :data:`TOKEN_SLOTS_SUFFIX` for a speculative-decoding call (shape "token_slots": a 2-D ssm_state_indices),
    whose kernel stores every token's state (RecurrentConfig.token_slots), so that it never runs a plain
    call's winner; :data:`SLOT_GRID_SUFFIX` for a decode step on a pool of "P" slots that puts its programs
    over the slots.  The inference forward's adds :data:`LONGEST_SUFFIX` for a packed call ("T_max") whose
    longest sequence is not in its mean length's bucket.  So every feature a heuristic branches on is in
    the key, bucketed: a winner is served only to calls the heuristic sees as the shape it was timed at."""
    T, B, N = int(shape["T"]), int(shape["B"]), int(shape["N"])
    bucket = shape_bucket(kind, T, B, N)
    if heads and _keyed_heads(shape):
        bucket += f"{HEADS_SUFFIX}{min(_pow2_ceil(int(shape['HV'])), HEADS_BUCKET_MAX)}"
    if kind == "chunk_fwd" and shape.get("T_max"):
        longest, mean = _token_bucket(int(shape["T_max"])), _token_bucket(-(-T * B // N))
        bucket += f"{LONGEST_SUFFIX}{longest}" if longest != mean else ""
    if kind == "recurrent":
        step = B * T <= N  # a decode step, as heuristics.Features reads it
        bucket += (V_FIRST_SUFFIX if shape.get("state_v_first") else "") + ("" if step else TOKENS_SUFFIX)
        bucket += TOKEN_SLOTS_SUFFIX if shape.get("token_slots") else ""
        grid = step and shape.get("P") and slot_grid(N, int(shape.get("HV") or 0), int(shape["P"]))
        bucket += SLOT_GRID_SUFFIX if grid else ""
    return bucket


@dataclass(frozen=True)
class CacheKey:
    kernel: str
    spec_hash: str
    source_hash: str
    K: int
    V: int
    dtype: str
    state_dtype: str
    shape_bucket: str
    gpu_name: str
    compute_capability: tuple[int, int]
    sm_count: int
    triton_version: str
    torch_version: str
    cuda_version: str
    kdagen_version: str

    def __post_init__(self):
        for name in ("dtype", "state_dtype"):  # a canonical dtype name, whatever the spelling given
            v = getattr(self, name)
            object.__setattr__(self, name, v if isinstance(v, str) else dtype(v).name)
        cc = tuple(int(x) for x in self.compute_capability)
        if len(cc) != 2:
            raise ValueError(f"CacheKey: compute_capability must be (major, minor), got {self.compute_capability!r}")
        object.__setattr__(self, "compute_capability", cc)
        for name in ("K", "V", "sm_count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"CacheKey: {name} must be an int, got {v!r}")
        for f in fields(self):
            if f.name not in ("K", "V", "sm_count", "compute_capability"):
                if not isinstance(getattr(self, f.name), str):
                    raise ValueError(f"CacheKey: {f.name} must be a str, got {getattr(self, f.name)!r}")

    @classmethod
    def create(cls, *, kernel: str, spec_hash: str, source_hash: str, K: int, V: int,
               dtype: Any, state_dtype: Any, shape_bucket: str, gpu: Any,
               versions: dict[str, str] | None = None) -> "CacheKey":
        """Key for the running environment; ``gpu`` is a :class:`~kdagen.cache.gpus.GpuProfile`."""
        v = environment_versions() if versions is None else versions
        return cls(kernel=kernel, spec_hash=spec_hash, source_hash=source_hash, K=K, V=V,
                   dtype=dtype, state_dtype=state_dtype, shape_bucket=shape_bucket,
                   gpu_name=gpu.name, compute_capability=tuple(gpu.compute_capability),
                   sm_count=gpu.sm_count, **{k: v[k] for k in (
                       "triton_version", "torch_version", "cuda_version", "kdagen_version")})

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["compute_capability"] = list(self.compute_capability)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CacheKey":
        names = {f.name for f in fields(cls)}
        if set(d) != names:
            raise ValueError(f"CacheKey: fields {sorted(d)} != expected {sorted(names)}")
        return cls(**d)

    def canonical(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def key_string(self) -> str:
        """Readable prefix + sha256 of the canonical JSON of ALL fields (20 hex digits)."""
        prefix = f"{self.kernel}-K{self.K}-V{self.V}-{self.dtype}-{self.state_dtype}-{self.shape_bucket}"
        prefix = re.sub(r"[^A-Za-z0-9_.=+-]", "_", prefix)
        return f"{prefix}-{self.digest()[:20]}"



# --------------------------------------------------------------------------- sources


@lru_cache(maxsize=None)
def source_hash(family: str) -> str:
    """Hash of every file a family's kernels are rendered from (its templates and the modules
    that lower and render, :func:`kdagen.codegen.sources.render_inputs`), by path relative to
    the package and content: any change that can change the kernels invalidates the winners
    tuned on the old ones, and no other change does.  Kept between processes under the stamp of
    the package's files (:func:`kdagen.codegen.sources.source_stamp`: names, sizes, times), so an
    op's first call in a fresh process stats the files instead of reading and parsing them."""
    from ..codegen import sources
    from . import paths

    stamp = sources.source_stamp(family)
    memo_file = paths.source_hashes_file()
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    memo = memo if isinstance(memo, dict) else {}
    if isinstance(memo.get(stamp), str):
        return memo[stamp]
    value = _source_hash(family)
    # at most SOURCE_HASHES_KEPT stamps (the newest); a cache directory that cannot be written keeps none
    memo = {k: v for k, v in list(memo.items())[-(SOURCE_HASHES_KEPT - 1):] if isinstance(v, str)}
    memo[stamp] = value
    tmp = memo_file.with_name(f".{memo_file.name}.{os.getpid()}")
    try:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_file)
    except OSError:  # (no half-written file left behind)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return value


SOURCE_HASHES_KEPT = 64


def _source_hash(family: str) -> str:
    """:func:`source_hash` from the files themselves."""
    from ..codegen import sources

    h = hashlib.sha256()
    for path in sources.render_inputs(family):
        # templates by name: the same key from a source checkout and from an installed package
        if path.name.endswith(".j2"):
            label = f"templates/{path.name}"
        else:
            label = path.relative_to(sources.PACKAGE_DIR).as_posix()
        h.update(label.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _keyed_heads(shape: dict) -> bool:
    """Whether a call's bucket names its value heads (:data:`HEADS_SUFFIX`): wherever the call says them."""
    return bool(shape.get("HV"))


def lookup_buckets(kernel: str, shape: dict) -> list[bool]:
    """The ``heads`` arguments of :func:`call_bucket` (and :func:`cache_key`) a look-up tries, in order: the
    bucket with the call's value heads, then -- a winner stored before the heads were keyed -- the one
    without."""
    return [True, False] if _keyed_heads(shape) else [False]


def lookup_keys(plan, kernel: str, shape: dict, gpu, state_dtype: str = "float32") -> list["CacheKey"]:
    """The keys a winner of this call is looked up by, in order (:func:`lookup_buckets`)."""
    return [cache_key(plan, kernel, shape, gpu, state_dtype, heads) for heads in lookup_buckets(kernel, shape)]


def cache_key(plan, kernel: str, shape: dict, gpu, state_dtype: str = "float32", heads: bool = True) -> CacheKey:
    """The key of a winner of ``kernel`` (a family) for ``plan`` at a call ``shape`` ({"T", "B",
    "N", "HV"}, for the recurrent form also "state_v_first": :func:`call_bucket`, ``heads`` its) on ``gpu``,
    whose state (initial state, decode pool) is ``state_dtype``.  Its spec is the plan's tuning spec
    (:func:`kdagen.codegen.lower.tuning_spec`): an in-kernel gate's call finds the winners tuned for
    the direct gate with its bound."""
    bucket = call_bucket(kernel, shape, heads)
    return CacheKey.create(kernel=kernel, spec_hash=plan.tuning_spec_hash, source_hash=source_hash(kernel),
                           K=plan.K, V=plan.V, dtype=plan.dtype, state_dtype=state_dtype,
                           shape_bucket=bucket, gpu=gpu)
