"""The decode's lean body (RecurrentConfig.lean, templates/recurrent_lean.py.j2's lean_item).

The lean body runs a decode step's item (one token) as one straight-line step and every other item (no
token, or several) a few value columns of its tile at a time, each through all the item's tokens -- on the
batch grid in the item's own program, on the slot grid in row 0's programs (which also write the padding's
o, and the NaN o of sequences sharing a slot), so that a slot's program holds the step alone.  These tests
put items of 0, 1, 2 and 3 tokens in the same call, at tiles narrower than, equal to and wider than the
columns' width, on both state layouts, with and without the slot grid, and check every sequence against
the float64 recurrence; and the shared-slot NaN fill with the kept sequence's item of either kind."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import TOL, assert_close
from plain_configs import plain_decode

import kdagen
from kdagen.cache import heuristics
from kdagen.config import RecurrentConfig
from kdagen.ops import recurrent as R
from kdagen.spec.reference import naive_recurrent_kda

F32, F16 = torch.float32, torch.float16


@pytest.fixture(params=(True, False), ids=("slot-grid", "batch-grid"))
def grid(request, monkeypatch):
    """The slot grid forced on at the tests' few pairs, or kept off (the fast path's entries forgotten)."""
    monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", 1 if request.param else 10 ** 9)
    R._FAST.clear()
    yield request.param
    R._FAST.clear()


def _packed(lens, HV=2, K=16, V=16, P=7, dt=F32, seed=0, v_first=False):
    """Packed inputs for sequences of ``lens`` tokens, a pool of P slots ([P, HV, K, V], or [V, K] per
    head with v_first), and the pool as the recurrence sees it ([K, V])."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, T, HV, K, generator=gen)
    k = F.normalize(torch.randn(1, T, HV, K, generator=gen), dim=-1)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = -2 * torch.rand(1, T, HV, K, generator=gen)
    beta = torch.rand(1, T, HV, generator=gen)
    pool_kv = 0.3 * torch.randn(P, HV, K, V, generator=gen)
    pool = pool_kv.transpose(-1, -2).contiguous() if v_first else pool_kv.clone()
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    x = dict(q=q.to(dt), k=k.to(dt), v=v.to(dt), g=g, beta=beta.to(dt))
    return x, pool, pool_kv, cu


def _as_kv(pool, v_first):
    return pool.transpose(-1, -2) if v_first else pool


@pytest.mark.parametrize("v_first", (False, True), ids=("kv-pool", "vk-pool"))
@pytest.mark.parametrize("block_v", (1, 2, 8))
@pytest.mark.parametrize("dt", (F32, F16), ids=("fp32", "fp16"))
def test_items_of_every_length_in_one_call(grid, dt, block_v, v_first):
    """Sequences of 1, 0, 3, 1 and 2 tokens on scrambled slots of a pool (and one padding sequence of
    2 tokens): the decode steps' items take the straight-line step, the others the column path (its
    columns 1 or 2 at a time: min(2, block_v)), and every one gets the float64 recurrence's o and final
    state; the empty sequence's slot keeps its state, the padding sequence's o is 0, unused slots are
    not written."""
    lens = [1, 0, 3, 1, 2, 2]
    slots = torch.tensor([4, 0, 6, 2, 5, -1], dtype=torch.int32)
    x, pool, pool_kv, cu = _packed(lens, dt=dt, seed=block_v, v_first=v_first)
    cfg = RecurrentConfig(block_v=block_v, num_warps=1, readout="loaded", lean=True)
    out = torch.full(x["v"].shape, float("nan"), dtype=dt)
    for call in range(2):  # the second call goes through the fast path's entry
        p = pool.clone()
        out.fill_(float("nan"))
        o, ht = kdagen.fused_recurrent_kda(**x, initial_state=p, ssm_state_indices=slots, cu_seqlens=cu, out=out,
                                           config=cfg, state_v_first=v_first)
        assert o is out and ht is p
        got = _as_kv(p, v_first)
        for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            s = int(slots[n])
            if s < 0:
                assert torch.equal(o[:, a:b], torch.zeros_like(o[:, a:b])), f"call {call}: padding o is not 0"
                continue
            if a == b:
                assert torch.equal(got[s], pool_kv[s]), f"call {call}: the empty sequence's slot changed"
                continue
            ro, rh = naive_recurrent_kda(*(x[m][:, a:b] for m in ("q", "k", "v", "g", "beta")),
                                         initial_state=pool_kv[s][None], output_final_state=True)
            assert_close(o[:, a:b], ro, TOL[dt], f"call {call}: o of sequence {n} ({b - a} tokens)")
            assert_close(got[s], rh[0], TOL[dt], f"call {call}: the state of sequence {n} ({b - a} tokens)")
        unused = [1, 3]
        assert torch.equal(got[unused], pool_kv[unused]), f"call {call}: a slot no sequence uses was written"
    launch, *_ = R.fused_recurrent_kda_launch(**x, initial_state=pool.clone(), ssm_state_indices=slots,
                                              cu_seqlens=cu, config=cfg, state_v_first=v_first)
    assert launch.constexprs["SLOT_GRID"] is grid


@pytest.mark.parametrize("lens", ([1, 1, 1, 1], [2, 1, 3, 1]), ids=("decode-steps", "longer-items"))
def test_shared_slot_nan_on_both_paths(monkeypatch, lens):
    """Sequences 0 and 2 share slot 3 (the caller's error): the later one's state is kept and its o is the
    recurrence's, the earlier one's o is NaN -- whether the kept item is a decode step's (the slot's program's
    straight-line step) or longer (the column path: row 0's on the slot grid)."""
    monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", 1)
    R._FAST.clear()
    x, pool, pool_kv, cu = _packed(lens, P=5, seed=3)
    slots = torch.tensor([3, 1, 3, 0], dtype=torch.int32)
    out = torch.zeros(x["v"].shape)
    p = pool.clone()
    kdagen.fused_recurrent_kda(**x, initial_state=p, ssm_state_indices=slots, cu_seqlens=cu, out=out,
                               config=plain_decode(block_v=8, num_warps=1, lean=True))
    R._FAST.clear()
    b = cu.tolist()
    assert torch.isnan(out[:, b[0]:b[1]]).all(), "the earlier sequence on the shared slot: o is not NaN"
    assert torch.isfinite(out[:, b[1]:]).all()
    ro, rh = naive_recurrent_kda(*(x[m][:, b[2]:b[3]] for m in ("q", "k", "v", "g", "beta")),
                                 initial_state=pool_kv[3][None], output_final_state=True)
    assert_close(out[:, b[2]:b[3]], ro, TOL[F32], "the later sequence's o")
    assert_close(p[3], rh[0], TOL[F32], "the shared slot holds the later sequence's state")
