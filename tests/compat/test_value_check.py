"""The opt-in value check (kdagen.ops.checks): with ``check_inputs=True`` or
``KDAGEN_CHECK_INPUTS=1`` a bad value raises a ValueError naming the argument and its first bad
index, before any kernel runs; it is off by default, and what it accepts runs unchanged."""
from __future__ import annotations

import re

import pytest
import torch

from cases import make_inputs
from conftest import nan_tensor

import kdagen
import kdagen.ops.recurrent as R
from kdagen.ops import checks

B, H, HV, K, V, P = 3, 1, 2, 16, 16, 5
NAN, INF = float("nan"), float("inf")


def _call(**change):
    x = make_inputs(B, 1, H, HV, K, V, seed=0, h0=False)
    pool = torch.randn(P, HV, K, V, generator=torch.Generator().manual_seed(1))
    a = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, initial_state=pool,
             ssm_state_indices=torch.tensor([4, -1, 1], dtype=torch.int32))
    for name, fn in change.items():
        a[name] = fn(a[name].clone()) if callable(fn) else fn
    return a


def _set(index, value):
    def f(t):
        t[index] = value
        return t
    return f


def _packed(cu):
    def build():
        x = make_inputs(1, 4, H, HV, K, V, seed=2, h0=False)
        return dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, cu_seqlens=torch.tensor(cu),
                    initial_state=torch.zeros(P, HV, K, V), ssm_state_indices=torch.arange(len(cu) - 1))
    return build


# (id, arguments, the message must match)
CASES = [
    ("q-nan", lambda: _call(q=_set((2, 0, 0, 5), NAN)), r"\bq\[2, 0, 0, 5\] = nan is NaN or infinite"),
    ("k-inf", lambda: _call(k=_set((0, 0, 0, 1), INF)), r"\bk\[0, 0, 0, 1\] = inf"),
    ("v-nan", lambda: _call(v=_set((1, 0, 1, 3), NAN)), r"\bv\[1, 0, 1, 3\]"),
    ("beta-inf", lambda: _call(beta=_set((0, 0, 1), -INF)), r"\bbeta\[0, 0, 1\] = -inf"),
    ("g-nan", lambda: _call(g=_set((1, 0, 1, 7), NAN)), r"\bg\[1, 0, 1, 7\] = nan is NaN"),
    ("g-positive", lambda: _call(g=_set((2, 0, 0, 0), 0.5)), r"\bg\[2, 0, 0, 0\] = 0\.5 is > 0"),
    ("g-plus-inf", lambda: _call(g=_set((0, 0, 0, 3), INF)), r"\bg\[0, 0, 0, 3\] = inf is > 0"),
    ("slot-outside-the-pool", lambda: _call(ssm_state_indices=torch.tensor([4, 5, 1])),
     r"ssm_state_indices\[1\] = 5 is a slot outside the pool's 5 slots"),
    ("slot-twice", lambda: _call(ssm_state_indices=torch.tensor([1, -1, 1])),
     r"ssm_state_indices\[2\] = 1 repeats a slot"),
    ("pool-slot-read-is-nan", lambda: _call(initial_state=_set((1, 0, 2, 3), NAN)),
     r"initial_state\[1, 0, 2, 3\] = nan \(a slot this call reads\)"),
    ("state-inf", lambda: {**_call(), "ssm_state_indices": None,
                           "initial_state": _set((2, 1, 0, 0), INF)(torch.zeros(B, HV, K, V))},
     r"initial_state\[2, 1, 0, 0\] = inf is NaN or infinite"),
    ("padded-slots-and-a-nan", lambda: {**_packed([0, 1, 1, 4])(), "ssm_state_indices": torch.tensor([-1, 3, 0]),
                                        "v": _set((0, 2, 0, 1), NAN)(_packed([0, 1, 1, 4])()["v"])},
     r"\bv\[0, 2, 0, 1\]"),
]


@pytest.mark.parametrize("build,message", [pytest.param(c[1], c[2], id=c[0]) for c in CASES])
def test_a_bad_value_is_named_with_its_first_index_before_any_launch(build, message, no_launch):
    a = build()
    with pytest.raises(ValueError) as info:
        kdagen.fused_recurrent_kda(**a, check_inputs=True)
    assert re.search(message, str(info.value)), str(info.value)
    assert str(info.value).startswith("fused_recurrent_kda: ")
    assert no_launch == []


@pytest.mark.parametrize("cu,message", [([1, 2, 4], r"cu_seqlens\[0\] = 1 breaks the offsets' contract"),
                                        ([0, 3, 2, 4], r"cu_seqlens\[2\] = 2 breaks"),
                                        ([0, 2, 5], r"cu_seqlens\[2\] = 5 breaks .*end at T=4")])
def test_bad_offsets_on_the_device_are_named(cu, message):
    """(A host cu_seqlens is checked by the op itself, for free; on the device only the value
    check reads it.)"""
    a = _packed(cu)()
    with pytest.raises(ValueError, match=message):
        checks.check_values("fused_recurrent_kda", q=a["q"], k=a["k"], v=a["v"], g=a["g"], beta=a["beta"],
                            cu_seqlens=a["cu_seqlens"])


def test_the_first_bad_index_is_the_first_in_order():
    a = _call(g=_set((slice(None), 0, 1, slice(3, 6)), 1.0))
    with pytest.raises(ValueError, match=r"g\[0, 0, 1, 3\] = 1\.0 .*\(9 such element"):
        kdagen.fused_recurrent_kda(**a, check_inputs=True)


def test_what_the_check_accepts():
    """g = -inf (a reset) and far below any bound, padding slots, NaN in slots nobody reads:
    accepted, and computed as without the check."""
    R._FAST.clear()
    g = _set((0, 0, 0, slice(None)), -INF)(_call()["g"].clone())
    g[2, 0, 1, :4] = -50.0
    pool = torch.randn(P, HV, K, V)
    pool[[0, 2, 3]] = NAN  # unused slots
    a = _call(g=g, initial_state=pool.clone())
    b = _call(g=g, initial_state=pool.clone())
    o1, _ = kdagen.fused_recurrent_kda(**a, check_inputs=True)
    o2, _ = kdagen.fused_recurrent_kda(**b)
    assert torch.equal(o1, o2) and torch.isfinite(o1).all()
    assert torch.equal(a["initial_state"][[1, 4]], b["initial_state"][[1, 4]])


def test_off_by_default_and_the_environment_turns_it_on(monkeypatch):
    R._FAST.clear()
    bad = _call(q=_set((0, 0, 0, 0), NAN))
    assert not checks.from_env() or checks.DEFAULT
    monkeypatch.setattr(checks, "DEFAULT", False)
    kdagen.fused_recurrent_kda(**bad)  # computes (NaN in, NaN out): no check
    monkeypatch.setattr(checks, "DEFAULT", True)
    for _ in range(2):  # the fast path checks too
        with pytest.raises(ValueError, match=r"\bq\[0, 0, 0, 0\]"):
            kdagen.fused_recurrent_kda(**bad)
    kdagen.fused_recurrent_kda(**bad, check_inputs=False)  # a call turns it off
    monkeypatch.setenv(checks.ENV, "1")
    assert checks.from_env()
    monkeypatch.setenv(checks.ENV, "0")
    assert not checks.from_env()


def test_the_in_kernel_gate_checks_its_raw_input_and_parameters():
    a = _call()
    a["g"] = torch.randn(B, 1, HV, K)  # raw input: any sign is fine
    A_log, dt_bias = torch.zeros(HV), torch.zeros(HV * K)
    kdagen.fused_recurrent_kda(**a, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, lower_bound=-5.0,
                               check_inputs=True)
    with pytest.raises(ValueError, match=r"g\[1, 0, 0, 2\] = nan \(the raw gate input"):
        kdagen.fused_recurrent_kda(**{**a, "g": _set((1, 0, 0, 2), NAN)(a["g"].clone())}, A_log=A_log,
                                   dt_bias=dt_bias, use_gate_in_kernel=True, lower_bound=-5.0, check_inputs=True)
    with pytest.raises(ValueError, match=r"A_log\[1\] = nan"):
        kdagen.fused_recurrent_kda(**a, A_log=_set(1, NAN)(A_log.clone()), dt_bias=dt_bias, use_gate_in_kernel=True,
                                   lower_bound=-5.0, check_inputs=True)


def test_a_promised_bound_is_checked():
    """What chunk_kda's safe_gate promises (decode promises nothing about g)."""
    x = make_inputs(1, 5, H, HV, K, V, seed=3)
    assert checks.promised_bound(True, None, False) == -5.0
    assert checks.promised_bound(True, -3.0, False) == -3.0
    assert checks.promised_bound(False, -3.0, False) is None and checks.promised_bound(True, -3.0, True) is None
    kw = dict(q=x.q, k=x.k, v=x.v, beta=x.beta)
    checks.check_values("chunk_kda", g=x.g, gate_bound=-5.0, **kw)  # make_inputs' g is in [-5, 0)
    for value in (-5.5, -INF):
        g = _set((0, 3, 1, 9), value)(x.g.clone())
        with pytest.raises(ValueError, match=r"chunk_kda: g\[0, 3, 1, 9\] = .* below the promised lower_bound=-5\.0"):
            checks.check_values("chunk_kda", g=g, gate_bound=-5.0, **kw)
        checks.check_values("chunk_kda", g=g, gate_bound=None, **kw)


def test_padding_slots_and_nan_in_unread_slots_pass():
    pool = nan_tensor(P, HV, K, V)
    pool[2] = 0.0
    a = _call(initial_state=pool, ssm_state_indices=torch.tensor([-1, 2, -7]))
    kdagen.fused_recurrent_kda(**a, check_inputs=True)
