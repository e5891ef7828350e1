"""The recurrent form's variants: its two readouts (RecurrentConfig.readout): "updated" reads o = S_t^T q after
the update, "loaded" from the state as loaded plus the token's own terms.  Both must be the
recurrence's answer for every member -- KDA (also with its gate in the kernel), Gated DeltaNet,
DeltaNet, GLA and general DPLR -- in fp32 and fp16, over several tokens (the state carried in
registers from one token's update to the next readout), varlen with an empty sequence, GVA, an
initial state, a state pool, and g = -inf (a reset); each also as persistent programs
(RecurrentConfig.programs_per_sm: fewer programs than items) whose item loop Triton's pipeliner runs
(num_stages > 1: one-token items in the pipelined loop, longer ones in a second loop)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cases import inputs, reference
from conftest import TOL, assert_close
from plain_configs import plain_decode

import kdagen
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen import spec as S
from kdagen.config import ConfigError, RecurrentConfig
from kdagen.spec.reference import kda_gate, naive_recurrent_dplr, naive_recurrent_kda

F32, F16 = torch.float32, torch.float16
MEMBERS = ("kda", "kda_gate", "gdn", "deltanet", "gla", "dplr")
READOUTS = ("updated", "loaded")


# Every member's case: two sequences packed (lengths 5 and 0 and 4), GVA 1 -> 2, K=24, V=40 (not powers of
# two), an initial state of 0.3 N(0, 1); gates -2 U[0, 1) with a reset of three channels of one head (of one
# head for GDN's scalar gate), kda_gate's the raw gate input (A_log, dt_bias below); everything in the inputs'
# dtype but the state
SHAPE, CU = (1, 9, 1, 2, 24, 40), [0, 5, 5, 9]
_RESET = (0, 2, 1, slice(None, 3))
DRAWS = {
    "kda": dict(gate="uniform", g_scale=2.0, reset=_RESET, beta="uniform"),
    "kda_gate": dict(gate="raw", beta="uniform"),
    "gdn": dict(gate="uniform", g_scale=2.0, reset=(0, 6, 0), order=("gate", "beta")),
    "deltanet": dict(),
    "gla": dict(key="unit", gate="uniform", g_scale=2.0, reset=_RESET),
    "dplr": dict(key="unit", gate="uniform", g_scale=2.0, reset=_RESET, ab="independent", order=("gate", "ab")),
}
DRAWS = {m: dict(d, cu_seqlens=CU, gate_in_dtype=True, state_scale=0.3) for m, d in DRAWS.items()}


def _member(member):
    return "kda" if member == "kda_gate" else member


def _op(member, x, h0, cu, cfg, final_state=True):
    kw = dict(initial_state=h0, output_final_state=final_state, cu_seqlens=cu, config=cfg)
    if member == "kda":
        return kdagen.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    if member == "kda_gate":
        return kdagen.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=_A_LOG,
                                          dt_bias=_DT_BIAS, use_gate_in_kernel=True, **kw)
    if member == "gdn":
        return kdagen.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], **kw)
    if member == "deltanet":
        return kdagen.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], x["beta"], **kw)
    if member == "gla":
        return kdagen.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["g"], **kw)
    return kdagen.fused_recurrent_dplr_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], **kw)


_A_LOG = torch.tensor([0.3, -0.2])
_DT_BIAS = torch.linspace(-0.5, 0.5, 2 * 24).reshape(2, 24)


@pytest.mark.parametrize(("pps", "stages"), ((0, 1), (2, 3)), ids=("grid", "pipelined"))
@pytest.mark.parametrize("dt", (F32, F16), ids=("fp32", "fp16"))
@pytest.mark.parametrize("member", MEMBERS)
def test_both_readouts_are_the_recurrence(member, dt, pps, stages):
    """(pipelined: 2 programs on the interpreter's one 'SM' for 3 V tiles x 3 sequences x 2 heads; every item
    has more or less than one token, so the second loop runs them all)"""
    c = inputs(_member(member), *SHAPE, dtype=dt, **DRAWS[member])
    x, h0, cu = c.tensors(), c.h0, c.cu_seqlens
    g = kda_gate(x["g"], _A_LOG, _DT_BIAS) if member == "kda_gate" else x.get("g")  # (the kernel's gate)
    ro, rh = reference(_member(member), x, g=g, h0=h0, cu_seqlens=cu)
    outs = {}
    for readout in READOUTS:
        o, ht = _op(member, x, h0, cu, RecurrentConfig(block_v=16, num_warps=1 if pps == 0 else 2, readout=readout,
                                                       programs_per_sm=pps, num_stages=stages))
        assert_close(o, ro, TOL[dt], f"{member} {readout} o")
        assert_close(ht, rh, TOL[dt], f"{member} {readout} final state")
        assert torch.isfinite(o).all() and torch.isfinite(ht).all()
        outs[readout] = o
    # the two are different programs (the check above would pass twice for one of them otherwise)
    assert not torch.equal(outs["updated"], outs["loaded"]) or dt == F16


@pytest.mark.parametrize("v_first", (False, True), ids=("k-first", "v-first"))
@pytest.mark.parametrize(("pps", "stages"), ((0, 1), (1, 2), (4, 3)),
                         ids=("grid", "one-program-pipelined", "pipelined"))
def test_loaded_readout_in_a_state_pool(pps, stages, v_first):
    """Decode from a pool, one token per sequence, slots permuted and one padding slot (-1);
    persistent programs: one program for every item, and four, pipelined by Triton (num_stages > 1); the
    pool [P, HV, K, V] or (state_v_first) [P, HV, V, K]."""
    torch.manual_seed(3)
    N, HV, K, V, P = 4, 2, 32, 32, 6
    q, k = torch.randn(N, 1, HV, K), F.normalize(torch.randn(N, 1, HV, K), dim=-1)
    v, g, beta = torch.randn(N, 1, HV, V), -torch.rand(N, 1, HV, K), torch.rand(N, 1, HV)
    pool_kv = torch.randn(P, HV, K, V)
    pool = pool_kv.transpose(-1, -2).contiguous() if v_first else pool_kv.clone()
    slots = torch.tensor([4, 0, -1, 2], dtype=torch.int32)
    want = pool_kv.clone()
    keep = slots >= 0
    ro, rh = naive_recurrent_kda(q[keep], k[keep], v[keep], g[keep], beta[keep],
                                 initial_state=pool_kv[slots[keep].long()], output_final_state=True)
    o, _ = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots,
                                      state_v_first=v_first,
                                      config=RecurrentConfig(block_v=16, num_warps=2, readout="loaded",
                                                             programs_per_sm=pps, num_stages=stages))
    want[slots[keep].long()] = rh.float()
    assert_close(o[keep], ro, TOL[F32], "o")
    assert torch.equal(o[~keep], torch.zeros_like(o[~keep]))
    assert_close(pool.transpose(-1, -2) if v_first else pool, want, TOL[F32], "pool")


def test_the_readout_is_a_config_choice_in_the_source():
    plan = lower(S.kda(), 128, 128, "bfloat16", "recurrent")
    upd = render("recurrent", plan, plain_decode(readout="updated")).text
    ld = render("recurrent", plan, plain_decode(readout="loaded")).text
    assert "readout=updated" in upd and "readout=loaded" in ld  # the header line names it
    assert "b_rq = tl.sum(b_S * b_dq[:, None], axis=0)" in ld and "b_rq" not in upd
    assert "b_o = tl.sum(b_S * b_q[:, None], axis=0)" in upd
    with pytest.raises(ConfigError, match="readout"):
        RecurrentConfig(readout="late")


@pytest.mark.parametrize("reverse", (False, True), ids=("forward", "reverse"))
def test_persistent_dplr_with_reverse_and_the_batch_form(reverse):
    """General DPLR's reverse order (the first token, loaded beside the state, is the last) and the batch
    form (no cu_seqlens) as persistent programs, against the float64 recurrence."""
    c = inputs("dplr", *SHAPE, seed=5, **DRAWS["dplr"])
    x, h0 = c.tensors(), c.h0
    x = {n: t[:, :8].reshape(2, 4, *t.shape[2:]).contiguous() for n, t in x.items()}  # B=2, T=4
    kw = dict(initial_state=h0[:2], output_final_state=True, reverse=reverse)
    flip = (lambda t: t.flip(1)) if reverse else (lambda t: t)  # noqa: E731
    ro, rh = naive_recurrent_dplr(*(flip(t) for t in (x["q"], x["k"], x["v"], -x["b"], x["a"], x["g"])),
                                  initial_state=h0[:2], output_final_state=True)
    for pps, stages in ((0, 1), (2, 3)):
        o, ht = kdagen.fused_recurrent_dplr_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], **kw,
                                                       config=plain_decode(block_v=16, programs_per_sm=pps,
                                                                           num_stages=stages))
        assert_close(flip(o), ro, TOL[F32], f"o, {pps} programs per SM, {stages} stages")
        assert_close(ht, rh, TOL[F32], f"final state, {pps} programs per SM, {stages} stages")


@pytest.mark.parametrize("member", ("kda", "dplr"))
@pytest.mark.parametrize("with_state", (True, False), ids=("final-state", "no-final-state"))
def test_pipelined_items_of_one_and_of_several_tokens(member, with_state):
    """The pipelined persistent form with sequences of 1, 3, 0, 1 and 2 tokens in one call: the
    one-token items go through the pipelined loop, the others through the second loop, and both
    kinds share programs (two programs for 3 V tiles x 5 sequences x 2 heads)."""
    c = inputs(member, *SHAPE, seed=11, **DRAWS[member])
    x, h0 = c.tensors(), c.h0
    x = {n: t[:, :7].contiguous() for n, t in x.items()}
    cu = torch.tensor([0, 1, 4, 4, 5, 7])
    h0 = torch.randn(5, 2, 24, 40) * 0.3
    ro, rh = reference(member, x, h0=h0, cu_seqlens=cu)
    cfg = RecurrentConfig(block_v=16, num_warps=2, readout="loaded", programs_per_sm=2, num_stages=3)
    o, ht = _op(member, x, h0, cu, cfg, final_state=with_state)
    assert_close(o, ro, TOL[F32], "o")
    if with_state:
        assert_close(ht, rh, TOL[F32], "final state")
    else:
        assert ht is None


def test_programs_per_sm_is_validated():
    assert RecurrentConfig(programs_per_sm=3, num_stages=2).programs_per_sm == 3
    for bad in (33, 64, -1, True, 2.0):
        with pytest.raises(ConfigError, match="programs_per_sm"):
            RecurrentConfig(programs_per_sm=bad, num_stages=2)
    # persistent programs run Triton's pipelined item loop: at least two stages
    with pytest.raises(ConfigError, match="num_stages"):
        RecurrentConfig(programs_per_sm=3)


def test_only_persistent_programs_pipeline_their_item_loop():
    """Persistent programs' item loop is a pipelined tl.range of num_stages stages; one program per item keeps
    the source it had, whatever num_stages says."""
    plan = lower(S.kda(), 128, 128, "bfloat16", "recurrent")
    piped = render("recurrent", plan, plain_decode(programs_per_sm=2, num_stages=3)).text
    grid = render("recurrent", plan, plain_decode(programs_per_sm=0, num_stages=3)).text
    assert "tl.range(it0, n_items, step, num_stages=3)" in piped and "item_n" not in piped
    assert "tl.range" not in grid and "n_items" not in grid
    assert grid == render("recurrent", plan, plain_decode(programs_per_sm=0, num_stages=1)).text


def test_the_lean_body_is_validated_and_in_the_source():
    """RecurrentConfig.lean: one-item programs only, a tile that divides K and V (checked where the
    plan is known, at render), constant masks and no first token peeled in the source."""
    assert RecurrentConfig(lean=True).lean
    for bad in (dict(programs_per_sm=4, num_stages=2),):
        with pytest.raises(ConfigError, match="lean is for one-item programs"):
            RecurrentConfig(lean=True, **bad)
    with pytest.raises(ConfigError, match="lean"):
        RecurrentConfig(lean=1)
    plan = lower(S.kda(), 128, 128, "bfloat16", "recurrent")
    lean = render("recurrent", plan, plain_decode(block_v=8, lean=True)).text
    plain = render("recurrent", plan, plain_decode(block_v=8)).text
    assert "m_kv = tl.full([BK, BV], 1, tl.int1)" in lean and "for i_t in range(bos, eos):" in lean
    assert "tl.full([BK, BV], 1, tl.int1)" not in plain and "for i_t in range(bos + 1, eos):" in plain
    with pytest.raises(ConfigError, match="divides K and V"):
        render("recurrent", lower(S.kda(), 128, 96, "bfloat16", "recurrent"), RecurrentConfig(block_v=64, lean=True))
