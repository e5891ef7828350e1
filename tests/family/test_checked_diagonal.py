"""The training kernels' checked diagonal tiles, in the CPU interpreter.  A per-channel gate without a
lower bound (chunk_kda without ``safe_gate``, chunk_gla, chunk_dplr_delta_rule), or with a bound the
caller promises (``safe_gate=True``: g given, so the promise can be broken; checked unless the configs
set ``check_gate_bound=False``), gets the factorised diagonal products wherever a 16-token sub-tile's
decay span keeps their factors in range and element-wise ones (one column at a time) elsewhere.  KDA's
and GLA's kernels do it in repair launches: the main launches factorise everything and flag each
(chunk, head) with a sub-tile over the limit, a repair launch after each re-runs the flagged ones with
the per-sub-tile check; general DPLR's check in the kernel.

Inputs mixing both kinds of sub-tile (gate "below": g in [-5, 0) with a run of 20 tokens at -8 and a
token at -20; "inf": resets) must give the float64 recurrence's forward and every gradient in fp32
(fp16 where it applies), for KDA (the split backward and the fused one), GLA and general DPLR; the
source must carry the check only where it applies.
"""
from __future__ import annotations

import pytest
import torch

from cases import inputs, make_inputs
from conftest import F64, assert_close
from plain_configs import plain_bwd, plain_train

import kdagen
import kdagen.spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import SPAN_LIMIT, render
from kdagen.config import ChunkBwdConfig, ChunkTrainConfig
from kdagen.ops.chunk import chunk_bwd_config
from kdagen.ops.inputs import select_spec
from kdagen.spec.reference import naive_recurrent_dplr, naive_recurrent_gla, naive_recurrent_kda

TOL = 1e-5  # relative Frobenius error, fp32 against float64
TOL_F16 = 5e-3  # fp16 inputs (the family's bar)
C, BC = 32, 16


def _spans(g: torch.Tensor) -> torch.Tensor:
    """Each 16-token sub-tile's decay span (the largest -sum of g over its rows, per channel) for
    one sequence [T, HV, K] in chunks of 32 from token 0."""
    T = g.shape[0]
    out = []
    for t0 in range(0, T, BC):
        out.append((-g[t0:t0 + BC].sum(0)).max())
    return torch.stack(out)


def _grads(fn, leaves, do, dht):
    o, ht = fn(**leaves)
    return [o, ht] + list(torch.autograd.grad((o, ht), list(leaves.values()), (do, dht)))


def _kda_against_float64(x, seed: int, fwd: ChunkTrainConfig, bwd: ChunkBwdConfig, **kw):
    """chunk_kda's forward and every gradient (q, k, v, g, beta, initial_state; from o and the final
    state) for inputs ``x`` under configs ``fwd`` and ``bwd``, against float64 autograd through the
    recurrence, at the fp32 bar (or TOL_F16 for fp16 inputs)."""
    leaves = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, initial_state=x.h0)
    leaves = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(x.v.shape, generator=gen).to(x.v.dtype)
    dht = torch.randn(x.h0.shape, generator=gen)
    with chunk_bwd_config(bwd):
        got = _grads(lambda **d: kdagen.chunk_kda(**d, output_final_state=True, config=fwd, **kw), leaves, do, dht)
    ref_leaves = {n: t.detach().to(F64).requires_grad_(True) for n, t in leaves.items()}
    ref = _grads(lambda **d: naive_recurrent_kda(**d, output_final_state=True), ref_leaves, do.to(F64), dht.to(F64))
    tol = TOL if x.v.dtype == torch.float32 else TOL_F16
    for name, a, r in zip(["o", "ht"] + [f"d{n}" for n in leaves], got, ref):
        assert_close(a.float(), r, tol, name)


@pytest.mark.parametrize("bwd", [dict(intra_split=True), dict(intra_split=False)], ids=["split", "fused"])
def test_kda_without_a_bound_mixing_both_kinds_of_sub_tile(bwd):
    x = make_inputs(1, 100, 1, 2, 32, 16, gate="below", seed=5)
    spans = _spans(x.g[0])
    assert (spans > SPAN_LIMIT).any() and (spans <= SPAN_LIMIT).sum() >= 4  # both branches are taken
    _kda_against_float64(x, 11, plain_train(chunk_size=C, sub_chunk=BC, intra_block_k=32),
                         plain_bwd(intra_block_k=32, **bwd))


def test_gla_without_a_bound_mixing_both_kinds_of_sub_tile():
    x = make_inputs(1, 70, 1, 1, 32, 16, gate="below", seed=6)
    spans = _spans(x.g[0])
    assert (spans > SPAN_LIMIT).any() and (spans <= SPAN_LIMIT).any()
    leaves = dict(q=x.q, k=x.k, v=x.v, g=x.g, initial_state=x.h0)
    leaves = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    gen = torch.Generator().manual_seed(12)
    do = torch.randn(x.v.shape, generator=gen)
    dht = torch.randn(1, 1, 32, 16, generator=gen)
    got = _grads(lambda **d: kdagen.chunk_gla(**d, output_final_state=True), leaves, do, dht)
    ref_leaves = {n: t.detach().to(F64).requires_grad_(True) for n, t in leaves.items()}
    ref = _grads(lambda **d: naive_recurrent_gla(**d, output_final_state=True), ref_leaves, do.to(F64), dht.to(F64))
    for name, a, r in zip(["o", "ht"] + [f"d{n}" for n in leaves], got, ref):
        assert torch.isfinite(a).all(), name
        assert_close(a, r, TOL, name)


def _source(kernel, dtype, bounded=False, config=None):
    sel = select_spec(False, bounded, -5.0 if bounded else None, False, False)
    plan = lower(sel, 64, 64, dtype, "chunk", False)
    cfg = config or (plain_train(intra_block_k=32) if kernel == "chunk_intra" else plain_bwd(intra_split=True))
    return render(kernel, plan, cfg).text


# A promised bound that g breaks (issue 13's gate contract, training path), checked (check_gate_bound=True,
# the default for KDA: repair launches re-run the flagged chunks): chunk_kda with safe_gate=True,
# lower_bound=-5 given g at the bound everywhere ("lb"), below it ("below": runs at -8 and a -20, so some
# sub-tiles span over the limit) and -inf resets ("inf": a whole token, and some channels of another).
# Each must give the float64 recurrence's forward and gradients.  fp16 keeps the element-wise diagonal
# (no check: nothing to break) and is checked at its own tolerance; it needs the -inf floor too.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("gate", ["lb", "below", "inf"])
def test_kda_training_gives_the_recurrence_where_g_breaks_the_promised_bound(gate, dtype):
    x = make_inputs(1, 75, 1, 2, 32, 16, gate=gate, seed=7, dtype=dtype)
    if gate == "below":
        spans = _spans(x.g[0].float())
        assert (spans > SPAN_LIMIT).any() and (spans <= SPAN_LIMIT).any()  # both branches are taken
    _kda_against_float64(x, 13, plain_train(chunk_size=C, sub_chunk=BC, intra_block_k=32, check_gate_bound=True),
                         plain_bwd(intra_block_k=32, intra_split=True, check_gate_bound=True),
                         safe_gate=True, lower_bound=-5.0)


def test_trusting_the_bound_is_what_the_check_guards_against():
    """The same broken promise with check_gate_bound=False (the unchecked factorised tiles, no repair
    launch): wrong, so the test above passes because of the check, not by luck."""
    x = make_inputs(1, 75, 1, 2, 32, 16, gate="below", seed=7)
    cfg = plain_train(chunk_size=C, sub_chunk=BC, intra_block_k=32, check_gate_bound=False)
    o, _ = kdagen.chunk_kda(x.q, x.k, x.v, x.g.requires_grad_(True), x.beta, initial_state=x.h0,
                            safe_gate=True, lower_bound=-5.0, config=cfg)
    ref, _ = naive_recurrent_kda(x.q.to(F64), x.k.to(F64), x.v.to(F64), x.g.detach().to(F64), x.beta.to(F64),
                                 initial_state=x.h0.to(F64))
    assert not torch.isfinite(o).all() or rel(o, ref) > 1e-2


def rel(a, r):
    return float((a.to(F64) - r).norm() / r.norm())


@pytest.mark.parametrize("kernel", ["chunk_intra", "chunk_bwd_wy", "chunk_bwd_intra"])
def test_the_check_is_in_the_source_where_it_applies(kernel):
    check = f"if span <= {SPAN_LIMIT!r}:"
    assert check in _source(kernel, "bfloat16") and check in _source(kernel, "float32")
    # a promised bound is checked by default (g below it takes the element-wise columns in the repair
    # launch), and trusted when the config says so
    assert check in _source(kernel, "bfloat16", bounded=True)
    ask = (plain_train(intra_block_k=32, check_gate_bound=True) if kernel == "chunk_intra"
           else plain_bwd(intra_split=True, check_gate_bound=True))
    trust = (plain_train(intra_block_k=32, check_gate_bound=False) if kernel == "chunk_intra"
             else plain_bwd(intra_split=True, check_gate_bound=False))
    assert "if span <=" not in _source(kernel, "bfloat16", bounded=True, config=trust)
    assert check in _source(kernel, "bfloat16", config=trust)  # without a bound there is nothing to trust
    # the check runs in the repair launch only (REPAIR): the fast launch factorises outright
    src = _source(kernel, "bfloat16")
    assert "REPAIR: tl.constexpr" in src and "if REPAIR:\n" in src
    # a bound the in-kernel gate's formula guarantees (g = lower_bound * sigmoid(...)): nothing to check
    sel = select_spec(True, True, -5.0, False, False)
    plan = lower(sel, 64, 64, "bfloat16", "chunk", True)
    assert plan.diag_mode == "factorised"
    assert "if span <=" not in render(kernel, plan, ask).text
    # fp16 factors (range 6.5e4) cannot hold exp(81): element-wise unless the diagonal's operands are fp32
    assert "if span <=" not in _source(kernel, "float16")
    cfg = (plain_train(intra_block_k=32, diag_precision="tf32") if kernel == "chunk_intra"
           else plain_bwd(intra_split=True, diag_precision="tf32"))
    assert check in _source(kernel, "float16", config=cfg)
    # no per-channel decay: nothing to check
    plan = lower(S.gdn(), 64, 64, "bfloat16", "chunk", False)
    assert "if span <=" not in render(kernel, plan, plain_train() if kernel == "chunk_intra"
                                      else plain_bwd(intra_split=True)).text


# General DPLR (chunk_dplr_delta_rule) has its own intra templates, checked the same way: gk mixing
# sub-tiles under and over the span limit (a run of 20 tokens at -8 and a -inf in some channels),
# without a bound and with a promised bound that gk breaks.  Forward and every gradient in fp32
# against float64 autograd through the recurrence.
@pytest.mark.parametrize("bound", [None, -5.0], ids=["unbounded", "promised-broken"])
def test_dplr_mixing_both_kinds_of_sub_tile(bound):
    from test_dplr_chunk_bwd import NAMES, _op_grads, _reference_grads
    xs = inputs("dplr", 1, 80, 1, 2, 32, 16, seed=9).tensors(*NAMES)
    g = xs["gk"]
    g[0, 20:40, :, :8] = -8.0  # 160 over 20 tokens: over any 16-token budget in those channels
    g[0, 50, 1, 3:6] = -float("inf")
    spans = _spans(g[0])
    assert (spans > SPAN_LIMIT).any() and (spans <= SPAN_LIMIT).sum() >= 2
    do, dht, ref = _reference_grads(xs)
    # with a bound, the check asked for (check_gate_bound=True; DPLR's heuristic trusts the promise)
    kw = {} if bound is None else dict(safe_gate=True, lower_bound=bound,
                                       config=plain_train(check_gate_bound=True))
    with chunk_bwd_config(plain_bwd(check_gate_bound=True)):
        got = _op_grads(xs, do, dht, **kw)
    for n in NAMES:
        assert_close(got[n], ref[n], TOL, f"d{n}")
    # the forward on its own (the inference call runs the same intra launch)
    x64 = {n: xs[n].to(F64) for n in NAMES}
    ro, rh = naive_recurrent_dplr(x64["q"], x64["k"], x64["v"], -x64["b"], x64["a"], x64["gk"],
                                  initial_state=x64["h0"], output_final_state=True)
    o, ht = kdagen.chunk_dplr_delta_rule(xs["q"], xs["k"], xs["v"], xs["a"], xs["b"], xs["gk"],
                                         initial_state=xs["h0"], output_final_state=True, **kw)
    assert_close(o, ro, TOL, "o")
    assert_close(ht, rh, TOL, "ht")


def test_backward_repairs_every_chunk_where_the_forward_wrote_no_flags():
    """A backward config that checks (check_gate_bound=True) after a forward that trusted the bound (no
    flags written): the backward's repair launches re-run every chunk, and the gradients are still the
    recurrence's (g within the bound here, so the forward is exact)."""
    from kdagen.ops.chunk_bwd import _repair_flags

    x = make_inputs(1, 45, 1, 2, 32, 16, seed=8)
    _kda_against_float64(x, 14, plain_train(chunk_size=C, sub_chunk=BC, intra_block_k=32, check_gate_bound=False),
                         plain_bwd(intra_block_k=32, intra_split=True, check_gate_bound=True),
                         safe_gate=True, lower_bound=-5.0)

    class _Meta:  # the flags' fallback itself: every program flagged
        NT_total, HV = 3, 2
        fwd_intra = type("I", (), {"args": {}})()
    flags = _repair_flags(_Meta, torch.device("cpu"))
    assert flags.dtype == torch.int8 and flags.shape == (3, 2) and bool((flags == 1).all())


def test_the_repair_of_the_k_split_gradients_walks_every_k_tile():
    """The split backward's dq/dk/dg launch runs one program per (chunk, head, K tile); its repair launch
    one per (chunk, head), walking every K tile: two K tiles here (K=64, BK=32), a chunk flagged."""
    x = make_inputs(1, 70, 1, 1, 64, 16, gate="below", seed=15)
    spans = _spans(x.g[0])
    assert (spans > SPAN_LIMIT).any() and (spans <= SPAN_LIMIT).any()
    _kda_against_float64(x, 16, plain_train(chunk_size=C, sub_chunk=BC, intra_block_k=32),
                         plain_bwd(intra_block_k=32, intra_split=True))
