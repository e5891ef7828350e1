"""Which forms of which structure this build's templates generate, for the callers that must
refuse a form before they render it: :func:`kdagen.codegen.lower.lower` plans every structure it
knows in both forms, and the templates branch on the plan's structure, so a structure whose
chunk templates have no branch yet would otherwise render another structure's kernels.

General DPLR's recurrent form (``templates/recurrent*.py.j2``) and its chunk form (the training-path
templates ``chunk_intra``/``chunk_state`` and the backward's, ``chunk_dplr_delta_rule``) are
generated; a structure whose chunk templates have no branch stays out of :data:`CHUNK_STRUCTURES`.  ``chunk_member``,
``kdagen list/inspect/build/tune`` and the tuner ask :func:`generates` and say what is missing.
"""
from __future__ import annotations

# the structures (Plan.structure) whose chunk form the chunk templates generate
CHUNK_STRUCTURES = frozenset({"kda", "gla", "dplr"})


def generates(structure: str, form: str) -> bool:
    """Whether this build generates the kernels of ``structure`` in ``form`` ('chunk' or
    'recurrent'; every structure the lowering plans has its recurrent form)."""
    return form == "recurrent" or structure in CHUNK_STRUCTURES
