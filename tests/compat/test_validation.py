"""Input validation of chunk_kda and fused_recurrent_kda: every bad input raises ValueError or
TypeError naming the offending argument, before any kernel is launched (the ``no_launch``
fixture turns a launch into a test failure).  Also: chunk_kda has no backward and says so."""
from __future__ import annotations

import re

import pytest
import torch

from cases import make_inputs

import kdagen

OPS = {"chunk": kdagen.chunk_kda, "recurrent": kdagen.fused_recurrent_kda}
B, T, H, HV, K, V = 2, 8, 1, 2, 32, 32


def _base(B_=B, T_=T, H_=H, HV_=HV, K_=K, V_=V, cu=None):
    x = make_inputs(B_, T_, H_, HV_, K_, V_, seed=0, cu_seqlens=cu)
    return dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, initial_state=x.h0, cu_seqlens=x.cu_seqlens)


def _with(**kw):
    """A case builder: the valid base inputs with some arguments replaced."""
    def build():
        a = _base()
        a.update(kw)
        return a
    return build


def _varlen(cu, T_=None):
    def build():
        a = _base(B_=1, T_=T_ if T_ is not None else 10, cu=[0, 4, 10])
        a["cu_seqlens"] = torch.tensor(cu) if not isinstance(cu, torch.Tensor) else cu
        return a
    return build


def _dims(**d):
    return lambda: _base(**d)


def _hv_not_multiple():
    return _base(H_=2, HV_=3)


def _k_shape():
    a = _base()
    a["k"] = torch.randn(B, T, H, K + 16)
    return a


def _v_batch():
    a = _base()
    a["v"] = torch.randn(B + 1, T, HV, V)
    return a


def _v_time():
    a = _base()
    a["v"] = torch.randn(B, T + 1, HV, V)
    return a


def _q_rank():
    a = _base()
    a["q"] = a["q"][0]
    return a


def _cu_batch():
    a = _base()  # B = 2
    a["cu_seqlens"] = torch.tensor([0, 3, T])
    a["initial_state"] = None
    return a


def _gik(**kw):
    def build():
        a = _base()
        a.update(use_gate_in_kernel=True, lower_bound=-5.0)
        a.update(kw)
        return a
    return build


# (id, builder, exception, regex the message must match: the argument's name)
COMMON = [
    ("q-rank", _q_rank, ValueError, r"\bq\b"),
    ("k-shape", _k_shape, ValueError, r"\bk\b"),
    ("v-batch", _v_batch, ValueError, r"\bv\b"),
    ("v-time", _v_time, ValueError, r"\bv\b"),
    ("hv-not-multiple-of-h", _hv_not_multiple, ValueError, r"\bHV\b|\bv\b"),
    ("g-shape", _with(g=torch.zeros(B, T, HV)), ValueError, r"\bg\b"),
    ("g-shape-H-not-HV", _with(g=torch.zeros(B, T, H, K)), ValueError, r"\bg\b"),
    ("beta-shape", _with(beta=torch.ones(B, T, HV, 1)), ValueError, r"\bbeta\b"),
    ("beta-shape-H", _with(beta=torch.ones(B, T, H)), ValueError, r"\bbeta\b"),
    ("q-integer", lambda: {**_base(), "q": torch.ones(B, T, H, K, dtype=torch.int64)}, TypeError, r"\bq\b"),
    ("v-not-tensor", lambda: {**_base(), "v": _base()["v"].tolist()}, TypeError, r"\bv\b"),
    ("beta-not-tensor", lambda: {**_base(), "beta": 0.5}, TypeError, r"\bbeta\b"),
    ("cu-not-starting-at-0", _varlen([1, 4, 10]), ValueError, r"cu_seqlens"),
    ("cu-decreasing", _varlen([0, 6, 4, 10]), ValueError, r"cu_seqlens"),
    ("cu-last-not-T", _varlen([0, 4, 9]), ValueError, r"cu_seqlens"),
    ("cu-with-B2", _cu_batch, ValueError, r"cu_seqlens"),
    ("cu-float", _varlen(torch.tensor([0.0, 4.0, 10.0])), TypeError, r"cu_seqlens"),
    ("initial-state-shape", _with(initial_state=torch.zeros(B, HV, K, V + 1)), ValueError, r"initial_state"),
    ("initial-state-rows", _with(initial_state=torch.zeros(B + 1, HV, K, V)), ValueError, r"initial_state"),
    ("initial-state-int", _with(initial_state=torch.zeros(B, HV, K, V, dtype=torch.int32)), TypeError,
     r"initial_state"),
    ("K-8", _dims(K_=8), ValueError, r"\bK\b"),
    ("K-512", _dims(K_=512), ValueError, r"\bK\b"),
    ("V-8", _dims(V_=8), ValueError, r"\bV\b"),
    ("A_log-size", _gik(A_log=torch.zeros(HV + 1)), ValueError, r"A_log"),
    ("dt_bias-size", _gik(A_log=torch.zeros(HV), dt_bias=torch.zeros(HV * K - 1)), ValueError, r"dt_bias"),
    ("A_log-without-gate-in-kernel", _with(A_log=torch.zeros(HV)), ValueError, r"A_log"),
    ("dt_bias-without-gate-in-kernel", _with(dt_bias=torch.zeros(HV * K)), ValueError, r"dt_bias"),
    ("softplus-gate-without-A_log", _gik(lower_bound=None), ValueError, r"A_log"),
    ("unknown-kwarg", _with(not_an_argument=1), TypeError, r"not_an_argument"),
    ("lower-bound-positive", _with(lower_bound=1.0), ValueError, r"lower_bound"),
    ("lower-bound-positive-gate-in-kernel", _gik(lower_bound=1.0, A_log=torch.zeros(HV)), ValueError,
     r"lower_bound"),
    ("allow-neg-eigval-without-sigmoid", _with(allow_neg_eigval=True), ValueError, r"allow_neg_eigval"),
    ("scale-not-a-number", _with(scale="0.5"), TypeError, r"\bscale\b"),
]

CHUNK_ONLY = [
    ("lower-bound-positive-safe-gate", _with(safe_gate=True, lower_bound=1.0), ValueError, r"lower_bound"),
    ("state-indices-not-accepted", _with(ssm_state_indices=torch.zeros(B, dtype=torch.int64)), TypeError,
     r"ssm_state_indices"),
]

RECURRENT_ONLY = [
    ("state-indices-without-initial-state",
     _with(initial_state=None, ssm_state_indices=torch.tensor([0, 1])), ValueError, r"state_indices"),
    ("state-indices-wrong-length",
     _with(initial_state=torch.zeros(4, HV, K, V), ssm_state_indices=torch.tensor([0, 1, 2])), ValueError,
     r"state_indices"),
    ("state-indices-float",
     _with(initial_state=torch.zeros(4, HV, K, V), ssm_state_indices=torch.tensor([0.0, 1.0])), ValueError,
     r"state_indices"),
    ("pool-shape", _with(initial_state=torch.zeros(4, HV, K, V + 1), ssm_state_indices=torch.tensor([0, 1])),
     ValueError, r"initial_state"),
    ("out-shape", _with(out=torch.empty(B, T, HV, V + 1)), ValueError, r"\bout\b"),
    ("out-dtype", _with(out=torch.empty(B, T, HV, V, dtype=torch.float16)), ValueError, r"\bout\b"),
]


@pytest.fixture(scope="module", autouse=True)
def warm_ops():
    """Run both ops once on the valid base inputs first: a bad call with the same geometry
    must be rejected even when a previous good call left something cached (the decode
    loop's situation)."""
    for op in OPS.values():
        op(**_base())
        op(**_base())


def _params():
    for op in OPS:
        extra = CHUNK_ONLY if op == "chunk" else RECURRENT_ONLY
        for case in COMMON + extra:
            yield pytest.param(op, *case[1:], id=f"{op}-{case[0]}")


@pytest.mark.parametrize("op,build,exc,name", list(_params()))
def test_bad_input_is_rejected_before_launch(op, build, exc, name, no_launch):
    args = build()
    with pytest.raises(exc) as info:
        OPS[op](**args)
    assert info.type is exc, f"expected {exc.__name__}, got {info.type.__name__}: {info.value}"
    assert re.search(name, str(info.value)), f"message does not name the argument ({name}): {info.value}"
    assert no_launch == [], "a kernel ran before the error"


@pytest.mark.parametrize("op", list(OPS))
def test_valid_base_inputs_are_accepted(op):
    """The builders' base inputs are valid: the errors above come from the one bad argument."""
    out = OPS[op](**_base())
    assert torch.isfinite(out[0]).all()


# ------------------------------------------------------------------------- no backward


@pytest.mark.slow
@pytest.mark.parametrize("which", ["q", "k", "v", "g", "beta", "initial_state", "A_log"])
def test_chunk_kda_gradient_reaches_whichever_input_asks(which):
    """Whichever input asks for a gradient gets one (finite, and not all zero): none is lost."""
    a = _base()
    if which == "A_log":
        a.update(use_gate_in_kernel=True, lower_bound=-5.0, A_log=torch.zeros(HV))
    a[which] = a[which].clone().requires_grad_(True)
    o, _ = kdagen.chunk_kda(**a)
    assert o.requires_grad, f"o does not require grad although {which} does: its gradient would be lost"
    o.square().sum().backward()
    grad = a[which].grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_chunk_kda_no_grad_is_fine():
    a = _base()
    a["q"] = a["q"].clone().requires_grad_(True)
    with torch.no_grad():
        o, _ = kdagen.chunk_kda(**a)
    assert not o.requires_grad


def test_a_training_call_validates_selects_and_lowers_once(monkeypatch):
    """The grad path validates the inputs, selects the spec and lowers the plan once (forward
    and backward together), as the inference path does."""
    from kdagen.ops import chunk, chunk_call

    counts = {}
    for op, name in ((chunk_call, "check_inputs"), (chunk, "select_spec"), (chunk_call, "lower")):
        real = getattr(op, name)

        def counted(*a, _real=real, _name=name, **k):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(op, name, counted)
    x = make_inputs(1, 20, 1, 1, 16, 16)
    leaves = {n: t.clone().requires_grad_(True) for n, t in dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta).items()}
    o, _ = kdagen.chunk_kda(**leaves, use_qk_l2norm_in_kernel=True, safe_gate=True, lower_bound=-5.0)
    o.sum().backward()
    assert counts == {"check_inputs": 1, "select_spec": 1, "lower": 1}
    assert all(t.grad is not None for t in leaves.values())
