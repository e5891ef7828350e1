"""Exact symbolic proof (for one chunk of n = 3 tokens) that the chunkwise KDA / GLA formulas
used by kdagen.reference.naive_chunk_* equal the token-by-token recurrence.

Every input -- q, k, v, g, beta, the entering state S and the scale -- is a sympy symbol.  The
recurrence is written with exp(g_t); the chunkwise form with explicit exp(G_i - G_j).  To keep
``simplify`` fast, exponentials of sums are split and exp(g_td) is replaced by a positive symbol
e_td (a bijection onto the positive reals, so polynomial identities in e are identities in g).
Because I + A_kk is unit lower triangular, its inverse is polynomial and the difference reduces
to an exact polynomial that must vanish identically.
"""
from __future__ import annotations

import random

import pytest
import sympy as sp
import torch

from kdagen.spec.reference import naive_chunk_gla, naive_chunk_kda, naive_recurrent_gla, naive_recurrent_kda

N_TOK = 3


def _symbols(n, K, V):
    def mat(name, rows, cols):
        return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}_{j}", real=True))

    return dict(
        q=mat("q", n, K),
        k=mat("k", n, K),
        v=mat("v", n, V),
        g=mat("g", n, K),
        beta=[sp.Symbol(f"beta_{i}", real=True) for i in range(n)],
        S0=mat("S", K, V),
        scale=sp.Symbol("scale", positive=True),
    )


def _recurrence(sym, delta=True):
    q, k, v, g, beta, S, scale = (sym[x] for x in ("q", "k", "v", "g", "beta", "S0", "scale"))
    n, K = q.shape
    rows = []
    for t in range(n):
        D = sp.diag(*[sp.exp(g[t, d]) for d in range(K)])
        kt = k[t, :].T  # K x 1
        if delta:
            S = (sp.eye(K) - beta[t] * kt * kt.T) * D * S + beta[t] * kt * v[t, :]
        else:
            S = D * S + kt * v[t, :]
        rows.append((S.T * (scale * q[t, :].T)).T)
    return sp.Matrix.vstack(*rows), S


def _chunk(sym, delta=True, strict_kk=True, inclusive_G=True):
    """The chunkwise formulas; the keyword switches introduce deliberate mistakes for negative controls."""
    q, k, v, g, beta, S, scale = (sym[x] for x in ("q", "k", "v", "g", "beta", "S0", "scale"))
    n, K = q.shape
    if inclusive_G:
        G = sp.Matrix(n, K, lambda i, d: sum(g[t, d] for t in range(i + 1)))
    else:
        G = sp.Matrix(n, K, lambda i, d: sum(g[t, d] for t in range(i)))
    Gam = G.applyfunc(sp.exp)

    def akk(i, j):
        ok = j < i if strict_kk else j <= i
        return beta[i] * sum(k[i, d] * k[j, d] * sp.exp(G[i, d] - G[j, d]) for d in range(K)) if ok else 0

    def aqk(i, j):
        return scale * sum(q[i, d] * k[j, d] * sp.exp(G[i, d] - G[j, d]) for d in range(K)) if j <= i else 0

    A_qk = sp.Matrix(n, n, aqk)
    if delta:
        A_kk = sp.Matrix(n, n, akk)
        Tm = (sp.eye(n) + A_kk).inv() * sp.diag(*beta)
        W = Tm * k.multiply_elementwise(Gam)
        U = Tm * v
        Vp = U - W * S
    else:
        Vp = v
    O = scale * q.multiply_elementwise(Gam) * S + A_qk * Vp
    Gn = G[n - 1, :]
    decay_to_end = sp.Matrix(n, K, lambda i, d: sp.exp(Gn[d] - G[i, d]))
    S_new = sp.diag(*[sp.exp(Gn[d]) for d in range(K)]) * S + k.multiply_elementwise(decay_to_end).T * Vp
    return O, S_new


def _exp_to_positive_symbols(expr, sym):
    n, K = sym["g"].shape
    e = {sp.exp(sym["g"][t, d]): sp.Symbol(f"e_{t}_{d}", positive=True) for t in range(n) for d in range(K)}
    out = sp.expand(expr, power_exp=True).xreplace(e)
    assert not out.atoms(sp.exp), f"exponentials left after substitution: {out.atoms(sp.exp)}"
    return out


def _differences(sym, delta, **mistakes):
    O_r, S_r = _recurrence(sym, delta)
    O_c, S_c = _chunk(sym, delta, **mistakes)
    assert O_r.shape == O_c.shape and S_r.shape == S_c.shape
    return [sp.simplify(_exp_to_positive_symbols(a - b, sym)) for a, b in zip(list(O_r) + list(S_r), list(O_c) + list(S_c))]


@pytest.mark.parametrize("KV", [1, 2])
@pytest.mark.parametrize("delta", [True, False], ids=["kda", "gla"])
def test_chunkwise_equals_recurrence_symbolically(KV, delta):
    sym = _symbols(N_TOK, KV, KV)
    diffs = _differences(sym, delta)
    assert len(diffs) == N_TOK * KV + KV * KV
    for dexpr in diffs:
        assert sp.simplify(dexpr) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "mistake", [dict(strict_kk=False), dict(inclusive_G=False)], ids=["A_kk_with_diagonal", "exclusive_cumsum"]
)
def test_symbolic_check_detects_wrong_chunk_formulas(mistake):
    # negative control: the same machinery must reject subtly wrong chunk formulas
    sym = _symbols(N_TOK, 1, 1)
    diffs = _differences(sym, True, **mistake)
    assert any(sp.simplify(dexpr) != 0 for dexpr in diffs)


@pytest.mark.parametrize("delta", [True, False], ids=["kda", "gla"])
def test_symbolic_expressions_match_numeric_reference(delta):
    """Evaluate the symbolic recurrence at random numbers and compare with the float64 code."""
    K = V = 2
    sym = _symbols(N_TOK, K, V)
    O_r, S_r = _recurrence(sym, delta)
    rng = random.Random(1234)
    vals = {}
    num = {}
    for name in ("q", "k", "v", "S0"):
        M = sym[name]
        num[name] = [[rng.uniform(-1, 1) for _ in range(M.shape[1])] for _ in range(M.shape[0])]
        vals.update({M[i, j]: num[name][i][j] for i in range(M.shape[0]) for j in range(M.shape[1])})
    num["g"] = [[rng.uniform(-5, 0) for _ in range(K)] for _ in range(N_TOK)]
    vals.update({sym["g"][i, j]: num["g"][i][j] for i in range(N_TOK) for j in range(K)})
    num["beta"] = [rng.uniform(0, 1) for _ in range(N_TOK)]
    vals.update(dict(zip(sym["beta"], num["beta"])))
    scale = 0.61
    vals[sym["scale"]] = scale

    O_exp = torch.tensor([[float(O_r[i, j].evalf(30, subs=vals)) for j in range(V)] for i in range(N_TOK)], dtype=torch.float64)
    S_exp = torch.tensor([[float(S_r[i, j].evalf(30, subs=vals)) for j in range(V)] for i in range(K)], dtype=torch.float64)

    f64 = dict(dtype=torch.float64)
    q = torch.tensor(num["q"], **f64).reshape(1, N_TOK, 1, K)
    k = torch.tensor(num["k"], **f64).reshape(1, N_TOK, 1, K)
    v = torch.tensor(num["v"], **f64).reshape(1, N_TOK, 1, V)
    g = torch.tensor(num["g"], **f64).reshape(1, N_TOK, 1, K)
    beta = torch.tensor(num["beta"], **f64).reshape(1, N_TOK, 1)
    h0 = torch.tensor(num["S0"], **f64).reshape(1, 1, K, V)
    kw = dict(scale=scale, initial_state=h0, output_final_state=True)
    if delta:
        runs = [naive_recurrent_kda(q, k, v, g, beta, **kw), naive_chunk_kda(q, k, v, g, beta, chunk_size=N_TOK, **kw)]
        runs.append(naive_chunk_kda(q, k, v, g, beta, chunk_size=2, **kw))
    else:
        runs = [naive_recurrent_gla(q, k, v, g, **kw), naive_chunk_gla(q, k, v, g, chunk_size=N_TOK, **kw)]
        runs.append(naive_chunk_gla(q, k, v, g, chunk_size=2, **kw))
    for o, S in runs:
        assert torch.allclose(o[0, :, 0], O_exp, rtol=1e-12, atol=1e-14)
        assert torch.allclose(S[0, 0], S_exp, rtol=1e-12, atol=1e-14)
