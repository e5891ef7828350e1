"""bench/decode_structure_probe.py on the CPU (Triton's interpreter): the probe's decode kernels
(the one-pass tile without masks, the two-pass chunk stream, the programs over the pool's slots and
their tail on narrower tiles) against the float64 recurrence, and its
pure-traffic kernels (flat blocks, [BR, BC] blocks, chunk loops, the held tile) scale exactly the
slots the sequences use, once, and nothing else -- so a probe row times the traffic it names."""
from __future__ import annotations

import pytest
import torch
from bench_script import load_bench


@pytest.fixture(scope="module")
def probe():
    return load_bench("decode_structure_probe")


def test_probe_decode_kernels_match_float64(probe, capsys):
    probe.smoke()  # asserts each kernel's o and state within 1e-5 of the float64 recurrence
    out = capsys.readouterr().out
    assert out.count("decode_two_pass") == 3 and out.count("decode_one_pass") == 2 and "smoke: ok" in out
    assert out.count("decode_slot_grid") == 2 and out.count("decode_slot_tail") == 2  # (session 30's kernels)
    assert out.count("decode_vk_loop") == 9  # (session 32's: a [V, K] pool, G tiles per program; 34: prefetched)
    assert out.count("prefetch=1") == 3 and out.count("prefetch=2") == 2


def test_pure_traffic_kernels_touch_the_used_slots_once(probe):
    B, H, K, V, P = 3, 2, 16, 32, 5
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    pool = torch.randn(P, H, K, V, generator=torch.Generator().manual_seed(0))
    want = pool.clone()
    want[slots.long()] *= 0.999
    runs = {
        "flat_rw": lambda p: probe.flat_rw[(B * (H * K * V // 128),)](p, slots, SLOT=H * K * V, BLOCK=128),
        "block_rw": lambda p: probe.block_rw[(B * H * 2 * 2,)](p, slots, HV=H, K=K, V=V, BR=8, BC=16),
        "chunk_rw": lambda p: probe.chunk_rw[(2, B * H)](p, slots, HV=H, K=K, V=V, KC=4, BV=16),
    }
    for name, run in runs.items():
        p = pool.clone()
        run(p)
        torch.testing.assert_close(p, want, rtol=0, atol=0, msg=name)
    # the held tile: every used slot's column gets its K sum folded in (1e-9 of it) before the scale
    vec = torch.ones(H * K + 2)
    p = pool.clone()
    probe.hold_rw[(2, B * H)](p, slots, vec, HV=H, K=K, V=V, BV=16, ROWVECS=0)
    s = pool[slots.long()]
    torch.testing.assert_close(p[slots.long()], (s + 1e-9 * s.sum(-2, keepdim=True)) * 0.999)
    unused = [i for i in range(P) if i not in slots.tolist()]
    assert torch.equal(p[unused], pool[unused])


def test_slot_orders_are_permutations(probe):
    for order in ("seven", "identity", "reversed", "random", "blocks8"):
        s = probe.order_slots(order, 256, 260, "cpu")
        assert s.dtype == torch.int32 and len(set(s.tolist())) == 256 and 0 <= int(s.min()) and int(s.max()) < 260
