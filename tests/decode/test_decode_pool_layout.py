"""One decode step on a copy of the pool in either layout ([K, V] or [V, K], ``state_v_first``) against
the float64 recurrence, in Triton's interpreter: the op is exact in each layout at the narrow [V, K] tiles
the GPU sweep times (slot grid, batch grid, persistent programs), and the check fails when the kernel reads
the pool in the other layout, so a layout mix-up cannot pass."""
from __future__ import annotations

import pytest
import torch

import kdagen
from kdagen.cache import heuristics
from kdagen.config import RecurrentConfig
from kdagen.ops import recurrent as R
from kdagen.spec.reference import naive_recurrent_kda


def config_of(c) -> RecurrentConfig:
    """(BV, warps[, programs per SM, stages]): the config with the loaded readout."""
    return RecurrentConfig(block_v=c[0], num_warps=c[1], num_stages=c[3] if len(c) > 3 else 1,
                           programs_per_sm=c[2] if len(c) > 2 else 0, readout="loaded")


def case(B, H, K, V, seed=0):
    """(inputs, pool [P, H, K, V], slots, cu): a packed step of B sequences over P slots, sequence n in
    slot (7 n) mod P."""
    gen = torch.Generator().manual_seed(1000 + B + seed)
    r = lambda *s: torch.randn(1, B, *s, generator=gen)  # noqa: E731
    x = dict(q=r(H, K), k=torch.nn.functional.normalize(r(H, K), dim=-1), v=r(H, V),
             g=-5 * torch.sigmoid(r(H, K) + 2.0), beta=torch.sigmoid(r(H)))
    P = B + 3 + (1 if (B + 3) % 7 == 0 else 0)
    pool = 0.1 * torch.randn(P, H, K, V, generator=gen)
    slots = ((torch.arange(B) * 7) % P).to(torch.int32)
    return x, pool, slots, torch.arange(B + 1, dtype=torch.int64)


def as_layout(pool_kv, layout):
    return pool_kv.transpose(-1, -2).contiguous() if layout == "vk" else pool_kv.clone()


def check(x, pool_kv, layout, read_as, slots, cu, config):
    """Relative error of o and the new states against the float64 recurrence: one step of the op, told
    the pool is laid out ``read_as``, on a copy of the pool laid out as ``layout``."""
    pool = as_layout(pool_kv, layout)
    out = torch.full_like(x["v"], float("nan"))
    kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots, cu_seqlens=cu, out=out,
                               config=config, state_v_first=read_as == "vk")
    s = slots.long()
    ref = [x[n][0].unsqueeze(1).double() for n in ("q", "k", "v", "g", "beta")]
    ro, rs = naive_recurrent_kda(*ref, initial_state=pool_kv[s].double(), output_final_state=True)
    got_s = pool[s].double()
    if layout == "vk":
        got_s = got_s.transpose(-1, -2)
    err = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    return max(err(out[0].double(), ro[:, 0]), err(got_s, rs))


@pytest.mark.parametrize("layout,c,grid", [
    ("kv", (64, 2), "auto"), ("vk", (8, 4), "auto"), ("vk", (4, 1), "auto"), ("vk", (8, 4), "batch"),
    ("vk", (16, 4, 2, 2), "auto"), ("vk", (8, 2, 1, 3), "auto")])
def test_one_step_in_each_layout_against_float64(monkeypatch, layout, c, grid):
    # the slot grid at the interpreter's few pairs ("auto"), or forced off ("batch"); the fast path forgotten
    monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", 1 if grid == "auto" else 10 ** 9)
    R._FAST.clear()
    x, pool_kv, slots, cu = case(4, 2, K=16, V=16)
    assert pool_kv.shape == (8, 2, 16, 16) and slots.tolist() == [0, 7, 6, 5]  # (7 n) mod P, scrambled
    cfg = config_of(c)
    desc = R.fused_recurrent_kda_launch(**x, initial_state=as_layout(pool_kv, layout), ssm_state_indices=slots,
                                        cu_seqlens=cu, config=cfg, state_v_first=layout == "vk")[0]
    assert desc.constexprs["SLOT_GRID"] == (grid == "auto" and cfg.programs_per_sm == 0)  # (persistent: never)
    assert check(x, pool_kv, layout, layout, slots, cu, cfg) < 1e-5
    wrong = "kv" if layout == "vk" else "vk"
    assert check(x, pool_kv, layout, wrong, slots, cu, cfg) > 0.1
    R._FAST.clear()
