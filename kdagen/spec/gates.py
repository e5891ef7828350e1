"""Gates: the per-token log-decay ``g`` as a sympy expression of raw inputs, with its range.

The range's lower bound is what makes a factorised sub-tile safe (:mod:`kdagen.spec.structure`).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .symbols import A_log, Sigmoid, Softplus, dt_bias, g, g_min, z


@dataclass(frozen=True)
class Gate:
    """The per-token log-decay ``g`` as a sympy expression of raw inputs.

    ``raw`` are the per-token inputs the expression reads, ``params`` the learned
    parameters (with how they are laid out), ``constants`` fixed numbers substituted at
    lowering time.  ``declared_range`` is used only for the ``direct`` gate, where g is
    the input itself and its range is a promise of the caller.
    """

    name: str
    expr: sp.Expr
    raw: tuple[sp.Symbol, ...]
    params: tuple[tuple[sp.Symbol, str], ...] = ()
    constants: tuple[tuple[sp.Symbol, float], ...] = ()
    declared_range: tuple[sp.Expr, sp.Expr] | None = None

    @property
    def substituted(self) -> sp.Expr:
        return self.expr.subs(dict(self.constants))

    def range(self) -> tuple[sp.Expr, sp.Expr]:
        """(inf, sup) of g over all raw inputs, from sympy limits (or the declaration).

        Every non-direct gate here is monotone in its raw input, so the extremes are the
        limits at -oo and +oo; ``tests/spec/test_spec.py`` checks that assumption for the
        built-in gates by differentiating.
        """
        if self.declared_range is not None:
            return self.declared_range
        e = self.substituted
        # parameters are arbitrary reals: evaluate at a generic point is not enough, so
        # use positive stand-ins for exp(A_log) by keeping symbols; limits in the raw input
        (x,) = self.raw
        lo = sp.limit(e, x, sp.S.NegativeInfinity)
        hi = sp.limit(e, x, sp.oo)
        return (sp.Min(lo, hi), sp.Max(lo, hi))

    @property
    def lower_bound(self) -> float | None:
        """Numeric lower bound of g, or None when g is unbounded below."""
        lo, _ = self.range()
        lo = sp.simplify(lo)
        if lo in (sp.S.NegativeInfinity, sp.zoo) or lo.has(sp.oo, sp.S.NegativeInfinity):
            return None
        if lo.free_symbols:
            return None
        return float(lo)

    def fingerprint(self) -> str:
        return "|".join([
            self.name, sp.srepr(self.expr), ",".join(sp.srepr(s) for s in self.raw),
            ",".join(f"{sp.srepr(s)}:{lay}" for s, lay in self.params),
            ",".join(f"{sp.srepr(s)}={v!r}" for s, v in self.constants),
            "" if self.declared_range is None else ",".join(sp.srepr(x) for x in self.declared_range),
        ])


def gate_direct(lower_bound: float | None = None) -> Gate:
    """g is given directly (FLA's default). ``lower_bound`` is the caller's promise
    (FLA's ``safe_gate=True`` with ``lower_bound``); None means unbounded below."""
    lo = sp.S.NegativeInfinity if lower_bound is None else sp.Float(lower_bound)
    if lower_bound is not None and not lower_bound < 0:
        raise ValueError(f"lower_bound must be negative, got {lower_bound}")
    return Gate("direct", g, (g,), declared_range=(lo, sp.Integer(0)))


def gate_lower_bound(bound: float = -5.0) -> Gate:
    """g = g_min * sigmoid(exp(A_log) * (z + dt_bias)), range [g_min, 0) (Kimi's gate)."""
    if not bound < 0:
        raise ValueError(f"the gate's lower bound must be negative, got {bound}")
    expr = g_min * Sigmoid(sp.exp(A_log) * (z + dt_bias))
    return Gate("lower_bound", expr, (z,), params=((A_log, "head"), (dt_bias, "channel")),
                constants=((g_min, float(bound)),))


def gate_softplus() -> Gate:
    """g = -exp(A_log) * softplus(z + dt_bias), range (-oo, 0] (Mamba-style)."""
    expr = -sp.exp(A_log) * Softplus(z + dt_bias)
    return Gate("softplus", expr, (z,), params=((A_log, "head"), (dt_bias, "channel")))


def gate_custom(name: str, expr: sp.Expr, raw: sp.Symbol, params=(), constants=()) -> Gate:
    """A user gate: any sympy expression of one raw per-channel symbol and parameters."""
    if raw not in expr.free_symbols:
        raise ValueError(f"custom gate {name!r}: expression does not depend on its raw input {raw}")
    return Gate(name, expr, (raw,), params=tuple(params), constants=tuple(constants))


GATES = {"direct": gate_direct, "lower_bound": gate_lower_bound, "softplus": gate_softplus}
