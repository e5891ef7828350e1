"""A seeded, randomized differential test of the prefill op ``kdagen.chunk_kda`` (inference forward only:
no input requires grad) against the float64 recurrence ``kdagen.spec.reference.naive_recurrent_kda``.

Each seed draws one case:

* layout: packed varlen (1..3 sequences of 0..70 tokens through ``cu_seqlens``, q of shape [1, T, H, K];
  lengths biased towards 0, 1 and the chunk boundaries 31..33 / 63..65, at least one sequence with tokens
  since chunk_kda refuses T = 0; ``cu_seqlens_cpu`` given in half of them) or the batch form ([B, T, H, K],
  B in 1..3, T in 1..70);
* H in 1..2 q/k heads, HV = H or 2H value heads (GVA), K, V in {16, 32}, fp32 or fp16 q/k/v/beta
  (g and the states float32);
* the gate: g = -mag * U[0, 1) with mag in {0.05, 1, 5} (and 8 without a promise, past the factorised
  sub-tiles' budget), ``safe_gate=True, lower_bound=-5`` in about half the draws, and in some draws a few
  specials: entries exactly at -5, below it (-8 on a run of tokens, -20 on one) or -inf (one token of one
  head, some channels of another) -- with the promise too, which the docstring says the inference kernels
  do not rely on;
* beta in (0.02, 0.98), some draws with entries exactly 0 and 1;
* ``use_qk_l2norm_in_kernel`` in about a third (then q, k are raw, of random norms, and the reference reads
  the float64 l2-normalised rounded inputs; otherwise k is l2-normalised before rounding);
* the default scale or a random one in [0.1, 1.1);
* a random initial state (or none), ``output_final_state`` or not, ``state_v_first`` in a fifth;
* the chunk config: the op's default, the ``chunk_size=`` keyword (32 / 64), or a ``ChunkFwdConfig`` with
  chunk_size 32 / 64 and random state_block_v, state_prefetch, state_num_stages, solve_load_ahead,
  factor_precision, inverse_precision and state_segment_chunks (0 or 2: the sequence-parallel pass).
  fp16 inputs never take the bf16 inverse (Triton's interpreter cannot run bf16 operands; the heuristic
  takes tf32 for fp16 as well).

Checks: o's dtype and shape, the final state's (None without ``output_final_state``), and per sequence
(per batch row in the batch form) o and the final state against the float64 recurrence from that
sequence's initial state over its own tokens (conftest's TOL and assert_close per dtype); an empty
sequence's final state must equal its initial state bit for bit (zero without one); the inputs are not
modified.

Reproduce one case: ``python -m pytest -q tests/chunk/test_chunk_random_cases.py -k "seed7-"`` (or its full id,
``test_random_chunk_case[seed7-...]``; the id's suffix only summarises the draw: the seed alone determines it);
``print(describe(draw(7)))`` prints the draw, every option and the config.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import TOL, assert_close
from random_draws import integer as _int, pick as _pick, uniform as _u

import kdagen
from kdagen.config import ChunkFwdConfig
from kdagen.spec.reference import naive_recurrent_kda

F32, F16, F64 = torch.float32, torch.float16, torch.float64
SEEDS = range(56)  # ~30 s in the interpreter on 2 CPUs (~45 s with a CI run beside it)
LB = -5.0
NEG_INF = float("-inf")


def _length(gen, lo):
    """A sequence length in [lo, 70]: uniform, or one at a chunk boundary (or 0 / 1)."""
    if _u(gen) < 0.4:
        return max(lo, _pick(gen, (0, 1, 31, 32, 33, 63, 64, 65)))
    return _int(gen, max(lo, 1), 70)


def _config(gen, dt):
    """(kind, chunk_size keyword, ChunkFwdConfig or None)."""
    kind = _pick(gen, ("default", "keyword", "config", "config"))
    if kind == "default":
        return kind, None, None
    C = _pick(gen, (32, 64))
    if kind == "keyword":
        return kind, C, None
    inv = _pick(gen, ("tf32", "ieee") if dt == F16 else ("bf16", "tf32", "ieee"))
    cfg = ChunkFwdConfig(chunk_size=C, state_block_v=_pick(gen, (16, 32, 64)), state_prefetch=_u(gen) < 0.5,
                         state_num_stages=_int(gen, 1, 3), solve_load_ahead=_int(gen, 0, 2),
                         factor_precision=_pick(gen, ("input", "fp32")), inverse_precision=inv,
                         state_segment_chunks=_pick(gen, (0, 0, 2)))
    return kind, None, cfg


def _specials(gen, g, lens_rows):
    """Put a few gate values at the bound, below it or at -inf (in place); returns what was done."""
    HV, K = g.shape[2], g.shape[3]
    done = []
    if _u(gen) < 0.3:  # a plain gate
        return done
    lens_rows = [(b, ts) for b, ts in lens_rows if ts.stop > ts.start]
    for kind in ("at_lb", "below", "neginf"):
        if _u(gen) >= 0.5:
            continue
        b, ts = _pick(gen, lens_rows)
        t = _int(gen, ts.start, ts.stop - 1)
        hv = _int(gen, 0, HV - 1)
        if kind == "at_lb":
            n = _int(gen, 1, 6)
            for _ in range(n):  # scattered entries of the sequence exactly at the bound
                g[b, _int(gen, ts.start, ts.stop - 1), _int(gen, 0, HV - 1), _int(gen, 0, K - 1)] = LB
            if _u(gen) < 0.5:  # and a run of whole tokens of one head at it
                g[b, t:min(ts.stop, t + 16), hv] = LB
            done.append(f"at_lb({n}+run)")
        elif kind == "below":
            run = _int(gen, 1, 20)
            g[b, t:min(ts.stop, t + run), hv] = -8.0  # a run at -8 (past a 16-row sub-tile's budget of 81)
            t2 = _int(gen, ts.start, ts.stop - 1)
            g[b, t2, _int(gen, 0, HV - 1), :_int(gen, 1, K)] = -20.0
            done.append(f"below(-8x{run}@{t},-20@{t2})")
        else:
            g[b, t, hv] = NEG_INF  # a reset of one head at one token
            t2 = _int(gen, ts.start, ts.stop - 1)
            ch = torch.randperm(K, generator=gen)[:_int(gen, 1, K)]
            g[b, t2, _int(gen, 0, HV - 1), ch] = NEG_INF  # and of some channels of another
            done.append(f"-inf(@{t},{len(ch)}ch@{t2})")
    return done


def draw(seed: int) -> dict:
    """The case of ``seed``: shapes, inputs and options."""
    gen = torch.Generator().manual_seed(7919 * seed + 29)
    varlen = _u(gen) < 0.6
    N = _int(gen, 1, 3)
    H = _int(gen, 1, 2)
    HV = H * _int(gen, 1, 2)
    K, V = _pick(gen, (16, 32)), _pick(gen, (16, 32))
    dt = _pick(gen, (F32, F16))
    if varlen:
        lens = [0 if _u(gen) < 0.2 else _length(gen, 1) for _ in range(N)]
        if sum(lens) == 0:
            lens[_int(gen, 0, N - 1)] = _length(gen, 1)
        shape = (1, sum(lens))
        cu = [0] + torch.tensor(lens).cumsum(0).tolist()
        rows = [(0, slice(a, b)) for a, b in zip(cu, cu[1:])]
    else:
        T = _length(gen, 1)
        lens = [T] * N
        shape = (N, T)
        cu = None
        rows = [(n, slice(0, T)) for n in range(N)]
    l2norm = _u(gen) < 0.35
    if l2norm:  # raw q and k of random norms: the kernel normalises them
        q = (0.3 + 2.7 * _u(gen)) * torch.randn(*shape, H, K, generator=gen)
        k = (0.3 + 2.7 * _u(gen)) * torch.randn(*shape, H, K, generator=gen)
    else:
        q = torch.randn(*shape, H, K, generator=gen)
        k = F.normalize(torch.randn(*shape, H, K, generator=gen), p=2, dim=-1)
    v = torch.randn(*shape, HV, V, generator=gen)
    safe = _u(gen) < 0.5
    mag = _pick(gen, (0.05, 1.0, 5.0) if safe else (0.05, 1.0, 5.0, 8.0))
    g = -mag * torch.rand(*shape, HV, K, generator=gen)
    specials = _specials(gen, g, rows)
    beta = 0.02 + 0.96 * torch.rand(*shape, HV, generator=gen)
    beta01 = _u(gen) < 0.3
    if beta01:
        flat = beta.view(-1)
        flat[_int(gen, 0, 6)::7] = 0.0
        flat[_int(gen, 0, 10)::11] = 1.0
    h0 = (0.3 + 0.7 * _u(gen)) * torch.randn(N, HV, K, V, generator=gen) if _u(gen) < 0.6 else None
    final = _u(gen) < 0.7
    v_first = _u(gen) < 0.2
    scale = None if _u(gen) < 0.5 else 0.1 + _u(gen)
    host_cu = varlen and _u(gen) < 0.5
    cfg_kind, chunk_size, cfg = _config(gen, dt)
    x = dict(q=q.to(dt), k=k.to(dt), v=v.to(dt), g=g, beta=beta.to(dt))
    return dict(seed=seed, varlen=varlen, N=N, H=H, HV=HV, K=K, V=V, dt=dt, lens=lens, rows=rows,
                cu=None if cu is None else torch.tensor(cu, dtype=torch.int64), host_cu=host_cu, l2norm=l2norm,
                safe=safe, mag=mag, specials=specials, beta01=beta01, h0=h0, final=final, v_first=v_first,
                scale=scale, cfg_kind=cfg_kind, chunk_size=chunk_size, cfg=cfg, x=x)


def case_id(case: dict) -> str:
    lay = f"varlen{'-'.join(map(str, case['lens']))}" if case["varlen"] else f"B{case['N']}T{case['lens'][0]}"
    parts = [f"seed{case['seed']}", lay, f"h{case['H']}x{case['HV']}", f"k{case['K']}v{case['V']}",
             "f16" if case["dt"] == F16 else "f32", "safe" if case["safe"] else "free"]
    if case["specials"]:
        parts.append("sp" + "".join(s[0] if s[0] != "-" else "i" for s in case["specials"]))
    if case["l2norm"]:
        parts.append("l2")
    if case["h0"] is not None:
        parts.append("h0")
    if case["final"]:
        parts.append("ht")
    if case["v_first"]:
        parts.append("vfirst")
    parts.append(case["cfg_kind"] + ("" if case["chunk_size"] is None else str(case["chunk_size"])))
    return "-".join(parts)


def describe(case: dict) -> str:
    lay = f"varlen lens={case['lens']}" if case["varlen"] else f"batch B={case['N']} T={case['lens'][0]}"
    return (f"seed {case['seed']}: {lay}"
            f" H={case['H']} HV={case['HV']} K={case['K']} V={case['V']} {str(case['dt'])[6:]}"
            f" safe_gate={case['safe']} g=-{case['mag']}*U specials={case['specials']} beta01={case['beta01']}"
            f" l2norm={case['l2norm']} scale={case['scale']} h0={case['h0'] is not None}"
            f" output_final_state={case['final']} state_v_first={case['v_first']}"
            f" cu_seqlens_cpu={case['host_cu']} chunk_size={case['chunk_size']} config={case['cfg']}")


def expected(case: dict):
    """Per sequence, (o, final state) of the float64 recurrence over its own tokens from its initial state."""
    x = case["x"]
    q, k = x["q"].to(F64), x["k"].to(F64)
    if case["l2norm"]:
        q, k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
    ref = dict(q=q, k=k, v=x["v"].to(F64), g=x["g"].to(F64), beta=x["beta"].to(F64))
    want = []
    for n, (b, ts) in enumerate(case["rows"]):
        h0 = None if case["h0"] is None else case["h0"][n:n + 1].to(F64)
        if ts.stop == ts.start:
            want.append(None)
            continue
        ro, rh = naive_recurrent_kda(*(ref[m][b:b + 1, ts] for m in ("q", "k", "v", "g", "beta")),
                                     scale=case["scale"], initial_state=h0, output_final_state=True)
        want.append((ro[0], rh[0]))
    return want


def _close(out, ref, tol, what):
    """assert_close, or exactly zero where the reference is (a reset with beta = 0 can leave nothing)."""
    if ref.abs().max().item() == 0:
        assert torch.equal(out, torch.zeros_like(out)), f"{what}: the reference is zero, got max {out.abs().max()}"
    else:
        assert_close(out, ref, tol, what)


CASES = [pytest.param(seed, id=case_id(draw(seed))) for seed in SEEDS]


@pytest.mark.parametrize("seed", CASES)
def test_random_chunk_case(seed):
    case = draw(seed)
    what = describe(case)
    x, dt, N, HV, K, V = case["x"], case["dt"], case["N"], case["HV"], case["K"], case["V"]
    h0 = case["h0"]
    h0_arg = None if h0 is None else (h0.transpose(-1, -2).contiguous() if case["v_first"] else h0.clone())
    h0_before = None if h0_arg is None else h0_arg.clone()
    x_before = {n: t.clone() for n, t in x.items()}
    kw = dict(scale=case["scale"], initial_state=h0_arg, output_final_state=case["final"],
              use_qk_l2norm_in_kernel=case["l2norm"], state_v_first=case["v_first"], cu_seqlens=case["cu"],
              config=case["cfg"], chunk_size=case["chunk_size"])
    if case["safe"]:
        kw.update(safe_gate=True, lower_bound=LB)
    if case["host_cu"]:
        kw["cu_seqlens_cpu"] = case["cu"].clone()
    with torch.no_grad():
        o, ht = kdagen.chunk_kda(**x, **kw)

    assert o.dtype == dt and tuple(o.shape) == tuple(x["v"].shape), f"{what}: o {o.dtype} {tuple(o.shape)}"
    if case["final"]:
        want_shape = (N, HV, V, K) if case["v_first"] else (N, HV, K, V)
        assert ht is not None and ht.dtype == F32 and tuple(ht.shape) == want_shape, \
            f"{what}: final state {None if ht is None else (ht.dtype, tuple(ht.shape))}"
        hts = ht.transpose(-1, -2) if case["v_first"] else ht
    else:
        assert ht is None, f"{what}: a final state without output_final_state"
    tol = TOL[dt]
    for n, ((b, ts), want) in enumerate(zip(case["rows"], expected(case))):
        if want is None:  # an empty sequence: its state passes through
            if case["final"]:
                h_in = torch.zeros(HV, K, V) if h0 is None else h0[n]
                assert torch.equal(hts[n], h_in), f"{what}: final state of empty sequence {n} != its initial state"
            continue
        ro, rh = want
        _close(o[b, ts], ro, tol, f"{what}: o of sequence {n}")
        if case["final"]:
            _close(hts[n], rh, tol, f"{what}: final state of sequence {n}")
    for n, t in x.items():
        assert torch.equal(t, x_before[n]), f"{what}: chunk_kda modified {n}"
    if h0_arg is not None:
        assert torch.equal(h0_arg, h0_before), f"{what}: chunk_kda modified initial_state"
