"""GLA (per-channel decay, no rank-1 part) from the same templates: the plan field the structure
analysis sets (no solve, no beta), and FLA's ops chunk_gla / fused_recurrent_gla (forward, its
gradients, decode, decode gradients) in the interpreter against the float64 recurrence of
kdagen.spec.reference, on odd T, T = 1, head dims that are not powers of two, GVA, varlen with
length-0/1 sequences, initial and final states, g = -inf, with and without a gate bound, and the
refusals."""
from __future__ import annotations

import pytest
import torch

from cases import inputs, reference
from conftest import F64, TOL, assert_close
from plain_configs import plain_bwd, plain_decode, plain_fwd, plain_train

import kdagen
from kdagen import spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.config import RecurrentBwdConfig

F32, F16 = torch.float32, torch.float16
GRAD_TOL = {F32: 1e-5, F16: 5e-3}  # the bar of tests/chunk/test_ops_chunk_bwd.py


def test_plan_and_sources_have_no_rank1_part():
    p = lower(S.gla(), 48, 32, "float16", "chunk")
    assert (p.structure, p.decay, p.has_rank1) == ("gla", "channel", False)
    assert lower(S.kda(), 48, 32, "float16", "chunk").has_rank1
    for kernel, cfg in (("chunk_solve", plain_fwd()), ("chunk_pass", plain_fwd()),
                        ("chunk_intra", plain_train()), ("chunk_state", plain_train()),
                        ("chunk_bwd_state", plain_bwd()), ("chunk_bwd_dqkw", plain_bwd()),
                        ("chunk_bwd_intra", plain_bwd()), ("recurrent", plain_decode()),
                        ("recurrent_bwd", RecurrentBwdConfig())):
        form = "recurrent" if kernel.startswith("recurrent") else "chunk"
        src = render(kernel, lower(S.gla(S.gate_direct(-5.0)), 64, 64, "bfloat16", form), cfg).text
        body = src[src.index("@triton.jit"):]
        kda = render(kernel, lower(S.kda(S.gate_direct(-5.0)), 64, 64, "bfloat16", form), cfg).text
        kbody = kda[kda.index("@triton.jit"):]
        # the rank-1 part's names KDA's kernel uses are all gone from GLA's (the branch is the plan's)
        used = [n for n in ("b_beta", "b_Akk", "b_w ", "b_dw", "b_bk", "dbeta +") if n in kbody]
        assert used, kernel
        assert not [n for n in used if n in body], (kernel, [n for n in used if n in body])


NAMES = ("q", "k", "v", "g", "h0")


# (id, B, T, H, HV, K, V, dtype, lower bound)
CASES = [
    ("T37-gva1x2-K32V48", 1, 37, 1, 2, 32, 48, F32, None),
    ("T1-B3-K48V48-bound", 3, 1, 1, 1, 48, 48, F32, -5.0),
    ("T70-B2-K48V32-fp16-bound", 2, 70, 1, 1, 48, 32, F16, -5.0),
    ("T70-K32V32-fp16", 1, 70, 1, 1, 32, 32, F16, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_decode_match_the_recurrence(case):
    _, B, T, H, HV, K, V, dt, lb = case
    q, k, v, g, h0 = inputs("gla", B, T, H, HV, K, V, dtype=dt, lb=lb).take(*NAMES)  # (in [lb, 0) with a bound)
    if T > 1:
        g[0, T // 2, 0, :5] = -float("inf")  # a reset of five channels
    ro, rh = reference("gla", q=q, k=k, v=v, g=g, h0=h0)
    kw = dict(safe_gate=True, lower_bound=lb) if lb is not None else {}
    o, ht = kdagen.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, **kw)
    assert o.dtype == dt and ht.dtype == F32
    assert_close(o, ro, TOL[dt], "chunk o")
    assert_close(ht, rh, TOL[dt], "chunk final state")
    o, ht = kdagen.fused_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    assert_close(o, ro, TOL[dt], "recurrent o")
    assert_close(ht, rh, TOL[dt], "recurrent final state")
    o2, none = kdagen.chunk_gla(q, k, v, g)
    assert none is None and o2.shape == o.shape


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
def test_gradients_match_the_recurrence(dt):
    B, T, H, HV, K, V = 1, 37, 1, 2, 48, 32  # K = 48: two K tiles of the backward, the second masked
    q, k, v, g, h0 = inputs("gla", B, T, H, HV, K, V, dtype=dt).take(*NAMES)
    names = ["q", "k", "v", "g", "h0"]
    xs = dict(q=q, k=k, v=v, g=g, h0=h0)
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(B, T, HV, V, generator=gen), torch.randn(1, HV, K, V, generator=gen)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference("gla", x64)
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in names])
    for fn in (kdagen.chunk_gla, kdagen.fused_recurrent_gla) if dt == F32 else (kdagen.chunk_gla,):
        xl = {n: xs[n].clone().requires_grad_() for n in names}
        o, ht = fn(xl["q"], xl["k"], xl["v"], xl["g"], initial_state=xl["h0"], output_final_state=True)
        grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), [xl[n] for n in names])
        for n, a, b in zip(names, grads, ref):
            assert a.shape == xs[n].shape and a.dtype == xs[n].dtype
            assert_close(a, b, GRAD_TOL[dt], f"{fn.__name__} d{n}")


CU = [0, 0, 1, 20, 37]  # lengths 0, 1, 19, 17


def test_varlen_with_empty_and_one_token_sequences():
    q, k, v, g, h0 = inputs("gla", 1, 37, 1, 2, 48, 32, N=4).take(*NAMES)
    cu = torch.tensor(CU, dtype=torch.int64)
    ro, rh = reference("gla", q=q, k=k, v=v, g=g, h0=h0, cu_seqlens=cu)
    for fn in (kdagen.chunk_gla, kdagen.fused_recurrent_gla):
        o, ht = fn(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        assert_close(o, ro, TOL[F32], f"{fn.__name__} o")
        assert_close(ht, rh, TOL[F32], f"{fn.__name__} final state")
        assert torch.equal(ht[0], h0[0])  # a length-0 sequence keeps its state
    names = ["q", "k", "v", "g", "h0"]
    xs = dict(q=q, k=k, v=v, g=g, h0=h0)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference("gla", x64, cu_seqlens=cu)
    do = torch.randn(ro.shape, generator=torch.Generator().manual_seed(3))
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + rh.sum(), [x64[n] for n in names])
    xl = {n: xs[n].clone().requires_grad_() for n in names}
    o, ht = kdagen.chunk_gla(xl["q"], xl["k"], xl["v"], xl["g"], initial_state=xl["h0"], output_final_state=True,
                             cu_seqlens=cu)
    grads = torch.autograd.grad((o * do).sum() + ht.sum(), [xl[n] for n in names])
    for n, a, b in zip(names, grads, ref):
        assert_close(a, b, TOL[F32], f"d{n}")


def test_state_v_first_and_scale():
    q, k, v, g, h0 = inputs("gla", 1, 21, 1, 1, 32, 32).take(*NAMES)
    ro, rh = reference("gla", q=q, k=k, v=v, g=g, h0=h0, scale=0.3)
    for fn in (kdagen.chunk_gla, kdagen.fused_recurrent_gla):
        o, ht = fn(q, k, v, g, scale=0.3, initial_state=h0.transpose(-1, -2).contiguous(), output_final_state=True,
                   state_v_first=True)
        assert_close(o, ro, TOL[F32], f"{fn.__name__} o")
        assert_close(ht.transpose(-1, -2), rh, TOL[F32], f"{fn.__name__} final state (V, K)")


def test_fused_recurrent_gla_without_gk_is_linear_attention():
    q, k, v, g, h0 = inputs("gla", 1, 9, 1, 1, 32, 32).take(*NAMES)
    o, ht = kdagen.fused_recurrent_gla(q, k, v, initial_state=h0, output_final_state=True)
    ro, rh = reference("gla", q=q, k=k, v=v, g=torch.zeros_like(g), h0=h0)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")


def test_refusals_name_the_keyword():
    q, k, v, g, h0 = inputs("gla", 1, 4, 1, 1, 32, 32).take(*NAMES)
    cases = [
        (lambda: kdagen.fused_recurrent_gla(q, k, v, g, gv=torch.zeros_like(v)), "gv"),
        (lambda: kdagen.fused_recurrent_gla(q, k, v, g, reverse=True), "reverse"),
        (lambda: kdagen.chunk_gla(q, k, v, g[..., 0]), r"g must have shape"),
        (lambda: kdagen.chunk_gla(q, k, v, None), "g is required"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
