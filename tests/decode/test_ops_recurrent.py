"""fused_recurrent_kda (the recurrent Triton kernel, run in the CPU interpreter) against the
float64 reference, the state pool updated in place through ssm_state_indices, the ``out=``
buffer, a bf16 pool, and agreement with chunk_kda."""
from __future__ import annotations

import pytest
import torch

from cases import make_inputs, reference
from conftest import TOL, assert_close, nan_tensor, params, poison, rel_err
from plain_configs import plain_decode

import kdagen
from kdagen.spec.reference import kda_gate

F32, F16 = torch.float32, torch.float16
VARLEN = [0, 1, 40, 41, 105]


# (id, B, T, H, HV, K, V, dtype, h0, cu)
CASES = [
    ("decode-T1-B5", 5, 1, 1, 2, 64, 64, F32, True, None),
    ("decode-T1-B5-fp16", 5, 1, 1, 2, 64, 64, F16, True, None),
    ("decode-T1-B5-K96V48-gva2x4", 5, 1, 2, 4, 96, 48, F32, True, None),
    ("T37-B2-gva2x4", 2, 37, 2, 4, 64, 64, F32, True, None),
    ("T64-fp16-gva1x2", 1, 64, 1, 2, 64, 64, F16, True, None),
    ("T20-K48V96-noh0", 2, 20, 1, 1, 48, 96, F32, False, None),
    ("T33-K96V96-fp16", 1, 33, 1, 1, 96, 96, F16, True, None),
    ("varlen-K96V48", 1, 105, 1, 2, 96, 48, F32, True, VARLEN),
    ("varlen-K48V16-fp16-noh0", 1, 105, 1, 1, 48, 16, F16, False, VARLEN),
]


@pytest.mark.parametrize("case", params(CASES, [c[0] for c in CASES], {
    'T37-B2-gva2x4', 'T64-fp16-gva1x2', 'varlen-K96V48'
}))
def test_fused_recurrent_matches_reference(case):
    _, B, T, H, HV, K, V, dtype, h0, cu = case
    x = make_inputs(B, T, H, HV, K, V, dtype=dtype, seed=100 + CASES.index(case), h0=h0, cu_seqlens=cu)
    before = None if x.h0 is None else x.h0.clone()
    o, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                       cu_seqlens=x.cu_seqlens)
    ro, rh = reference("kda", x)
    assert o.dtype == dtype and ht.dtype == torch.float32
    assert_close(o, ro, TOL[dtype], "o")
    assert_close(ht, rh, TOL[dtype], "final state")
    if before is not None:
        assert torch.equal(x.h0, before), "initial_state was modified without ssm_state_indices"


@pytest.mark.slow
def test_fused_recurrent_beta_extremes_and_gate_at_bound():
    """beta exactly 0 and 1 and gates exactly -5 (and the default factory's mix of both)."""
    for beta, gate in (("one", "lb"), ("zero", "random"), ("random", "lb")):
        g_lo = -1.0 if beta == "zero" else -5.0  # beta = 0: only the decayed state remains
        x = make_inputs(2, 24, 1, 2, 64, 32, seed=5, beta=beta, gate=gate, g_lo=g_lo)
        o, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0,
                                           output_final_state=True)
        ro, rh = reference("kda", x)
        assert_close(o, ro, TOL[F32], f"o (beta={beta}, gate={gate})")
        assert_close(ht, rh, TOL[F32], f"final state (beta={beta}, gate={gate})")


@pytest.mark.slow
@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["lowerbound", "softplus"])
def test_fused_recurrent_gate_in_kernel(lower_bound):
    B, T, H, HV, K, V = 2, 19, 1, 2, 96, 48
    x = make_inputs(B, T, H, HV, K, V, seed=21, gate="raw")
    gen = torch.Generator().manual_seed(22)
    A_log = 0.5 * torch.randn(HV, generator=gen)
    dt_bias = 0.5 * torch.randn(HV * K, generator=gen)
    o, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, A_log=A_log, dt_bias=dt_bias,
                                       initial_state=x.h0, output_final_state=True,
                                       use_gate_in_kernel=True, lower_bound=lower_bound)
    g64 = kda_gate(x.g, A_log, dt_bias, lower_bound=lower_bound)
    ro, rh = reference("kda", x, g=g64)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")


def test_fused_recurrent_without_final_state_returns_none():
    x = make_inputs(3, 5, 1, 1, 32, 32, seed=2)
    o, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0)
    assert ht is None
    ro, _ = reference("kda", x)
    assert_close(o, ro, TOL[F32], "o")


# ------------------------------------------------------------------ state pool in place

POOL_LAYOUTS = [
    # (id, B, T, cu_seqlens, slots, pool size P): slots is a non-identity permutation into
    # the pool with one padding entry (-1); the pool's last slot is unused, so a padding
    # sequence wrapped around to slot -1 == P - 1 would overwrite its NaN poison
    ("decode-B4", 4, 1, None, [4, 0, -1, 2], 6),
    ("varlen", 1, 105, VARLEN, [3, -1, 0, 1], 5),
]


@pytest.mark.slow
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("layout", POOL_LAYOUTS, ids=[p[0] for p in POOL_LAYOUTS])
def test_state_pool_in_place(layout, idx_dtype):
    _, B, T, cu, slots, P = layout
    HV, K, V = 2, 64, 48
    x = make_inputs(B, T, 1, HV, K, V, seed=31, h0=False, cu_seqlens=cu)
    N = len(slots)
    gen = torch.Generator().manual_seed(32)
    pool = nan_tensor(P, HV, K, V)
    used = [s for s in slots if s >= 0]
    for s in used:
        pool[s] = torch.randn(HV, K, V, generator=gen)
    pool_before = pool.clone()
    idx = torch.tensor(slots, dtype=idx_dtype)
    out = poison(torch.empty_like(x.v))

    o, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=pool, ssm_state_indices=idx,
                                       cu_seqlens=x.cu_seqlens, out=out)
    assert ht is pool, "the pool (updated in place) must be returned as the final state"
    assert o.data_ptr() == out.data_ptr(), "out= was not used as the output"

    # reference: every real sequence from its slot's state; the padding sequence from zeros
    # (only its o rows matter, and they must be 0)
    h0 = torch.stack([pool_before[s] if s >= 0 else torch.zeros(HV, K, V) for s in slots])
    ro, rh = reference("kda", x, h0=h0)
    bounds = list(zip(cu, cu[1:])) if cu else [(n * T, (n + 1) * T) for n in range(N)]
    o_rows = o.reshape(-1, HV, V) if cu is None else o[0]
    r_rows = ro.reshape(-1, HV, V) if cu is None else ro[0]
    assert torch.isfinite(o).all(), "some output element was left unwritten"
    for n, (a, b) in enumerate(bounds):
        if slots[n] < 0:
            assert torch.equal(o_rows[a:b], torch.zeros_like(o_rows[a:b])), "a padding sequence's o must be 0"
        else:
            assert_close(o_rows[a:b], r_rows[a:b], TOL[F32], f"o of sequence {n}")
            assert_close(pool[slots[n]], rh[n], TOL[F32], f"pool slot {slots[n]} (sequence {n})")
    for s in range(P):
        if s not in used:
            assert torch.isnan(pool[s]).all(), f"unused pool slot {s} was written"


@pytest.mark.slow
def test_out_argument_is_written_completely():
    x = make_inputs(1, 105, 2, 4, 96, 48, seed=41, cu_seqlens=VARLEN)
    out = poison(torch.empty_like(x.v))
    o, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                       cu_seqlens=x.cu_seqlens, out=out)
    assert o is out or o.data_ptr() == out.data_ptr()
    ro, rh = reference("kda", x)
    assert_close(out, ro, TOL[F32], "out")
    assert_close(ht, rh, TOL[F32], "final state")


def test_bf16_state_pool_close_to_fp32_pool():
    B, HV, K, V, P = 4, 2, 64, 64, 6
    slots = [5, 1, 3, 0]
    x = make_inputs(B, 8, 1, HV, K, V, seed=51, h0=False)
    gen = torch.Generator().manual_seed(52)
    pool32 = torch.randn(P, HV, K, V, generator=gen)
    pool16 = pool32.to(torch.bfloat16)
    pool_before32 = pool32.clone()
    idx = torch.tensor(slots, dtype=torch.int64)
    o32, _ = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=pool32, ssm_state_indices=idx)
    o16, ret = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=pool16, ssm_state_indices=idx)
    assert ret is pool16 and pool16.dtype == torch.bfloat16
    assert torch.isfinite(o16).all()
    assert rel_err(o16, o32) <= 2e-2, rel_err(o16, o32)
    for s in slots:
        assert rel_err(pool16[s].float(), pool32[s]) <= 2e-2, (s, rel_err(pool16[s].float(), pool32[s]))
    # and the fp32-pool result is itself right (so "close to it" means close to the truth)
    ro, rh = reference("kda", x, h0=pool_before32[slots])
    assert_close(o32, ro, TOL[F32], "o with the fp32 pool")
    assert_close(pool32[slots], rh, TOL[F32], "fp32 pool slots")


@pytest.mark.slow
def test_chunk_and_recurrent_agree():
    x = make_inputs(2, 70, 1, 2, 64, 48, seed=61)
    oc, hc = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                              safe_gate=True, lower_bound=-5.0)
    orr, hr = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True)
    assert_close(oc, orr, TOL[F32], "chunk o vs recurrent o")
    assert_close(hc, hr, TOL[F32], "chunk state vs recurrent state")
    ro, rh = reference("kda", x)
    assert_close(orr, ro, TOL[F32], "recurrent o")
    assert_close(oc, ro, TOL[F32], "chunk o")


@pytest.mark.slow
def test_decode_loop_repeated_calls():
    """A decode loop: one token per call, same geometry every call (later calls may take a
    cached fast path), the pool advanced in place; after the loop every slot holds the
    reference state of its whole token sequence and every step's o matches."""
    Bn, steps, HV, K, V, P = 5, 4, 2, 64, 32, 7
    slots = [6, 2, -1, 0, 3]
    x = make_inputs(Bn, steps, 1, HV, K, V, seed=71, h0=False)
    gen = torch.Generator().manual_seed(72)
    pool = nan_tensor(P, HV, K, V)
    for s in slots:
        if s >= 0:
            pool[s] = torch.randn(HV, K, V, generator=gen)
    h0 = torch.stack([pool[s].clone() if s >= 0 else torch.zeros(HV, K, V) for s in slots])
    idx = torch.tensor(slots, dtype=torch.int32)
    outs = []
    for t in range(steps):
        step = lambda z: z[:, t:t + 1].clone()  # noqa: E731  (fresh tensors each call)
        out = poison(torch.empty(Bn, 1, HV, V))
        o, ret = kdagen.fused_recurrent_kda(step(x.q), step(x.k), step(x.v), step(x.g), step(x.beta),
                                            initial_state=pool, ssm_state_indices=idx, out=out)
        assert ret is pool and o.data_ptr() == out.data_ptr()
        outs.append(o)
    o = torch.cat(outs, dim=1)
    ro, rh = reference("kda", x, h0=h0)
    live = [n for n, s in enumerate(slots) if s >= 0]
    assert_close(o[live], ro[live], TOL[F32], "o of the live sequences")
    assert torch.equal(o[2], torch.zeros_like(o[2])), "the padding sequence's o must be 0"
    for n in live:
        assert_close(pool[slots[n]], rh[n], TOL[F32], f"slot {slots[n]}")
    for s in set(range(P)) - set(slots):
        assert torch.isnan(pool[s]).all(), f"unused slot {s} was written"

    # the same loop with a new final state each step (no pool): chained states
    state = x.h0 if x.h0 is not None else torch.randn(Bn, HV, K, V, generator=gen)
    s0 = state.clone()
    outs = []
    for t in range(steps):
        step = lambda z: z[:, t:t + 1].clone()  # noqa: E731
        o_t, state = kdagen.fused_recurrent_kda(step(x.q), step(x.k), step(x.v), step(x.g), step(x.beta),
                                                initial_state=state, output_final_state=True)
        outs.append(o_t)
    ro, rh = reference("kda", x, h0=s0)
    assert_close(torch.cat(outs, dim=1), ro, TOL[F32], "chained o")
    assert_close(state, rh, TOL[F32], "chained state")


def test_launch_description_matches_the_op():
    """fused_recurrent_kda_launch (what the tuner times) computes what the op returns, and a
    second launch() rewrites the same outputs with the same values."""
    from kdagen.ops.recurrent import fused_recurrent_kda_launch

    torch.manual_seed(0)
    B, H, HV, K, V = 3, 1, 2, 16, 24
    q, k = torch.randn(B, 1, H, K), torch.nn.functional.normalize(torch.randn(B, 1, H, K), dim=-1)
    v, g = torch.randn(B, 1, HV, V), -torch.rand(B, 1, HV, K)
    beta, h0 = torch.rand(B, 1, HV), torch.randn(B, HV, K, V)
    cfg = plain_decode(block_v=8, num_warps=2, num_stages=1)
    o_ref, h_ref = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              config=cfg)
    launch, (o, h), (scale, dims) = fused_recurrent_kda_launch(q, k, v, g, beta, initial_state=h0,
                                                               output_final_state=True, config=cfg)
    assert scale == K ** -0.5 and (dims.B, dims.HV, dims.V) == (B, HV, V)
    launch()
    assert torch.equal(o, o_ref) and torch.equal(h, h_ref)
    launch()
    assert torch.equal(o, o_ref) and torch.equal(h, h_ref)
