"""Plans without a decay (DeltaNet) write no qg or kg (``Plan.raw_qk``): qg = q scale and kg = k, so the
training forward's intra launch and the backward's re-run skip them, and the state passes and the output
launch read q and k from the inputs ([B, T, H, K], the scale applied after the product).  Half-precision
plans with a scalar decay given as g (Gated DeltaNet, ``Plan.qk_row_scaled``) do the same, their readers
forming qg = q exp(G) and kg = k exp(G_n - G) from q, k and g.  Checked here:

* which plans take it, and that the writing launches' sources store no qg / kg for them (and still do for
  a decayed plan);
* the launches pass the inputs themselves where qg and kg were (no [B, T, HV, K] buffer allocated);
* DeltaNet's output, final state and gradients against float64 autograd through the token-by-token
  recurrence with GVA (two q/k heads of two value heads each), varlen with length-0/1 sequences, in the four
  combinations of the output's launch (fused in the state pass, or split out) and the backward's
  intermediates (re-run, or kept from the forward), fp32 and fp16;
* Gated DeltaNet's (dg too) the same way in fp16 (row-scaled) and fp32 (qg and kg written), with a reset
  (g = -inf) inside a chunk.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cases import inputs, reference
from conftest import F64, assert_close
from plain_configs import plain_bwd, plain_train

import kdagen.spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.ops.member import chunk_member, chunk_member_launches

F32, F16 = torch.float32, torch.float16


def test_only_plans_without_a_decay_read_q_and_k_raw():
    plans = {name: lower(S.get_spec("kda", lower_bound=-5.0) if name == "kda" else S.get_spec(name), 64, 64,
                         "bfloat16", "chunk") for name in ("kda", "gdn", "deltanet", "gla", "dplr")}
    assert {n for n, p in plans.items() if p.raw_qk} == {"deltanet"}
    cfg, bcfg = plain_train(), plain_bwd()
    for name in ("deltanet", "kda"):
        writes = [render("chunk_intra", plans[name], cfg).text, render("chunk_bwd_rerun", plans[name], bcfg).text]
        for src in writes:
            stores = ("tl.store(qg" in src, "tl.store(kg" in src)
            assert stores == ((False, False) if name == "deltanet" else (True, True)), name


NAMES = ("q", "k", "v", "beta", "h0")


def test_the_launches_pass_the_inputs_where_qg_and_kg_were():
    q, k, v, beta, h0 = inputs("deltanet", 1, 40, 1, 2, 32, 16, N=1, seed=1).take(*NAMES)
    fwd, bwd, _ = chunk_member_launches(S.deltanet(), q, k, v, None, beta, training=True, initial_state=h0,
                                        config=plain_train(split_output=True))
    intra, state, out = fwd
    assert intra.args["qg"].numel() <= 1 and intra.args["kg"].numel() <= 1  # dummies: nothing allocated
    assert state.args["kg"] is k and out.args["qg"] is q and state.constexprs["H"] == 1
    rerun = next(ln for ln in bwd if ln.kernel == "chunk_bwd_rerun")
    rev = next(ln for ln in bwd if ln.kernel == "chunk_bwd_state")
    assert rerun.args["qg"].numel() <= 1 and rerun.args["kg"].numel() <= 1
    assert rev.args["qg"] is q and rev.args["kg"] is k and rev.args["scale"] == pytest.approx(32 ** -0.5)


@pytest.mark.parametrize("split", [True, False], ids=["split-output", "fused-output"])
@pytest.mark.parametrize("stored", [False, True], ids=["rerun", "stored"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("member", ["deltanet", "gdn"])
def test_q_and_k_from_the_inputs_match_the_recurrence(member, dtype, stored, split):
    """DeltaNet (q and k raw) and Gated DeltaNet (in fp16 their rows scaled by the readers; in fp32 qg and kg
    written) against float64 autograd, GDN with a reset (g = -inf) inside a chunk."""
    _check_against_the_recurrence(member, dtype, stored, split, plain_train(split_output=split, state_block_v=16))


@pytest.mark.parametrize("member", ["gdn", "deltanet"])
def test_64_row_chunks_match_the_recurrence(member):
    """Gated DeltaNet's bf16 training step, and DeltaNet's with few state programs, run on 64-row chunks with
    the folded backward (the heuristic, kdagen/cache/heuristics.py trains_on_64_row_chunks:
    docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md);
    the same launches in fp16 (the interpreter runs no bf16), q and k from the inputs (GDN's rows scaled),
    recompute mode, against float64 autograd: varlen with sequences of
    lengths 0, 1, 19 and 33 (each one partial 64-row chunk), GVA, a reset mid-chunk."""
    from kdagen.ops.chunk import chunk_bwd_config

    bwd = plain_bwd(chunk_size=64, sub_chunk=32, intra_split=True, intra_fold=True, intra_block_k=32,
                    intra_block_v=16, intra_num_warps=2, dqkw_block_k=32, dqkw_block_v=16, state_block_v=32,
                    state_num_stages=3, state_prefetch=True, rerun_num_warps=1)
    train = plain_train(chunk_size=64, sub_chunk=32, split_output=True, state_block_v=32)
    with chunk_bwd_config(bwd):
        _check_against_the_recurrence(member, F16, False, True, train, expect_chunk=64)


def _check_against_the_recurrence(member, dtype, stored, split, config, expect_chunk=None):
    gdn = member == "gdn"
    T, H, HV, K, V = 53, 2, 4, 32, 24  # two q/k heads of two value heads each
    cu = [0, 0, 1, 20, 53]
    q, k, v, beta, h0 = inputs("deltanet", 1, T, H, HV, K, V, dtype=dtype, N=len(cu) - 1,
                               seed=41 if gdn else 31).take(*NAMES)
    gen = torch.Generator().manual_seed(42 if gdn else 32)
    g = None
    if gdn:
        g = F.logsigmoid(torch.randn(1, T, HV, generator=gen) + 1.0)
        g[0, 37, 2] = -float("inf")  # a reset of one value head's state, mid-chunk
        g = g.to(dtype)
    do = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    dht = torch.randn(h0.shape, generator=gen)
    spec = S.gdn() if gdn else S.deltanet()
    names = ("q", "k", "v", "g", "beta", "h0") if gdn else ("q", "k", "v", "beta", "h0")
    vals = dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    fwd, bwd, _ = chunk_member_launches(spec, q, k, v, g, beta, training=True, initial_state=h0,
                                        cu_seqlens=torch.tensor(cu), config=config)
    # DeltaNet reads k itself; GDN in fp16 too (its rows scaled in the readers), in fp32 a kg buffer
    assert (fwd[1].args["kg"] is k) == (not gdn or dtype == F16)
    if expect_chunk is not None:  # the launches run on the chunks asked for, the backward folded
        assert {ln.constexprs["BT"] for ln in list(fwd) + list(bwd) if "BT" in ln.constexprs} == {expect_chunk}
        assert "chunk_bwd_intra" not in {ln.kernel for ln in bwd}
    xs = {n: vals[n].clone().requires_grad_() for n in names}
    o, ht = chunk_member(spec, xs["q"], xs["k"], xs["v"], xs.get("g"), xs["beta"], initial_state=xs["h0"],
                         output_final_state=True, cu_seqlens=torch.tensor(cu), scale=0.3,
                         config=config, disable_recompute=stored)
    mine = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), [xs[n] for n in names])
    x64 = {n: vals[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference(member, x64, scale=0.3, cu_seqlens=torch.tensor(cu))
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in names])
    tol = {F32: 1e-5, F16: 5e-3}[dtype]
    assert_close(o.float(), ro, tol, "o")
    assert_close(ht.float(), rh, tol, "final state")
    for n, a, b in zip(names, mine, ref):
        if n == "g":  # the reset's own dg is not finite in the float64 recurrence; the finite rest is compared
            assert torch.isfinite(a).all()
            keep = torch.isfinite(b)
            a, b = a[keep], b[keep]
        assert_close(a.float(), b, tol, f"d{n}")


def test_half_precision_scalar_decay_plans_form_qg_and_kg_in_their_readers():
    plans = {(name, dt): lower(S.get_spec("kda", lower_bound=-5.0) if name == "kda" else S.get_spec(name), 64, 64,
                               dt, "chunk") for name in ("kda", "gdn", "deltanet", "gla", "dplr")
             for dt in ("bfloat16", "float16", "float32")}
    assert {k for k, p in plans.items() if p.qk_row_scaled} == {("gdn", "bfloat16"), ("gdn", "float16")}
    assert {k for k, p in plans.items() if p.qk_from_inputs} == (
        {("gdn", "bfloat16"), ("gdn", "float16")} | {("deltanet", dt) for dt in ("bfloat16", "float16", "float32")})
    from kdagen.ops.family import gdn_spec
    assert not lower(gdn_spec(True, True), 64, 64, "bfloat16", "chunk", True).qk_row_scaled  # the in-kernel gate
    cfg, bcfg = plain_train(), plain_bwd()
    for dt, written in (("float16", False), ("float32", True)):
        plan = plans[("gdn", dt)]
        for src in (render("chunk_intra", plan, cfg).text, render("chunk_bwd_rerun", plan, bcfg).text):
            assert ("tl.store(qg" in src, "tl.store(kg" in src) == (written, written), dt
        for kernel in ("chunk_state", "chunk_bwd_state"):  # the readers form them from g, or load them
            assert ("b_gam = tl.exp(" in render(kernel, plan, cfg if kernel == "chunk_state" else bcfg).text) != written
