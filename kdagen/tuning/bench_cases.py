"""The bench harness's cases: each family member's ops (kdagen's and FLA's, the same names and
signatures), its inputs, its float64 reference and its gradients; and the named suites of cases
(member x pass x shape) that ``kdagen bench --suite NAME`` runs.

Inputs follow FLA's recipe: l2-normalised k, beta = sigmoid, fp32 gates and states.  KDA's are
:func:`kdagen.tuning.candidates.random_inputs` (g in [-5, 0), the call promises ``safe_gate`` with
``lower_bound=-5``); the other members' gates are ``logsigmoid`` draws, called with FLA's default
keywords.  General DPLR follows FLA's convention ``S <- Diag(exp gk) S + b (a^T S) + k v^T`` with a
unit read vector a and b = -beta a, so each step's transition stays contracting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

LOWER = -5.0  # KDA's gate bound (safe_gate=True): g is drawn in [-5, 0)
PASSES = ("fwd", "fwdbwd", "decode")


@dataclass(frozen=True)
class Member:
    name: str
    ops: tuple[str, str]  # (chunk op, recurrent op): the names in kdagen and in FLA
    fla_module: str  # where FLA keeps them
    args: tuple[str, ...]  # the positional inputs, in the ops' order
    grads: tuple[str, ...]  # the inputs the fwdbwd pass differentiates


MEMBERS = {m.name: m for m in (
    Member("kda", ("chunk_kda", "fused_recurrent_kda"), "fla.ops.kda", ("q", "k", "v", "g", "beta"),
           ("q", "k", "v", "g", "beta", "initial_state")),
    Member("gdn", ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"), "fla.ops.gated_delta_rule",
           ("q", "k", "v", "g", "beta"), ("q", "k", "v", "g", "beta", "initial_state")),
    Member("deltanet", ("chunk_delta_rule", "fused_recurrent_delta_rule"), "fla.ops.delta_rule",
           ("q", "k", "v", "beta"), ("q", "k", "v", "beta", "initial_state")),
    Member("gla", ("chunk_gla", "fused_recurrent_gla"), "fla.ops.gla", ("q", "k", "v", "g"),
           ("q", "k", "v", "g", "initial_state")),
    Member("dplr", ("chunk_dplr_delta_rule", "fused_recurrent_dplr_delta_rule"), "fla.ops.generalized_delta_rule",
           ("q", "k", "v", "a", "b", "gk"), ("q", "k", "v", "a", "b", "gk", "initial_state")),
)}


@dataclass(frozen=True)
class Case:
    """One benchmark case: a member's op at one pass and shape (B, T, H, K, V; decode: B sequences
    of one token)."""

    member: str
    pass_: str
    shape: tuple[int, int, int, int, int]


# the README's performance table: KDA's forward, forward+backward and decode step (B = 1, 16, 256 on an
# fp32 state), and one forward per family member, bf16, K = V = 128
_SHAPES = ((1, 8192, 96, 128, 128), (2, 16384, 16, 128, 128), (4, 4096, 32, 128, 128))
SUITES: dict[str, list[Case]] = {
    "readme": [Case("kda", p, s) for p in ("fwd", "fwdbwd") for s in _SHAPES]
    + [Case("kda", "decode", (B, 1, 32, 128, 128)) for B in (1, 16, 256)]
    + [Case(m, "fwd", _SHAPES[1]) for m in ("gdn", "deltanet", "gla", "dplr")],
}


def cases(members, shapes, passes) -> list[Case]:
    """Every member at every shape and pass (shapes as (B, T, H, K, V) tuples)."""
    return [Case(m, p, tuple(s)) for m in members for s in shapes for p in passes]


def member(name: str) -> Member:
    if name not in MEMBERS:
        raise ValueError(f"unknown member {name!r}; known: {', '.join(MEMBERS)}")
    return MEMBERS[name]


def inputs(name: str, shape, dtype: torch.dtype, device: str, seed: int, decode: bool = False) -> dict:
    """The inputs of every library for ``name`` at ``shape`` (``decode``: one token per sequence)."""
    B, T, H, K, V = shape
    T = 1 if decode else T
    if name == "kda":
        from .candidates import random_inputs

        return random_inputs(B, T, H, H, K, V, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    x = dict(q=q, k=k, v=torch.randn(B, T, H, V, generator=gen))
    if name == "dplr":
        a = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
        x.update(a=a, b=-torch.sigmoid(torch.randn(B, T, H, 1, generator=gen)) * a)
    elif name != "gla":
        x["beta"] = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    x = {n: t.to(device, dtype) for n, t in x.items()}
    if name == "gdn":
        x["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen) + 2.0).to(device)
    if name in ("gla", "dplr"):
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 2.0).to(device)
        x["gk" if name == "dplr" else "g"] = g
    x["initial_state"] = (0.1 * torch.randn(B, H, K, V, generator=gen)).to(device)
    return x


def call(name: str, fn: Callable, x: dict, chunk: bool):
    """(o, final state) of one call of ``fn`` (a member's chunk or recurrent op) on ``x``."""
    m = member(name)
    kw = dict(safe_gate=True, lower_bound=LOWER) if name == "kda" and chunk else {}
    if name == "gdn" and not chunk:  # FLA's fused_recurrent_gated_delta_rule takes beta by keyword
        return fn(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], initial_state=x["initial_state"],
                  output_final_state=True)
    return fn(*(x[n] for n in m.args), initial_state=x["initial_state"], output_final_state=True, **kw)


def reference(name: str, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, final state) of the member's float64 recurrence on ``x``, on x's device."""
    from ..spec import reference as R

    r = {n: t.double() for n, t in x.items()}
    with torch.no_grad():
        if name == "kda":
            return R.naive_recurrent_kda(r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["initial_state"],
                                         output_final_state=True)
        if name == "gdn":
            return R.naive_recurrent_gdn(r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["initial_state"],
                                         output_final_state=True)
        if name == "deltanet":
            return R.naive_recurrent_deltanet(r["q"], r["k"], r["v"], r["beta"], initial_state=r["initial_state"],
                                              output_final_state=True)
        if name == "gla":
            return R.naive_recurrent_gla(r["q"], r["k"], r["v"], r["g"], initial_state=r["initial_state"],
                                         output_final_state=True)
        # kdagen's reference subtracts a b^T: FLA's b (a^T S) is a_ref = -b, b_ref = a
        return R.naive_recurrent_dplr(r["q"], r["k"], r["v"], -r["b"], r["a"], r["gk"],
                                      initial_state=r["initial_state"], output_final_state=True)
