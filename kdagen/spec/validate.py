"""Is a spec well formed, and can kdagen's templates lower it?

:func:`validate_spec` checks that a spec (a user's above all) is written in the symbols the
family's inputs are: per-channel ``q``, ``k``, ``g`` (the log decay), ``a``, ``b``, and per-token
``beta``; its gate in its raw input and declared parameters.  :func:`check_lowerable` says
whether kernels can be generated for it: the spec-level facts the templates assume (what they
read out, where a rank-1 coefficient comes from), then :func:`kdagen.codegen.lower.lower` itself
for each form, with the structure analysis's reason when something is refused.
"""
from __future__ import annotations

import sympy as sp

from .recurrence import Recurrence
from .structure import analyze_structure
from .symbols import a_free, b_free, beta, g, k, q

INPUT_SYMBOLS = {q: "q", k: "k", g: "g", beta: "beta", a_free: "a", b_free: "b"}
FORMS = ("chunk", "recurrent")


class SpecError(ValueError):
    """A spec that is not well formed."""


class NotLowerable(ValueError):
    """A well-formed spec kdagen's templates cannot generate kernels for: the message says why
    in full, ``reason`` in a line (for tables)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


def validate_spec(spec: Recurrence) -> Recurrence:
    """Raise :class:`SpecError` unless every expression of ``spec`` is written in its inputs'
    symbols (and its gate in its raw input and parameters); return the spec."""
    if not isinstance(spec, Recurrence):
        raise SpecError(f"expected a kdagen.spec.Recurrence, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not spec.name.strip():
        raise SpecError(f"a spec needs a name (a non-empty string), got {spec.name!r}")
    allowed = set(INPUT_SYMBOLS)
    if spec.decay == "identity":
        allowed.discard(g)
    where = "" if spec.decay != "identity" else " (g is not one: the decay is the identity)"
    for part in ("a", "b", "write_key", "readout"):
        e = getattr(spec, part)
        if e is None:
            continue
        if not isinstance(e, sp.Basic):
            raise SpecError(f"spec {spec.name!r}: {part} must be a sympy expression, got {type(e).__name__}")
        unknown = e.free_symbols - allowed
        if unknown:
            raise SpecError(f"spec {spec.name!r}: {part} = {e} uses {', '.join(sorted(map(str, unknown)))}, which "
                            f"{'is' if len(unknown) == 1 else 'are'} not an input; a spec's expressions are written in "
                            f"{', '.join(INPUT_SYMBOLS[s] for s in INPUT_SYMBOLS if s in allowed)} "
                            f"(kdagen.spec's symbols){where}")
    if spec.gate is not None:
        gate = spec.gate
        if len(gate.raw) != 1:
            raise SpecError(f"spec {spec.name!r}: gate {gate.name!r} must read exactly one raw input, got {gate.raw}")
        known = set(gate.raw) | {s for s, _ in gate.params}
        unknown = gate.substituted.free_symbols - known
        if unknown:
            raise SpecError(f"spec {spec.name!r}: gate {gate.name!r} = {gate.expr} uses "
                            f"{', '.join(sorted(map(str, unknown)))}, which is neither its raw input "
                            f"({gate.raw[0]}) nor a parameter ({', '.join(str(s) for s, _ in gate.params) or 'none'}) "
                            "nor a constant; declare it in params= or constants= of gate_custom")
        for s, layout in gate.params:
            if layout not in ("head", "channel"):
                raise SpecError(f"spec {spec.name!r}: gate parameter {s} has layout {layout!r}; "
                                "expected 'head' or 'channel'")
    return spec


def structure_text(spec: Recurrence) -> str:
    """The structure analysis in words, for messages."""
    st = analyze_structure(spec)
    if st.kind == "dplr":
        return f"{st.reason}: a general DPLR structure"
    if st.kind == "gla":
        return "no rank-1 part: the GLA structure"
    return f"the KDA structure ({st.reason})"


def _template_assumptions(spec: Recurrence) -> str | None:
    """What the templates assume of a spec that :func:`lower` does not itself check, or None."""
    if sp.simplify(spec.readout - q) != 0:
        return (f"the kernels read out scale * q; this spec's readout is scale * ({spec.readout}), which "
                "kdagen's templates do not lower")
    st = analyze_structure(spec)
    if st.kind == "kda" and sp.simplify(spec.a / k - beta) != 0:
        return (f"a = {spec.a}: the kernels take a's coefficient of k from the beta input, so a = beta*k "
                "(and write key = a) lowers and this does not; pass the coefficient as beta instead")
    if st.kind == "gla" and sp.simplify(spec.write_key - k) != 0:
        return f"write key {spec.write_key}: without a rank-1 part the kernels write k itself"
    return None


def check_lowerable(spec: Recurrence, K: int = 64, V: int | None = None, dtype: str = "bfloat16",
                    forms=FORMS, gate_in_kernel: bool | None = None) -> dict:
    """The plans of ``spec``'s kernels (``{(form, gate_in_kernel): plan}``) at head dims K, V, or
    :class:`NotLowerable` saying why kdagen's templates cannot generate them -- the structure
    analysis and the lowering's reason.  ``gate_in_kernel``: None lowers g given (always) and,
    for a gate expression (not the direct gate), the in-kernel gate too."""
    from ..codegen.forms import generates
    from ..codegen.lower import LoweringError, head_dim_error, lower, spec_max_head_dim

    validate_spec(spec)
    V = K if V is None else V
    why = head_dim_error(K, V, spec_max_head_dim(spec), f"spec {spec.name!r}")
    if why:
        raise NotLowerable(why)
    why = _template_assumptions(spec)
    if why:
        raise NotLowerable(f"spec {spec.name!r} cannot be lowered: {why}", why)
    gated = spec.gate is not None and spec.gate.name != "direct"
    variants = [False, True] if gate_in_kernel is None and gated else [bool(gate_in_kernel)]
    plans = {}
    for form in forms:
        for gik in variants:
            try:
                plans[(form, gik)] = lower(spec, K, V, dtype, form, gik)
            except LoweringError as e:
                if gik and _lowers(lower, LoweringError, spec, K, V, dtype, form):
                    # g given lowers: the gate expression is what is refused
                    raise NotLowerable(f"spec {spec.name!r}: its gate {spec.gate.name!r} cannot be computed in the "
                                       f"kernels ({form} form): {e}", f"gate in kernel: {e}") from None
                what = f"{form} form{', gate in kernel' if gik else ''}"
                reason = f"{structure_text(spec)} with {spec.decay} decay, which kdagen's templates do not lower yet"
                raise NotLowerable(f"spec {spec.name!r} cannot be lowered ({what}): {reason}. The lowering says: {e}",
                                   f"{reason} ({what})") from None
    if any(not generates(p.structure, p.form) for p in plans.values()):
        reason = (f"{structure_text(spec)} with {spec.decay} decay, whose chunk kernels kdagen's templates do not "
                  "lower yet in this build")
        raise ChunkFormMissing(f"spec {spec.name!r} cannot be lowered (chunk form): {reason}; its recurrent form is "
                               "generated (--form recurrent, --family recurrent, "
                               "kdagen.fused_recurrent_dplr_delta_rule)", f"{reason} (chunk form)")
    return plans


class ChunkFormMissing(NotLowerable):
    """The spec's recurrent form lowers; its chunk form is a structure whose chunk kernels this
    build does not generate (general DPLR before ``chunk_dplr_delta_rule``)."""


def _lowers(lower, error, spec, K, V, dtype, form) -> bool:
    try:
        lower(spec, K, V, dtype, form, False)
    except error:
        return False
    return True


def lowering_status(spec: Recurrence) -> tuple[bool, str]:
    """(whether kernels are generated, what or why not) -- by trying :func:`check_lowerable`."""
    try:
        check_lowerable(spec)
    except ChunkFormMissing as e:
        try:
            check_lowerable(spec, forms=("recurrent",))
        except (NotLowerable, SpecError):
            return False, e.reason
        return True, "recurrent (the chunk form is not generated in this build)"
    except NotLowerable as e:
        return False, e.reason
    except SpecError as e:
        return False, str(e)
    return True, "chunk forward and backward, recurrent"
