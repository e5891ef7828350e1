"""chunk_size=16 on the member ops (FLA 0.6.0's chunk_delta_rule and chunk_gated_delta_rule take 16, 32
or 64; kdagen's chunk_gla takes the keyword too) in the interpreter, against the float64 recurrences of
kdagen.spec.reference: the forward of an inference call (the training forward's launches: the solve
and pass take 32 or 64) and of a training call, and the gradients of every input with the initial
state's, fp32 and fp16, T not a multiple of 16, T < 16, GVA, varlen with length-0/1 sequences, FLA's
in-kernel flags and GDN's gate, the per-chunk states; every launch on 16-row chunks; chunk_kda refuses
16 as FLA's does; the training configs of a 64 / 32 heuristic (GDN in bf16) pinned to 16 rows."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cases import inputs, reference
from conftest import F64, TOL, assert_close

import kdagen
from kdagen import spec as S
from kdagen.codegen.lower import lower
from kdagen.config import ChunkBwdConfig, ChunkTrainConfig
from kdagen.kernels import Launch
from kdagen.ops import chunk_call as C
from kdagen.ops.member import _prepare_chunk

F32, F16 = torch.float32, torch.float16
GRAD_TOL = {F32: 1e-5, F16: 5e-3}  # the family's bar (tests/family/test_family.py)
MEMBERS = ("deltanet", "gdn", "gla")


NAMES = ("q", "k", "v", "g", "beta", "h0")  # (beta None for GLA, g for DeltaNet)
# GLA's case: q, k, v and beta drawn as the other members' (its keys l2-normalised; beta not used), the gate
# in the inputs' dtype: log-sigmoid without strong decays, or in [lb, 0) under a bound
GLA = dict(key="unit", beta="unused", order=("beta", "gate"), decays=None, gate_in_dtype=True)


def _names(x):
    return [n for n in ("q", "k", "v", "g", "beta", "h0") if x[n] is not None]


def _op(member, x, **kw):
    q, k, v, g, beta, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "h0"))
    kw = dict(initial_state=h0, output_final_state=True, chunk_size=16, **kw)
    if member == "gdn":
        return kdagen.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    if member == "gla":
        return kdagen.chunk_gla(q, k, v, g, **kw)
    return kdagen.chunk_delta_rule(q, k, v, beta, **kw)


@pytest.fixture
def chunk_rows(monkeypatch):
    """The BT of every launch run (kdagen.kernels.Launch), in order."""
    seen = []
    real = Launch.__call__

    def spy(self):
        seen.append((self.kernel, self.constexprs.get("BT")))
        return real(self)

    monkeypatch.setattr(Launch, "__call__", spy)
    return seen


# (id, B, T, H, HV, K, V, cu_seqlens): T = 37 (two full chunks and a partial one), T = 7 (< 16), varlen
CASES = [
    ("T37-gva1x2-K48V32", 1, 37, 1, 2, 48, 32, None),
    ("T7-B2-K32V48", 2, 7, 1, 1, 32, 48, None),
    ("varlen-0-1-19-17", 1, 37, 1, 2, 32, 32, [0, 0, 1, 20, 37]),
]


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("member", MEMBERS)
def test_forward_and_gradients_match_the_recurrence(member, case, dt, chunk_rows):
    _, B, T, H, HV, K, V, cu = case
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int64)
    lb = -5.0 if member == "gla" and dt == F16 else None  # fp16 GLA with a promised bound (factorised tiles)
    gla = dict(GLA, lb=lb) if member == "gla" else {}
    x = inputs(member, B, T, H, HV, K, V, dtype=dt, N=None if cu is None else cu.numel() - 1, **gla).tensors(*NAMES)
    kw = dict(cu_seqlens=cu) | (dict(safe_gate=True, lower_bound=lb) if lb is not None else {})
    names = _names(x)
    x64 = {n: x[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference(member, x64, cu_seqlens=cu)
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(ro.shape, generator=gen), torch.randn(rh.shape, generator=gen)
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in names])

    with torch.no_grad():  # inference: the training forward's two launches on 16-row chunks
        o, ht = _op(member, x, **kw)
    # (GLA's intra launch is followed by its repair launch, the same kernel)
    assert {n for n, _ in chunk_rows} == {"chunk_intra", "chunk_state"} and all(bt == 16 for _, bt in chunk_rows)
    assert o.dtype == dt and ht.dtype == F32
    assert_close(o, ro, TOL[dt], "inference o")
    assert_close(ht, rh, TOL[dt], "inference final state")
    if cu is not None:
        assert torch.equal(ht[0], x["h0"][0])  # a length-0 sequence keeps its state

    chunk_rows.clear()
    xl = {n: x[n].clone().requires_grad_() if n in names else None for n in x}
    o, ht = _op(member, xl, **kw)
    grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), [xl[n] for n in names])
    assert chunk_rows and all(bt == 16 for _, bt in chunk_rows if bt is not None), chunk_rows  # fwd, re-run, bwd
    assert_close(o, ro, TOL[dt], "training o")
    for n, a, b in zip(names, grads, ref):
        assert a.shape == x[n].shape and a.dtype == x[n].dtype, n
        assert_close(a, b, GRAD_TOL[dt], f"d{n}")


@pytest.mark.parametrize("member", ("deltanet", "gdn"))
def test_fla_flags_and_per_chunk_states(member):
    """use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel with allow_neg_eigval (applied before the
    training forward's launches), state_v_first, and return_intermediate_states: the state entering each
    16-row chunk, in the call's layout, as at chunk_size=32 with the same states every other chunk."""
    x = inputs(member, 1, 45, 1, 1, 32, 32).tensors(*NAMES)
    q, k, beta = x["q"] * 3.0, x["k"] * 0.3, torch.randn_like(x["beta"])
    qn, kn = F.normalize(q.to(F64), dim=-1), F.normalize(k.to(F64), dim=-1)
    b = torch.sigmoid(beta.to(F64)) * 2.0
    ref = dict(x, q=qn, k=kn, beta=b)
    ro, rh = reference(member, ref)
    flags = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    h0t = x["h0"].transpose(-1, -2).contiguous()
    args = (q, k, x["v"]) + ((x["g"],) if member == "gdn" else ()) + (beta,)
    fn = kdagen.chunk_gated_delta_rule if member == "gdn" else kdagen.chunk_delta_rule
    o, ht, hs = fn(*args, initial_state=h0t, output_final_state=True, state_v_first=True, chunk_size=16,
                   return_intermediate_states=True, **flags)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht.transpose(-1, -2), rh, TOL[F32], "final state (V, K)")
    assert hs.shape == (1, 3, 1, 32, 32)
    assert torch.equal(hs[0, 0], h0t[0])  # the first chunk's entering state is the initial state
    _, _, hs32 = fn(*args, initial_state=h0t, state_v_first=True, chunk_size=32, return_intermediate_states=True,
                    **flags)
    assert_close(hs[0, 2], hs32[0, 1], TOL[F32], "state entering row 32")
    # the [K, V] layout
    _, _, hk = fn(*args, initial_state=x["h0"], chunk_size=16, return_intermediate_states=True, **flags)
    assert torch.allclose(hk.transpose(-1, -2), hs, atol=1e-5)


def test_gdn_gate_in_kernel():
    """FLA's GDN gate (A_log, dt_bias per value head) at chunk_size=16: the inference forward (the
    training forward's intra launch computes it) and the gradients of z, A_log and dt_bias."""
    x = inputs("gdn", 1, 23, 1, 2, 32, 32).tensors(*NAMES)
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(1, 23, 2, generator=gen)
    A_log, dt_bias = torch.randn(2, generator=gen) * 0.5, torch.randn(2, generator=gen)
    z64, A64, b64 = (t.to(F64).requires_grad_() for t in (z, A_log, dt_bias))
    ro, rh = reference("gdn", dict(x, g=-A64.exp() * F.softplus(z64 + b64)))
    ref = torch.autograd.grad(ro.sum() + rh.sum(), (z64, A64, b64))
    kw = dict(initial_state=x["h0"], output_final_state=True, use_gate_in_kernel=True, chunk_size=16)
    with torch.no_grad():
        o, _ = kdagen.chunk_gated_delta_rule(x["q"], x["k"], x["v"], z, x["beta"], A_log=A_log, dt_bias=dt_bias, **kw)
    assert_close(o, ro, TOL[F32], "o (no grad)")
    zl, Al, bl = (t.clone().requires_grad_() for t in (z, A_log, dt_bias))
    o, ht = kdagen.chunk_gated_delta_rule(x["q"], x["k"], x["v"], zl, x["beta"], A_log=Al, dt_bias=bl, **kw)
    assert_close(o, ro, TOL[F32], "o")
    for n, a, b in zip(("dz", "dA_log", "ddt_bias"), torch.autograd.grad(o.sum() + ht.sum(), (zl, Al, bl)), ref):
        assert_close(a, b, TOL[F32], n)


@pytest.mark.parametrize("member", ("gdn", "deltanet"))
def test_bf16_configs_pinned_to_16_rows(member):
    """GDN's bf16 heuristic trains on 64-row chunks of two 32-row sub-tiles: pinned to 16 rows the
    training forward and backward run one 16-row sub-tile per chunk (a ConfigError before), and an
    inference call gets the training forward's config.  Nothing runs (bf16 is not exact in the
    interpreter; tests/sm90/test_family_compile_sm90.py compiles these launches)."""
    spec = S.gdn() if member == "gdn" else S.deltanet()
    B, T, HV, K = 1, 8192, 96, 128
    q = torch.empty(B, T, 1, K, dtype=torch.bfloat16)
    g = torch.empty(B, T, HV, dtype=torch.bfloat16) if member == "gdn" else None
    v, beta = torch.empty(B, T, HV, K, dtype=torch.bfloat16), torch.empty(B, T, HV, dtype=torch.bfloat16)
    call, _, _ = _prepare_chunk(spec, q, q, v, g, beta, training=True)
    if member == "gdn":
        assert (C.chunk_configs(call, None, None, True)[0].chunk_size, C.chunk_configs(call, None, None, True)[0].sub_chunk) \
            == (64, 32)
    train, bwd = C.chunk_configs(call, None, None, True, 16)
    assert isinstance(train, ChunkTrainConfig) and isinstance(bwd, ChunkBwdConfig)
    assert (train.chunk_size, train.sub_chunk, bwd.chunk_size, bwd.sub_chunk) == (16, 16, 16, 16)
    assert not bwd.splits_intra(call.plan) and not bwd.reruns_from_saved(call.plan)
    assert (C.chunk_configs(call, None, None, True, 32)[0].sub_chunk, C.chunk_configs(call, None, None, True, 64)[0].sub_chunk) \
        == ((32, 32) if member == "gdn" else (16, 16))  # 32 and 64 as before
    fwd, none = C.chunk_configs(call, None, None, False, 16)
    assert none is None and isinstance(fwd, ChunkTrainConfig) and (fwd.chunk_size, fwd.sub_chunk) == (16, 16)
    assert not fwd.gate_launch


def test_chunk_kda_refuses_16_and_the_members_refuse_other_lengths():
    x = inputs("gdn", 1, 4, 1, 1, 32, 32).tensors(*NAMES)
    gk = -torch.rand(1, 4, 1, 32)
    with pytest.raises(ValueError, match="chunk_size"):
        kdagen.chunk_kda(x["q"], x["k"], x["v"], gk, x["beta"], chunk_size=16)
    for bad in (8, 48, 128):
        with pytest.raises(ValueError, match="chunk_size"):
            kdagen.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=bad)
        with pytest.raises(ValueError, match="chunk_size"):
            kdagen.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], chunk_size=bad)
        with pytest.raises(ValueError, match="chunk_size"):
            kdagen.chunk_gla(x["q"], x["k"], x["v"], gk, chunk_size=bad)


def test_plan_of_a_member_at_16_rows_is_the_training_forwards():
    """The choice is the config's: an inference call's config at 16 rows is a ChunkTrainConfig
    (the solve's lengths are ChunkFwdConfig.CHUNK_SIZES), and at 32 / 64 the solve's as before."""
    from kdagen.config import ChunkFwdConfig

    assert ChunkFwdConfig.CHUNK_SIZES == (32, 64)
    x = inputs("deltanet", 1, 20, 1, 1, 32, 32).tensors(*NAMES)
    call, _, _ = _prepare_chunk(S.deltanet(), x["q"], x["k"], x["v"], None, x["beta"], training=False)
    assert isinstance(C.chunk_configs(call, None, None, False, 16)[0], ChunkTrainConfig)
    for c in (None, 32, 64):
        assert isinstance(C.chunk_configs(call, None, None, False, c)[0], ChunkFwdConfig)
    assert lower(S.deltanet(), 32, 32, "float32", "chunk") == call.plan


def test_offsets_read_back_once_without_host_lengths():
    """An inference call with its offsets only on the device (no cu_seqlens_cpu: seqlens None, the solve's
    schedule built there) reads them back once at 16 rows: the training forward's schedule is the host's."""
    import dataclasses

    cu = torch.tensor([0, 0, 1, 20, 37], dtype=torch.int64)
    x = inputs("gdn", 1, 37, 1, 2, 32, 32, N=4).tensors(*NAMES)
    call, xs, _ = _prepare_chunk(S.gdn(), x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                 cu_seqlens=cu, training=False)
    call = dataclasses.replace(call, seqlens=None)
    config, _ = C.chunk_configs(call, None, None, False, 16)
    launches, (o, ht, _) = C.forward_launches(call, xs, config, True)
    for launch in launches:
        launch()
    ro, rh = reference("gdn", x, cu_seqlens=cu)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")


def test_dplr_fla_multihead_safe_gate_case():
    """FLA's test_chunk_safe_gate_multihead_gradients end to end (chunk_dplr_delta_rule, fp16, D = 16, three
    heads, safe_gate, chunk_size=16, a zero initial state requiring grad; FLA's defaults to 16 rows): o, the
    final state and every gradient against float64 autograd through the DPLR recurrence."""
    from kdagen.spec.reference import naive_recurrent_dplr

    B, T, H, D = 1, 16, 3, 16
    h = torch.arange(H, dtype=torch.float32).view(1, 1, H, 1)
    q, k, v = ((1 + c * h).expand(B, T, H, D).to(F16) for c in (0.1, 0.2, 0.3))
    a = F.normalize((0.5 + 0.1 * h).expand(B, T, H, D).to(F16), p=2, dim=-1)
    gk = torch.full((B, T, H, D), -0.1)
    gk[:, :, 1], gk[:, :, 2], gk[:, :8, 0] = -0.2, -0.3, -5.0
    xs = dict(q=q, k=k, v=v, a=a, b=-a, gk=gk, h0=torch.zeros(B, H, D, D))
    x64 = {n: t.to(F64).requires_grad_() for n, t in xs.items()}
    ro, rh = naive_recurrent_dplr(x64["q"], x64["k"], x64["v"], -x64["b"], x64["a"], x64["gk"], scale=1.0,
                                  initial_state=x64["h0"], output_final_state=True)
    ref = torch.autograd.grad(ro.square().mean() + rh.square().mean(), list(x64.values()))
    xl = {n: t.detach().clone().requires_grad_() for n, t in xs.items()}
    o, ht = kdagen.chunk_dplr_delta_rule(xl["q"], xl["k"], xl["v"], xl["a"], xl["b"], xl["gk"], scale=1.0,
                                         initial_state=xl["h0"], output_final_state=True, safe_gate=True,
                                         chunk_size=16)
    assert_close(o, ro, TOL[F16], "o")
    assert_close(ht, rh, TOL[F16], "final state")
    grads = torch.autograd.grad(o.float().square().mean() + ht.square().mean(), list(xl.values()))
    for n, g, r in zip(xs, grads, ref):
        assert g.dtype == xs[n].dtype and torch.isfinite(g).all(), n
        assert_close(g, r, GRAD_TOL[F16], f"d{n}")
    assert grads[-1].abs().max() > 0
