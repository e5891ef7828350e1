"""General DPLR's recurrent form (decode): kdagen.fused_recurrent_dplr_delta_rule, FLA 0.6.0's op
(S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T, o_t = S_t^T (scale q_t)), in the
interpreter against the float64 recurrence of kdagen.spec.reference (whose (a', b') are FLA's
(-b, a)): multi-token calls and one-token decode steps, odd T, T = 1, head dims that are not
powers of two, GVA, reverse, varlen with length-0/1 sequences, initial and final states, the
state pool updated in place, gk = -inf, the value check, refusals naming the argument, the
gradients FLA's op has none of (against float64 autograd; reverse=True has none: a
NotImplementedError naming chunk_dplr_delta_rule), and the tuner's recurrent candidates."""
from __future__ import annotations

import pytest
import torch

from cases import inputs, reference
from conftest import F64, TOL, assert_close

import kdagen
from kdagen import spec as S
from kdagen.cache.heuristics import default_config
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.ops.member import chunk_member, fused_recurrent_member

F32, F16 = torch.float32, torch.float16
op = kdagen.fused_recurrent_dplr_delta_rule


# FLA-convention inputs (tests/cases.py's ab="noisy"): a unit read vector a and a write vector b = -beta a (beta
# in (0, 1)) plus a small independent part, so the transition is a general DPLR one but stays contracting; gk
# log-sigmoid with some strong decays
NAMES = ["q", "k", "v", "a", "b", "gk", "h0"]


def test_plan_field_decides_the_branch():
    """The DPLR branch is the plan's structure: the kernel reads a and b and no beta, and takes
    REVERSE; KDA's recurrent kernel keeps beta and has no REVERSE."""
    p = lower(S.dplr(), 48, 48, "float16", "recurrent")
    assert (p.structure, p.decay, p.has_rank1) == ("dplr", "channel", True)
    src = render("recurrent", p, default_config("recurrent", p)).text
    assert "q, k, v, g, a, b," in src and "REVERSE: tl.constexpr" in src and "beta" not in src
    assert "tl.sum(b_S * b_a[:, None], axis=0)" in src  # a^T S of the undecayed state
    kda = render("recurrent", lower(S.kda(), 48, 48, "float16", "recurrent"), default_config("recurrent", p))
    assert "REVERSE" not in kda.text and "b_beta" in kda.text and "b_a" not in kda.text


# FLA 0.6.0's signature, positional order (fla/ops/generalized_delta_rule/dplr/fused_recurrent.py)
FLA_RECURRENT = ("q", "k", "v", "a", "b", "gk", "scale", "initial_state", "output_final_state", "reverse",
                 "cu_seqlens")


def test_signature_takes_fla_arguments_in_fla_positions():
    import inspect

    params = list(inspect.signature(op).parameters)
    assert tuple(params[:len(FLA_RECURRENT)]) == FLA_RECURRENT
    assert "fused_recurrent_dplr_delta_rule" in kdagen.__all__


# (id, B, T, H, HV, K, V, dtype)
CASES = [
    ("T37-gva1x2-K48V48-fp32", 1, 37, 1, 2, 48, 48, F32),
    ("T1-B3-K32V48-fp32", 3, 1, 1, 1, 32, 48, F32),
    ("T21-B2-K48V32-fp16", 2, 21, 1, 1, 48, 32, F16),
    ("T9-gva2x4-K16V16-fp32", 1, 9, 2, 4, 16, 16, F32),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_the_recurrence(case):
    _, B, T, H, HV, K, V, dt = case
    q, k, v, a, b, gk, h0 = inputs("dplr", B, T, H, HV, K, V, dtype=dt, ab="noisy").take(*NAMES)
    if T > 1:
        gk[0, T // 2, 0, :5] = -float("inf")  # a reset of five channels
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=gk, h0=h0)
    o, ht = op(q, k, v, a, b, gk, initial_state=h0, output_final_state=True)
    assert o.dtype == dt and ht.dtype == F32 and ht.shape == h0.shape
    assert_close(o, ro, TOL[dt], "o")
    assert_close(ht, rh, TOL[dt], "final state")
    o2, none = op(q, k, v, a, b, gk)  # no initial state, no final state
    ro2, _ = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=gk, h0=None)
    assert none is None
    assert_close(o2, ro2, TOL[dt], "o without h0")


def test_decode_steps_carry_the_state():
    """One token at a time (decode), feeding each step's final state into the next: the
    multi-token answer."""
    q, k, v, a, b, gk, h0 = inputs("dplr", 2, 7, 1, 2, 48, 32, ab="noisy").take(*NAMES)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=gk, h0=h0)
    s = h0
    for t in range(7):
        sl = slice(t, t + 1)
        o, s = op(q[:, sl], k[:, sl], v[:, sl], a[:, sl], b[:, sl], gk[:, sl], initial_state=s,
                  output_final_state=True)
        assert_close(o, ro[:, sl], TOL[F32], f"o at step {t}")
    assert_close(s, rh, TOL[F32], "state after the steps")


def test_reverse_scale_and_state_v_first():
    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 19, 1, 2, 48, 32, ab="noisy").take(*NAMES)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=gk, h0=h0, scale=0.3, reverse=True)
    o, ht = op(q, k, v, a, b, gk, scale=0.3, initial_state=h0, output_final_state=True, reverse=True)
    assert_close(o, ro, TOL[F32], "reverse o")
    assert_close(ht, rh, TOL[F32], "reverse final state")
    o, ht = op(q, k, v, a, b, gk, scale=0.3, initial_state=h0.transpose(-1, -2).contiguous(),
               output_final_state=True, reverse=True, state_v_first=True)
    assert_close(o, ro, TOL[F32], "reverse o (V, K) states")
    assert_close(ht.transpose(-1, -2), rh, TOL[F32], "reverse final state (V, K)")
    fwd, _ = op(q, k, v, a, b, gk, scale=0.3, initial_state=h0)
    assert (fwd - o).abs().max().item() > 1e-2  # reverse is a different walk


CU = [0, 0, 1, 20, 37]  # lengths 0, 1, 19, 17


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_varlen_with_empty_and_one_token_sequences(reverse):
    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 37, 1, 2, 48, 48, N=4, ab="noisy").take(*NAMES)
    cu = torch.tensor(CU, dtype=torch.int64)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=gk, h0=h0, cu_seqlens=cu, reverse=reverse)
    o, ht = op(q, k, v, a, b, gk, initial_state=h0, output_final_state=True, cu_seqlens=cu, reverse=reverse)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")
    assert torch.equal(ht[0], h0[0])  # a length-0 sequence keeps its state


def test_state_pool_in_place_with_padding_and_out():
    """Packed decode into a pool: each sequence reads and writes its slot in place, the padding
    slot (-1) writes nothing and gives o = 0, untouched slots stay bit for bit; out= is filled."""
    P, HV, K, V = 6, 2, 48, 32
    q, k, v, a, b, gk, _ = inputs("dplr", 1, 5, 1, HV, K, V, h0=False, ab="noisy").take(*NAMES)
    bounds = [0, 1, 3, 4, 5]  # four sequences: 1, 2, 1, 1 tokens
    cu = torch.tensor(bounds, dtype=torch.int64)
    idx = torch.tensor([4, 0, -1, 2], dtype=torch.int32)
    pool = torch.randn(P, HV, K, V, generator=torch.Generator().manual_seed(5))
    before = pool.clone()
    out = torch.full_like(v, float("nan"))
    rows = torch.tensor([4, 0, 0, 2])  # the pool rows the reference starts from (row 0 for the padding)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=gk, h0=before[rows], cu_seqlens=cu)
    for step in range(2):  # the second call takes the fast path (same geometry)
        pool.copy_(before)
        out.fill_(float("nan"))
        o, ret = op(q, k, v, a, b, gk, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx, out=out)
        assert o is out and ret is pool
        for n, slot in enumerate(idx.tolist()):
            s, e = bounds[n], bounds[n + 1]
            if slot < 0:
                assert torch.equal(o[:, s:e], torch.zeros_like(o[:, s:e])), "padding gives o = 0"
            else:
                assert_close(o[:, s:e], ro[:, s:e], TOL[F32], f"o of sequence {n} (call {step})")
                assert_close(pool[slot], rh[n], TOL[F32], f"slot {slot} (call {step})")
        for slot in (1, 3, 5):
            assert torch.equal(pool[slot], before[slot]), f"untouched slot {slot} changed"



def test_decode_fast_path(monkeypatch):
    """A decode loop's later calls of one geometry skip validation, lowering and the config look-up
    (the member entries' per-geometry memo, with a and b in its key) and still give the
    recurrence's answer; reverse=True, or another batch, is another key (the full path)."""
    import kdagen.ops.member as M

    pool = torch.randn(4, 2, 32, 32, generator=torch.Generator().manual_seed(9))
    idx = torch.tensor([2, 0], dtype=torch.int32)
    for step in range(3):
        q, k, v, a, b, gk, _ = inputs("dplr", 2, 1, 1, 2, 32, 32, h0=False, seed=step, ab="noisy").take(*NAMES)
        before = pool.clone()
        if step == 1:  # from now on this geometry must not lower again
            monkeypatch.setattr(M, "lower", lambda *a, **kw: pytest.fail("the fast path lowered again"))
        o, ht = op(q, k, v, a, b, gk, initial_state=pool, ssm_state_indices=idx)
        ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=gk, h0=before[[2, 0]])
        assert ht is pool
        assert_close(o, ro, TOL[F32], f"step {step} o")
        assert_close(pool[[2, 0]], rh, TOL[F32], f"step {step} pool")
    with pytest.raises(pytest.fail.Exception, match="lowered again"):
        op(q, k, v, a, b, gk, initial_state=pool, ssm_state_indices=idx, reverse=True)
    with pytest.raises(ValueError, match="gk must have shape"):  # a bad input is still refused after the memo
        op(q, k, v, a, b, gk[..., :16].contiguous(), initial_state=pool, ssm_state_indices=idx)
    # another batch: the full path
    q, k, v, a, b, gk, _ = inputs("dplr", 3, 1, 1, 2, 32, 32, h0=False, ab="noisy").take(*NAMES)
    with pytest.raises(pytest.fail.Exception, match="lowered again"):
        op(q, k, v, a, b, gk, initial_state=pool, ssm_state_indices=torch.tensor([1, 2, 3], dtype=torch.int32))


def test_value_check_names_a_and_b():
    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 4, 1, 1, 32, 32, ab="noisy").take(*NAMES)
    for name in ("a", "b"):
        bad = dict(a=a.clone(), b=b.clone())
        bad[name][0, 2, 0, 3] = float("nan")
        with pytest.raises(ValueError, match=rf"{name}\[0, 2, 0, 3\] = nan is NaN or infinite"):
            op(q, k, v, bad["a"], bad["b"], gk, initial_state=h0, check_inputs=True)
    g2 = gk.clone()
    g2[0, 1, 0, 0] = 0.5
    with pytest.raises(ValueError, match="is > 0"):
        op(q, k, v, a, b, g2, check_inputs=True)


def test_bad_inputs_name_the_argument():
    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 4, 1, 2, 32, 32, ab="noisy").take(*NAMES)
    cases = [
        (lambda: op(q, k, v, a[:, :, :1], b, gk), ValueError, r"a must have shape \[B, T, HV, K\]"),
        (lambda: op(q, k, v, a, b[..., :16], gk), ValueError, r"b must have shape \[B, T, HV, K\]"),
        (lambda: op(q, k, v, a, b, gk[..., :16]), ValueError, r"gk must have shape \[B, T, HV, K\]"),
        (lambda: op(q, k, v, None, b, gk), ValueError, "a .* is required"),
        (lambda: op(q, k, v, a, b, None), ValueError, "gk .* is required"),
        (lambda: op(q, k, v, a.int(), b, gk), TypeError, "a must be float32, float16 or bfloat16"),
        (lambda: op(q, k, v, a, b, gk, initial_state=h0[:, :1]), ValueError, "initial_state must have shape"),
        (lambda: op(q, k, v, a, b, gk, head_first=True), ValueError, "head_first"),
        (lambda: op(q, k, v, a, b, gk, cp_context=object()), ValueError, "cp_context"),
        (lambda: op(q, k, v, a, b, gk, reverse=1), TypeError, "reverse must be a bool"),
        (lambda: op(q, k, v, a, b, gk, bogus=1), TypeError, "unexpected keyword"),
        (lambda: fused_recurrent_member(S.dplr(), q, k, v, gk, torch.ones(1, 4, 2), a=a, b=b), ValueError,
         "takes a and b, not beta"),
        (lambda: fused_recurrent_member(S.kda(), q, k, v, gk, torch.ones(1, 4, 2), a=a, b=b), ValueError,
         "takes no free rank-1 vectors"),
        (lambda: fused_recurrent_member(S.kda(), q, k, v, gk, torch.ones(1, 4, 2), reverse=True), ValueError,
         "reverse=True .* general DPLR structure only"),
        (lambda: chunk_member(S.dplr(), q, k, v, gk, None), ValueError,
         r"no beta\), which the member entries do not take; call kdagen.chunk_dplr_delta_rule"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()


GRAD_TOL = {F32: 1e-5, F16: 5e-3}  # the bar of tests/chunk/test_ops_chunk_bwd.py and test_family_gla.py


def _grads_vs_float64(xs, cu=None, dt=F32, v_first=False):
    """Every gradient of the op (o and the final state both carry upstream gradients) against
    float64 autograd of the reference; ``v_first``: the states [.., V, K] (state_v_first)."""
    gen = torch.Generator().manual_seed(7)
    B, T, HV, V = xs["v"].shape
    N, _, K, _ = xs["h0"].shape
    do, dht = torch.randn(B, T, HV, V, generator=gen), torch.randn(N, HV, K, V, generator=gen)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in NAMES}
    ro, rh = reference("dplr", x64, cu_seqlens=cu)
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in NAMES])
    flip = (lambda t: t.transpose(-1, -2)) if v_first else (lambda t: t)  # noqa: E731
    xl = {n: xs[n].clone().requires_grad_() for n in NAMES}
    xl["h0"] = flip(xs["h0"]).contiguous().requires_grad_()
    o, ht = op(*(xl[n] for n in NAMES[:6]), initial_state=xl["h0"], output_final_state=True, cu_seqlens=cu,
               state_v_first=v_first)
    grads = list(torch.autograd.grad((o.float() * do).sum() + (flip(ht) * dht).sum(), [xl[n] for n in NAMES]))
    grads[-1] = flip(grads[-1])  # dh0 comes back in the initial state's layout
    for n, got, want in zip(NAMES, grads, ref):
        assert got.shape == xs[n].shape and got.dtype == xs[n].dtype, n
        assert_close(got, want, GRAD_TOL[dt], f"d{n}")


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
def test_gradients_match_float64_autograd(dt):
    """Beyond FLA (whose op raises): general DPLR's recurrent backward template, K = 48 (the
    masked tail of a K row), GVA, a gk = -inf reset, against float64 autograd of the reference."""
    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 15, 1, 2, 48, 32, dtype=dt, ab="noisy").take(*NAMES)
    gk[0, 7, 1, :4] = -float("inf")
    _grads_vs_float64(dict(q=q, k=k, v=v, a=a, b=b, gk=gk, h0=h0), dt=dt)


def test_gradients_varlen_and_state_v_first():
    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 37, 1, 1, 32, 48, N=4, ab="noisy").take(*NAMES)
    cu = torch.tensor(CU, dtype=torch.int64)
    _grads_vs_float64(dict(q=q, k=k, v=v, a=a, b=b, gk=gk, h0=h0), cu=cu)
    _grads_vs_float64(inputs("dplr", 2, 9, 1, 1, 32, 48, ab="noisy").tensors(*NAMES), v_first=True)


def test_reverse_has_no_backward_and_the_pool_no_gradient():
    """reverse=True runs forwards with inputs that require grad (the same answer) and its
    backward raises NotImplementedError naming chunk_dplr_delta_rule; the pool and out= are
    refused under autograd, as for the other recurrent ops."""
    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 6, 1, 1, 32, 32, ab="noisy").take(*NAMES)
    ref, _ = op(q, k, v, a, b, gk, initial_state=h0, reverse=True)
    qg = q.clone().requires_grad_()
    o, ht = op(qg, k, v, a, b, gk, initial_state=h0, output_final_state=True, reverse=True)
    assert o.requires_grad and torch.equal(o.detach(), ref)
    with pytest.raises(NotImplementedError, match="reverse=True has no backward.*chunk_dplr_delta_rule"):
        (o.sum() + ht.sum()).backward()
    with pytest.raises(ValueError, match="ssm_state_indices"):
        op(qg, k, v, a, b, gk, initial_state=h0, ssm_state_indices=torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="out= has no gradient"):
        op(qg, k, v, a, b, gk, out=torch.empty_like(v))
    with torch.no_grad():  # inference with inputs that require grad: no autograd record
        o, _ = op(qg, k, v, a, b, gk, initial_state=h0, reverse=True)
    assert not o.requires_grad and torch.equal(o, ref)


# --- tuning and build: the recurrent family of the dplr spec ---------------------------------

DPLR_ARGS = {"safe_gate": True, "lower_bound": -5.0, "spec": "dplr"}


def test_tuner_candidates_run_the_dplr_op_against_its_own_recurrence(monkeypatch):
    """A recurrent candidate of the dplr spec runs fused_recurrent_member with a and b (FLA's
    convention) and passes the float64 check of the spec's own recurrence; the same check with
    the write vector's sign flipped (the spec's a' = -b read as +b) fails: the check sees the
    rank-1 term."""
    from kdagen.tuning import candidates as CA, families as Fm, member_ops as M

    Fm.check_tunable(DPLR_ARGS, ("recurrent",))
    spec = Fm.family_spec("recurrent", DPLR_ARGS)
    plan = Fm.lower_for(spec, "recurrent", 16, 16, torch.float32)
    assert plan.structure == "dplr"
    shape = (2, 1, 1, 2)
    cand = CA.KernelCandidate("recurrent", None, plan, DPLR_ARGS, torch.float32, shape, device="cpu")
    x = cand._check_inputs(seed=0)
    assert x["beta"] is None and tuple(x["a"].shape) == tuple(x["b"].shape) == (2, 1, 2, 16)
    cfg = default_config("recurrent", plan, {"N": 2, "HV": 2})
    assert cand.check(cand.build(cfg)) < cand.tolerance
    assert cand.time(cfg) > 0
    launch = M.recurrent_launch(spec, x, cfg)
    assert launch.fn.__name__.startswith("dplr_recurrent") and {"a", "b"} <= set(launch.args)
    real = M.reference
    monkeypatch.setattr(M, "reference", lambda s, r: real(s, {**r, "b": -r["b"]}))
    assert cand.check(cfg) > 10 * cand.tolerance


def test_build_compile_checks_the_recurrent_family_of_dplr(tmp_path, monkeypatch):
    """`kdagen build --spec dplr --check-all` (no --family) compile-checks what this build generates: its chunk
    forward (the chunk_train family) and recurrent family; a build without the chunk form checks
    the recurrent family alone, saying so, and the summary's next command inspects that form."""
    from click.testing import CliRunner

    from kdagen.cli import main
    from kdagen.ops.dplr import chunk_form_available
    from kdagen.tuning import compile_pool as CP, driver as D

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    asked = []

    def fake(fam, plan, *a, **k):
        asked.append((fam, plan.structure))
        return [CP.CompileSurvey(fam, None, 1, [default_config(fam, plan)])]

    monkeypatch.setattr(D, "compile_check", fake)
    r = CliRunner().invoke(main, ["build", "--gpu", "h800", "--spec", "dplr", "--head-dim", "32", "--check-all",
                                  "--quiet"])
    assert r.exit_code == 0, r.output
    assert "spec dplr hash" in r.output and "compile-check only" in r.output
    # the chunk forward is the chunk_train family (the training-path kernels); the backward's configs
    # are the heuristic's (its family is not tuned for DPLR)
    assert chunk_form_available()
    assert sorted(asked) == [("chunk_train", "dplr"), ("recurrent", "dplr")], asked
    monkeypatch.setattr("kdagen.codegen.forms.CHUNK_STRUCTURES", frozenset({"kda", "gla"}))  # a build without it
    asked.clear()
    r = CliRunner().invoke(main, ["build", "--gpu", "h800", "--spec", "dplr", "--head-dim", "32", "--check-all",
                                  "--quiet"])
    assert r.exit_code == 0, r.output
    # without the chunk form: the recurrent family alone, and the build says so
    assert asked == [("recurrent", "dplr")]
    assert "whose chunk kernels kdagen's templates do not lower yet in this build" in r.output
    assert "compile-checking its recurrent family only" in r.output
    assert "--spec dplr --form recurrent`" in r.output


def test_backward_writes_every_gradient_element():
    """Every buffer of the DPLR backward launch -- the per-V-tile partials of dq, dk, dgk, da, db,
    dv and dh0 -- is NaN first and written in full (varlen with a length-0 and a length-1
    sequence, K and V not powers of two, three V tiles)."""
    from kdagen.config import RecurrentBwdConfig
    from kdagen.ops.inputs import check_inputs
    from kdagen.ops.recurrent_bwd import RecurrentBwdMeta, prepare_recurrent_bwd

    q, k, v, a, b, gk, h0 = inputs("dplr", 1, 12, 1, 2, 24, 40, N=3, ab="noisy").take(*NAMES)
    cu = torch.tensor([0, 0, 1, 12], dtype=torch.int64)
    dims, seqlens = check_inputs(q, k, v, gk, None, scale=None, initial_state=h0, cu_seqlens=cu, rank1=False)
    plan = lower(S.dplr(), 24, 40, "float32", "recurrent")
    meta = RecurrentBwdMeta(dims, seqlens, cu, 24 ** -0.5, plan, RecurrentBwdConfig(block_v=16, segment=4), False)
    gen = torch.Generator().manual_seed(2)
    do, dht = torch.randn(1, 12, 2, 40, generator=gen), torch.randn(3, 2, 24, 40, generator=gen)
    launch, out = prepare_recurrent_bwd(meta, dict(q=q, k=k, v=v, g=gk, a=a, b=b), h0, do, dht, True)
    assert launch.grid == (3, 6)
    bufs = {n: t for n, t in out.items() if t is not None}
    assert {"dq", "dk", "dg", "da", "db", "dv", "dh0"} <= set(bufs) and "dbeta" not in bufs
    for t in bufs.values():
        t.fill_(float("nan"))
    launch()
    for name, t in bufs.items():
        assert torch.isfinite(t).all(), f"{name} has unwritten elements"
    assert torch.equal(out["dh0"][0], dht[0])  # a length-0 sequence passes dht through to dh0 unchanged
