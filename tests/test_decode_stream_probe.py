"""bench/decode_stream_probe.py on the CPU (Triton's interpreter): its decode kernels -- the persistent
TMA loop and the K-split at KS = 1 (a larger group's members wait for one another, which programs run
one after another cannot do), a padding sequence included (o = 0, no slot written), and the lean
[V, K] kernel with its slot map -- against the float64 recurrence; and its pure-traffic kernels scale
exactly the used slots' tiles, once."""
from __future__ import annotations

import pytest
import torch
from bench_script import load_bench

B, H, K, V, P = 4, 2, 16, 32, 6
SLOTS = [3, -1, 0, 5]  # sequence 1 is padding


@pytest.fixture(scope="module")
def probe():
    return load_bench("decode_stream_probe")


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=r(1, B, H, K), k=r(1, B, H, K) / K ** 0.5, v=r(1, B, H, V),
             g=-torch.rand(1, B, H, K, generator=gen) * 2, beta=torch.rand(1, B, H, generator=gen))
    return x, r(P, H, K, V), torch.tensor(SLOTS, dtype=torch.int32), torch.arange(B + 1)


def reference(x, pool, slots):
    """The step in float64: S' = D S + k u^T with u = beta (v - (D S)^T k), o = S'^T (q / sqrt(K))."""
    o = torch.zeros(1, B, H, V, dtype=torch.float64)
    new = pool.double().clone()
    for n, s in enumerate(slots.tolist()):
        if not 0 <= s < P:
            continue
        for h in range(H):
            q, k, v, g = (x[a][0, n, h].double() for a in ("q", "k", "v", "g"))
            S = torch.exp(g)[:, None] * new[s, h]
            u = x["beta"][0, n, h].double() * (v - S.T @ k)
            S = S + k[:, None] * u[None, :]
            new[s, h] = S
            o[0, n, h] = S.T @ (q * K ** -0.5)
    return o, new


@pytest.mark.parametrize("kernel", ["tma", "ksplit"])
def test_decode_kernels_match_float64(probe, kernel):
    x, pool, slots, cu = inputs()
    o_ref, s_ref = reference(x, pool, slots)
    out = torch.full((1, B, H, V), 7.0)  # a padding sequence's o must be written (0), not left
    if kernel == "tma":
        probe.run_decode(x, pool, slots, cu, out, BV=16, S=2, warps=4, per_sm=1)
    else:
        scratch = probe.ksplit_scratch(B, H, V, 1, "cpu")
        probe.run_ksplit(x, pool, slots, cu, out, KS=1, warps=4, scratch=scratch)
        assert int(scratch[1].abs().sum()) == 0  # the group counters back at 0 for the next launch
    torch.testing.assert_close(out.double(), o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.double(), s_ref, rtol=1e-5, atol=1e-5)  # slots 1, 2, 4 untouched
    assert torch.equal(out[0, 1], torch.zeros(H, V))


@pytest.mark.parametrize("find", ["map", "scan", "scan_offsets"])
def test_lean_v_first_kernel_and_its_slot_map_match_float64(probe, find):
    x, pool, slots, cu = inputs(2)
    live = torch.tensor([3, 0, 5, 1], dtype=torch.int32)  # (the lean probe writes no padding o: none here)
    o_ref, s_ref = reference(x, pool, live)
    vk = pool.transpose(-1, -2).contiguous()  # the same states laid out [P, H, V, K]
    inv = torch.full((P,), 9, dtype=torch.int32)
    out = torch.zeros(1, B, H, V)
    if find == "map":
        probe.run_vk_lean(x, vk, live, cu, out, R=8, warps=1, inv=inv)
        assert inv.tolist() == [1, 3, -1, 0, -1, 2]  # slot -> its sequence, -1 for the slots nobody has
    else:
        probe.run_vk_lean_scan(x, vk, live, cu, out, R=8, warps=1, offsets=find == "scan_offsets")
    torch.testing.assert_close(out.double(), o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vk.transpose(-1, -2).double(), s_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["address", "scrambled"])
def test_stream_kernels_scale_the_used_tiles_once(probe, order):
    _, pool, _, _ = inputs(1)
    slots = torch.tensor([0, 1, 2, 3] if order == "address" else [3, 0, 5, 2], dtype=torch.int32)
    want = pool.clone()
    want[slots.long()] *= 0.999
    runs = {
        "one tile, BV=16": lambda p: probe.stream_one_tile[(B * H * 2,)](p, slots, HV=H, K=K, V=V, BV=16),
        "one [4, 32] block": lambda p: probe.stream_one_tile[(B * H * 4,)](p, slots, HV=H, K=K, V=V, BV=32, BK=4),
        "TMA loop": lambda p: probe.stream_tma[(3,)](probe.pool_desc(p, 16), slots, B * H * 2, HV=H, K=K, V=V,
                                                     BV=16, S=2),
    }
    for name, run in runs.items():
        p = pool.clone()
        run(p)
        torch.testing.assert_close(p, want, rtol=0, atol=0, msg=name)
