"""``kdagen verify``: the spec's and the float64 oracle's self-checks, as a table.

Nothing here runs a Triton kernel: it checks the two things every kernel is tested
against -- the symbolic spec (its structure and the sub-chunk bound derived from its gate)
and the float64 references (chunkwise form against the token-by-token recurrence, the
degenerate members, and an exact sympy identity of the chunkwise algebra).
"""
from __future__ import annotations

from typing import Callable

import sympy as sp
import torch

from . import reference as R
from .recurrence import Recurrence, get_spec
from .structure import analyze_structure, safe_sub_chunk

TOL = 1e-10


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _inputs(gen, B, T, H, HV, K, V, scalar_gate=False):
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v = r(B, T, H, K), torch.nn.functional.normalize(r(B, T, H, K), dim=-1), r(B, T, HV, V)
    g = -5.0 * torch.rand(B, T, HV, *(() if scalar_gate else (K,)), generator=gen, dtype=torch.float64)
    g[..., 0] = -5.0 if not scalar_gate else g[..., 0]  # some gates exactly at the bound
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta


SHAPES = [  # (B, T, H, HV, K, V, C, varlen)
    (2, 37, 2, 2, 24, 40, 16, False),
    (1, 1, 1, 1, 8, 8, 16, False),
    (1, 130, 1, 2, 16, 12, 64, False),
    (1, 90, 2, 4, 8, 8, 16, True),
]


def chunk_vs_recurrence(spec: Recurrence, gen) -> list[tuple[str, float]]:
    out = []
    for B, T, H, HV, K, V, C, varlen in SHAPES:
        cu = torch.tensor([0, 1, 33, 34, T], dtype=torch.long) if varlen else None
        N = 4 if varlen else B
        h0 = torch.randn(N, HV, K, V, generator=gen, dtype=torch.float64)
        q, k, v, g, beta = _inputs(gen, B, T, H, HV, K, V, scalar_gate=spec.decay == "scalar")
        kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
        if spec.name == "kda":
            a, b = R.naive_chunk_kda(q, k, v, g, beta, chunk_size=C, **kw), R.naive_recurrent_kda(q, k, v, g, beta, **kw)
        elif spec.name == "gdn":
            a, b = R.naive_chunk_gdn(q, k, v, g, beta, chunk_size=C, **kw), R.naive_recurrent_gdn(q, k, v, g, beta, **kw)
        elif spec.name == "deltanet":
            a = R.naive_chunk_deltanet(q, k, v, beta, chunk_size=C, **kw)
            b = R.naive_recurrent_deltanet(q, k, v, beta, **kw)
        elif spec.name == "gla":
            a, b = R.naive_chunk_gla(q, k, v, g, chunk_size=C, **kw), R.naive_recurrent_gla(q, k, v, g, **kw)
        else:  # dplr: no chunkwise reference; the recurrence with KDA's a, b, khat equals KDA
            r = HV // H
            kk = k.repeat_interleave(r, dim=2)
            a = R.dplr_recurrence(q, k, v, g, a=beta[..., None] * kk, b=torch.exp(g) * kk,
                                  write_key=beta[..., None] * kk, **kw)
            b = R.naive_recurrent_kda(q, k, v, g, beta, **kw)
        name = f"B={B} T={T} H={H} HV={HV} K={K} V={V} C={C}{' varlen' if varlen else ''}"
        out.append((name, max(_rel(a[0], b[0]), _rel(a[1], b[1]))))
    return out


def degenerate_cases(gen) -> list[tuple[str, float]]:
    B, T, H, K, V = 1, 21, 2, 8, 8
    q, k, v, g, beta = _inputs(gen, B, T, H, H, K, V)
    h0 = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    kw = dict(initial_state=h0, output_final_state=True)
    out = []
    a = R.naive_recurrent_kda(q, k, v, torch.zeros_like(g), beta, **kw)
    b = R.naive_recurrent_deltanet(q, k, v, beta, **kw)
    out.append(("g = 0 gives DeltaNet", _rel(a[0], b[0])))
    gs = g[..., :1]
    a = R.naive_recurrent_kda(q, k, v, gs.expand_as(g), beta, **kw)
    b = R.naive_recurrent_gdn(q, k, v, gs[..., 0], beta, **kw)
    out.append(("equal channels give GDN", _rel(a[0], b[0])))
    a = R.naive_recurrent_kda(q, k, v, g, torch.zeros_like(beta), **kw)
    decay = torch.exp(g.sum(1))  # [B, H, K]
    out.append(("beta = 0 only decays", _rel(a[1], decay[..., None] * h0)))
    a = R.dplr_recurrence(q, k, v, g, **kw)
    b = R.naive_recurrent_gla(q, k, v, g, **kw)
    out.append(("no delta term gives GLA", _rel(a[0], b[0])))
    return out


def symbolic_check(n: int = 3) -> tuple[str, float]:
    """Exact sympy identity, K = V = 1: the chunkwise KDA formulas equal the recurrence.
    exp(g_t) is a positive symbol d_t, so exp(G_i - G_j) = prod_{j<t<=i} d_t."""
    qs, ks, vs, bs = (sp.symbols(f"{c}0:{n}", real=True) for c in "qkvb")
    ds = sp.symbols(f"d0:{n}", positive=True)
    S0 = sp.Symbol("S0", real=True)
    S, rec = S0, []
    for t in range(n):  # S_t = (1 - b k^2) d S + b k v ; o_t = q S_t (scale 1)
        S = (1 - bs[t] * ks[t] ** 2) * ds[t] * S + bs[t] * ks[t] * vs[t]
        rec.append(qs[t] * S)
    gam = [sp.Mul(*ds[: i + 1]) for i in range(n)]  # exp(G_i)
    dec = lambda i, j: sp.Mul(*ds[j + 1: i + 1])  # noqa: E731  exp(G_i - G_j), i >= j
    Akk = sp.Matrix(n, n, lambda i, j: bs[i] * ks[i] * ks[j] * dec(i, j) if j < i else 0)
    Aqk = sp.Matrix(n, n, lambda i, j: qs[i] * ks[j] * dec(i, j) if j <= i else 0)
    T = (sp.eye(n) + Akk).inv() * sp.diag(*bs)
    W = T * sp.Matrix([gam[i] * ks[i] for i in range(n)])
    U = T * sp.Matrix(vs)
    Vp = U - W * S0
    O = sp.Matrix([qs[i] * gam[i] * S0 for i in range(n)]) + Aqk * Vp
    S_end = gam[-1] * S0 + sum(ks[j] * dec(n - 1, j) * Vp[j] for j in range(n))
    diffs = [sp.simplify(sp.expand(O[i] - rec[i])) for i in range(n)] + [sp.simplify(sp.expand(S_end - S))]
    bad = sum(1 for d in diffs if d != 0)
    return (f"sympy: chunkwise == recurrence exactly (n={n}, K=V=1)", float(bad))


def _spec_inputs(spec: Recurrence, gen, B, T, H, HV, K, V):
    """Random float64 inputs of ``spec``: q, k (normalised), v, the log decay through the spec's
    gate (``[B, T, HV]`` for a scalar decay, None for none), beta and a, b when the spec reads
    them."""
    from .evaluate import random_gate_inputs
    from .symbols import a_free, b_free, beta as beta_sym

    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    unit = lambda *s: torch.nn.functional.normalize(r(*s), dim=-1)  # noqa: E731
    q, k, v = r(B, T, H, K), unit(B, T, H, K), r(B, T, HV, V)
    _, _, g = random_gate_inputs(spec, B, T, HV, K, gen)
    g = None if spec.decay == "identity" else (g[..., 0].contiguous() if spec.decay == "scalar" else g)
    used = set().union(*(e.free_symbols for e in (spec.a, spec.b, spec.write_key, spec.readout) if e is not None))
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64) if beta_sym in used else None
    a = 0.5 * unit(B, T, HV, K) if a_free in used else None
    b = 0.5 * unit(B, T, HV, K) if b_free in used else None
    return dict(q_=q, k_=k, v_=v, g_=g, beta_=beta, a_=a, b_=b)


def _chunk_reference(spec: Recurrence, x: dict, C: int, **kw):
    """The chunkwise float64 form of ``spec``'s structure, on the spec's own evaluated tensors
    (KDA structure: the WY form with a's coefficient of k as beta; GLA: the gated form with the
    write key as key), or None for the general DPLR structure, which has no chunkwise reference."""
    from .evaluate import evaluate, spec_tensors
    from .symbols import beta as beta_sym, k as k_sym

    st = analyze_structure(spec).kind
    t = spec_tensors(spec, **x)
    if st == "kda":
        coef = evaluate(sp.simplify(spec.a / k_sym), {beta_sym: x["beta_"]} if x["beta_"] is not None else {})
        B, T, HV = t["log_decay"].shape[:3]
        coef = coef if isinstance(coef, torch.Tensor) else torch.full((B, T, HV), float(coef), dtype=torch.float64)
        kk = x["k_"].repeat_interleave(HV // x["k_"].shape[2], dim=2).double()
        return R.naive_chunk_kda(t["readout"], kk, x["v_"], t["log_decay"], coef.expand(B, T, HV), chunk_size=C, **kw)
    if st == "gla":
        return R.naive_chunk_gla(t["readout"], t["write_key"], x["v_"], t["log_decay"], chunk_size=C, **kw)
    return None


def spec_checks(spec: Recurrence, gen) -> list[tuple[str, str, float, float]]:
    """The checks of any spec, from its expressions alone (a user's as a member's): its chunkwise
    form against its own token-by-token recurrence (:func:`~kdagen.spec.evaluate.spec_recurrence`)
    on :data:`SHAPES`, a sequence split in two with the state carried equal to one call, and its
    gate's values inside the gate's range.  Rows (kind, case, value, tolerance)."""
    from .evaluate import gate_values, spec_recurrence

    rows = []
    for B, T, H, HV, K, V, C, varlen in SHAPES:
        cu = torch.tensor([0, 1, 33, 34, T], dtype=torch.long) if varlen else None
        N = 4 if varlen else B
        h0 = torch.randn(N, HV, K, V, generator=gen, dtype=torch.float64)
        x = _spec_inputs(spec, gen, B, T, H, HV, K, V)
        kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
        ref = spec_recurrence(spec, **x, **kw)
        got = _chunk_reference(spec, x, C, **kw)
        if got is None:
            break
        name = f"B={B} T={T} H={H} HV={HV} K={K} V={V} C={C}{' varlen' if varlen else ''}"
        rows.append(("spec: chunk vs rec.", name, max(_rel(got[0], ref[0]), _rel(got[1], ref[1])), TOL))
    # the state carried across a split: what prefill-then-decode and chunked prefill rely on
    B, T, H, HV, K, V, cut = 2, 23, 1, 2, 16, 8, 10
    x = _spec_inputs(spec, gen, B, T, H, HV, K, V)
    h0 = torch.randn(B, HV, K, V, generator=gen, dtype=torch.float64)
    whole = spec_recurrence(spec, **x, initial_state=h0, output_final_state=True)
    part = lambda sl: {n: (t[:, sl] if t is not None else None) for n, t in x.items()}  # noqa: E731
    first = spec_recurrence(spec, **part(slice(0, cut)), initial_state=h0, output_final_state=True)
    second = spec_recurrence(spec, **part(slice(cut, T)), initial_state=first[1], output_final_state=True)
    err = max(_rel(torch.cat([first[0], second[0]], 1), whole[0]), _rel(second[1], whole[1]))
    rows.append(("spec: state carry", f"T={T} split at {cut} == one call", err, TOL))
    if spec.gate is not None and spec.gate.name != "direct":
        lo, hi = spec.gate.range()
        if not (sp.sympify(lo).free_symbols or sp.sympify(hi).free_symbols):
            from .evaluate import random_gate_inputs

            raw, params, _ = random_gate_inputs(spec, 2, 64, 2, 16, gen)
            raw = torch.cat([raw, torch.full_like(raw[:, :1], -40.0), torch.full_like(raw[:, :1], 40.0)], 1)
            gv = gate_values(spec, raw, params)
            lo_f, hi_f = float(lo), float(hi)
            outside = ((gv < lo_f - 1e-12) | (gv > hi_f + 1e-12)).double().mean().item()
            rows.append(("spec: gate range", f"g in [{lo_f:g}, {hi_f:g}] on random and extreme z", outside, 0.0))
    return rows


_MEMBER_REFERENCE = {  # a member's hand-written recurrence, for "the spec equals its member's reference"
    "kda": lambda x, kw: R.naive_recurrent_kda(x["q_"], x["k_"], x["v_"], x["g_"], x["beta_"], **kw),
    "gdn": lambda x, kw: R.naive_recurrent_gdn(x["q_"], x["k_"], x["v_"], x["g_"], x["beta_"], **kw),
    "deltanet": lambda x, kw: R.naive_recurrent_deltanet(x["q_"], x["k_"], x["v_"], x["beta_"], **kw),
    "gla": lambda x, kw: R.naive_recurrent_gla(x["q_"], x["k_"], x["v_"], x["g_"], **kw),
    "dplr": lambda x, kw: R.naive_recurrent_dplr(x["q_"], x["k_"], x["v_"], x["a_"], x["b_"], x["g_"], **kw),
}


def member_reference_check(spec: Recurrence, gen) -> tuple[str, str, float, float]:
    """A member's spec, evaluated from its sympy expressions, against the member's hand-written
    float64 recurrence (GVA, an initial state)."""
    from .evaluate import spec_recurrence

    B, T, H, HV, K, V = 1, 29, 1, 2, 16, 8
    x = _spec_inputs(spec, gen, B, T, H, HV, K, V)
    kw = dict(initial_state=torch.randn(B, HV, K, V, generator=gen, dtype=torch.float64), output_final_state=True)
    got = spec_recurrence(spec, **x, **kw)
    ref = _MEMBER_REFERENCE[spec.name](x, kw)
    return ("spec vs reference", f"{spec.name}'s expressions == naive_recurrent_{spec.name}",
            max(_rel(got[0], ref[0]), _rel(got[1], ref[1])), TOL)


def run_verify(spec_name, gate: str | None = None, lower_bound: float | None = None, seed: int = 0,
               echo: Callable[[str], None] = print) -> bool:
    """Print the self-checks of a member (``spec_name`` a name: its hand-written references and
    the checks from its expressions) or of any spec (a :class:`Recurrence`, e.g. a user's: the
    checks from its expressions, :func:`spec_checks`); True when every check passes."""
    from .validate import lowering_status

    if isinstance(spec_name, Recurrence):
        spec, member = spec_name, False
    else:
        spec, member = get_spec(spec_name, gate=gate, lower_bound=lower_bound), True
    echo(spec.describe())
    st = analyze_structure(spec)
    bound = safe_sub_chunk(spec)
    echo(f"  structure  : {st.kind} ({st.reason})")
    echo(f"  sub-chunk  : {bound.length if bound.length else '-'} ({bound.reason})")
    ok_lower, what = lowering_status(spec)
    echo(f"  kernels    : {what if ok_lower else 'none: ' + what}")
    gen = torch.Generator().manual_seed(seed)
    rows: list[tuple[str, str, float, float]] = []
    if member:
        for name, err in chunk_vs_recurrence(spec, gen):
            rows.append(("chunk vs recurrence" if spec.name != "dplr" else "dplr(KDA a,b) vs KDA", name, err, TOL))
        if spec.name == "kda":
            for name, err in degenerate_cases(gen):
                rows.append(("degenerate", name, err, TOL))
            name, bad = symbolic_check()
            rows.append(("symbolic", name, bad, 0.0))
        rows.append(member_reference_check(spec, gen))
    if analyze_structure(spec).kind == "dplr":
        echo("  (the general DPLR structure has no chunkwise reference: its recurrence is checked by carrying "
             "the state across a split)")
    rows += spec_checks(spec, gen)
    ok = True
    echo("")
    echo(f"{'check':<22} {'case':<46} {'rel err':>10}  result")
    for kind, name, err, tol in rows:
        passed = err == err and err <= tol
        ok &= passed
        echo(f"{kind:<22} {name:<46} {err:>10.2e}  {'ok' if passed else 'FAIL'}")
    echo("")
    echo(f"{sum(1 for r in rows if r[2] <= r[3])} passed, {sum(1 for r in rows if not r[2] <= r[3])} failed")
    return ok
