"""What each kernel family is to the tuner: the spec and plan it is tuned for, its heuristic
default, its separately timed stages and their candidates, and the shapes a candidate is
built and checked at; the search space a plan's candidates come from (:func:`space_for`);
whether a spec can be tuned (:func:`check_tunable`: whatever lowers)."""
from __future__ import annotations

import sys

import torch

from ..cache.gpus import GpuProfile
from ..codegen.lower import Plan, lower
from ..codegen.render import REPLACES
from ..config import ChunkBwdConfig, ConfigError
from ..dtypes import dtype as as_dtype
from ..ops.inputs import select_spec
from ..spec import Recurrence, gate_direct
from ..spec.load import load_spec
from ..spec.structure import safe_sub_chunk
from .space import SearchSpace, load_space

FAMILIES = ("chunk_fwd", "chunk_bwd", "recurrent")  # in tuning order: the backward takes the forward's C
# general DPLR's chunk forward: the training-path kernels (chunk_intra, chunk_state), for inference too
DPLR_CHUNK_FAMILY = "chunk_train"
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


def is_dplr(spec_args: dict) -> bool:
    """Whether ``spec_args``' spec has the general DPLR structure (the structure analysis, not
    the spec's name): its chunk forward is the ``chunk_train`` family's kernels."""
    if uses_kda_ops(spec_args):
        return False
    from ..ops.member import free_rank1

    return free_rank1(family_spec("recurrent", spec_args))


def families_for(spec_args: dict, families) -> list[str]:
    """The kernel families tuned for ``families`` (FAMILIES' names, as ``kdagen build --family``
    takes them) of ``spec_args``' spec.  A general DPLR spec's chunk forward runs the
    training-path kernels (``chunk_dplr_delta_rule``), so its ``chunk_fwd`` is the
    ``chunk_train`` family, tuned and looked up under that name; its chunk backward is not
    generated yet, so ``chunk_bwd`` is left out.  Any other spec: ``families`` unchanged."""
    if not is_dplr(spec_args):
        return list(families)
    mapped = {"chunk_fwd": DPLR_CHUNK_FAMILY, "chunk_bwd": None}
    return list(dict.fromkeys(mapped.get(f, f) for f in families if mapped.get(f, f) is not None))


def op_args(spec_args: dict) -> dict:
    """The keyword arguments of the op a candidate runs (``spec_args`` without ``spec``)."""
    return {n: a for n, a in spec_args.items() if n != "spec"}


def uses_kda_ops(spec_args: dict) -> bool:
    """Whether a family's candidates run through ``chunk_kda`` / ``fused_recurrent_kda`` (the KDA
    member, as always) rather than the member entries (:mod:`kdagen.tuning.member_ops`: any other
    spec, a user's spec file too)."""
    return spec_args.get("spec", "kda") == "kda"


def check_tunable(spec_args: dict, families=FAMILIES) -> None:
    """Raise ValueError, with the reason, unless every family (of ``families``) of ``spec_args``'s
    spec can be tuned: what the tuner runs is the spec's own op (KDA's for the KDA member, the
    member entries :func:`kdagen.ops.member.chunk_member` / ``fused_recurrent_member`` for any
    other spec), so a spec is refused only where lowering its tuning spec is
    (:func:`kdagen.codegen.lower.lower`, which the member entries call) -- and where this build's
    templates lack the form (:func:`kdagen.codegen.forms.generates`: general DPLR's chunk form)."""
    from ..codegen.forms import generates
    from ..codegen.lower import LoweringError

    for family in families_for(spec_args, families):
        spec = family_spec(family, spec_args)
        try:
            plan = lower_for(spec, family, 64, 64, "bfloat16")
        except (LoweringError, ValueError) as e:
            raise ValueError(f"spec {spec.name!r} cannot be tuned: its {family} kernels cannot be generated: "
                             f"{e}") from None
        if not generates(plan.structure, plan.form):
            from ..spec.validate import structure_text

            raise ValueError(f"spec {spec.name!r} cannot be tuned: its {family} kernels cannot be generated: "
                             f"{structure_text(spec)}, whose chunk form is not generated yet in this build; its "
                             "recurrent family is (--family recurrent)")


def lower_for(spec: Recurrence, family: str, K: int, V: int, dtype, gate_in_kernel: bool = False) -> Plan:
    """The plan of a family's kernels for inputs of ``dtype`` (any spelling)."""
    form = "recurrent" if family == "recurrent" else "chunk"
    return lower(spec, K, V, as_dtype(dtype).name, form, gate_in_kernel)


SCALAR_DIAG_SPACES = {"chunk_fwd": "chunk_fwd.scalar_decay.json"}
FOLDABLE_SPACES = {"chunk_bwd": "chunk_bwd.foldable.json"}


def space_for(family: str, plan: Plan) -> SearchSpace:
    """The packaged search space a family's candidates are drawn from for ``plan``.

    KDA's files (``search_spaces/<family>.json``) serve every plan whose kernels read all their
    fields.  A plan of diag mode ``scalar`` (a scalar decay, or none: one decay per token, so the
    forward's solve has no factorised sub-tiles) renders its solve kernel without
    ``sub_chunk``'s sub-tiling or ``factor_precision``'s factored tiles: the KDA file's
    ``factor_precision`` choices would time the same kernel twice, so such a plan takes
    :data:`SCALAR_DIAG_SPACES`' file (tests/tuning/test_tune_family.py checks, for gdn and deltanet,
    that the dropped choices render kernel bodies identical to the kept ones, and that the kept
    ones differ).  The backward and decode spaces hold only tiles, warps and stages, which every
    plan reads: those files are shared, except that a plan whose split intra gradients can fold (no
    decay, or a scalar one given as g: ``ChunkBwdConfig.fold_candidate``) takes :data:`FOLDABLE_SPACES`'
    backward file, which adds ``intra_fold`` (read only by such plans: their split intra gradients
    folded into dqkw and the wy launch)."""
    name = SCALAR_DIAG_SPACES.get(family) if plan.diag_mode == "scalar" else None
    if ChunkBwdConfig.fold_candidate(plan):
        name = FOLDABLE_SPACES.get(family, name)
    if name is None:
        return load_space(family)
    from ..resources import search_spaces_dir

    return load_space(search_spaces_dir() / name)


def space_context(plan: Plan, spec: Recurrence, gpu: GpuProfile, elem_bytes: int) -> dict:
    """The names a search space's constraints read besides the config's fields."""
    bound = safe_sub_chunk(spec)
    return dict(K=plan.K, V=plan.V, safe_sub_chunk=bound.length or 0,
                smem_limit=gpu.smem_per_block_bytes, elem_bytes=elem_bytes)


def elem_bytes(dtype) -> int:
    return torch.tensor([], dtype=as_dtype(dtype).torch).element_size()


def stage_candidates(space: SearchSpace, context: dict, stage: str | None, default) -> list:
    """Candidates of one separately-timed stage: the stage's own fields vary, every other
    field keeps the default's value; duplicates are dropped, order is kept.  A stage value the
    default's other fields refuse is left out (a 16-wide reverse-pass tile where the default runs
    64-row chunks, Gated DeltaNet's bf16 training: ChunkBwdConfig's min_state_block_v)."""
    cands = space.candidates(context)
    if stage is None:
        return cands
    fields_ = space.stages[stage]
    out, seen = [], set()
    for c in cands:
        try:
            proj = default.replace(**{f: getattr(c, f) for f in fields_})
        except ConfigError:
            continue
        canon = proj.canonical()
        if canon not in seen:
            seen.add(canon)
            out.append(proj)
    return out


def timed_launches(launches: list, launch: str | None, plan) -> list:
    """The launches a stage times: its kernel's, and those standing in for it (REPLACES: the wy launch for
    the intra-chunk gradients).  Where the split can fold (``ChunkBwdConfig.fold_candidate``) a backward config may fold
    the split intra gradients into dqkw and the wy launch (ChunkBwdConfig.folds_intra), moving work into
    dqkw; there the intra stage times dqkw with them for every candidate, folded or not, so that a fold
    is charged for what it moved and the candidates are compared on the same launches."""
    kinds = {launch}
    if launch == "chunk_bwd_intra" and ChunkBwdConfig.fold_candidate(plan):
        kinds.add("chunk_bwd_dqkw")
    return [ln for ln in launches if launch is None or ln.kernel in kinds or REPLACES.get(ln.kernel) in kinds]


def check_shape(family: str, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The shape a candidate is built and checked at for a timed ``shape`` (B, T, H, HV): one
    sequence of ``min(T, CHECK_T_MAX)`` tokens with the timed heads (decode: the timed batch,
    one token).  Triton specialises its kernels alike for both, so each compiles once."""
    B, T, H, HV = shape
    return (B, 1, H, HV) if family == "recurrent" else (1, min(T, CHECK_T_MAX), H, HV)

