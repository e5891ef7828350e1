"""Gated DeltaNet (scalar decay) and DeltaNet (no decay) from the KDA templates: the plan fields
the structure analysis sets, and FLA's four ops (chunk forward, its gradients, decode, decode
gradients) in the interpreter against the float64 recurrences of kdagen.spec.reference, on
odd T, T = 1, head dims that are not powers of two, GVA, varlen with length-0/1 sequences,
initial and final states, g = -inf, FLA's in-kernel flags and gate, and the refusals."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from cases import inputs, reference
from conftest import F64, TOL, assert_close
from plain_configs import plain_bwd, plain_decode, plain_fwd, plain_train

import kdagen
from kdagen import spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.config import RecurrentBwdConfig
from kdagen.ops.member import chunk_member, fused_recurrent_member

F32, F16 = torch.float32, torch.float16
MEMBERS = ("gdn", "deltanet")
GRAD_TOL = {F32: 1e-5, F16: 5e-3}  # the bar of tests/chunk/test_ops_chunk_bwd.py


# ------------------------------------------------------------------------------ plan fields
def test_plan_fields_come_from_the_structure():
    p = lower(S.gdn(), 48, 32, "float16", "chunk")
    assert (p.structure, p.decay, p.diag_mode) == ("kda", "scalar", "scalar")
    p = lower(S.deltanet(), 48, 32, "float32", "chunk")
    assert (p.structure, p.decay, p.diag_mode, p.gate_name) == ("kda", "identity", "scalar", "none")
    assert lower(S.kda(), 64, 64, "float16", "chunk").diag_mode == "elementwise"  # KDA's paths stay
    assert lower(S.kda(S.gate_direct(-5.0)), 64, 64, "bfloat16", "chunk").diag_mode == "factorised"
    # a member the library does not name, with GDN's structure, lowers as GDN does: the templates
    # branch on the plan, not on the name
    mine = S.Recurrence("mine", "scalar", S.gate_direct(), a=S.gdn().a, b=S.gdn().b, write_key=S.gdn().write_key)
    pm, pg = lower(mine, 64, 64, "float16", "chunk"), lower(S.gdn(), 64, 64, "float16", "chunk")
    for kernel, cfg in (("chunk_solve", plain_fwd()), ("chunk_intra", plain_train()),
                        ("chunk_bwd_intra", plain_bwd()), ("recurrent", plain_decode()),
                        ("recurrent_bwd", RecurrentBwdConfig())):
        form = "recurrent" if kernel.startswith("recurrent") else "chunk"
        a = render(kernel, lower(mine, 64, 64, "float16", form), cfg).text
        b = render(kernel, lower(S.gdn(), 64, 64, "float16", form), cfg).text
        body = lambda t: re.sub(r"\b(mine|gdn)_\w+_[0-9a-f]{12}\b", "NAME", t[t.index("import triton"):])  # noqa: E731
        assert body(a) == body(b), kernel
    assert pm.diag_mode == pg.diag_mode


def test_sources_read_the_gate_by_its_layout():
    gdn = render("chunk_solve", lower(S.gdn(), 64, 64, "bfloat16", "chunk"), plain_fwd()).text
    assert "g_c = g + t0 * HV + i_hv" in gdn and "b_Gs = tl.cumsum(" in gdn
    assert "for d in range(K)" not in gdn and "span" not in gdn  # no element-wise fallback, no bound check
    dn = render("chunk_solve", lower(S.deltanet(), 64, 64, "bfloat16", "chunk"), plain_fwd()).text
    assert not re.search(r"\bg_c\b", dn) and "b_Gs" not in dn and "b_E" not in dn  # no gate, no decay factors
    rec = render("recurrent", lower(S.deltanet(), 64, 64, "bfloat16", "recurrent"), plain_decode()).text
    assert "tl.exp(b_g)" not in rec and "g +" not in rec
    for kernel, cfg in (("chunk_intra", plain_train()), ("chunk_bwd_intra", plain_bwd())):
        src = render(kernel, lower(S.gdn(), 64, 64, "float16", "chunk"), cfg).text
        assert "p_g + " in src and "b_G[:, None, :] - b_G[None, :, :]" not in src, kernel


# ------------------------------------------------------------------------------ inputs
# the members' usual cases (tests/cases.py): l2-normalised keys, beta ~ U[0, 1), GDN's log-sigmoid gates with some
# strong decays (a reset: -inf at one token of head 0), all in the inputs' dtype but the initial state
NAMES = ("q", "k", "v", "g", "beta", "h0")  # (g None for DeltaNet)


def _chunk(member, q, k, v, g, beta, **kw):
    if member == "gdn":
        return kdagen.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    return kdagen.chunk_delta_rule(q, k, v, beta, **kw)


def _recurrent(member, q, k, v, g, beta, **kw):
    if member == "gdn":
        return kdagen.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, **kw)
    return kdagen.fused_recurrent_delta_rule(q, k, v, beta, **kw)


# (id, B, T, H, HV, K, V, dtype)
FWD_CASES = [
    ("T37-gva1x2-K32V48", 1, 37, 1, 2, 32, 48, F32),
    ("T1-B3-K48V48", 3, 1, 1, 1, 48, 48, F32),
    ("T70-B2-K48V32-fp16", 2, 70, 1, 1, 48, 32, F16),
]


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("case", FWD_CASES, ids=[c[0] for c in FWD_CASES])
def test_forward_and_decode_match_the_recurrence(member, case):
    _, B, T, H, HV, K, V, dt = case
    reset = (slice(None), T // 2, 0) if member == "gdn" and T > 1 else None
    q, k, v, g, beta, h0 = inputs(member, B, T, H, HV, K, V, dtype=dt, reset=reset).take(*NAMES)
    ro, rh = reference(member, q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    for fn in (_chunk, _recurrent):
        o, ht = fn(member, q, k, v, g, beta, initial_state=h0, output_final_state=True)
        assert o.dtype == dt and ht.dtype == F32
        assert_close(o, ro, TOL[dt], f"{member} {fn.__name__} o")
        assert_close(ht, rh, TOL[dt], f"{member} {fn.__name__} final state")
        o2, none = fn(member, q, k, v, g, beta)
        assert none is None and o2.shape == o.shape


def test_gdn_reset_is_the_recurrences_answer():
    """g = -inf at token t: the state before t is forgotten, so o after t does not depend on
    anything before t (and the result is the float64 recurrence's)."""
    q, k, v, g, beta, h0 = inputs("gdn", 1, 40, 1, 1, 32, 32).take(*NAMES)
    g[0, 20, 0] = -float("inf")
    o, _ = kdagen.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0)
    v2 = v.clone()
    v2[0, :20] = torch.randn(20, 1, 32)
    o2, _ = kdagen.chunk_gated_delta_rule(q, k, v2, g, beta, initial_state=torch.zeros_like(h0))
    assert torch.allclose(o[0, 20:], o2[0, 20:], atol=1e-6)
    assert_close(o, reference("gdn", q=q, k=k, v=v, g=g, beta=beta, h0=h0)[0], TOL[F32], "o")


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
def test_chunk_gradients_match_the_recurrence(member, dt):
    B, T, H, HV, K, V = 1, 37, 1, 2, 48, 32  # K = 48: two K tiles of the backward, the second masked
    q, k, v, g, beta, h0 = inputs(member, B, T, H, HV, K, V, dtype=dt).take(*NAMES)
    names = ["q", "k", "v", "g", "beta", "h0"] if member == "gdn" else ["q", "k", "v", "beta", "h0"]
    xs = dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(B, T, HV, V, generator=gen), torch.randn(1, HV, K, V, generator=gen)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference(member, x64)
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in names])
    for fn in (_chunk, _recurrent) if dt == F32 else (_chunk,):
        xl = {n: xs[n].clone().requires_grad_() for n in names}
        o, ht = fn(member, xl["q"], xl["k"], xl["v"], xl.get("g"), xl["beta"], initial_state=xl["h0"],
                   output_final_state=True)
        grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), [xl[n] for n in names])
        for n, a, b in zip(names, grads, ref):
            assert a.shape == xs[n].shape and a.dtype == xs[n].dtype
            assert_close(a, b, GRAD_TOL[dt], f"{member} {fn.__name__} d{n}")


CU = [0, 0, 1, 20, 37]  # lengths 0, 1, 19, 17


@pytest.mark.parametrize("member", MEMBERS)
def test_varlen_with_empty_and_one_token_sequences(member):
    q, k, v, g, beta, h0 = inputs(member, 1, 37, 1, 2, 48, 32, N=4).take(*NAMES)
    cu = torch.tensor(CU, dtype=torch.int64)
    ro, rh = reference(member, q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu_seqlens=cu)
    o, ht = _chunk(member, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                   cu_seqlens_cpu=cu)
    assert_close(o, ro, TOL[F32], "chunk o")
    assert_close(ht, rh, TOL[F32], "chunk final state")
    assert torch.equal(ht[0], h0[0])  # a length-0 sequence keeps its state
    o, ht = _recurrent(member, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert_close(o, ro, TOL[F32], "recurrent o")
    assert_close(ht, rh, TOL[F32], "recurrent final state")
    # gradients through the packed chunk form
    names = ["q", "k", "v", "g", "beta", "h0"] if member == "gdn" else ["q", "k", "v", "beta", "h0"]
    xs = dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference(member, x64, cu_seqlens=cu)
    do = torch.randn(ro.shape, generator=torch.Generator().manual_seed(3))
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + rh.sum(), [x64[n] for n in names])
    xl = {n: xs[n].clone().requires_grad_() for n in names}
    o, ht = _chunk(member, xl["q"], xl["k"], xl["v"], xl.get("g"), xl["beta"], initial_state=xl["h0"],
                   output_final_state=True, cu_seqlens=cu)
    grads = torch.autograd.grad((o * do).sum() + ht.sum(), [xl[n] for n in names])
    for n, a, b in zip(names, grads, ref):
        assert_close(a, b, TOL[F32], f"d{n}")


@pytest.mark.parametrize("member", MEMBERS)
def test_decode_state_pool(member):
    """ssm_state_indices: slot 3 and slot 0 updated in place, a negative slot is padding (o = 0,
    nothing written), an untouched slot stays as it was."""
    q, k, v, g, beta, _ = inputs(member, 3, 1, 1, 2, 32, 48, h0=False).take(*NAMES)
    pool = torch.randn(5, 2, 32, 48)
    before = pool.clone()
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    o, ht = _recurrent(member, q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx)
    assert ht is pool
    sel = [0, 2]
    ro, rh = reference(member, q=q[sel], k=k[sel], v=v[sel], g=None if g is None else g[sel], beta=beta[sel],
                       h0=before[[3, 0]])
    assert_close(o[sel], ro, TOL[F32], "o")
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert_close(pool[[3, 0]], rh, TOL[F32], "pool slots")
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])


def _norm_ref(member, q, k, v, g, beta, h0, sigmoid, neg):
    qn, kn = F.normalize(q.to(F64), dim=-1), F.normalize(k.to(F64), dim=-1)
    b = torch.sigmoid(beta.to(F64)) * (2.0 if neg else 1.0) if sigmoid else beta
    return reference(member, q=qn, k=kn, v=v, g=g, beta=b, h0=h0)


@pytest.mark.parametrize("member", MEMBERS)
def test_fla_flags(member):
    """use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel/allow_neg_eigval and state_v_first."""
    q, k, v, g, beta, h0 = inputs(member, 1, 45, 1, 1, 32, 32).take(*NAMES)  # both halves of a 64-row chunk
    q, k, beta = q * 3.0, k * 0.3, torch.randn_like(beta)
    kw = dict(use_qk_l2norm_in_kernel=True)
    if member == "gdn":
        kw.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    ro, rh = _norm_ref(member, q, k, v, g, beta, h0, member == "gdn", member == "gdn")
    if member == "deltanet":
        beta_in = beta.sigmoid()
        ro, rh = _norm_ref(member, q, k, v, g, beta_in, h0, False, False)
    else:
        beta_in = beta
    for fn in (_chunk, _recurrent):
        o, ht = fn(member, q, k, v, g, beta_in, initial_state=h0.transpose(-1, -2).contiguous(),
                   output_final_state=True, state_v_first=True, **kw)
        assert_close(o, ro, TOL[F32], f"{fn.__name__} o")
        assert_close(ht.transpose(-1, -2), rh, TOL[F32], f"{fn.__name__} final state (V, K)")


def test_gdn_gate_in_kernel():
    """FLA's GDN gate g = -exp(A_log) softplus(z + dt_bias), A_log and dt_bias per value head:
    forward and gradients of z, A_log and dt_bias, chunk and recurrent."""
    q, k, v, _, beta, h0 = inputs("gdn", 1, 23, 1, 2, 32, 32).take(*NAMES)
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(1, 23, 2, generator=gen)
    A_log, dt_bias = torch.randn(2, generator=gen) * 0.5, torch.randn(2, generator=gen)
    z64, A64, b64 = (x.to(F64).requires_grad_() for x in (z, A_log, dt_bias))
    g64 = -A64.exp() * F.softplus(z64 + b64)
    ro, rh = reference("gdn", q=q, k=k, v=v, g=g64, beta=beta, h0=h0)
    ref = torch.autograd.grad(ro.sum() + rh.sum(), (z64, A64, b64))
    for fn in (kdagen.chunk_gated_delta_rule, kdagen.fused_recurrent_gated_delta_rule):
        zl, Al, bl = (x.clone().requires_grad_() for x in (z, A_log, dt_bias))
        if fn is kdagen.chunk_gated_delta_rule:
            o, ht = fn(q, k, v, zl, beta, initial_state=h0, output_final_state=True, use_gate_in_kernel=True,
                       A_log=Al, dt_bias=bl)
        else:
            o, ht = fn(q, k, v, zl, beta=beta, initial_state=h0, output_final_state=True, use_gate_in_kernel=True,
                       A_log=Al, dt_bias=bl)
        assert_close(o, ro, TOL[F32], f"{fn.__name__} o")
        grads = torch.autograd.grad(o.sum() + ht.sum(), (zl, Al, bl))
        for n, a, b in zip(("dz", "dA_log", "ddt_bias"), grads, ref):
            assert a.shape == b.shape
            assert_close(a, b, TOL[F32], f"{fn.__name__} {n}")
        with torch.no_grad():  # the inference kernels compute the gate themselves
            o, _ = (fn(q, k, v, z, beta, initial_state=h0, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
                    if fn is kdagen.chunk_gated_delta_rule else
                    fn(q, k, v, z, beta=beta, initial_state=h0, use_gate_in_kernel=True, A_log=A_log,
                       dt_bias=dt_bias))
        assert_close(o, ro, TOL[F32], f"{fn.__name__} o (no grad)")


def test_fused_recurrent_gated_delta_rule_without_g_is_deltanet_and_gk_is_kda():
    q, k, v, _, beta, h0 = inputs("deltanet", 1, 9, 1, 1, 32, 32).take(*NAMES)
    o, _ = kdagen.fused_recurrent_gated_delta_rule(q, k, v, beta=beta, initial_state=h0)
    assert_close(o, reference("deltanet", q=q, k=k, v=v, beta=beta, h0=h0)[0], TOL[F32], "g=None")
    o1, _ = kdagen.fused_recurrent_delta_rule(q, k, v, initial_state=h0)  # beta None = 1, as in FLA
    assert_close(o1, reference("deltanet", q=q, k=k, v=v, beta=torch.ones_like(beta), h0=h0)[0], TOL[F32],
                 "beta=None")
    gk = -torch.rand(1, 9, 1, 32)
    o, _ = kdagen.fused_recurrent_gated_delta_rule(q, k, v, gk=gk, beta=beta, initial_state=h0)
    ok, _ = kdagen.fused_recurrent_kda(q, k, v, gk, beta, initial_state=h0)
    assert torch.equal(o, ok)


def test_member_entries_take_a_users_spec():
    """chunk_member / fused_recurrent_member run a spec the library does not name."""
    mine = S.Recurrence("mine", "scalar", S.gate_direct(), a=S.gdn().a, b=S.gdn().b, write_key=S.gdn().write_key)
    q, k, v, g, beta, h0 = inputs("gdn", 1, 19, 1, 1, 32, 32).take(*NAMES)
    ro, rh = reference("gdn", q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    for fn in (chunk_member, fused_recurrent_member):
        o, ht = fn(mine, q, k, v, g, beta, initial_state=h0, output_final_state=True)
        assert_close(o, ro, TOL[F32], fn.__name__)


def test_refusals_name_the_keyword():
    q, k, v, g, beta, h0 = inputs("gdn", 1, 4, 1, 1, 32, 32).take(*NAMES)
    gk = -torch.rand(1, 4, 1, 32)
    cases = [
        (lambda: kdagen.fused_recurrent_gated_delta_rule(q, k, v, g, gv=torch.zeros_like(v), beta=beta), "gv"),
        (lambda: kdagen.fused_recurrent_gated_delta_rule(q, k, v, g, gk=gk, beta=beta), "gk together"),
        (lambda: kdagen.chunk_gated_delta_rule(q, k, v, g, beta, cp_context=object()), "cp_context"),
        (lambda: kdagen.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=8), "chunk_size=8"),
        (lambda: kdagen.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True), "A_log"),
        (lambda: kdagen.chunk_gated_delta_rule(q, k, v, g, beta, A_log=torch.zeros(1)), "use_gate_in_kernel"),
        (lambda: kdagen.chunk_gated_delta_rule(q, k, v, gk, beta), r"g must have shape \[B, T, HV\]"),
        (lambda: kdagen.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True, A_log=torch.zeros(1),
                                               dt_bias=torch.zeros(32)), "dt_bias must have HV"),
        (lambda: chunk_member(S.deltanet(), q, k, v, g, beta), "no decay"),
        (lambda: kdagen.chunk_delta_rule(q, k, v, beta, head_first=False), "head_first"),
        (lambda: chunk_member(S.dplr(), q, k, v, gk, beta), "general DPLR structure.*chunk_dplr_delta_rule"),
        (lambda: chunk_member(S.gla(), q, k, v, gk, beta), "takes no beta"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(TypeError, match="unexpected keyword"):
        kdagen.chunk_delta_rule(q, k, v, beta, bogus=1)


@pytest.mark.parametrize("member", MEMBERS)
def test_both_chunk_lengths(member):
    """chunk_size 32 (one half per chunk; no prefetch in the state pass) and 64 (two halves coupled),
    inference and training (every
    gradient), with g = -inf (a reset) mid-sequence for GDN: the recurrence's answer."""
    reset = (slice(None), 45 // 2, 0) if member == "gdn" else None
    q, k, v, g, beta, h0 = inputs(member, 1, 45, 1, 1, 32, 32, reset=reset).take(*NAMES)
    names = ["q", "k", "v", "g", "beta", "h0"] if member == "gdn" else ["q", "k", "v", "beta", "h0"]
    xs = dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    x64 = {n: xs[n].to(F64).requires_grad_() for n in names}
    ro, rh = reference(member, x64)
    do = torch.randn(ro.shape, generator=torch.Generator().manual_seed(2))
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + rh.sum(), [x64[n] for n in names])
    for C in (32, 64):
        cfg = plain_fwd(chunk_size=C, state_prefetch=C == 64, state_num_stages=2)  # both state passes
        o, ht = _chunk(member, q, k, v, g, beta, initial_state=h0, output_final_state=True, config=cfg)
        assert_close(o, ro.detach(), TOL[F32], f"C={C} o")
        assert_close(ht, rh.detach(), TOL[F32], f"C={C} final state")
        xl = {n: xs[n].clone().requires_grad_() for n in names}
        o, ht = _chunk(member, xl["q"], xl["k"], xl["v"], xl.get("g"), xl["beta"], initial_state=xl["h0"],
                       output_final_state=True, chunk_size=C)
        grads = torch.autograd.grad((o * do).sum() + ht.sum(), [xl[n] for n in names])
        for n, a, b in zip(names, grads, ref):
            assert_close(a, b, GRAD_TOL[F32], f"C={C} d{n}")


def test_torch_compile_runs_the_ops_eagerly():
    """No registered op yet: under torch.compile the ops are a graph break, and give the eager answer."""
    q, k, v, g, beta, _ = inputs("gdn", 1, 20, 1, 1, 32, 32, h0=False).take(*NAMES)

    def f(q, k, v, g, beta):
        return kdagen.chunk_gated_delta_rule(q, k, v, g, beta)[0] * 2 + kdagen.chunk_delta_rule(q, k, v, beta)[0]

    assert torch.equal(torch.compile(f, backend="eager")(q, k, v, g, beta), f(q, k, v, g, beta))


_FRESH_PROCESS = """
import sys
import torch
import kdagen
assert "torch._dynamo" not in sys.modules, "import kdagen imported torch._dynamo"
gen = torch.Generator().manual_seed(0)
q, k = (torch.nn.functional.normalize(torch.randn(1, 20, 1, 16, generator=gen), dim=-1) for _ in range(2))
v = torch.randn(1, 20, 1, 16, generator=gen)
g, beta = -torch.rand(1, 20, 1, generator=gen), torch.rand(1, 20, 1, generator=gen)
def f(q, k, v, g, beta):
    return kdagen.chunk_gated_delta_rule(q, k, v, g, beta)[0] * 2
got = torch.compile(f, backend="eager")(q, k, v, g, beta)  # the op's first call is under torch.compile
assert torch.equal(got, f(q, k, v, g, beta)), "compiled and eager differ"
print("ok")
"""


@pytest.mark.slow  # a subprocess
def test_importing_kdagen_leaves_dynamo_out_and_a_first_call_under_compile_runs_eagerly():
    """The member ops' graph break costs nothing at import (Dynamo, ~0.9 s, is imported by the first call),
    and an op whose first call in the process is inside torch.compile runs eagerly and gives eager's bits."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_kda_with_a_gate_through_the_member_entry_is_chunk_kda():
    """A KDA-structured spec with a gate expression runs through chunk_member /
    fused_recurrent_member and gives chunk_kda's / fused_recurrent_kda's bits (same plan, kernels)."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 19, 1, 32, generator=gen) for _ in range(3))
    z, beta = torch.randn(1, 19, 1, 32, generator=gen), torch.rand(1, 19, 1, generator=gen)
    A_log, dt_bias = torch.randn(1, generator=gen), torch.randn(32, generator=gen)
    spec = S.kda(S.gate_lower_bound(-5.0))
    kw = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, output_final_state=True)
    o, ht = chunk_member(spec, q, k, v, z, beta, **kw)
    ok, hk = kdagen.chunk_kda(q, k, v, z, beta, lower_bound=-5.0, **kw)
    assert torch.equal(o, ok) and torch.equal(ht, hk)
    o, ht = fused_recurrent_member(spec, q, k, v, z, beta, **kw)
    ok, hk = kdagen.fused_recurrent_kda(q, k, v, z, beta, lower_bound=-5.0, **kw)
    assert torch.equal(o, ok) and torch.equal(ht, hk)


def test_gdn_training_over_several_k_tiles():
    """The training kernels over three K tiles of 16 (K = 48), with the in-kernel gate (A_log,
    dt_bias per head) and a cumsum-by-dot config (a scalar decay's per-row gate takes tl.cumsum)."""
    from kdagen.ops.chunk import chunk_bwd_config

    q, k, v, _, beta, h0 = inputs("gdn", 1, 45, 1, 2, 48, 32).take(*NAMES)
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(1, 45, 2, generator=gen)
    A_log, dt_bias = torch.randn(2, generator=gen) * 0.5, torch.randn(2, generator=gen)
    leaves64 = [x.to(F64).requires_grad_() for x in (q, k, z, A_log, dt_bias, h0)]
    q64, k64, z64, A64, b64, h64 = leaves64
    ro, rh = reference("gdn", q=q64, k=k64, v=v, g=-A64.exp() * F.softplus(z64 + b64), beta=beta, h0=h64)
    ref = torch.autograd.grad(ro.sum() + rh.sum(), leaves64)
    leaves = [x.clone().requires_grad_() for x in (q, k, z, A_log, dt_bias, h0)]
    ql, kl, zl, Al, bl, hl = leaves
    with chunk_bwd_config(plain_bwd(intra_block_k=16)):
        o, ht = kdagen.chunk_gated_delta_rule(ql, kl, v, zl, beta, initial_state=hl, output_final_state=True,
                                              use_gate_in_kernel=True, A_log=Al, dt_bias=bl,
                                              config=plain_train(chunk_size=32, intra_block_k=16, cumsum="dot"))
    assert_close(o.detach(), ro.detach(), TOL[F32], "o")
    grads = torch.autograd.grad(o.sum() + ht.sum(), leaves)
    for n, a, b in zip(("dq", "dk", "dz", "dA_log", "ddt_bias", "dh0"), grads, ref):
        assert_close(a, b, GRAD_TOL[F32], n)


def test_tuned_winners_are_shared_whatever_the_bound():
    """A scalar decay's kernels read no bound: a build with the CLI's default bound (-5) and the ops
    (no bound) look winners up under one tuning spec; KDA's bound still sets its own."""
    gdn_ops, gdn_built = S.gdn(), S.get_spec("gdn", lower_bound=-5.0)
    for form in ("chunk", "recurrent"):
        assert lower(gdn_ops, 64, 64, "bfloat16", form).tuning_spec_hash == \
            lower(gdn_built, 64, 64, "bfloat16", form).tuning_spec_hash
    assert lower(S.deltanet(), 64, 64, "bfloat16", "chunk").tuning_spec_hash == S.deltanet().hash
    assert lower(S.kda(), 64, 64, "bfloat16", "chunk").tuning_spec_hash != \
        lower(S.get_spec("kda", lower_bound=-5.0), 64, 64, "bfloat16", "chunk").tuning_spec_hash


@pytest.mark.parametrize("member,decay", [("gdn", "scalar"), ("deltanet", "identity")])
def test_cli_inspect_renders_the_members_kernels(member, decay):
    from click.testing import CliRunner

    from kdagen.cli import main

    r = CliRunner().invoke(main, ["inspect", "--spec", member, "--head-dim", "64"])
    assert r.exit_code == 0, r.output
    assert f"decay {decay}" in r.output and "diagonal tiles scalar" in r.output
    assert f"def {member}_chunk_solve_" in r.output


@pytest.mark.parametrize("member", MEMBERS)
def test_decode_fast_path(member, monkeypatch):
    """A decode loop's second call of one geometry skips validation, lowering and the config look-up
    (as fused_recurrent_kda's) and still gives the recurrence's answer; another geometry does not."""
    import kdagen.ops.member as M

    pool = torch.randn(4, 1, 32, 32)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    for step in range(3):
        q, k, v, g, beta, _ = inputs(member, 2, 1, 1, 1, 32, 32, h0=False, seed=step).take(*NAMES)
        before = pool.clone()
        if step == 1:  # from now on this geometry must not lower again
            monkeypatch.setattr(M, "lower", lambda *a, **kw: pytest.fail("the fast path lowered again"))
        o, ht = _recurrent(member, q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx)
        ro, rh = reference(member, q=q, k=k, v=v, g=g, beta=beta, h0=before[[2, 0]])
        assert ht is pool
        assert_close(o, ro, TOL[F32], f"step {step} o")
        assert_close(pool[[2, 0]], rh, TOL[F32], f"step {step} pool")
    q, k, v, g, beta, _ = inputs(member, 3, 1, 1, 1, 32, 32, h0=False).take(*NAMES)  # another batch: the full path
    with pytest.raises(pytest.fail.Exception, match="lowered again"):
        _recurrent(member, q, k, v, g, beta, initial_state=pool, ssm_state_indices=torch.tensor([1, 2, 3]))
