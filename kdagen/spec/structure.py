"""Structure analysis of a spec, with sympy: which chunkwise form applies, and how long
a factorised sub-tile may be given the gate's lower bound."""
from __future__ import annotations

import math
from dataclasses import dataclass

import sympy as sp

from .recurrence import Recurrence
from .symbols import beta, g, k

# exp(x) overflows float32 at x ~ 88.72.  A factorised tile multiplies exp(G_a - G_j)
# (<= exp(span)) into k before the dot; keep the span under this budget so that |k|
# and the dot's sum still have ~3.7 decades of head-room (exp(88.72 - 80) ~ 6e3).
EXP_BUDGET = 80.0
# ... and in the dtype the factor is cast to for the dot: fp16 overflows at exp(11.09)
EXP_BUDGET_BY_DTYPE = {"float32": EXP_BUDGET, "bfloat16": EXP_BUDGET, "float16": 10.0}
MIN_DOT = 16  # the smallest tl.dot tile


@dataclass(frozen=True)
class Structure:
    kind: str  # 'kda' (a, b, write tied to k: one A_kk), 'dplr' (separate matrices), 'gla' (no rank-1)
    reason: str


@dataclass(frozen=True)
class SubChunkBound:
    length: int | None  # largest safe factorised sub-tile length (power of two); None = no factorised path
    lower_bound: float | None
    reason: str


def _channel_free(expr: sp.Expr) -> bool:
    """True if expr does not depend on any per-channel symbol (only per-token scalars)."""
    return not (expr.free_symbols - {beta})


def analyze_structure(spec: Recurrence) -> Structure:
    if not spec.has_rank1:
        return Structure("gla", "no rank-1 part: S_t = D_t S + khat v^T, no triangular solve")
    decay_factor = sp.Integer(1) if spec.decay == "identity" else sp.exp(g)
    a_over_k = sp.simplify(spec.a / k)
    b_over_dk = sp.simplify(spec.b / (decay_factor * k))
    if not _channel_free(a_over_k):
        return Structure("dplr", f"a = {spec.a} is not a per-token multiple of k")
    if sp.simplify(b_over_dk - 1) != 0:
        return Structure("dplr", f"b = {spec.b} is not the decayed key {decay_factor * k}")
    if sp.simplify(spec.write_key - spec.a) != 0:
        return Structure("dplr", f"write key {spec.write_key} differs from a = {spec.a}")
    return Structure("kda", f"a = ({a_over_k}) k, b = D k and khat = a: one A_kk, WY form")


def safe_sub_chunk(spec: Recurrence, budget: float = EXP_BUDGET) -> SubChunkBound:
    """Largest power-of-two sub-tile B_c with |g_min| * B_c <= budget (DESIGN.md)."""
    if spec.decay == "identity":
        return SubChunkBound(None, 0.0, "no decay: nothing overflows; any sub-tile length is safe")
    lb = spec.gate.lower_bound
    if lb is None:
        return SubChunkBound(None, None, f"gate {spec.gate.name!r} has no lower bound: the diagonal "
                             "tiles need the element-wise (non-factorised) path")
    if lb == 0:
        return SubChunkBound(None, 0.0, "gate identically zero")
    n = budget / abs(lb)
    if n < 1:
        return SubChunkBound(None, lb, f"|g_min| = {abs(lb)} exceeds the budget {budget} for a single token")
    length = 2 ** int(math.floor(math.log2(n)))
    return SubChunkBound(length, lb, f"|g_min| = {abs(lb):g}: {length} tokens span at most "
                         f"{abs(lb) * length:g} <= {budget:g} in log space")
