"""Symbolic (sympy) description of the DPLR family of linear-attention recurrences.

    S_t = (D_t - a_t b_t^T) S_{t-1} + khat_t v_t^T,      o_t = S_t^T (scale * q_t)

Per-channel quantities (``a``, ``b``, ``khat``, the gate) are written as sympy
expressions of *channel symbols*: ``q``, ``k``, ``g`` stand for the d-th component of
the token's query, key and log-decay; ``beta`` is a per-token scalar.  A member fixes the
structure of D (identity / scalar / per-channel), the rank-1 part and the write key; the
gate is a sympy expression of raw inputs together with its range.

The symbols are in :mod:`kdagen.spec.symbols`, the gates in :mod:`kdagen.spec.gates`.
The spec is pure data: lowering (:mod:`kdagen.codegen.lower`) and structure analysis
(:mod:`kdagen.spec.structure`) read it, nothing here touches a tensor.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import sympy as sp

from .gates import GATES, Gate, gate_direct, gate_lower_bound, gate_softplus
from .symbols import a_free, b_free, beta, g, k, q

DECAY_KINDS = ("identity", "scalar", "channel")


@dataclass(frozen=True)
class Input:
    """A tensor the op takes. ``shape`` is symbolic per (token, head): () or ('K',)."""

    name: str
    role: str
    shape: tuple[str, ...]
    per: str = "token"  # 'token' (varies with t), 'head' or 'channel' (a parameter)


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
