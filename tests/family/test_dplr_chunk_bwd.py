"""General DPLR's chunkwise backward (FLA's chunk_dplr_delta_rule, training) in the interpreter:
every gradient -- q, k, v, a, b, gk and the initial state, from o and the final state -- against
float64 autograd through kdagen.spec.reference.naive_recurrent_dplr (FLA's (a, b) are the spec's
(a', b') = (-b, a)).  fp32 at the family's tight bar and fp16; odd T, T = 1, head dims that are not
powers of two (48), GVA, varlen with length-0/1 sequences, initial and final states, gk unbounded
with a -inf entry (element-wise diagonal tiles) and bounded with safe_gate/lower_bound (factorised
ones), chunk lengths 16/32/64 (one, two and four sub-tiles), the recompute and the
stored-intermediates modes.  The three kernels are also run on their own on intermediates computed
in float64 torch (tests/dplr_chunk_ref.py), so a fault is placed in the backward, not the forward.
Every other member's sources are unchanged (tests/family/test_family*.py; the byte-identity of the
backward templates' renders is checked in the report of the commit that added these)."""
from __future__ import annotations

import pytest
import torch

from cases import inputs, reference
from conftest import F64, assert_close
from plain_configs import plain_bwd
from dplr_chunk_ref import chunk_forward

import kdagen
from kdagen import spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.kernels import dummy_pointer
from kdagen.ops.chunk_bwd import BwdMeta
from kdagen.ops.dplr_bwd import run_dplr_bwd
from kdagen.ops.schedule import chunk_schedule

F32, F16 = torch.float32, torch.float16
GRAD_TOL = {F32: 1e-5, F16: 5e-3}  # the family's bar (tests/family/test_family.py)
NAMES = ("q", "k", "v", "a", "b", "gk", "h0")
# DPLR's case (tests/cases.py): a a unit read vector, b = -beta a' with a' a unit vector near a (a general rank-1
# term, each step a contraction); gk log-sigmoid with some strong decays (a reset: -inf in one channel of one
# token), or in [lb, 0) with a bound


def _reference_grads(xs, cu=None, scale=None, seed=1):
    """(do, dht, float64 autograd grads by name) of <o, do> + <final state, dht>."""
    x64 = {n: xs[n].to(F64).requires_grad_() for n in NAMES}
    ro, rh = reference("dplr", x64, scale=scale, cu_seqlens=cu)
    gen = torch.Generator().manual_seed(seed)
    do, dht = torch.randn(ro.shape, generator=gen), torch.randn(rh.shape, generator=gen)
    grads = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in NAMES])
    return do, dht, dict(zip(NAMES, grads))


def _op_grads(xs, do, dht, **kw):
    xl = {n: xs[n].clone().requires_grad_() for n in NAMES}
    o, ht = kdagen.chunk_dplr_delta_rule(xl["q"], xl["k"], xl["v"], xl["a"], xl["b"], xl["gk"],
                                         initial_state=xl["h0"], output_final_state=True, **kw)
    assert o.grad_fn is not None
    grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), [xl[n] for n in NAMES])
    return dict(zip(NAMES, grads))


def _check(grads, ref, xs, dt, what):
    for n in NAMES:
        assert grads[n].shape == xs[n].shape and grads[n].dtype == xs[n].dtype, (what, n)
        assert_close(grads[n], ref[n], GRAD_TOL[dt], f"{what} d{n}")


# (B, T, H, HV, K, V, dtype, lower bound (None: element-wise), chunk_size, -inf in gk)
CASES = [
    (1, 37, 1, 2, 48, 48, F32, None, 32, True),  # GVA, K = V = 48 (masked tiles), element-wise, a reset
    (1, 70, 1, 1, 32, 32, F32, -5.0, 64, False),  # factorised, four sub-tiles (non-adjacent pairs), two chunks
    (3, 1, 1, 1, 32, 48, F32, None, 16, False),  # T = 1, one sub-tile per chunk
    (1, 45, 1, 2, 48, 32, F16, -0.5, 32, False),  # fp16, factorised (exp(0.5 * 16) fits fp16)
    (1, 29, 1, 1, 32, 32, F16, None, 16, True),  # fp16, element-wise, a reset
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[6]}-B{c[0]}T{c[1]}-HV{c[3]}-K{c[4]}V{c[5]}-lb{c[7]}-C{c[8]}"
                                             for c in CASES])
def test_gradients_match_float64_autograd(case):
    B, T, H, HV, K, V, dt, lb, C, neg_inf = case
    plan = lower(S.dplr(S.gate_direct(lb)), K, V, {F32: "float32", F16: "float16"}[dt], "chunk")
    assert plan.diag_mode == ("factorised" if lb is not None else "elementwise")
    xs = inputs("dplr", B, T, H, HV, K, V, dtype=dt, lb=lb,
                reset=(0, T // 2, 0, 1) if neg_inf else None).tensors(*NAMES)
    do, dht, ref = _reference_grads(xs)
    grads = _op_grads(xs, do, dht, chunk_size=C, safe_gate=lb is not None, lower_bound=lb)
    _check(grads, ref, xs, dt, "recompute")
    if neg_inf:  # the reset's own gate has no influence: its gradient is 0 (exp(-inf) = 0)
        assert torch.isfinite(grads["gk"]).all() and grads["gk"][0, T // 2, 0, 1].abs() < 1e-6


def test_stored_intermediates_and_some_inputs_only():
    """disable_recompute keeps the forward's intermediates (ChunkBwdConfig.store_intermediates): the
    same gradients; inputs that do not require grad get none."""
    xs = inputs("dplr", 1, 37, 1, 2, 48, 48, reset=(0, 37 // 2, 0, 1)).tensors(*NAMES)
    do, dht, ref = _reference_grads(xs)
    _check(_op_grads(xs, do, dht, chunk_size=32, disable_recompute=True), ref, xs, F32, "stored")
    v = xs["v"].clone().requires_grad_()
    b = xs["b"].clone().requires_grad_()
    o, ht = kdagen.chunk_dplr_delta_rule(xs["q"], xs["k"], v, xs["a"], b, xs["gk"], initial_state=xs["h0"],
                                         output_final_state=True, chunk_size=32)
    ((o.float() * do).sum() + (ht * dht).sum()).backward()
    assert_close(v.grad, ref["v"], GRAD_TOL[F32], "dv alone")
    assert_close(b.grad, ref["b"], GRAD_TOL[F32], "db alone")


def test_without_states():
    """No initial state and no final state: the gradients of o alone (dh0 is not asked for)."""
    xs = inputs("dplr", 1, 37, 1, 1, 32, 32, reset=(0, 37 // 2, 0, 1)).tensors(*NAMES)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in NAMES[:-1]}
    ro, _ = reference("dplr", x64, output_final_state=False)
    do = torch.randn(ro.shape, generator=torch.Generator().manual_seed(1))
    ref = torch.autograd.grad((ro * do.to(F64)).sum(), list(x64.values()))
    xl = {n: xs[n].clone().requires_grad_() for n in NAMES[:-1]}
    o, ht = kdagen.chunk_dplr_delta_rule(xl["q"], xl["k"], xl["v"], xl["a"], xl["b"], xl["gk"], chunk_size=32)
    assert ht is None
    grads = torch.autograd.grad((o * do).sum(), list(xl.values()))
    for n, x, r in zip(NAMES, grads, ref):
        assert_close(x, r, GRAD_TOL[F32], f"d{n}")


@pytest.mark.parametrize("dt", [F32, F16])
def test_varlen_with_empty_and_single_token_sequences(dt):
    lens = [0, 1, 20, 0, 17, 1]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
    T = int(cu[-1])
    xs = inputs("dplr", 1, T, 1, 2, 32, 32, dtype=dt, N=len(lens),
                reset=(0, T // 2, 0, 1) if dt == F32 else None).tensors(*NAMES)
    do, dht, ref = _reference_grads(xs, cu=cu)
    grads = _op_grads(xs, do, dht, cu_seqlens=cu, chunk_size=16)
    _check(grads, ref, xs, dt, "varlen")
    # an empty sequence passes its state through: dh0 = dht
    assert torch.equal(grads["h0"][0], dht[0]) and torch.equal(grads["h0"][3], dht[3])


@pytest.mark.parametrize("lb", [None, -5.0], ids=["elementwise", "factorised"])
def test_kernels_on_float64_intermediates(lb):
    """The three backward launches alone, on the forward's intermediates computed in float64 torch
    (kdagen.ops.dplr_bwd's chunk form; tests/dplr_chunk_ref.py): no kdagen forward involved."""
    B, T, H, HV, K, V, C = 1, 37, 1, 2, 48, 48, 32
    xs = inputs("dplr", B, T, H, HV, K, V, lb=lb, reset=(0, T // 2, 0, 1) if lb is None else None).tensors(*NAMES)
    do, dht, ref = _reference_grads(xs, scale=0.3)
    fw = chunk_forward(xs["q"], xs["k"], xs["v"], xs["a"], xs["b"], xs["gk"], xs["h0"], 0.3, C)
    plan = lower(S.dplr(S.gate_direct(lb)), K, V, "float32", "chunk")
    NT_total, _, _ = chunk_schedule(None, B, T, C, "cpu")
    dummy = dummy_pointer("cpu")
    meta = BwdMeta(B=B, T=T, H=H, HV=HV, K=K, V=V, N=B, NT=-(-T // C), NT_total=NT_total, C=C, scale=0.3, plan=plan,
                   config=plain_bwd(chunk_size=C, sub_chunk=16), is_varlen=False, cu_seqlens=dummy,
                   chunk_indices=dummy, chunk_offsets=dummy, fwd_intra=None, inter_dtype=F32)
    inter = {n: fw[n].float() for n in ("qg", "kg", "w", "aqk", "gn", "aqv", "kgv")}
    tensors = dict(q=xs["q"], k=xs["k"], v=xs["v"], a=xs["a"], b=xs["b"], g=xs["gk"])
    out = run_dplr_bwd(meta, tensors, inter, fw["hs"].float(), fw["vn"].float(), do, dht, True)
    for n in NAMES:
        assert_close(out["dg" if n == "gk" else f"d{n}"], ref[n], GRAD_TOL[F32], f"kernels d{n}")


def test_sources_branch_on_the_structure():
    """DPLR's backward sources: its branches of the state and dqkw kernels, its own intra template
    (four products, L = (I - A_ab)^-1, no beta); KDA's have none of it."""
    cfg = plain_bwd(chunk_size=64, sub_chunk=16, check_gate_bound=False)  # (the heuristic's for DPLR)
    for lb in (None, -5.0):
        dplr = {kind: render(kind, lower(S.dplr(S.gate_direct(lb)), 64, 64, "bfloat16", "chunk"), cfg).text
                for kind in ("chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra")}
        kda = {kind: render(kind, lower(S.kda(S.gate_direct(lb)), 64, 64, "bfloat16", "chunk"), cfg).text
               for kind in ("chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra")}
        assert "tl.store(dv0" in dplr["chunk_bwd_state"] and "dv0" not in kda["chunk_bwd_state"]
        assert "tl.store(daqv" in dplr["chunk_bwd_dqkw"] and "dkgv" not in kda["chunk_bwd_dqkw"]
        intra = dplr["chunk_bwd_intra"][dplr["chunk_bwd_intra"].index("@triton.jit"):]
        for name in ("b_Aab_3_0", "b_Aak_3_3", "b_L_3_0", "b_dAB_2_1", "b_dQK_3_3", "tl.store(da", "tl.store(db"):
            assert name in intra, (lb, name)
        assert "beta" not in intra and "b_Aab" not in kda["chunk_bwd_intra"]
        # the off-diagonal pairs are tensor-core dots; the diagonal ones too: factorised outright with a
        # bound (trusted by default), each sub-tile's span checked in the kernel without one (element-wise
        # columns where it is over the limit)
        assert "b_Aab_3_0 += tl.dot(" in intra and "b_dY = tl.dot(" in intra
        assert "b_Sx = tl.dot(b_dPqb, b_bb" in intra
        assert intra.count("if span <=") == (8 if lb is None else 0)  # 4 sub-tiles x 2 passes
    # a promised bound checked when the config asks (check_gate_bound=True)
    checked = render("chunk_bwd_intra", lower(S.dplr(S.gate_direct(-5.0)), 64, 64, "bfloat16", "chunk"),
                     plain_bwd(chunk_size=64, sub_chunk=16, check_gate_bound=True)).text
    assert "b_Sx = tl.dot(b_dPqb, b_bb" in checked and checked.count("if span <=") == 8
    # fp16 factors cannot hold exp(81): element-wise without a bound, no check
    fp16 = render("chunk_bwd_intra", lower(S.dplr(S.gate_direct(None)), 64, 64, "float16", "chunk"), cfg).text
    assert "b_Sx = tl.dot(b_dPqb, b_bb" not in fp16 and "if span <=" not in fp16
