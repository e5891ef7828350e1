"""Symbolic (sympy) description of the DPLR family of linear-attention recurrences.

    S_t = (D_t - a_t b_t^T) S_{t-1} + khat_t v_t^T,      o_t = S_t^T (scale * q_t)

Per-channel quantities (``a``, ``b``, ``khat``, the gate) are written as sympy
expressions of *channel symbols*: ``q``, ``k``, ``g`` stand for the d-th component of
the token's query, key and log-decay; ``beta`` is a per-token scalar.  A member fixes the
structure of D (identity / scalar / per-channel), the rank-1 part and the write key; the
gate is a sympy expression of raw inputs together with its range.

The spec is pure data: lowering (:mod:`kdagen.lower`) and structure analysis
(:mod:`kdagen.structure`) read it, nothing here touches a tensor.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import sympy as sp

# --- channel symbols -----------------------------------------------------------------
q, k, g, beta = sp.symbols("q k g beta", real=True)
a_free, b_free = sp.symbols("a b", real=True)
# raw gate input and its parameters
z = sp.Symbol("z", real=True)  # raw per-token, per-channel gate input
A_log = sp.Symbol("A_log", real=True)  # per-head log rate
dt_bias = sp.Symbol("dt_bias", real=True)  # per-channel bias
g_min = sp.Symbol("g_min", negative=True)  # lower bound of the gate (a constant)

DECAY_KINDS = ("identity", "scalar", "channel")


class Sigmoid(sp.Function):
    """Logistic function, kept as a named function so it prints as ``tl.sigmoid``."""

    nargs = 1

    def fdiff(self, argindex=1):
        s = Sigmoid(self.args[0])
        return s * (1 - s)

    @classmethod
    def eval(cls, x):
        if x is sp.oo:
            return sp.Integer(1)
        if x is sp.S.NegativeInfinity:
            return sp.Integer(0)
        if x == 0:
            return sp.Rational(1, 2)
        return None

    def _eval_rewrite_as_exp(self, x, **kw):
        return 1 / (1 + sp.exp(-x))

    def _eval_is_positive(self):
        return self.args[0].is_extended_real

    def _eval_is_real(self):
        return self.args[0].is_extended_real


class Softplus(sp.Function):
    """log(1 + exp(x)), printed with a large-argument cut-off."""

    nargs = 1

    def fdiff(self, argindex=1):
        return Sigmoid(self.args[0])

    @classmethod
    def eval(cls, x):
        if x is sp.oo:
            return sp.oo
        if x is sp.S.NegativeInfinity:
            return sp.Integer(0)
        return None

    def _eval_rewrite_as_log(self, x, **kw):
        return sp.log(1 + sp.exp(x))

    def _eval_is_nonnegative(self):
        return self.args[0].is_extended_real

    def _eval_is_real(self):
        return self.args[0].is_extended_real


@dataclass(frozen=True)
class Input:
    """A tensor the op takes. ``shape`` is symbolic per (token, head): () or ('K',)."""

    name: str
    role: str
    shape: tuple[str, ...]
    per: str = "token"  # 'token' (varies with t), 'head' or 'channel' (a parameter)


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
        limits at -oo and +oo; ``tests/test_spec.py`` checks that assumption for the
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


@dataclass(frozen=True)
class Recurrence:
    """One member of the DPLR family (see module docstring)."""

    name: str
    decay: str  # 'identity' | 'scalar' | 'channel'
    gate: Gate | None  # None iff decay == 'identity'
    a: sp.Expr | None  # rank-1 left factor per channel; None: no rank-1 part
    b: sp.Expr | None
    write_key: sp.Expr
    readout: sp.Expr = field(default_factory=lambda: q)  # times `scale`
    inputs: tuple[Input, ...] = ()

    def __post_init__(self):
        if self.decay not in DECAY_KINDS:
            raise ValueError(f"decay must be one of {DECAY_KINDS}, got {self.decay!r}")
        if (self.decay == "identity") != (self.gate is None):
            raise ValueError("a gate is required exactly when the decay is not the identity")
        if (self.a is None) != (self.b is None):
            raise ValueError("a and b must both be given or both be None")

    @property
    def has_rank1(self) -> bool:
        return self.a is not None

    def fingerprint(self) -> str:
        parts = [
            "kdagen-spec-v1", self.name, self.decay,
            self.gate.fingerprint() if self.gate else "nogate",
            sp.srepr(self.a) if self.a is not None else "-",
            sp.srepr(self.b) if self.b is not None else "-",
            sp.srepr(self.write_key), sp.srepr(self.readout),
            ";".join(f"{i.name}:{i.role}:{','.join(i.shape)}:{i.per}" for i in self.inputs),
        ]
        return "\n".join(parts)

    @property
    def hash(self) -> str:
        """Stable content hash: same spec -> same hash in any process."""
        return hashlib.sha256(self.fingerprint().encode()).hexdigest()[:16]

    def with_gate(self, gate: Gate) -> "Recurrence":
        if self.decay == "identity":
            raise ValueError(f"{self.name} has no decay, so it takes no gate")
        return Recurrence(self.name, self.decay, gate, self.a, self.b, self.write_key,
                          self.readout, self.inputs)

    def describe(self) -> str:
        lines = [f"spec {self.name} (hash {self.hash})", f"  decay      : {self.decay}"]
        if self.gate is not None:
            lo, hi = self.gate.range()
            lines.append(f"  gate       : {self.gate.name}: g = {self.gate.expr}  range [{lo}, {hi}]")
        lines.append(f"  rank-1     : a = {self.a}, b = {self.b}" if self.has_rank1 else "  rank-1     : none")
        lines.append(f"  write key  : {self.write_key}")
        lines.append(f"  readout    : scale * {self.readout}")
        lines.append("  inputs     : " + ", ".join(f"{i.name}[{','.join(i.shape) or '1'}]({i.role})" for i in self.inputs))
        return "\n".join(lines)


# --- members -----------------------------------------------------------------------
_QKV = (Input("q", "query", ("K",)), Input("k", "key", ("K",)), Input("v", "value", ("V",)))
_BETA = Input("beta", "beta", ())
_G_CHANNEL = Input("g", "gate", ("K",))
_G_SCALAR = Input("g", "gate", ())


def kda(gate: Gate | None = None) -> Recurrence:
    """Kimi Delta Attention: S_t = (I - beta k k^T) Diag(exp g) S + beta k v^T."""
    return Recurrence("kda", "channel", gate or gate_direct(), a=beta * k, b=sp.exp(g) * k,
                      write_key=beta * k, inputs=_QKV + (_G_CHANNEL, _BETA))


def gdn(gate: Gate | None = None) -> Recurrence:
    """Gated DeltaNet: scalar decay per token and head."""
    return Recurrence("gdn", "scalar", gate or gate_direct(), a=beta * k, b=sp.exp(g) * k,
                      write_key=beta * k, inputs=_QKV + (_G_SCALAR, _BETA))


def deltanet() -> Recurrence:
    return Recurrence("deltanet", "identity", None, a=beta * k, b=k, write_key=beta * k,
                      inputs=_QKV + (_BETA,))


def gla(gate: Gate | None = None) -> Recurrence:
    return Recurrence("gla", "channel", gate or gate_direct(), a=None, b=None, write_key=k,
                      inputs=_QKV + (_G_CHANNEL,))


def dplr(gate: Gate | None = None) -> Recurrence:
    return Recurrence("dplr", "channel", gate or gate_direct(), a=a_free, b=b_free, write_key=k,
                      inputs=_QKV + (_G_CHANNEL, Input("a", "a", ("K",)), Input("b", "b", ("K",))))


MEMBERS = {"kda": kda, "gdn": gdn, "deltanet": deltanet, "gla": gla, "dplr": dplr}
GATES = {"direct": gate_direct, "lower_bound": gate_lower_bound, "softplus": gate_softplus}


def get_spec(name: str, gate: str | None = None, lower_bound: float | None = None) -> Recurrence:
    """A named member, optionally with a named gate (``direct``, ``lower_bound``, ``softplus``)."""
    try:
        make = MEMBERS[name]
    except KeyError:
        raise ValueError(f"unknown spec {name!r}; known: {', '.join(MEMBERS)}") from None
    if gate is None:
        if name == "deltanet":
            return make()
        return make(gate_direct(lower_bound)) if lower_bound is not None else make()
    if name == "deltanet":
        raise ValueError("deltanet has no decay, so it takes no gate")
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; known: {', '.join(GATES)}")
    if gate == "softplus":
        if lower_bound is not None:
            raise ValueError("the softplus gate has no lower bound")
        return make(gate_softplus())
    if gate == "lower_bound":
        return make(gate_lower_bound(-5.0 if lower_bound is None else lower_bound))
    return make(gate_direct(lower_bound))
