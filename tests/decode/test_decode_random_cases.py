"""A seeded, randomized differential test of the decode op with a state pool: ``kdagen.fused_recurrent_kda``
against the float64 recurrence (``kdagen.spec.reference.naive_recurrent_kda``), over its three launch paths:

* ``slot``: the slot grid (programs over the pool's slots, kdagen.cache.heuristics.slot_grid), forced at the
  interpreter's few pairs by lowering SLOT_GRID_MIN_PAIRS (and raising SLOT_GRID_MAX_RATIO, so a pool of
  more than twice the sequences takes it too);
* ``batch``: one program per (V tile, sequence, value head) (the heuristic's threshold raised out of reach);
* ``persistent``: RecurrentConfig.programs_per_sm > 0 (num_warps >= 2; num_stages 2 or 3: Triton's pipelined
  item loop), with the slot grid's threshold lowered as well: persistent programs must not take it.

Each seed draws one case (the same inputs for the three paths): 1..5 sequences, H in 1..2 q/k heads and
HV = H or 2H value heads (GVA), K, V in {16, 32}, a pool of N..N+3 float32 slots ([P, HV, K, V], or
[P, HV, V, K] with state_v_first), distinct slots from a permutation with some replaced by padding
(negative, or >= P up to 2**31 - 1, and with int64 indices past 2**32), packed varlen (0..3 tokens per
sequence through cu_seqlens, q of shape [1, T, H, K]) or the batch form ([N, T, H, K], T in 1..2),
fp32 or fp16 inputs, g in (-2, 0] with some channels of some tokens at -inf (a reset, which the docstring
promises), l2-normalised k, beta in (0, 1), the default or a random scale, either readout, block_v in
{4, 8, 16, 32} up to V (the narrow tiles of a [V, K] pool, each a contiguous block, among them); a third of the
slot and batch paths' cases take the lean body (RecurrentConfig.lean: no masks, a one-token item straight-line,
other lengths two value columns at a time).

Each case is called twice (the second call goes through the fast path's entry), the pool reset and
``out=`` filled with NaN before each call, and checked: every valid sequence's o and its slot's new state
against the float64 recurrence from that slot's state over that sequence's own tokens (conftest's TOL per
dtype, per sequence and per slot), every padding sequence's o exactly 0, every slot no valid sequence
uses bit-identical, ``out`` returned as o and the pool as the final state.  The launch's path (slot grid
or not, persistent grid) is checked on the launch description too, so a case id says which kernel ran.

Reproduce one case:
``python -m pytest -q "tests/decode/test_decode_random_cases.py::test_random_decode_case[seed7-slot]"``;
``describe(draw(7))`` prints its draw."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import TOL, assert_close
from random_draws import integer as _int, pick as _pick, uniform as _u

import kdagen
from kdagen.cache import heuristics
from kdagen.config import RecurrentConfig
from kdagen.ops import recurrent as R
from kdagen.spec.reference import naive_recurrent_kda

F32, F16, F64 = torch.float32, torch.float16, torch.float64
SEEDS = range(64)  # x 3 paths = 192 cases, ~65 s in the interpreter on 2 CPUs (narrow tiles: more programs)
PATHS = ("slot", "batch", "persistent")


def draw(seed: int) -> dict:
    """The case of ``seed``: its shapes, slots, inputs and pool (independent of the path)."""
    gen = torch.Generator().manual_seed(7919 * seed + 13)
    N = _int(gen, 1, 5)
    H = _int(gen, 1, 2)
    HV = H * _int(gen, 1, 2)
    K, V = _pick(gen, (16, 32)), _pick(gen, (16, 32))
    P = N + _int(gen, 0, 3)
    dt = _pick(gen, (F32, F16))
    idx_dtype = _pick(gen, (torch.int32, torch.int64))
    varlen = _u(gen) < 0.5
    v_first = _u(gen) < 0.4  # the [V, K] pool: the layout whose narrow tiles are contiguous
    # distinct slots from a permutation of the pool; some of them replaced by padding
    slots = torch.randperm(P, generator=gen)[:N].tolist()
    pads = [-1, -2, -(2 ** 31) + 1, P, P + 3, 2 ** 31 - 1] + ([2 ** 32 + 1, -(2 ** 40)] if idx_dtype == torch.int64 else [])
    for n in range(N):
        if _u(gen) < 0.3:
            slots[n] = _pick(gen, pads)
    if varlen:
        lens = [_int(gen, 0, 3) for _ in range(N)]
    else:
        lens = [_int(gen, 1, 2)] * N
    valid = [0 <= s < P for s in slots]
    if not any(v and n_tok > 0 for v, n_tok in zip(valid, lens)):
        # at least one valid sequence with a token (else o would have nothing to compare)
        m = _int(gen, 0, N - 1)
        slots[m] = next(s for s in torch.randperm(P, generator=gen).tolist() if s not in slots)
        valid[m] = True
        if varlen:
            lens[m] = max(lens[m], 1)
    if varlen:
        T = sum(lens)
        shape = (1, T)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
    else:
        shape = (N, lens[0])
        cu = None
    q = torch.randn(*shape, H, K, generator=gen)
    k = F.normalize(torch.randn(*shape, H, K, generator=gen), p=2, dim=-1)
    v = torch.randn(*shape, HV, V, generator=gen)
    g = -2 * torch.rand(*shape, HV, K, generator=gen)
    n_inf = 0
    if _u(gen) < 0.4:  # resets: some channels of one (token, value head) at -inf
        b, t = _int(gen, 0, shape[0] - 1), _int(gen, 0, shape[1] - 1)
        hv = _int(gen, 0, HV - 1)
        ch = torch.randperm(K, generator=gen)[:_int(gen, 1, K)]
        g[b, t, hv, ch] = float("-inf")
        n_inf = len(ch)
    beta = 0.02 + 0.96 * torch.rand(*shape, HV, generator=gen)
    pool_kv = 0.3 * torch.randn(P, HV, K, V, generator=gen)
    scale = None if _u(gen) < 0.5 else 0.2 + 0.8 * _u(gen)
    readout = _pick(gen, ("updated", "loaded"))
    block_v = _pick(gen, tuple(b for b in (4, 8, 16, 32) if b <= V))
    x = dict(q=q.to(dt), k=k.to(dt), v=v.to(dt), g=g, beta=beta.to(dt))
    return dict(seed=seed, N=N, H=H, HV=HV, K=K, V=V, P=P, dt=dt, idx_dtype=idx_dtype, varlen=varlen,
                v_first=v_first, slots=slots, lens=lens, cu=cu, x=x, n_inf=n_inf, pool_kv=pool_kv, scale=scale,
                readout=readout, block_v=block_v)


def config_for(case: dict, path: str) -> RecurrentConfig:
    gen = torch.Generator().manual_seed(1000 * case["seed"] + PATHS.index(path))
    if path == "persistent":
        return RecurrentConfig(block_v=case["block_v"], readout=case["readout"], num_warps=_pick(gen, (2, 4)),
                               programs_per_sm=_pick(gen, (1, 2, 4)), num_stages=_pick(gen, (2, 3)))
    # one-item programs, a V tile each; every third case takes the lean body (decided by the seed, so the draws
    # above are unchanged)
    warps = _pick(gen, (1, 2, 4))
    return RecurrentConfig(block_v=case["block_v"], readout=case["readout"], num_warps=warps,
                           lean=(case["seed"] + PATHS.index(path)) % 3 == 0)


def describe(case: dict, path: str | None = None) -> str:
    s = (f"seed {case['seed']}: N={case['N']} H={case['H']} HV={case['HV']} K={case['K']} V={case['V']} "
         f"P={case['P']} {str(case['dt'])[6:]} {'varlen lens=' + str(case['lens']) if case['varlen'] else 'batch T=' + str(case['lens'][0])} "
         f"slots={case['slots']} ({str(case['idx_dtype'])[6:]}) v_first={case['v_first']} scale={case['scale']} "
         f"-inf channels={case['n_inf']}")
    return s if path is None else f"{s}; {path}: {config_for(case, path)}"


def _token_rows(case, n):
    """Sequence n's tokens: (batch index, token slice)."""
    if case["varlen"]:
        a = sum(case["lens"][:n])
        return 0, slice(a, a + case["lens"][n])
    return n, slice(0, case["lens"][0])


def expected(case):
    """Per valid sequence with tokens, (o, final state) of the float64 recurrence from its slot's state."""
    x, pool_kv = case["x"], case["pool_kv"]
    want = {}
    for n, s in enumerate(case["slots"]):
        if not 0 <= s < case["P"] or case["lens"][n] == 0:
            continue
        b, ts = _token_rows(case, n)
        ro, rh = naive_recurrent_kda(*(x[m][b:b + 1, ts] for m in ("q", "k", "v", "g", "beta")), scale=case["scale"],
                                     initial_state=pool_kv[s][None].to(F64), output_final_state=True)
        want[n] = (ro[0], rh[0])
    return want


@pytest.fixture
def path_heuristics(monkeypatch):
    """Sets the slot grid's thresholds for a path (the fast path's entries forgotten before and after)."""
    def set_path(path):
        if path == "batch":
            monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", 10 ** 9)
        else:  # (persistent programs must ignore it)
            monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", 1)
            monkeypatch.setattr(heuristics, "SLOT_GRID_MAX_RATIO", 10 ** 6)
        R._FAST.clear()
    yield set_path
    R._FAST.clear()


CASES = [pytest.param(seed, path, id=f"seed{seed}-{path}") for seed in SEEDS for path in PATHS]


@pytest.mark.parametrize(("seed", "path"), CASES)
def test_random_decode_case(path_heuristics, seed, path):
    case = draw(seed)
    path_heuristics(path)
    cfg = config_for(case, path)
    what = describe(case, path)
    x, P, HV, V, dt = case["x"], case["P"], case["HV"], case["V"], case["dt"]
    pool_kv = case["pool_kv"]
    pool0 = pool_kv.transpose(-1, -2).contiguous() if case["v_first"] else pool_kv.clone()
    slots = torch.tensor(case["slots"], dtype=case["idx_dtype"])
    kw = dict(scale=case["scale"], cu_seqlens=case["cu"], ssm_state_indices=slots, state_v_first=case["v_first"],
              config=cfg)

    # the launch this path describes (nothing runs)
    launch, *_ = R.fused_recurrent_kda_launch(**x, initial_state=pool0.clone(), **kw)
    nv = -(-V // min(case["block_v"], V))
    if path == "slot":
        assert launch.constexprs["SLOT_GRID"] and launch.grid == (nv, (P + 1) * HV), what
    elif path == "batch":
        assert not launch.constexprs["SLOT_GRID"] and launch.grid == (nv, case["N"] * HV), what
    else:
        assert not launch.constexprs["SLOT_GRID"], what
        assert launch.grid == (min(nv * case["N"] * HV, cfg.programs_per_sm),), what  # (one "SM" on the CPU)

    want = expected(case)
    used = {s for s in case["slots"] if 0 <= s < P}
    unused = [s for s in range(P) if s not in used]
    out = torch.empty(x["v"].shape, dtype=dt)
    p = torch.empty_like(pool0)
    for call in range(2):  # the second call goes through the fast path's entry
        p.copy_(pool0)
        out.fill_(float("nan"))  # every row must be written
        o, ht = kdagen.fused_recurrent_kda(**x, initial_state=p, out=out, **kw)
        at = f"{what}; call {call}"
        assert o is out and ht is p, at
        assert o.dtype == dt
        got_pool = p.transpose(-1, -2) if case["v_first"] else p
        for n, s in enumerate(case["slots"]):
            b, ts = _token_rows(case, n)
            rows = o[b, ts]
            if not 0 <= s < P:
                assert torch.equal(rows, torch.zeros_like(rows)), f"{at}: padding sequence {n} (slot {s}): o != 0"
            elif n in want:
                ro, rh = want[n]
                assert_close(rows, ro, TOL[dt], f"{at}: o of sequence {n} (slot {s})")
                assert_close(got_pool[s], rh, TOL[dt], f"{at}: pool slot {s} (sequence {n})")
            else:  # a valid sequence without tokens: its state passes through unchanged
                assert torch.equal(got_pool[s], pool_kv[s]), f"{at}: pool slot {s} (empty sequence {n}) changed"
        assert torch.equal(p[unused], pool0[unused]), f"{at}: a slot no valid sequence uses was written"
        assert len(R._FAST) == 1, f"{at}: the fast path's entry"
