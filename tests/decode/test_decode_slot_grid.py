"""The decode's slot grid (kdagen.cache.heuristics.slot_grid, templates/_recurrent_grid.py.j2's SLOT_GRID):
with a state pool and many (sequence, head) pairs, the programs run over the pool's slots in address
order, each finding its sequence by a scan of the slot indices, and one extra row writes o = 0 for
the padding sequences.  Every sequence must still get the recurrence's answer in its own slot, in any
slot order, with padding (negative or past the pool), unused slots left untouched, varlen token
counts (1, 0, 3 tokens), both readouts, every member's structure, and the fast path's second call.
The interpreter runs it at small shapes by lowering the pairs threshold."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cases import inputs
from conftest import TOL, assert_close
from plain_configs import plain_decode

import kdagen
from kdagen.cache import heuristics
from kdagen.config import RecurrentConfig
from kdagen.ops import recurrent as R
from kdagen.spec.reference import naive_recurrent_kda

F32, F16 = torch.float32, torch.float16


@pytest.fixture
def slot_grid_on(monkeypatch):
    """The slot grid at the tests' few pairs (the fast path's entries forgotten before and after)."""
    monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", 1)
    R._FAST.clear()
    yield
    R._FAST.clear()


# the cases: N sequences of one token, a q/k head per value head, g = -2 U[0, 1), a pool of P states 0.3 N(0, 1)
SLOTS = dict(gate="uniform", g_scale=2.0, beta="uniform", state_scale=0.3)


def _expected(x, pool, slots):
    """(o, pool after the step) from the float64 recurrence: padding sequences o = 0, their slots and
    every unused slot as they were."""
    keep = (slots >= 0) & (slots < pool.shape[0])
    ro, rh = naive_recurrent_kda(*(x[n][keep] for n in ("q", "k", "v", "g", "beta")),
                                 initial_state=pool[slots[keep].long()], output_final_state=True)
    want_o = torch.zeros(x["v"].shape, dtype=torch.float64)
    want_o[keep] = ro.double()
    want = pool.clone()
    want[slots[keep].long()] = rh.float()
    return want_o, want, keep


@pytest.mark.parametrize("readout", ("updated", "loaded"))
@pytest.mark.parametrize("dt", (F32, F16), ids=("fp32", "fp16"))
def test_scrambled_slots_padding_and_unused_slots(slot_grid_on, dt, readout):
    c = inputs("kda", 6, 1, 2, 2, 32, 32, dtype=dt, N=9, **SLOTS)
    x, pool = c.tensors(), c.h0
    slots = torch.tensor([7, 0, -1, 3, 12, 5], dtype=torch.int32)  # -1 and 12 (>= P = 9): padding
    want_o, want, keep = _expected(x, pool, slots)
    cfg = RecurrentConfig(block_v=16, num_warps=1, readout=readout)
    out = torch.full(x["v"].shape, float("nan"), dtype=dt)  # every row must be written
    p = pool.clone()
    for step in range(2):  # the second call goes through the fast path's entry
        p.copy_(pool)
        out.fill_(float("nan"))
        o, ht = kdagen.fused_recurrent_kda(**x, initial_state=p, ssm_state_indices=slots, out=out, config=cfg)
        assert o is out and ht is p
        assert_close(o[keep], want_o[keep], TOL[dt], f"o, call {step}")
        assert torch.equal(o[~keep], torch.zeros_like(o[~keep])), "a padding sequence's o is not 0"
        assert_close(p, want, TOL[dt], f"pool, call {step}")
        unused = [s for s in range(pool.shape[0]) if s not in slots.tolist()]
        assert torch.equal(p[unused], pool[unused]), "a slot no sequence uses was written"
    assert R._FAST, "the second call did not find its fast-path entry"
    launch, *_ = R.fused_recurrent_kda_launch(**x, initial_state=pool.clone(), ssm_state_indices=slots, config=cfg)
    assert launch.constexprs["SLOT_GRID"] and launch.grid[1] == (pool.shape[0] + 1) * 2


def test_packed_varlen_with_several_and_no_tokens(slot_grid_on):
    """cu_seqlens with 1, 0, 3, 1, 2 tokens: each sequence's tokens in turn from its slot; the padding
    sequence (slot -1) has 3 tokens, all of whose o must be 0."""
    gen = torch.Generator().manual_seed(4)
    N, HV, K, V, P = 5, 2, 16, 32, 7
    lens = [1, 0, 3, 1, 2]
    T = sum(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist())
    x = dict(q=torch.randn(1, T, HV, K, generator=gen), k=F.normalize(torch.randn(1, T, HV, K, generator=gen), dim=-1),
             v=torch.randn(1, T, HV, V, generator=gen), g=-torch.rand(1, T, HV, K, generator=gen),
             beta=torch.rand(1, T, HV, generator=gen))
    pool = 0.3 * torch.randn(P, HV, K, V, generator=gen)
    slots = torch.tensor([6, 2, -1, 0, 4], dtype=torch.int32)
    p = pool.clone()
    o, _ = kdagen.fused_recurrent_kda(**x, initial_state=p, ssm_state_indices=slots, cu_seqlens=cu,
                                      config=RecurrentConfig(block_v=16, num_warps=1, readout="loaded"))
    want = pool.clone()
    for n in range(N):
        a, b = cu[n].item(), cu[n + 1].item()
        if slots[n] < 0:
            assert torch.equal(o[0, a:b], torch.zeros_like(o[0, a:b])), "padding sequence's o"
            continue
        s = slots[n].long()
        ro, rh = naive_recurrent_kda(*(x[m][:, a:b] for m in ("q", "k", "v", "g", "beta")),
                                     initial_state=pool[s][None], output_final_state=True)
        if b > a:
            assert_close(o[0, a:b], ro[0], TOL[F32], f"o of sequence {n}")
        want[s] = rh[0].float()
    assert_close(p, want, TOL[F32], "pool")
    assert torch.equal(p[[1, 3, 5]], pool[[1, 3, 5]])


@pytest.mark.parametrize("member", ("gdn", "dplr"))
def test_other_members_through_the_slot_grid(slot_grid_on, member):
    """The same kernel template's scalar-decay and general-DPLR structures: against the batch grid's
    answer (tested against float64 elsewhere) for the same scrambled slots."""
    gen = torch.Generator().manual_seed(8)
    N, HV, K, V, P = 4, 2, 16, 32, 6
    q, k = torch.randn(N, 1, HV, K, generator=gen), F.normalize(torch.randn(N, 1, HV, K, generator=gen), dim=-1)
    v = torch.randn(N, 1, HV, V, generator=gen)
    pool = 0.3 * torch.randn(P, HV, K, V, generator=gen)
    slots = torch.tensor([5, 1, 3, 0], dtype=torch.int32)
    if member == "gdn":
        g, beta = -torch.rand(N, 1, HV, generator=gen), torch.rand(N, 1, HV, generator=gen)
        call = lambda p: kdagen.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=p,  # noqa: E731
                                                                 ssm_state_indices=slots)
    else:
        gk = -torch.rand(N, 1, HV, K, generator=gen)
        a, b = -F.normalize(torch.randn(N, 1, HV, K, generator=gen), dim=-1), 0.5 * k
        call = lambda p: kdagen.fused_recurrent_dplr_delta_rule(q, k, v, a, b, gk, initial_state=p,  # noqa: E731
                                                                ssm_state_indices=slots)
    p_grid = pool.clone()
    o_grid, _ = call(p_grid)
    heuristics.SLOT_GRID_MIN_PAIRS = 10 ** 9  # (the fixture's monkeypatch restores it) the batch grid
    R._FAST.clear()
    p_batch = pool.clone()
    o_batch, _ = call(p_batch)
    assert_close(o_grid, o_batch.double(), TOL[F32], "o")
    assert_close(p_grid, p_batch.double(), TOL[F32], "pool")
    assert not torch.equal(p_grid, pool)


@pytest.mark.parametrize("lean", (False, True), ids=("a-tile-each", "lean"))
def test_shared_slots_give_nan_not_stale_output(slot_grid_on, lean):
    """Two sequences on one slot is the caller's error (check_inputs=True names it); the slot grid
    applies the later one and writes NaN for the other's o rather than leaving it unwritten (also with
    the lean body, whose scan finds the sequences' offsets after the slots)."""
    c = inputs("kda", 4, 1, 2, 2, 32, 32, seed=2, N=5, **SLOTS)
    x, pool = c.tensors(), c.h0
    slots = torch.tensor([3, 1, 3, 0], dtype=torch.int32)
    out = torch.zeros(x["v"].shape)
    p = pool.clone()
    kdagen.fused_recurrent_kda(**x, initial_state=p, ssm_state_indices=slots, out=out,
                               config=plain_decode(block_v=16, num_warps=1, lean=lean))
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1:]).all()
    ro, rh = naive_recurrent_kda(*(x[n][2:3] for n in ("q", "k", "v", "g", "beta")),
                                 initial_state=pool[3][None], output_final_state=True)
    assert_close(out[2:3], ro, TOL[F32], "the later sequence's o")
    assert_close(p[3], rh[0], TOL[F32], "the shared slot holds the later sequence's state")
    with pytest.raises(ValueError, match="ssm_state_indices"):
        kdagen.fused_recurrent_kda(**x, initial_state=pool.clone(), ssm_state_indices=slots, check_inputs=True)


def test_when_the_slot_grid_is_taken(monkeypatch):
    """Many pairs, a pool of at most twice the sequences, sequences the scan covers; never for
    persistent programs or without a pool."""
    assert heuristics.slot_grid(256, 32, 260)
    assert heuristics.slot_grid(256, 32, 512) and not heuristics.slot_grid(256, 32, 513)
    assert not heuristics.slot_grid(16, 32, 20) and not heuristics.slot_grid(64, 32, 68)  # 512, 2,048 pairs
    assert heuristics.slot_grid(128, 32, 132)
    assert not heuristics.slot_grid(2048, 32, 2048)  # past the scan's width
    c = inputs("kda", 4, 1, 2, 2, 32, 32, N=6, **SLOTS)
    x, pool = c.tensors(), c.h0
    slots = torch.tensor([1, 0, 3, 2], dtype=torch.int32)
    big = dict(initial_state=pool.clone(), ssm_state_indices=slots)
    monkeypatch.setattr(heuristics, "SLOT_GRID_MIN_PAIRS", 1)
    grid, *_ = R.fused_recurrent_kda_launch(**x, **big, config=plain_decode(block_v=16))
    pers, *_ = R.fused_recurrent_kda_launch(**x, **big, config=plain_decode(block_v=16, programs_per_sm=2,
                                                                            num_warps=2, num_stages=2))
    none, *_ = R.fused_recurrent_kda_launch(**x, initial_state=pool[:4].clone(), config=plain_decode(block_v=16))
    assert grid.constexprs["SLOT_GRID"] and grid.constexprs["SCAN"] == 16
    assert not pers.constexprs["SLOT_GRID"] and not none.constexprs["SLOT_GRID"]
    assert none.grid[1] == 4 * 2


_COMPILE = r"""
import json, sys
import torch
sys.path.insert(0, "tests")
from sm90_report import decode_launch, lean_step_local, report  # compiled for sm_90, then ptxas's own report
from kdagen.codegen.lower import lower
from kdagen.config import RecurrentConfig
from kdagen.ops.inputs import select_spec
from kdagen.tuning.compile_pool import pool_launch_for
out = {}
launches = {"serving": decode_launch("packed"),  # the serving shape's packed step as the H200 runs it (PDL on)
            "serving-vk-8/4": decode_launch("packed", 8, 4, state_v_first=True),  # on a [V, K] pool, 4 KB tiles
            # the lean body's 8-row tile on one warp, as the heuristic takes it
            "serving-vk-8/1-lean": decode_launch("packed", 8, 1, state_v_first=True, lean=True)}
for name, (N, K, bv, warps, readout, pool_dtype, packed) in {
        "updated-bf16-pool": (64, 128, 32, 1, "updated", torch.bfloat16, False),
        "k64": (32, 64, 64, 2, "loaded", torch.float32, True)}.items():
    # forced to the slot grid at their fewer pairs, PDL off (as on a GPU before sm_90)
    plan = lower(select_spec(False, False, None, False, False), K, K, "bfloat16", "recurrent")
    launches[name] = pool_launch_for(plan, RecurrentConfig(block_v=bv, num_warps=warps, readout=readout),
                                     torch.bfloat16, (N, 1, 32, 32), pool_dtype,
                                     slots=((torch.arange(N) * 7) % (N + 4)).to(torch.int32), packed=packed)
for name, launch in launches.items():
    r = report(launch)
    out[name] = dict(slot_grid=launch.constexprs["SLOT_GRID"], scan=launch.constexprs["SCAN"], rows=launch.grid[1],
                     griddepcontrol=r["griddepcontrol"], regs=r["regs"], spills=r["spill_bytes"])
for form in ("packed", "batch"):  # where the lean launch's spills lie, if any (the step's path, or row 0's code)
    r = lean_step_local(decode_launch(form, 8, 1, state_v_first=True, lean=True))
    out["lean-" + form] = dict(regs=r["regs"], spills=r["spill_bytes"], local=len(r["local"]),
                                   on_step_path=r["on_step_path"], step_ops=r["step_ops"])
print("@@" + json.dumps(out))
"""


def test_slot_grid_compiles_for_sm90_without_spills():
    """Compile-only, for the H200's sm_90 (no GPU, no interpreter: a subprocess): the serving shape's
    kernel (256 sequences, H=32, K=V=128, BV=64 on 2 warps, with PDL as on the H200) takes the slot
    grid, and neither it, nor the same step on a [V, K] pool with 8-wide tiles on 4 warps (each a
    contiguous 4 KB block), nor a half-width pool's or K=64's slot-grid kernel (forced at their fewer
    pairs), spills registers.  The lean body's 8-row tile on one warp (the heuristic's) spills nowhere, and
    in particular not on the decode step's path -- read from the sm_90 code's control-flow graph and line
    table (tests/sm90_report.py, lean_step_local) -- in both forms."""
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, cwd=repo,
                          timeout=600)
    assert proc.returncode == 0 and "@@" in proc.stdout, proc.stderr[-3000:]
    res = json.loads(proc.stdout.rsplit("@@", 1)[1])
    assert res["serving"]["slot_grid"] and res["serving"]["scan"] == 256 and res["serving"]["rows"] == 261 * 32
    assert res["serving-vk-8/4"]["slot_grid"] and res["serving-vk-8/4"]["rows"] == 261 * 32
    # (64 registers at 32 B of state a thread: the narrow tile is there for many programs per SM)
    assert res["serving-vk-8/4"]["griddepcontrol"] == 2 and res["serving-vk-8/4"]["regs"] <= 96
    lean = res["serving-vk-8/1-lean"]
    assert lean["slot_grid"] and lean["griddepcontrol"] == 2
    for form in ("packed", "batch"):
        r = res.pop("lean-" + form)
        assert r["step_ops"] > 100, (form, r)  # (the step was found in the code)
        assert r["on_step_path"] == [], f"{form}: spills on the decode step's path: {r['on_step_path']}"
        assert (r["spills"] == 0) == (r["local"] == 0), (form, r)
    assert res["updated-bf16-pool"]["slot_grid"] and res["k64"]["slot_grid"]
    # the programmatic dependent launch's wait and trigger, only where PDL is on
    assert res["serving"]["griddepcontrol"] == 2 and res["k64"]["griddepcontrol"] == 0
    for name, r in res.items():
        assert 0 < r["regs"] <= 255, name
        assert r["spills"] == 0, f"{name}: {r['spills']} spilled registers ({r['regs']} per thread)"


def test_pdl_only_on_a_gpu_that_has_it(monkeypatch):
    """PDL (a programmatic dependent launch) is a constexpr the op sets only for a CUDA device of
    compute capability >= 9, and only a PDL kernel is launched with launch_pdl."""
    from kdagen.kernels import launch_options
    dev = torch.device("cuda", 0)
    for major, want in ((8, False), (9, True), (10, True)):
        R._PDL.clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, m=major: (m, 0))
        assert R._pdl_capable(dev) is want
    assert R._pdl_capable(torch.device("cpu")) is False
    R._PDL.clear()
    assert launch_options({"PDL": True}) == {"launch_pdl": True}
    assert launch_options({"PDL": False}) == {} and launch_options({"BV": 64}) == {}
    c = inputs("kda", 4, 1, 2, 2, 32, 32, N=6, **SLOTS)
    x, pool = c.tensors(), c.h0
    ln, *_ = R.fused_recurrent_kda_launch(**x, initial_state=pool, ssm_state_indices=torch.arange(4, dtype=torch.int32))
    assert ln.constexprs["PDL"] is False  # the interpreter's CPU tensors


@pytest.mark.parametrize(("arch", "pdl"), ((90, True), (80, False)), ids=("sm90", "sm80"))
def test_build_compile_checks_the_pool_step_too(monkeypatch, arch, pdl):
    """`kdagen build`'s compile check of a recurrent candidate (kdagen.tuning.compile_pool._compile_one)
    compiles the tuner's batch launch and the launch a serving engine runs: the pool's step over its
    slots; both with the programmatic dependent launch exactly where the op takes it on the GPU (an
    architecture that has it), as the tuner times them there.  PDL is part of the kernel's specialisation:
    the batch launch once compiled without it was a kept binary never found on an H100 -- the op's own batch
    launch on a GPU of that capability has the compiled launch's constexprs."""
    from kdagen.tuning import compile_pool as CP
    seen = []

    class _Report:
        shared_bytes = 0

    def record(fn, args, constexprs, target, num_warps, num_stages, keep=None):
        seen.append((dict(constexprs), target.arch))
        return _Report()

    monkeypatch.setattr(CP, "compile_for_target", record)
    cfg = RecurrentConfig(block_v=32, num_warps=2, readout="loaded").to_dict()
    why = CP._compile_one("recurrent", 32, 32, "bfloat16", (), (8, 1, 2, 2), cfg, None, arch, 232448, "gpu")
    assert why is None
    assert [(c["USE_INDICES"], c["SLOT_GRID"], c["PDL"]) for c, _ in seen] == [(False, False, pdl), (True, True, pdl)]
    assert {a for _, a in seen} == {arch} and seen[1][0]["SCAN"] == 16
    monkeypatch.setattr(R, "_pdl_capable", lambda device: pdl)  # the op's device check, on that GPU
    plan = CP._worker_plan("recurrent", 32, 32, "bfloat16", ())[2]
    x = CP._dummy_inputs(plan, torch.bfloat16, (8, 1, 2, 2))
    assert CP._recurrent_launch(plan, RecurrentConfig.from_dict(cfg), x, x["initial_state"], None).constexprs == seen[0][0]
    launch = CP.pool_launch_for(*CP._worker_plan("recurrent", 32, 32, "bfloat16", ())[2:],
                                plain_decode(block_v=32, programs_per_sm=2, num_warps=2, num_stages=2),
                                torch.bfloat16, (8, 1, 2, 2))
    assert not launch.constexprs["SLOT_GRID"]  # persistent programs take their items in turn instead
