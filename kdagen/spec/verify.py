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


def run_verify(spec_name: str, gate: str | None, lower_bound: float | None, seed: int = 0,
               echo: Callable[[str], None] = print) -> bool:
    spec = get_spec(spec_name, gate=gate, lower_bound=lower_bound)
    echo(spec.describe())
    st = analyze_structure(spec)
    bound = safe_sub_chunk(spec)
    echo(f"  structure  : {st.kind} ({st.reason})")
    echo(f"  sub-chunk  : {bound.length if bound.length else '-'} ({bound.reason})")
    gen = torch.Generator().manual_seed(seed)
    rows: list[tuple[str, str, float, float]] = []
    for name, err in chunk_vs_recurrence(spec, gen):
        rows.append(("chunk vs recurrence" if spec.name != "dplr" else "dplr(KDA a,b) vs KDA", name, err, TOL))
    if spec.name == "kda":
        for name, err in degenerate_cases(gen):
            rows.append(("degenerate", name, err, TOL))
        name, bad = symbolic_check()
        rows.append(("symbolic", name, bad, 0.0))
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
