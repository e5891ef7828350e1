"""bench/decode_layout_gpu.py on the CPU (Triton's interpreter): its rows' check -- one decode step on a copy
of the pool in either layout against the float64 recurrence -- passes for the op in each layout at the
narrow [V, K] tiles the GPU sweep times (slot grid, batch grid, persistent programs), and fails when the
kernel reads the pool in the other layout, so a timed row is a checked one; its config strings parse to
the configs they name."""
from __future__ import annotations

import pytest
import torch
from bench_script import load_bench

from kdagen.cache import heuristics
from kdagen.ops import recurrent as R


@pytest.fixture(scope="module")
def bench():
    return load_bench("decode_layout_gpu")


@pytest.mark.parametrize("layout,c,grid", [
    ("kv", (64, 2), "auto"), ("vk", (8, 4), "auto"), ("vk", (4, 1), "auto"), ("vk", (8, 4), "batch"),
    ("vk", (16, 4, 2, 2), "auto"), ("vk", (8, 2, 1, 1), "auto"), ("kv", (16, 2, "s"), "auto")])
def test_rows_check_against_float64(bench, monkeypatch, layout, c, grid):
    monkeypatch.setattr(bench, "BASE_MIN_PAIRS", 1)  # the slot grid at the interpreter's few pairs
    monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", heuristics.SLOT_GRID_MIN_PAIRS)  # (restored after)
    x, pool_kv, slots, cu = bench.case(4, 2, torch.float32, K=16, V=16)
    assert pool_kv.shape == (8, 2, 16, 16) and slots.tolist() == [0, 7, 6, 5]  # (7 n) mod P, scrambled
    cfg = bench.config_of(c)
    bench.force_grid(grid)
    desc = R.fused_recurrent_kda_launch(**x, initial_state=bench.as_layout(pool_kv, layout), ssm_state_indices=slots,
                                        cu_seqlens=cu, config=cfg, state_v_first=layout == "vk")[0]
    assert desc.constexprs["SLOT_GRID"] == (grid == "auto" and cfg.programs_per_sm == 0)  # (persistent: never)
    make = lambda p, o: bench.step_fn("kdagen", layout, x, p, slots, cu, o, cfg)  # noqa: E731
    assert bench.check(make, x, pool_kv, layout, slots) < 1e-5
    wrong = lambda p, o: bench.step_fn("kdagen", "kv" if layout == "vk" else "vk", x, p, slots, cu, o, cfg)  # noqa: E731
    assert bench.check(wrong, x, pool_kv, layout, slots) > 0.1


def test_config_strings(bench):
    assert bench.pairs("64/2,8/4/6/2") == [(64, 2), (8, 4, 6, 2)] and bench.pairs("") == []
    c = bench.config_of((8, 4, 6, 2))
    assert (c.block_v, c.num_warps, c.programs_per_sm, c.num_stages, c.readout) == (8, 4, 6, 2, "loaded")
    c = bench.config_of((16, 2))
    assert (c.block_v, c.num_warps, c.programs_per_sm, c.num_stages, c.stream_state) == (16, 2, 0, 1, False)
    assert bench.pairs("64/2/s,8/4/6/2/s") == [(64, 2, "s"), (8, 4, 6, 2, "s")]
    c = bench.config_of((8, 4, 6, 2, "s"))
    assert (c.block_v, c.num_warps, c.programs_per_sm, c.num_stages, c.stream_state) == (8, 4, 6, 2, True)
    assert bench.pairs("8/4/t8,8/4/s/t4") == [(8, 4, "t8"), (8, 4, "s", "t4")]
    c = bench.config_of((8, 4, "s", "t4"))
    assert (c.block_v, c.num_warps, c.programs_per_sm, c.stream_state, c.tiles_per_program) == (8, 4, 0, True, 4)
    assert bench.config_of((16, 2)).tiles_per_program == 1
