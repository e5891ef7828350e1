"""GLA's head dims past 256 (flash-linear-attention's chunk_gla takes up to 512; its test_chunk runs
K=V=320 and 512): chunk_gla and fused_recurrent_gla, forward and gradients of q, k, v, g and the
initial state, in the interpreter against the float64 recurrence; the tiles the heuristics give a
state row of 512 (the state passes and the recurrent backward on 16-wide V tiles over 8 warps); and
the other members' refusal past their limit of 256 (FLA's too), naming it.  Compile-only sm_90
checks of the same launches: tests/sm90/test_gla_wide_heads_compile_sm90.py."""
from __future__ import annotations

import pytest
import torch

from cases import inputs, reference
from conftest import F64, TOL, assert_close, params
from test_family_gla import F16, F32, GRAD_TOL, NAMES

import kdagen
from kdagen import spec as S
from kdagen.cache.heuristics import default_config
from kdagen.codegen.lower import LoweringError, lower
from kdagen.ops import recurrent_bwd

# (id, B, T, H, HV, K, V, dtype, lower bound)
CASES = [
    ("T40-K320V320-fp32", 1, 40, 1, 1, 320, 320, F32, None),
    ("T70-K320V320-fp16-bound", 1, 70, 1, 1, 320, 320, F16, -5.0),
    ("T40-gva1x2-K512V384-fp32", 1, 40, 1, 2, 512, 384, F32, None),
    ("T70-K512V512-fp16", 1, 70, 1, 1, 512, 512, F16, None),
]
SLOW = [c[0] for c in CASES]  # 20-50 s each in the interpreter (the recurrent backward's walks most)


@pytest.mark.parametrize("case", params(CASES, [c[0] for c in CASES], SLOW))
def test_wide_heads_forward_and_gradients_match_the_recurrence(case):
    _, B, T, H, HV, K, V, dt, lb = case
    q, k, v, g, h0 = inputs("gla", B, T, H, HV, K, V, dtype=dt, lb=lb).take(*NAMES)
    if lb is None:
        g[0, T // 2, 0, :7] = -float("inf")  # a reset of seven channels (an unbounded gate only)
    names = ["q", "k", "v", "g", "h0"]
    xs = dict(q=q, k=k, v=v, g=g, h0=h0)
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(B, T, HV, V, generator=gen), torch.randn(B, HV, K, V, generator=gen)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference("gla", x64)
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in names])
    ro, rh = ro.detach(), rh.detach()
    kw = dict(safe_gate=True, lower_bound=lb) if lb is not None else {}
    for fn, extra in ((kdagen.chunk_gla, kw), (kdagen.fused_recurrent_gla, {})):
        op = fn.__name__
        o, ht = fn(q, k, v, g, initial_state=h0, output_final_state=True, **extra)  # inference
        assert o.dtype == dt and ht.dtype == F32
        assert_close(o, ro, TOL[dt], f"{op} o")
        assert_close(ht, rh, TOL[dt], f"{op} final state")
        xl = {n: xs[n].clone().requires_grad_() for n in names}
        o, ht = fn(xl["q"], xl["k"], xl["v"], xl["g"], initial_state=xl["h0"], output_final_state=True, **extra)
        assert_close(o.detach(), ro, TOL[dt], f"{op} o (training)")
        assert_close(ht.detach(), rh, TOL[dt], f"{op} final state (training)")
        grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), [xl[n] for n in names])
        for n, a, b in zip(names, grads, ref):
            assert a.shape == xs[n].shape and a.dtype == xs[n].dtype
            assert_close(a, b, GRAD_TOL[dt], f"{op} d{n}")


def test_wide_heads_without_initial_state_and_varlen():
    cu = torch.tensor([0, 1, 19, 40], dtype=torch.int64)
    q, k, v, g, h0 = inputs("gla", 1, 40, 1, 1, 320, 320, N=3).take(*NAMES)
    ro, rh = reference("gla", q=q, k=k, v=v, g=g, cu_seqlens=cu)
    for fn in (kdagen.chunk_gla, kdagen.fused_recurrent_gla):
        o, ht = fn(q, k, v, g, output_final_state=True, cu_seqlens=cu)
        assert_close(o, ro, TOL[F32], f"{fn.__name__} o")
        assert_close(ht, rh, TOL[F32], f"{fn.__name__} final state")


@pytest.mark.parametrize("K,V", [(320, 320), (512, 512), (300, 64)])
def test_wide_rows_take_narrow_state_tiles_over_8_warps(K, V):
    """A state row of 512 (K > 256): every state pass holds [512, BV] in float32 on 16-wide V tiles
    over 8 warps, and the recurrent backward (S and dS) too."""
    for dt in ("bfloat16", "float16", "float32"):
        for bound in (None, -5.0):
            plan = lower(S.gla(S.gate_direct(bound)), K, V, dt, "chunk")
            assert plan.BK == 512
            for shape in (None, {"N": 1, "HV": 4, "T": 128, "B": 1}, {"N": 64, "HV": 32, "T": 8192, "B": 64}):
                fwd = default_config("chunk_fwd", plan, shape)
                assert (fwd.chunk_size, fwd.state_block_v, fwd.state_num_warps, fwd.state_num_stages,
                        fwd.state_segment_chunks) == (32, min(16, plan.BV), 8, 1, 0)
                train = default_config("chunk_train", plan, shape)
                assert (train.chunk_size, train.state_block_v, train.state_num_warps,
                        train.state_num_stages) == (32, min(16, plan.BV), 8, 1)
                assert not train.split_output
                bwd = default_config("chunk_bwd", plan, shape, train)
                assert (bwd.state_block_v, bwd.state_num_warps, bwd.state_num_stages) == (16, 8, 1)
        rplan = lower(S.gla(), K, V, dt, "recurrent")
        assert recurrent_bwd.current_config(rplan).to_dict() == dict(block_v=16, segment=16, num_warps=8, num_stages=1)
    # rows of 256 keep their tiles
    plan = lower(S.gla(), 256, 256, "bfloat16", "chunk")
    assert default_config("chunk_fwd", plan).state_num_warps == 4
    assert default_config("chunk_bwd", plan).state_num_warps == 4
    assert recurrent_bwd.current_config(lower(S.gla(), 256, 256, "bfloat16", "recurrent")).block_v == 32


def test_other_members_refuse_heads_past_256():
    """KDA, Gated DeltaNet, DeltaNet and general DPLR keep 256 (flash-linear-attention's chunk kernels
    refuse K > 256 for them): a ValueError naming the op and its range; GLA's range is 512."""
    B, T, H = 1, 4, 1
    for K, V in ((320, 64), (64, 320)):
        q = torch.randn(B, T, H, K)
        v = torch.randn(B, T, H, V)
        gk, gs, beta = -torch.rand(B, T, H, K), -torch.rand(B, T, H), torch.rand(B, T, H)
        which = "K=320" if K == 320 else "V=320"
        calls = [
            ("chunk_kda", lambda: kdagen.chunk_kda(q, q, v, gk, beta)),
            ("fused_recurrent_kda", lambda: kdagen.fused_recurrent_kda(q, q, v, gk, beta)),
            ("chunk_gated_delta_rule", lambda: kdagen.chunk_gated_delta_rule(q, q, v, gs, beta)),
            ("fused_recurrent_gated_delta_rule", lambda: kdagen.fused_recurrent_gated_delta_rule(q, q, v, gs, beta=beta)),
            ("chunk_delta_rule", lambda: kdagen.chunk_delta_rule(q, q, v, beta)),
            ("fused_recurrent_delta_rule", lambda: kdagen.fused_recurrent_delta_rule(q, q, v, beta)),
            ("chunk_dplr_delta_rule", lambda: kdagen.chunk_dplr_delta_rule(q, q, v, q, q, gk)),
            ("fused_recurrent_dplr_delta_rule", lambda: kdagen.fused_recurrent_dplr_delta_rule(q, q, v, q, q, gk)),
        ]
        for op, call in calls:
            with pytest.raises(ValueError, match=rf"{which} is outside the supported range \[16, 256\] of {op}"):
                call()
    q = torch.randn(B, T, H, 640)
    with pytest.raises(ValueError, match=r"K=640 is outside the supported range \[16, 512\] of chunk_gla"):
        kdagen.chunk_gla(q, q, torch.randn(B, T, H, 64), -torch.rand(B, T, H, 640))
    for spec in (S.kda(), S.gdn(), S.deltanet(), S.dplr()):
        with pytest.raises(LoweringError, match=rf"\[16, 256\] of spec '{spec.name}'"):
            lower(spec, 320, 64, "bfloat16", "chunk")
    assert lower(S.gla(), 512, 512, "bfloat16", "recurrent").BK == 512
    with pytest.raises(LoweringError, match=r"V=513 is outside the supported range \[16, 512\] of spec 'gla'"):
        lower(S.gla(), 512, 513, "bfloat16", "chunk")
