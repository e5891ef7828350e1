"""General DPLR's chunk form (FLA's chunk_dplr_delta_rule) from the training-path templates: the
plan field the structure analysis sets and the branch it selects, the op's forward (o and the
final state) in the interpreter against the float64 token recurrence of kdagen.spec.reference
(fp32 and fp16; odd T, T = 1, head dims that are not powers of two, GVA, varlen with length-0/1
sequences, initial and final states, gk = -inf on the element-wise path, a bound on the
factorised one, chunk lengths 16/32/64), what the training forward keeps for the backward (the
per-chunk states and V' = the pseudo-values a_t^T S_{t-1}), the refusals, and that the training
forward's backward runs (its gradients are checked in tests/family/test_dplr_chunk_bwd.py)."""
from __future__ import annotations

import pytest
import torch

from cases import inputs, reference
from conftest import F64, TOL, assert_close
from plain_configs import plain_fwd, plain_train

import kdagen
from kdagen import spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.ops.dplr import chunk_dplr_launches
from kdagen.ops.member import chunk_member

F32, F16 = torch.float32, torch.float16


def test_plan_and_sources_take_the_dplr_branch():
    p = lower(S.dplr(), 48, 32, "float16", "chunk")
    assert (p.structure, p.decay, p.has_rank1, p.diag_mode) == ("dplr", "channel", True, "elementwise")
    assert lower(S.dplr(S.gate_direct(-5.0)), 64, 64, "bfloat16", "chunk").diag_mode == "factorised"
    for bound in (None, -5.0):
        srcs = {kind: render(kind, lower(S.dplr(S.gate_direct(bound)), 64, 64, "bfloat16", "chunk"),
                             plain_train(chunk_size=64)).text
                for kind in ("chunk_intra", "chunk_state")}
        kda = {kind: render(kind, lower(S.kda(S.gate_direct(bound)), 64, 64, "bfloat16", "chunk"),
                            plain_train(chunk_size=64)).text
               for kind in ("chunk_intra", "chunk_state")}
        intra = srcs["chunk_intra"][srcs["chunk_intra"].index("@triton.jit"):]
        # the four products, the inverse of I - A_ab, and no beta
        for name in ("b_Aab_3_0", "b_Aak_3_3", "b_Aqb_2_1", "b_Aqk_0_0", "b_Md_3_0", "tl.store(aqv", "tl.store(kgv"):
            assert name in intra, (bound, name)
        assert "beta" not in intra
        assert "aqv" not in kda["chunk_intra"] and "aqv" not in kda["chunk_state"]
        state = srcs["chunk_state"]
        assert "b_Av" in state and "b_kgv" in state


# DPLR's case (tests/cases.py): a a unit read vector, b = -beta a' with a' a unit vector near a (a general
# rank-1 term, every step's transition a contraction); gk log-sigmoid with some strong decays, or in [lb, 0);
# a reset: gk = -inf in one channel of one token
NAMES = ("q", "k", "v", "a", "b", "g", "h0")


# (B, T, H, HV, K, V, dtype, lower bound (None: element-wise), chunk_size, h0, -inf in gk)
CASES = [
    (1, 37, 1, 2, 48, 48, F32, None, 32, True, True),  # GVA, K = V = 48, element-wise, a reset
    (2, 21, 1, 1, 32, 32, F32, -5.0, 16, True, False),  # factorised, one sub-tile per chunk
    (1, 1, 1, 1, 32, 48, F32, None, 64, False, False),  # T = 1, no initial state
    (1, 70, 1, 1, 32, 32, F32, -5.0, 64, True, False),  # four sub-tiles, two chunks
    (1, 45, 1, 2, 48, 32, F16, -0.5, 32, True, False),  # fp16: exp(0.5 * 16) fits its range
    (1, 29, 1, 1, 32, 32, F16, None, 16, True, True),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[6]}-T{c[1]}-HV{c[3]}-K{c[4]}V{c[5]}-lb{c[7]}-C{c[8]}" for c in CASES])
def test_forward_matches_the_recurrence(case):
    B, T, H, HV, K, V, dt, lb, C, with_h0, neg_inf = case
    q, k, v, a, b, g, h0 = inputs("dplr", B, T, H, HV, K, V, dtype=dt, lb=lb, h0=with_h0,
                                  reset=(0, T // 2, 0, 1) if neg_inf else None).take(*NAMES)
    plan = lower(S.dplr(S.gate_direct(lb)), K, V, {F32: "float32", F16: "float16"}[dt], "chunk")
    assert plan.diag_mode == ("factorised" if lb is not None else "elementwise")
    o, ht = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, output_final_state=True, chunk_size=C,
                                         safe_gate=lb is not None, lower_bound=lb)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=g, h0=h0)
    assert o.dtype == v.dtype and ht.dtype == torch.float32
    assert_close(o, ro, TOL[dt], "o")
    assert_close(ht, rh, TOL[dt], "final state")
    o2, ht2 = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, chunk_size=C,
                                           safe_gate=lb is not None, lower_bound=lb)
    assert ht2 is None and torch.equal(o2, o)


def test_scale_and_default_config():
    q, k, v, a, b, g, h0 = inputs("dplr", 1, 19, 1, 1, 32, 32).take(*NAMES)
    o, ht = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, scale=0.3, initial_state=h0, output_final_state=True)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=g, h0=h0, scale=0.3)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")


@pytest.mark.parametrize("dt", [F32, F16])
def test_varlen_with_empty_and_single_token_sequences(dt):
    lens = [0, 1, 20, 0, 34, 1]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
    T = int(cu[-1])
    q, k, v, a, b, g, h0 = inputs("dplr", 1, T, 1, 2, 32, 32, dtype=dt, N=len(lens),
                                  reset=(0, T // 2, 0, 1) if dt == F32 else None).take(*NAMES)
    o, ht = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                         cu_seqlens_cpu=cu.clone(), chunk_size=16)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=g, h0=h0, cu_seqlens=cu)
    assert_close(o, ro, TOL[dt], "o")
    assert_close(ht, rh, TOL[dt], "final state")
    assert torch.equal(ht[0], h0[0]) and torch.equal(ht[3], h0[3])  # empty sequences keep their state


def _token_states(q, k, v, a, b, g, h0):
    """The float64 state before every token (S_{t-1}, [B, T, HV, K, V]) and the pseudo-values
    u_t = a_t^T S_{t-1} ([B, T, HV, V]), token by token (H = HV)."""
    S_ = h0.to(F64).clone()
    before, u = [], []
    for t in range(q.shape[1]):
        at, bt, kt, vt, gt = (x[:, t].to(F64) for x in (a, b, k, v, g))
        before.append(S_.clone())
        ut = torch.einsum("bhk,bhkv->bhv", at, S_)
        u.append(ut)
        S_ = gt.exp()[..., None] * S_ + bt[..., None] * ut[:, :, None, :] + kt[..., None] * vt[:, :, None, :]
    return torch.stack(before, 1), torch.stack(u, 1)


def test_training_forward_keeps_states_and_pseudo_values():
    """What the backward reads: the state pass's V' is the pseudo-values a_t^T S_{t-1} (u - w S
    with w = -L (a exp(G-))), and the per-chunk states are the states entering each chunk."""
    B, T, C = 2, 37, 16
    q, k, v, a, b, g, h0 = inputs("dplr", B, T, 1, 1, 32, 32, lb=-5.0).take(*NAMES)
    cfg = plain_train(chunk_size=C, sub_chunk=16)
    fwd, (o, ht, hs) = chunk_dplr_launches(q, k, v, a, b, g, training=True, config=cfg, initial_state=h0,
                                           output_final_state=True, safe_gate=True)
    for launch in fwd:
        launch()
    before, u = _token_states(q, k, v, a, b, g, h0)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=g, h0=h0)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")
    assert_close(fwd[1].args["vn"], u.float(), TOL[F32], "V' (the pseudo-values)")
    NT = -(-T // C)
    assert tuple(hs.shape) == (B * NT, 1, 32, 32)
    assert_close(hs.view(B, NT, 1, 32, 32), before[:, ::C], TOL[F32], "states entering the chunks")
    names = set(fwd[0].args)
    assert {"a", "b", "qg", "kg", "w", "u", "aqk", "gn", "aqv", "kgv"} <= names and "beta" not in names


@pytest.mark.parametrize("disable_recompute", [False, True])
def test_training_forward_and_its_backward(disable_recompute):
    q, k, v, a, b, g, h0 = inputs("dplr", 1, 19, 1, 1, 32, 32, lb=-5.0).take(*NAMES)
    xs = [x.clone().requires_grad_() for x in (q, k, v, a, b)]
    o, ht = kdagen.chunk_dplr_delta_rule(*xs, g, initial_state=h0, output_final_state=True, safe_gate=True,
                                         disable_recompute=disable_recompute)
    assert o.requires_grad and o.grad_fn is not None  # through kdagen's autograd Function
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=g, h0=h0)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")
    (o.sum() + ht.sum()).backward()  # the DPLR backward (its values: tests/family/test_dplr_chunk_bwd.py)
    assert all(x.grad is not None and x.grad.shape == x.shape and torch.isfinite(x.grad).all() for x in xs)


def test_refusals_name_the_argument():
    q, k, v, a, b, g, h0 = inputs("dplr", 1, 8, 1, 2, 32, 32).take(*NAMES)
    op = kdagen.chunk_dplr_delta_rule
    value_errors = [
        (lambda: op(q, k, v, a[..., :16], b, g), r"a must have shape \[B, T, HV, K\]"),
        (lambda: op(q, k, v, a, b[:, :, :1], g), r"b must have shape \[B, T, HV, K\]"),
        (lambda: op(q, k, v, a, b, g[:, :4]), r"gk must have shape \[B, T, HV, K\]"),
        (lambda: op(q, k, v, a.to("meta"), b, g), "a is on meta"),
        (lambda: op(q, k, v, a, b, g, chunk_size=128), "chunk_size=128 is not supported"),
        (lambda: op(q, k, v, a, b, g, chunk_size=8), "chunk_size=8 is not supported"),
        (lambda: op(q, k, v, a, b, g, cp_context=object()), "cp_context"),
        (lambda: op(q, k, v, a, b, g, head_first=False), "head_first"),
        (lambda: op(q, k, v, a, b, g, safe_gate=True, lower_bound=0.5), "lower_bound must be negative"),
        (lambda: op(q, k, v, a, b, g, initial_state=h0[:, :1]), "initial_state must have shape"),
        (lambda: op(q, k, v, a, b, g, chunk_size=32, config=plain_train(chunk_size=64)), "disagrees"),
        (lambda: chunk_member(S.dplr(), q, k, v, g, torch.rand(1, 8, 2)), "general DPLR structure"),
    ]
    for call, match in value_errors:
        with pytest.raises(ValueError, match=match):
            call()
    type_errors = [
        (lambda: op(q, k, v, None, b, g), "a must be a torch.Tensor"),
        (lambda: op(q, k, v, a, b, g.to(torch.int32)), "gk must be float32"),
        (lambda: op(q, k, v, a, b, g, config=plain_fwd()), "config must be a ChunkTrainConfig"),
        (lambda: op(q, k, v, a, b, g, bogus=1), "unexpected keyword"),
    ]
    for call, match in type_errors:
        with pytest.raises(TypeError, match=match):
            call()


def test_tuning_takes_the_chunk_forward_as_the_chunk_train_family(monkeypatch):
    """The tuner's view of DPLR: its chunk forward is the chunk_train family (the chunk backward
    is not generated yet), each stage's candidate runs through chunk_dplr_delta_rule and passes
    the check against the spec's own float64 recurrence, and the op looks its winners up under
    that family with the plan the tuner tuned."""
    import kdagen.ops.dplr as D
    from kdagen.cache.heuristics import default_config
    from kdagen.tuning import families as TF
    from kdagen.tuning.candidates import KernelCandidate

    sa = {"spec": "dplr", "safe_gate": True, "lower_bound": -5.0}
    assert TF.families_for(sa, TF.FAMILIES) == ["chunk_train", "recurrent"]
    assert TF.families_for({"spec": "gla"}, TF.FAMILIES) == list(TF.FAMILIES)
    assert TF.families_for({}, TF.FAMILIES) == list(TF.FAMILIES)  # KDA
    TF.check_tunable(sa)
    spec = TF.family_spec("chunk_train", sa)
    plan = TF.lower_for(spec, "chunk_train", 32, 32, F32)
    assert plan.structure == "dplr" and plan.diag_mode == "factorised"
    space = TF.space_for("chunk_train", plan)
    assert space.kernel == "chunk_train" and space.stage_launches == {"intra": "chunk_intra", "state": "chunk_state"}
    cfg = plain_train(chunk_size=32, intra_block_k=32, cumsum="dot")
    for launch in ("chunk_intra", "chunk_state"):
        cand = KernelCandidate("chunk_train", launch, plan, sa, F32, (1, 40, 1, 2), device="cpu")
        cand.build(cfg)
        assert cand.check(cfg) <= cand.tolerance
        assert cand.time(cfg) > 0
    seen = []

    def spy(family, p, explicit, shape, state_dtype="float32"):
        seen.append((family, p))
        return default_config(family, p, shape)

    monkeypatch.setattr(D, "resolve", spy)
    q, k, v, a, b, g, h0 = inputs("dplr", 1, 8, 1, 2, 32, 32, lb=-5.0).take(*NAMES)
    kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, safe_gate=True, lower_bound=-5.0)
    assert [(f, p.tuning_spec_hash) for f, p in seen] == [("chunk_train", plan.tuning_spec_hash)]


def test_the_op_looks_up_its_winners_on_a_gpu(monkeypatch):
    """On a GPU the inference call looks up a tuned winner of the chunk_train family: the cache's
    shape bucket knows that family (general DPLR's first call on an H200 found the look-up raising
    "unknown kernel kind 'chunk_train'", which the CPU suite never reached: without a GPU there is no
    look-up)."""
    from kdagen.cache import lookup
    from kdagen.cache.gpus import get_profile
    from kdagen.cache.keys import shape_bucket

    assert shape_bucket("chunk_train", 4096, 2, 2) == shape_bucket("chunk_fwd", 4096, 2, 2) == "t8192_s2"
    q, k, v, a, b, g, h0 = inputs("dplr", 1, 8, 1, 2, 32, 32, lb=-5.0).take(*NAMES)
    want = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, output_final_state=True)
    monkeypatch.setattr(lookup, "_current_gpu", lambda: get_profile("h200"))
    lookup._MEMO.clear()
    got = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, output_final_state=True)
    lookup._MEMO.clear()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # no winner cached: the heuristic
