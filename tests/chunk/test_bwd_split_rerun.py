"""The backward's two launch-structure options, in the CPU interpreter:

* ``ChunkBwdConfig.intra_split``: the intra-chunk gradients as two launches (chunk_bwd_wy writes
  dE and T; chunk_bwd_intra reads them, one K tile per program for a per-channel decay) give
  the same numbers as the fused launch -- bit for bit, since every value is computed by the
  same operations and dE crosses between them in float32 -- for KDA (bounded and unbounded
  gates, the in-kernel gate), Gated DeltaNet (a scalar decay: its dg sums the channels) and
  DeltaNet (no decay), fp32 and fp16, K over several tiles and K not a multiple of the tile;
* ``ChunkBwdConfig.intra_fold`` (no decay: DeltaNet; a scalar decay given as g: Gated DeltaNet): the
  split's second launch folded into dqkw (dq finished, dk's A_qk part, its share of dg's sums) and
  chunk_bwd_wy (dk's rank-1 part, dg's cumsums) gives the split's dq, dk and dg to float rounding (the
  products are summed in another order) and its dv, dbeta and dh0 bit for bit, and both members'
  gradients through it match the float64 recurrence (GVA, varlen with length-0/1 sequences, K over
  masked tiles, a reset g = -inf);
* recompute mode's chunk_bwd_rerun rebuilds from the kept A_qk and T exactly what the
  forward's intra launch wrote (qg, kg, W, G_n);

and which launches each (plan, config) takes (codegen.render.family_kernels).  The gradients
of both paths against float64 are tests/chunk/test_ops_chunk_bwd.py's (its fp16 cases run the split,
the heuristic for half precision; its fp32 cases the fused launch).
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from cases import make_inputs
from conftest import F64, TOL, assert_close
from plain_configs import plain_bwd, plain_train

import kdagen.spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import family_kernels, render
from kdagen.config import ChunkBwdConfig, ConfigError
from kdagen.ops.chunk import chunk_kda_bwd_launches
from kdagen.ops.member import chunk_member_launches
from kdagen.spec.reference import naive_recurrent_deltanet, naive_recurrent_gdn

F32, F16 = torch.float32, torch.float16
OUT_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_part", "dbias_part")


def _kda(dtype, K, V, gate, bwd_config, T=45, cu=None, HV=2):
    x = make_inputs(1, T, 1, HV, K, V, dtype=dtype, seed=3, gate="raw" if gate == "gik" else "random",
                    cu_seqlens=cu)
    kw = dict(safe_gate=True, lower_bound=-5.0) if gate == "safe" else {}
    if gate == "gik":
        gen = torch.Generator().manual_seed(5)
        kw = dict(use_gate_in_kernel=True, A_log=0.5 * torch.randn(HV, generator=gen),
                  dt_bias=0.5 * torch.randn(HV * K, generator=gen))
    gen = torch.Generator().manual_seed(9)
    do = torch.randn(x.v.shape, generator=gen).to(dtype)
    N = x.h0.shape[0]
    dht = torch.randn(N, HV, K, V, generator=gen)
    return chunk_kda_bwd_launches(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                  cu_seqlens=x.cu_seqlens, bwd_config=bwd_config, do=do, dht=dht, **kw)


def _member(member, dtype, K, V, bwd_config, T=45, HV=2):
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, T, 1, K, generator=gen).to(dtype)
    k = F.normalize(torch.randn(1, T, 1, K, generator=gen), dim=-1).to(dtype)
    v = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    beta = torch.rand(1, T, HV, generator=gen).to(dtype)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen) + 1.0).to(dtype) if member == "gdn" else None
    spec = S.gdn() if member == "gdn" else S.deltanet()
    do = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    return chunk_member_launches(spec, q, k, v, g, beta, training=True, output_final_state=True,
                                 initial_state=torch.randn(1, HV, K, V, generator=gen), bwd_config=bwd_config,
                                 do=do)


def _run(launches):
    fwd, bwd, out = launches
    for ln in list(fwd) + list(bwd):
        ln()
    return [ln.kernel for ln in bwd], {n: out[n] for n in OUT_NAMES if out.get(n) is not None}


SPLIT_CASES = [
    # (id, builder, dtype, K, V, extra config)
    ("kda-safe-fp32-K64-two-tiles", lambda c: _kda(F32, 64, 32, "safe", c), {}),
    ("kda-free-fp32-K40-masked", lambda c: _kda(F32, 40, 24, "free", c), dict(intra_block_k=16)),
    ("kda-gik-fp16", lambda c: _kda(F16, 32, 32, "gik", c), {}),
    ("kda-safe-fp16-varlen", lambda c: _kda(F16, 32, 40, "safe", c, T=53, cu=[0, 1, 20, 53]), {}),
    ("gdn-scalar-decay-fp32-K64", lambda c: _member("gdn", F32, 64, 32, c), {}),
    ("deltanet-no-decay-fp16", lambda c: _member("deltanet", F16, 32, 32, c), {}),
    # no decay: the second launch one K tile per program too (nothing sums channels), over four tiles
    ("deltanet-no-decay-fp32-K64-four-tiles", lambda c: _member("deltanet", F32, 64, 32, c), dict(intra_block_k=16)),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_intra_equals_the_fused_launch(case):
    _, builder, extra = case
    base = plain_bwd(intra_block_v=16, **extra)
    kinds_f, fused = _run(builder(base.replace(intra_split=False)))
    kinds_s, split = _run(builder(base.replace(intra_split=True)))
    assert kinds_f == ["chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"]
    assert kinds_s == ["chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_wy", "chunk_bwd_intra"]
    dqkg = builder(base.replace(intra_split=True))[1][-1]
    K, BK = dqkg.constexprs["K"], dqkg.constexprs["BK"]
    # one K tile per program unless the decay is one number per token (its dg sums the channels)
    assert dqkg.grid[2] == (1 if case[0].startswith("gdn") else -(-K // BK))
    assert fused.keys() == split.keys() and {"dq", "dk", "dv", "dbeta"} <= fused.keys()
    for n, a in fused.items():
        assert torch.isfinite(a).all(), n
        assert torch.equal(a, split[n]), f"{n}: max difference {(a.float() - split[n].float()).abs().max()}"


FOLD_CASES = [
    # (id, dtype, K, V, extra config)
    ("fp32-K32", F32, 32, 32, {}),
    # dqkw over two K tiles: a scalar decay's dg shares of both summed by the wy launch
    ("fp32-K64-two-dqkw-tiles-gdn", F32, 64, 32, dict(dqkw_block_k=32, intra_block_k=16)),
    ("fp32-K40-masked-tiles-gdn", F32, 40, 24, dict(dqkw_block_k=16, intra_block_k=16)),
    ("fp16-K32-gdn", F16, 32, 32, {}),
    ("fp32-K32-C64-gdn", F32, 32, 32, dict(chunk_size=64, sub_chunk=32, state_block_v=32)),
    # dqkw over two K tiles (each forms the whole dA_qk), the wy launch's K loop over four
    ("fp32-K64-two-dqkw-tiles", F32, 64, 32, dict(dqkw_block_k=32, intra_block_k=16)),
    ("fp32-K40-masked-tiles", F32, 40, 24, dict(dqkw_block_k=16, intra_block_k=16)),
    ("fp16-K32", F16, 32, 32, {}),
    # the forward's intermediates kept (no re-run), and 64-row chunks of two 32-row sub-tiles
    ("fp32-K32-stored", F32, 32, 32, dict(store_intermediates=True)),
    ("fp32-K32-C64", F32, 32, 32, dict(chunk_size=64, sub_chunk=32, state_block_v=32)),
]


@pytest.mark.parametrize("case", FOLD_CASES, ids=[c[0] for c in FOLD_CASES])
def test_folded_split_matches_the_split(case):
    cid, dtype, K, V, extra = case
    member = "gdn" if cid.endswith("-gdn") else "deltanet"
    split_cfg = plain_bwd(intra_block_v=16, intra_split=True, **extra)
    _, split = _run(_member(member, dtype, K, V, split_cfg))
    kinds, fold = _run(_member(member, dtype, K, V, split_cfg.replace(intra_fold=True)))
    rerun = [] if extra.get("store_intermediates") else ["chunk_bwd_rerun"]
    assert kinds == rerun + ["chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_wy"]
    assert fold.keys() == split.keys() and {"dq", "dk", "dv", "dbeta", "dh0"} <= fold.keys()
    if member == "gdn":  # dg one per token and value head, written by the wy launch
        assert fold["dg"].shape == fold["dq"].shape[:3]
    for n in ("dv", "dbeta", "dh0"):  # launches the fold leaves as they were
        assert torch.equal(fold[n], split[n]), n
    # dq, dk (and dg): the same products summed in another order (dA_qk's part first, in dqkw; dg's sums
    # over channels before its cumsums), and in half precision dA_qk (and dE) rounded after their decay
    # factors and before the scale
    tol = 2e-6 if dtype == F32 else 1e-3
    for n in ("dq", "dk", "dg") if member == "gdn" else ("dq", "dk"):
        a, b = fold[n].float(), split[n].float()
        assert torch.isfinite(a).all() and b.abs().max() > 1e-2, n
        assert (a - b).abs().max() <= tol * b.abs().max(), f"{n}: max difference {(a - b).abs().max()}"


@pytest.mark.parametrize("member", ["deltanet", "gdn"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_folded_gradients_match_the_recurrence(dtype, member):
    """DeltaNet's and Gated DeltaNet's gradients (GDN's dg too) with the folded split against float64 autograd
    through the token-by-token recurrence: GVA (two value heads per q/k head), varlen with sequences of length
    0 and 1, K = 40 over masked tiles of 16 in dqkw (for GDN three tiles whose dg shares the wy launch sums)
    and the wy launch, an initial state and the final state's gradient; for GDN a reset (g = -inf) inside a
    chunk."""
    gdn = member == "gdn"
    T, HV, K, V = 37, 2, 40, 24
    cu = [0, 0, 1, 20, 37]
    gen = torch.Generator().manual_seed(12 if gdn else 11)
    q = torch.randn(1, T, 1, K, generator=gen).to(dtype)
    k = F.normalize(torch.randn(1, T, 1, K, generator=gen), dim=-1).to(dtype)
    v = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    beta = torch.rand(1, T, HV, generator=gen).to(dtype)
    g = None
    if gdn:
        g = F.logsigmoid(torch.randn(1, T, HV, generator=gen) + 1.0)
        g[0, 27, 1] = -float("inf")  # a full reset of one value head's state, mid-chunk
        g = g.to(dtype)
    h0 = torch.randn(len(cu) - 1, HV, K, V, generator=gen)
    do = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    dht = torch.randn(h0.shape, generator=gen)
    cfg = plain_bwd(intra_split=True, intra_fold=True, intra_block_k=16, intra_block_v=16, dqkw_block_k=16)
    fwd, bwd, out = chunk_member_launches(S.gdn() if gdn else S.deltanet(), q, k, v, g, beta, training=True,
                                          output_final_state=True, initial_state=h0, cu_seqlens=torch.tensor(cu),
                                          bwd_config=cfg, do=do, dht=dht)
    assert [ln.kernel for ln in bwd] == ["chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_wy"]
    assert bwd[2].grid[2] == 3  # K = 40 in three tiles of 16, the last masked
    assert bwd[3].args.get("NKQ") == (3 if gdn else None)  # the wy launch sums GDN's three dg shares
    for ln in list(fwd) + list(bwd):
        ln()
    names = ("q", "k", "v", "g", "beta", "h0") if gdn else ("q", "k", "v", "beta", "h0")
    x64 = {n: x.to(F64).requires_grad_() for n, x in zip(names, (q, k, v, g, beta, h0) if gdn else (q, k, v, beta, h0))}
    if gdn:
        ro, rh = naive_recurrent_gdn(x64["q"], x64["k"], x64["v"], x64["g"], x64["beta"], initial_state=x64["h0"],
                                     output_final_state=True, cu_seqlens=torch.tensor(cu))
    else:
        ro, rh = naive_recurrent_deltanet(x64["q"], x64["k"], x64["v"], x64["beta"], initial_state=x64["h0"],
                                          output_final_state=True, cu_seqlens=torch.tensor(cu))
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in names])
    mine = {"q": out["dq"].float().sum(2, keepdim=True), "k": out["dk"].float().sum(2, keepdim=True),  # over value heads
            "v": out["dv"], "g": out["dg"], "beta": out["dbeta"], "h0": out["dh0"]}
    for n, b in zip(names, ref):
        a = mine[n]
        assert a.shape == b.shape, n
        if n == "g":  # the reset's own dg is not finite in the float64 recurrence; the finite rest is compared
            keep = torch.isfinite(b)
            assert torch.isfinite(a).all()
            a, b = a[keep], b[keep]
        assert_close(a.float(), b, {F32: 1e-5, F16: 5e-3}[dtype], f"d{n}")
    assert torch.equal(out["dh0"][0], dht[0])  # a length-0 sequence passes the state's gradient through


def test_fold_is_a_no_decay_plans_and_renders_no_second_launch():
    dn = lower(S.deltanet(), 64, 64, "bfloat16", "chunk")
    kda = lower(S.get_spec("kda", lower_bound=-5.0), 64, 64, "bfloat16", "chunk")
    fold = plain_bwd(intra_split=True, intra_fold=True)
    assert fold.folds_intra(dn) and not fold.folds_intra(kda)
    gdn = lower(S.gdn(), 64, 64, "bfloat16", "chunk")  # a scalar decay given as g folds too
    assert fold.folds_intra(gdn) and "chunk_bwd_intra" not in family_kernels("chunk_bwd", gdn, fold)
    assert "dgr" in render("chunk_bwd_dqkw", gdn, fold).text and "dgr" not in render("chunk_bwd_dqkw", dn, fold).text
    assert not plain_bwd(intra_fold=True).folds_intra(dn)  # folds a split only
    kinds = family_kernels("chunk_bwd", dn, fold)
    assert "chunk_bwd_wy" in kinds and "chunk_bwd_intra" not in kinds
    with pytest.raises(ConfigError, match="folded"):
        render("chunk_bwd_intra", dn, fold)
    # the fold's sources name the field; a plan with a decay reads it nowhere (its sources are unchanged)
    assert "intra_fold=True" in render("chunk_bwd_dqkw", dn, fold).text
    assert "intra_fold=True" in render("chunk_bwd_wy", dn, fold).text
    for kernel in family_kernels("chunk_bwd", kda, fold):
        assert "intra_fold" not in render(kernel, kda, fold).text, kernel
        assert render(kernel, kda, fold).text == render(kernel, kda, fold.replace(intra_fold=False)).text, kernel


@pytest.mark.parametrize("gate,dtype,K", [("safe", F32, 64), ("free", F16, 40), ("gik", F32, 32)])
def test_rerun_rebuilds_the_forwards_intermediates(gate, dtype, K):
    """chunk_bwd_rerun's qg, kg, W and G_n against those the forward's intra launch wrote (the
    forward keeps only A_qk and T): the same sums and exps, so equal; W is a dot of the same
    rounded factors, equal to fp32 rounding.  The re-run's qg is q exp(G), the forward's q exp(G) scale
    (the reverse pass applies the scale after its dot): equal once scaled in fp32, to one rounding in fp16."""
    fwd, bwd, _ = _kda(dtype, K, 32, gate, plain_bwd(rerun_block_k=32), T=70)
    for ln in fwd:
        ln()
    rerun = bwd[0]
    assert rerun.kernel == "chunk_bwd_rerun" and rerun.grid[2] == -(-K // 32)
    assert rerun.args["td"] is fwd[0].args["td"] and fwd[0].constexprs["STORE_T"]
    rerun()
    mine, theirs = rerun.args, fwd[0].args
    for n in ("kg", "gn"):
        assert torch.equal(mine[n], theirs[n]), f"{n}: max difference {(mine[n] - theirs[n]).abs().max()}"
    assert "scale" not in rerun.args and bwd[1].kernel == "chunk_bwd_state" and bwd[1].args["scale"] == K ** -0.5
    qg = mine["qg"].float() * bwd[1].args["scale"]
    qg_ref = theirs["qg"].float()
    assert qg_ref.abs().max() > 1e-2
    if dtype == F32:
        assert torch.equal(qg, qg_ref), f"qg: max difference {(qg - qg_ref).abs().max()}"
    else:  # one fp16 rounding each, of q exp(G) and of q exp(G) scale
        assert ((qg - qg_ref).abs() <= 2 ** -10 * qg_ref.abs() + 1e-7).all()
    w, w_ref = mine["w"].float(), theirs["w"].float()
    assert w_ref.abs().max() > 1e-2  # not a zero tensor compared with itself
    tol = 1e-6 if dtype == F32 else 2e-3  # fp16: W rounded to fp16 (one ulp where the sums differ in order)
    assert (w - w_ref).abs().max() <= tol * w_ref.abs().max()


def test_stored_intermediates_keep_no_T_and_run_no_rerun():
    fwd, bwd, _ = _kda(F32, 32, 32, "safe", plain_bwd(store_intermediates=True))
    assert not fwd[0].constexprs["STORE_T"]
    assert [ln.kernel for ln in bwd] == ["chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"]


def test_which_launches_a_plan_and_config_take():
    kda = lower(S.get_spec("kda", lower_bound=-5.0), 64, 64, "bfloat16", "chunk")
    gla = lower(S.gla(), 64, 64, "bfloat16", "chunk")
    dplr = lower(S.dplr(), 64, 64, "bfloat16", "chunk")
    split, fused, stored = (plain_bwd(intra_split=True), plain_bwd(),
                            plain_bwd(intra_split=True, store_intermediates=True))
    base = ("chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra")
    l2 = ("qk_l2norm_bwd",)  # every backward has the l2-norm's (launched by a call that asks for it)
    assert family_kernels("chunk_bwd", kda, split) == base + ("chunk_bwd_wy", "chunk_bwd_rerun") + l2
    assert family_kernels("chunk_bwd", kda, fused) == base + ("chunk_bwd_rerun",) + l2
    assert family_kernels("chunk_bwd", kda, stored) == base + ("chunk_bwd_wy",) + l2
    # no rank-1 part: nothing to split; general DPLR: its own intra template and forward re-run
    assert family_kernels("chunk_bwd", gla, split) == base + ("chunk_bwd_rerun",) + l2
    assert family_kernels("chunk_bwd", dplr, split) == base + l2
    with pytest.raises(ConfigError, match="intra_split=True"):
        render("chunk_bwd_wy", kda, fused)
    # the field is named in the header of the sources it changes, and only there
    assert "intra_split=True" in render("chunk_bwd_intra", kda, split).text
    assert "intra_split" not in render("chunk_bwd_intra", gla, split).text
    with pytest.raises(ConfigError, match="intra_split must be a bool"):
        ChunkBwdConfig(intra_split=1)


def test_chunks_of_four_sub_tiles_take_neither():
    """C=64 (four 16-row sub-tiles): the split and the re-run from kept tiles are not taken (they
    gave non-finite gradients on the H200 there, cause not found:
    docs/decisions/0017-recompute-mode-split-intra.md),
    whatever the config asks -- the fused launch after a re-run of the forward's intra launch,
    which keeps no T; the heuristic at that chunking is the fused launch on 4 warps."""
    from kdagen.cache.heuristics import default_config
    from kdagen.config import ChunkTrainConfig as Train

    x = make_inputs(1, 70, 1, 1, 32, 32, seed=1)
    asked = plain_bwd(chunk_size=64, intra_split=True)
    kda = lower(S.get_spec("kda", lower_bound=-5.0), 32, 32, "float16", "chunk")
    assert not asked.splits_intra(kda) and not asked.reruns_from_saved(kda)
    fwd, bwd, _ = chunk_kda_bwd_launches(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, safe_gate=True,
                                         lower_bound=-5.0, config=plain_train(chunk_size=64),
                                         bwd_config=asked, with_rerun=True)
    assert [ln.kernel for ln in fwd] == ["chunk_intra", "chunk_state", "chunk_intra"]
    assert not fwd[0].constexprs["STORE_T"] and not fwd[2].constexprs["STORE_U"]
    assert [ln.kernel for ln in bwd] == ["chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"]
    assert bwd[2].grid == (bwd[2].grid[0], 1) and bwd[2].constexprs["BT"] == 64
    cfg = default_config("chunk_bwd", kda, None, Train(chunk_size=64))
    assert (cfg.chunk_size, cfg.intra_split, cfg.intra_num_warps, cfg.rerun_num_warps) == (64, False, 4, 4)
    cfg32 = default_config("chunk_bwd", kda, None, Train())
    # (fp16 with a -5 bound keeps element-wise diagonal tiles: its intra gradients run on 4 warps,
    # docs/decisions/0019-elementwise-diagonal-backward-4-warps.md; a factorised plan's on 2)
    assert (cfg32.chunk_size, cfg32.intra_split, cfg32.intra_num_warps, cfg32.rerun_num_warps) == (32, True, 4, 1)
    bf16 = lower(S.get_spec("kda", lower_bound=-5.0), 32, 32, "bfloat16", "chunk")
    assert bf16.diag_mode == "factorised" and default_config("chunk_bwd", bf16, None, Train()).intra_num_warps == 2



def test_split_diagonal_precision_adds_exact_zeros_in_fp32():
    """diag_precision="split" (the backward's upstream diagonal tiles as hi + lo in the dot dtype) runs
    its extra products in the dq/dk/dg launch only; with fp32 inputs the low parts are exactly zero, so
    every gradient equals the default's bit for bit (its effect on bf16: tests/chunk/test_bf16_emulated.py)."""
    kinds, base = _run(_kda(F32, 32, 32, "safe", plain_bwd(intra_split=True)))
    launches = _kda(F32, 32, 32, "safe", plain_bwd(intra_split=True, diag_precision="split"))
    source = {ln.kernel: open(inspect.getsourcefile(ln.fn.fn)).read() for ln in launches[1]}
    assert "b_dQl" in source["chunk_bwd_intra"] and "b_dQl" not in source["chunk_bwd_wy"]
    split_kinds, split = _run(launches)
    assert split_kinds == kinds and set(split) == set(base)
    for n in base:
        assert torch.equal(base[n], split[n]), n
