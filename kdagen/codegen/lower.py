"""Lowering: a spec plus shapes and dtypes becomes a :class:`Plan` — which kernels and
matrices exist, how the gate and its derivatives are evaluated, and how long a factorised
sub-tile may be.

Decisions live here; templates only branch on plan fields.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import sympy as sp
import triton

from .. import spec as S
from ..dtypes import NAMES as DTYPES
from ..spec import Recurrence
from ..spec.structure import EXP_BUDGET_BY_DTYPE, analyze_structure, safe_sub_chunk
from .triton_printer import to_triton

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256  # MAX_HEAD_DIM: every structure's limit but those in HEAD_DIM_LIMITS
# structures whose kernels take wider heads, as flash-linear-attention 0.6.0 does: GLA (no rank-1 part) to 512,
# its state passes on narrow V tiles (kdagen.cache.heuristics); FLA's KDA, Gated DeltaNet, DeltaNet and general
# DPLR chunk kernels refuse K > 256, and so does kdagen
HEAD_DIM_LIMITS = {"gla": 512}
WIDEST_HEAD_DIM = max(MAX_HEAD_DIM, *HEAD_DIM_LIMITS.values())  # the widest any structure takes

# kernel variable names the templates use for the gate's symbols
GATE_NAMES = {S.z: "b_z", S.A_log: "b_A", S.dt_bias: "b_bias", S.g: "b_z"}


class LoweringError(ValueError):
    pass


@dataclass(frozen=True)
class Plan:
    spec_name: str
    spec_hash: str
    # the spec whose tuned winners this plan runs (its cache key's): the direct gate of the same
    # member with the bound the diagonal tiles use -- an in-kernel gate differs from it only in
    # an element-wise prologue, and the recurrent kernel does not read the bound (see tuning_spec)
    tuning_spec_hash: str
    form: str  # 'chunk' | 'recurrent'
    structure: str
    decay: str
    K: int
    V: int
    BK: int  # K padded to a power of two (a whole row of the state)
    BV: int  # V padded to a power of two
    dtype: str  # dtype of q/k/v
    gate_in_kernel: bool
    gate_name: str
    gate_expr: str  # Triton expression of b_z (raw), b_A, b_bias; "b_z" when g is given
    gate_has_A: bool
    gate_has_bias: bool
    # in-kernel gate only ("" otherwise): sympy's dg/dz, dg/dA_log, dg/ddt_bias, printed alike
    gate_dz: str
    gate_dA: str
    gate_dbias: str
    lower_bound: float | None
    safe_sub_chunk: int | None  # None: factorised diagonal tiles are not safe
    # 'factorised' | 'elementwise' (per-channel decay) | 'scalar' (a decay shared by all channels,
    # or none: exp(G_i - G_j) is one number per (i, j), so a diagonal tile is one dot times it)
    diag_mode: str
    # the rank-1 (delta) part: a = beta k erases and beta k writes (KDA's structure); without it the
    # update is S <- Diag(exp g) S + k v^T (GLA's): no triangular solve, no beta
    has_rank1: bool
    stages: tuple[str, ...]

    @property
    def raw_qk(self) -> bool:
        """Whether the chunk form's qg and kg are the inputs themselves (q scale and k: no decay), so no
        launch writes them and their readers take q and k ([B, T, H, K]) with the scale after the product."""
        return self.decay == "identity" and self.structure != "dplr"

    @property
    def qk_row_scaled(self) -> bool:
        """Whether qg and kg are q and k times one number per row (a scalar decay given as g: qg = q exp(G),
        kg = k exp(G_n - G)), formed by their readers from q, k and g rather than written: half-precision
        plans, whose readers round them as the writer would (fp32 plans keep kg's reverse cumsum, which
        the difference G_n - G their readers take would not match to 1e-5 after resets)."""
        return (self.decay == "scalar" and self.structure != "dplr" and not self.gate_in_kernel
                and self.dtype != "float32")

    @property
    def qk_from_inputs(self) -> bool:
        """Whether no launch writes qg and kg (:attr:`raw_qk` or :attr:`qk_row_scaled`): their readers take
        q and k from the inputs."""
        return self.raw_qk or self.qk_row_scaled

    def to_dict(self):
        return asdict(self)


def max_head_dim(structure: str) -> int:
    """The widest head dim (K and V) the kernels of ``structure`` ('kda', 'gla', 'dplr', ...) take."""
    return HEAD_DIM_LIMITS.get(structure, MAX_HEAD_DIM)


def spec_max_head_dim(spec: Recurrence) -> int:
    """The widest head dim the kernels of ``spec`` take (its structure's, :func:`max_head_dim`)."""
    return max_head_dim(analyze_structure(spec).kind)


def head_dim_error(K, V, limit: int = MAX_HEAD_DIM, what: str = "") -> str | None:
    """Why head dims K, V are refused at most ``limit`` wide (``what``: whose limit it is, for the
    message), or None when both are in range."""
    for name, d in (("K", K), ("V", V)):
        if isinstance(d, bool) or not isinstance(d, int) or not MIN_HEAD_DIM <= d <= limit:
            whose = f" of {what}" if what else ""
            wider = "; only GLA's kernels take up to 512" if limit < WIDEST_HEAD_DIM else ""
            return f"head dim {name}={d!r} is outside the supported range [{MIN_HEAD_DIM}, {limit}]{whose}{wider}"
    return None


def _check_dims(K: int, V: int, limit: int = WIDEST_HEAD_DIM, what: str = ""):
    why = head_dim_error(K, V, limit, what)
    if why:
        raise LoweringError(why)


def tuning_spec(spec: Recurrence, form: str) -> Recurrence:
    """The spec ``kdagen build`` tunes the kernels of ``spec`` in ``form`` for: g given directly
    (FLA's default), bounded below as ``spec``'s gate is for the chunk form (the bound sets the
    diagonal tiles and the sub-tile length), unbounded for the recurrent form (which reads no
    bound).  An in-kernel gate's kernels have the same loads, tiles and launches as this spec's,
    with the gate computed from z in a prologue, so they run its winners.  A spec without a
    decay (no gate) is its own tuning spec; a scalar decay's kernels read no bound in either form
    (diag_mode 'scalar'), so its tuning spec is unbounded: a build with any bound and the ops
    (which promise none) share winners."""
    if spec.gate is None:
        return spec
    bounded = form == "chunk" and spec.decay == "channel"
    return spec.with_gate(S.gate_direct(spec.gate.lower_bound if bounded else None))


@lru_cache(maxsize=256)
def lower(spec: Recurrence, K: int, V: int, dtype: str, form: str, gate_in_kernel: bool = False) -> Plan:
    """The plan of ``spec`` at head dims K, V for inputs of ``dtype`` (a canonical name) in
    ``form`` ('chunk' or 'recurrent'); memoised (the ops lower on every call)."""
    if dtype not in DTYPES:
        raise LoweringError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if form not in ("chunk", "recurrent"):
        raise LoweringError(f"form must be 'chunk' or 'recurrent', got {form!r}")
    st = analyze_structure(spec)
    _check_dims(K, V, max_head_dim(st.kind), f"spec {spec.name!r}")
    if st.kind == "gla":
        if spec.decay != "channel" or sp.simplify(spec.write_key - S.k) != 0:
            raise LoweringError(f"spec {spec.name!r} has no rank-1 part, a {spec.decay} decay and the write key "
                                f"{spec.write_key}: without a rank-1 part the templates lower GLA's structure only "
                                "(a per-channel decay and the write key k)")
    elif st.kind == "dplr":
        if (spec.decay != "channel" or sp.simplify(spec.a - S.a_free) != 0 or sp.simplify(spec.b - S.b_free) != 0
                or sp.simplify(spec.write_key - S.k) != 0):
            raise LoweringError(f"spec {spec.name!r} has a general rank-1 part ({st.reason}); the templates lower "
                                "the general DPLR structure as flash-linear-attention's chunk_dplr_delta_rule has "
                                "it: a per-channel decay, free per-token vectors a and b (inputs a, b) and the "
                                f"write key k; this spec has a {spec.decay} decay, a = {spec.a}, b = {spec.b} and "
                                f"write key {spec.write_key}")
    elif st.kind != "kda":
        raise LoweringError(f"kdagen generates kernels for the KDA structure (a = beta k, b = D k and the write "
                            f"key beta k: one A_kk, WY form) with identity, scalar or per-channel decay, and for "
                            f"GLA's (no rank-1 part, per-channel decay); spec {spec.name!r} is {st.kind!r} "
                            f"({st.reason}). Other structures are not generated yet.")
    gate = spec.gate
    names = dict(GATE_NAMES)
    if gate is None:  # identity decay: no gate is read, G = 0
        if gate_in_kernel:
            raise LoweringError(f"spec {spec.name!r} has no decay, so it has no gate to compute in the kernel")
        stages = ("intra", "state") if form == "chunk" else ("recurrent",)
        return Plan(
            spec_name=spec.name, spec_hash=spec.hash, tuning_spec_hash=tuning_spec(spec, form).hash, form=form,
            structure=st.kind, decay=spec.decay,
            K=K, V=V, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V), dtype=dtype,
            gate_in_kernel=False, gate_name="none", gate_expr="b_z", gate_has_A=False, gate_has_bias=False,
            gate_dz="", gate_dA="", gate_dbias="", lower_bound=None, safe_sub_chunk=None, diag_mode="scalar",
            has_rank1=spec.has_rank1, stages=stages)
    if gate_in_kernel:
        if gate.name == "direct":
            raise LoweringError("gate_in_kernel needs a gate expression (lower_bound, softplus or custom), "
                                "not the direct gate")
        expr = gate.substituted
        free = expr.free_symbols
        unknown = free - {S.z, S.A_log, S.dt_bias}
        if unknown:
            raise LoweringError(f"gate {gate.name!r} uses symbols {sorted(map(str, unknown))} the kernels "
                                "cannot read; a gate may use z (raw input), A_log (per head) and dt_bias (per channel)")
        gate_expr = to_triton(expr, names)
        has_A, has_bias = S.A_log in free, S.dt_bias in free
        d_z = to_triton(sp.diff(expr, S.z), names)
        d_A = to_triton(sp.diff(expr, S.A_log), names) if has_A else ""
        d_bias = to_triton(sp.diff(expr, S.dt_bias), names) if has_bias else ""
    else:
        gate_expr, has_A, has_bias = "b_z", False, False
        d_z = d_A = d_bias = ""
    # the factorised diagonal tile casts exp(a - G) <= exp(|g_min| BC) to the dot dtype
    bound = safe_sub_chunk(spec, budget=EXP_BUDGET_BY_DTYPE[dtype])
    if spec.decay == "scalar":  # exp(G_i - G_j) <= 1 for j <= i, one per (i, j): no bound needed
        diag_mode = "scalar"
    else:
        diag_mode = "factorised" if bound.length is not None and bound.length >= 16 else "elementwise"
    stages = ("intra", "state") if form == "chunk" else ("recurrent",)
    return Plan(
        spec_name=spec.name, spec_hash=spec.hash, tuning_spec_hash=tuning_spec(spec, form).hash, form=form,
        structure=st.kind, decay=spec.decay,
        K=K, V=V, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V), dtype=dtype,
        gate_in_kernel=gate_in_kernel, gate_name=gate.name, gate_expr=gate_expr,
        gate_has_A=has_A, gate_has_bias=has_bias, gate_dz=d_z, gate_dA=d_A, gate_dbias=d_bias,
        lower_bound=gate.lower_bound,
        safe_sub_chunk=bound.length, diag_mode=diag_mode, has_rank1=spec.has_rank1, stages=stages,
    )
