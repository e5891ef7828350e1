"""What each kernel family is to the tuner: the spec and plan it is tuned for, its heuristic
default, its separately timed stages and their candidates, and the shapes a candidate is
built and checked at."""
from __future__ import annotations

import sys

import torch

from ..cache.gpus import GpuProfile
from ..codegen.lower import Plan, lower
from ..dtypes import dtype as as_dtype
from ..ops.inputs import select_spec
from ..spec import Recurrence, gate_direct
from ..spec.load import load_spec
from ..spec.structure import safe_sub_chunk
from .space import SearchSpace

FAMILIES = ("chunk_fwd", "chunk_bwd", "recurrent")  # in tuning order: the backward takes the forward's C
TOLERANCE = {"bfloat16": 6e-3, "float16": 2e-3, "float32": 1e-4}  # relative error a candidate may have
CHECK_T_MAX = 1024  # tokens of the correctness check (the timed shape's heads, one sequence)
COMPILE_SHAPE = (1, 64, 1, 1)  # (B, T, H, HV) compiled for when no tuning shape is given


def log_progress(msg: str, enabled: bool = True):
    """A progress line on stderr (the tuner's and the compile-check's)."""
    if enabled:
        print(msg, file=sys.stderr, flush=True)


def family_spec(family: str, spec_args: dict) -> Recurrence:
    """The spec a family's kernels are built and tuned for, given ``spec_args``: the op arguments
    tuning passes (g given directly, ``safe_gate`` and ``lower_bound``) and, for any spec but the
    KDA member, ``spec``: a member's name or ``/abs/path/file.py:NAME`` (:func:`kdagen.load_spec`;
    plain text, so a compile worker rebuilds the same spec).

    ``chunk_kda`` takes ``safe_gate`` and ``lower_bound``; ``fused_recurrent_kda`` has no
    ``safe_gate`` (FLA's signature), so its kernel is the direct gate's whatever the bound.  Every
    member is tuned alike: its recurrence with g given, bounded below by ``lower_bound`` for the
    chunk forms -- the spec an op's plan looks its winners up by
    (:func:`kdagen.codegen.lower.tuning_spec`), so a member's winners are stored under its own
    keys.  Plans, cache keys and studies are made from this spec."""
    safe = bool(spec_args.get("safe_gate", False)) and family != "recurrent"
    ref = spec_args.get("spec", "kda")
    if ref == "kda":
        return select_spec(False, safe, spec_args.get("lower_bound"), False, False)
    spec = load_spec(ref)
    if spec.decay == "identity":
        return spec
    return spec.with_gate(gate_direct(spec_args.get("lower_bound") if safe else None))


def op_args(spec_args: dict) -> dict:
    """The keyword arguments of the op a candidate runs (``spec_args`` without ``spec``)."""
    return {n: a for n, a in spec_args.items() if n != "spec"}


def check_tunable(spec_args: dict) -> None:
    """Raise ValueError unless the ops the tuner runs candidates through (``chunk_kda``,
    ``fused_recurrent_kda``) compute ``spec_args``'s spec: their kernels are the KDA structure's
    with a per-channel decay and a = beta k, whose sources for a spec of that form differ from
    the KDA member's only in their header and name."""
    spec = family_spec("chunk_fwd", spec_args)
    kda_like = select_spec(False, False, None, False, False)
    same = (spec.decay == kda_like.decay and spec.a == kda_like.a and spec.b == kda_like.b
            and spec.write_key == kda_like.write_key and spec.readout == kda_like.readout)
    if not same:
        raise ValueError(f"spec {spec.name!r} lowers, but kdagen's tuner runs its candidates through chunk_kda and "
                         f"fused_recurrent_kda, which compute the KDA recurrence, not {spec.name!r}'s "
                         f"({spec.decay} decay): its own op is not wired into the tuner yet")


def lower_for(spec: Recurrence, family: str, K: int, V: int, dtype, gate_in_kernel: bool = False) -> Plan:
    """The plan of a family's kernels for inputs of ``dtype`` (any spelling)."""
    form = "recurrent" if family == "recurrent" else "chunk"
    return lower(spec, K, V, as_dtype(dtype).name, form, gate_in_kernel)


def space_context(plan: Plan, spec: Recurrence, gpu: GpuProfile, elem_bytes: int) -> dict:
    """The names a search space's constraints read besides the config's fields."""
    bound = safe_sub_chunk(spec)
    return dict(K=plan.K, V=plan.V, safe_sub_chunk=bound.length or 0,
                smem_limit=gpu.smem_per_block_bytes, elem_bytes=elem_bytes)


def elem_bytes(dtype) -> int:
    return torch.tensor([], dtype=as_dtype(dtype).torch).element_size()


def stage_candidates(space: SearchSpace, context: dict, stage: str | None, default) -> list:
    """Candidates of one separately-timed stage: the stage's own fields vary, every other
    field keeps the default's value; duplicates are dropped, order is kept."""
    cands = space.candidates(context)
    if stage is None:
        return cands
    fields_ = space.stages[stage]
    out, seen = [], set()
    for c in cands:
        proj = default.replace(**{f: getattr(c, f) for f in fields_})
        canon = proj.canonical()
        if canon not in seen:
            seen.add(canon)
            out.append(proj)
    return out


def check_shape(family: str, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The shape a candidate is built and checked at for a timed ``shape`` (B, T, H, HV): one
    sequence of ``min(T, CHECK_T_MAX)`` tokens with the timed heads (decode: the timed batch,
    one token).  Triton specialises its kernels alike for both, so each compiles once."""
    B, T, H, HV = shape
    return (B, 1, H, HV) if family == "recurrent" else (1, min(T, CHECK_T_MAX), H, HV)

