"""A training call's per-channel in-kernel gate as launches of its own (ChunkTrainConfig.gate_launch,
templates/gate.py.j2, kdagen/ops/gate.py), in the CPU interpreter: the gate and its gradients against
float64 autograd through FLA's formulas (kda_gate), both gates, a head dim that is not a power of two
and a token count that leaves a partial program; the layer call routed through them (the plain plan's
chunk launches on a float32 g, its bound trusted); the launches rendered only where they apply.  The whole
call's gradients against the float64 recurrence: tests/chunk/test_ops_chunk_bwd.py's ``*-gate-launch`` cases;
the sm_90 compile: tests/sm90/test_compile_sm90.py's ``test_the_gate_launches_compile_for_sm90``."""
from __future__ import annotations

import pytest
import torch

from plain_configs import plain_train

import kdagen
import kdagen.ops.chunk_call as C
from kdagen.codegen.lower import lower
from kdagen.codegen.render import family_kernels, render
from kdagen.config import ChunkTrainConfig, ConfigError
from kdagen.kernels import build
from kdagen.ops.gate import ROWS_PER_PROGRAM, layer_gate
from kdagen.ops.inputs import select_spec
from kdagen.spec.reference import kda_gate

F32, F16, F64 = torch.float32, torch.float16, torch.float64


def _plan(bound, K, dtype="float32"):
    return lower(select_spec(True, False, bound, True, True), K, K, dtype, "chunk", True)


def _gate_against_float64(plan, z0, A0, b0, dg, reference):
    """The plan's gate launches (layer_gate) on z0, A0, b0 against ``reference`` (its formula in float64
    autograd): g and, for upstream dg, dz, dA_log and ddt_bias, each within 2e-6 (fp32 z) or 2e-3 (fp16 z:
    dz is stored in fp16) of the reference's largest entry.  Returns (g, z, A, b), the grads on the leaves."""
    built = build(plan, plain_train(gate_launch=True))
    z, A, b = (t.clone().requires_grad_(True) for t in (z0, A0, b0))
    g = layer_gate(z, A, b, built.fn("gate"), built.fn("gate_bwd"))
    assert g.dtype == F32 and g.shape == z.shape
    (g * dg).sum().backward()
    rz, rA, rb = (t.detach().to(F64).requires_grad_(True) for t in (z0, A0, b0))
    rg = reference(rz, rA, rb)
    (rg * dg.to(F64)).sum().backward()
    tol = 2e-6 if z0.dtype == F32 else 2e-3
    for name, got, ref in (("g", g, rg), ("dz", z.grad, rz.grad), ("dA_log", A.grad, rA.grad),
                           ("ddt_bias", b.grad, rb.grad)):
        err = (got.detach().to(F64) - ref.detach()).abs().max().item()
        assert err <= tol * max(ref.abs().max().item(), 1e-30), (name, err)
    return g, z, A, b


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("bound", [-5.0, None], ids=["lower_bound", "softplus"])
def test_gate_and_its_gradients_against_float64(bound, dtype):
    HV, K = 3, 40
    T = 2 * ROWS_PER_PROGRAM + 5  # two full programs per head and a partial one
    gen = torch.Generator().manual_seed(3)
    z0 = (3 * torch.randn(2, T, HV, K, generator=gen)).to(dtype)
    z0[0, 0, 0, :4] = torch.tensor([-30.0, 30.0, 0.0, -0.0])  # saturated both ways
    A0 = 0.5 * torch.randn(HV, generator=gen)
    b0 = 0.5 * torch.randn(HV * K, generator=gen)
    dg = torch.randn(2, T, HV, K, generator=gen)
    plan = _plan(bound, K, "float32" if dtype == F32 else "float16")
    g, z, A, b = _gate_against_float64(plan, z0, A0, b0, dg, lambda rz, rA, rb: kda_gate(rz, rA, rb, lower_bound=bound))
    assert z.grad.dtype == dtype and A.grad.dtype == A0.dtype and b.grad.dtype == b0.dtype
    if bound is not None:
        assert (g >= bound).all()  # the bound the chunk launches then trust


def test_a_layer_call_runs_the_plain_plan_on_the_launched_gate(monkeypatch):
    """With gate_launch the chunk launches are the plan without an in-kernel gate (the direct gate, the
    bound trusted: check_gate_bound off), fed a float32 g; without it the layer plan's launches run as
    before; the two give the same output and gradients to fp32 rounding."""
    seen = []
    apply = C.ChunkFunction.apply

    def spy(*args):
        seen.append((args[0 + 3], args[-1]))
        return apply(*args)

    monkeypatch.setattr(C.ChunkFunction, "apply", spy)
    gen = torch.Generator().manual_seed(1)
    B, T, HV, K = 1, 37, 2, 32
    x0 = dict(q=torch.randn(B, T, HV, K, generator=gen), k=torch.randn(B, T, HV, K, generator=gen),
              v=torch.randn(B, T, HV, K, generator=gen), g=torch.randn(B, T, HV, K, generator=gen),
              beta=torch.rand(B, T, HV, generator=gen), A_log=0.3 * torch.randn(HV, generator=gen),
              dt_bias=0.3 * torch.randn(HV * K, generator=gen))
    do = torch.randn(B, T, HV, K, generator=gen)
    outs = {}
    for launched in (True, False):
        x = {n: t.clone().requires_grad_(True) for n, t in x0.items()}
        o, _ = kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                                use_gate_in_kernel=True, lower_bound=-5.0, use_qk_l2norm_in_kernel=True,
                                config=plain_train(gate_launch=launched))
        (o * do).sum().backward()
        outs[launched] = (o.detach(), {n: t.grad for n, t in x.items()})
    (g_on, run_on), (g_off, run_off) = seen
    call, cfg, bcfg, _ = run_on
    assert g_on.dtype == F32 and not call.plan.gate_in_kernel and call.plan.lower_bound == -5.0
    assert call.plan.diag_mode == "factorised" and not cfg.check_gate_bound and not bcfg.check_gate_bound
    assert not cfg.gate_launch
    assert run_off[0].plan.gate_in_kernel and g_off.dtype == F32  # (the raw z, as given)
    o_on, d_on = outs[True]
    o_off, d_off = outs[False]
    assert torch.allclose(o_on, o_off, rtol=1e-4, atol=1e-5)
    for n in x0:
        assert torch.allclose(d_on[n], d_off[n], rtol=1e-3, atol=1e-4), n


def test_the_gate_launches_render_only_where_they_apply():
    layer = _plan(-5.0, 64)
    on, off = plain_train(gate_launch=True), plain_train()
    assert family_kernels("chunk_train", layer, on)[0] == "gate" and family_kernels("chunk_train", layer, on)[-1] == "gate_bwd"
    assert not {"gate", "gate_bwd"} & set(family_kernels("chunk_train", layer, off))
    plain = lower(select_spec(False, True, -5.0, False, False), 64, 64, "float32", "chunk")
    assert not {"gate", "gate_bwd"} & set(family_kernels("chunk_train", plain, on))
    with pytest.raises(ConfigError, match="gate_launch"):
        render("gate", plain, on)
    with pytest.raises(ConfigError, match="gate_launch"):
        render("gate_bwd", layer, off)
    src = render("gate_bwd", layer, on).text
    assert "gate_launch=True" in src and "dA_part" in src and "dbias_part" in src
    # the field is read only by the gate's own sources: the chunk launches' sources do not change
    for kind in ("chunk_intra", "chunk_state"):
        assert render(kind, layer, on).text == render(kind, layer, off).text


def test_half_precision_layer_calls_launch_their_gate_by_default(monkeypatch):
    """Issue 17 (docs/decisions/0010-gate-launched-apart.md): the heuristic's training forward launches a half-precision
    layer call's per-channel in-kernel gate apart (both gates); fp32 plans and plans whose gate is given
    keep gate_launch off (so their sources and cache keys are as before).  A default call with fp16 inputs
    goes through the gate launches."""
    from kdagen.cache.heuristics import default_train_config

    for dt in ("bfloat16", "float16"):
        for bound in (-5.0, None):
            plan = _plan(bound, 128, dt)
            cfg = default_train_config(plan)
            assert cfg.gate_launch and cfg.launches_gate(plan), (dt, bound)
            assert {"gate", "gate_bwd"} <= set(family_kernels("chunk_train", plan, cfg))
    assert not default_train_config(_plan(-5.0, 128, "float32")).gate_launch
    given = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk")
    assert not default_train_config(given).gate_launch

    calls = []
    real = C.layer_gate
    monkeypatch.setattr(C, "layer_gate", lambda *a: calls.append(a[0].dtype) or real(*a))
    gen = torch.Generator().manual_seed(2)
    B, T, HV, K = 1, 19, 1, 16
    x = dict(q=torch.randn(B, T, HV, K, generator=gen), k=torch.randn(B, T, HV, K, generator=gen),
             v=torch.randn(B, T, HV, K, generator=gen), g=torch.randn(B, T, HV, K, generator=gen))
    x = {n: t.to(F16).requires_grad_(True) for n, t in x.items()}
    beta = torch.rand(B, T, HV, generator=gen).to(F16).requires_grad_(True)
    A_log = (0.3 * torch.randn(HV, generator=gen)).requires_grad_(True)
    o, _ = kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], beta, A_log=A_log, use_gate_in_kernel=True,
                            lower_bound=-5.0)
    o.float().sum().backward()
    assert calls == [F16] and torch.isfinite(A_log.grad).all() and A_log.grad.abs().sum() > 0


def _gdn_gate_plan(dtype="float32"):
    from kdagen.ops.family import gdn_spec

    return lower(gdn_spec(True, True), 32, 32, dtype, "chunk", True)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_gated_deltanet_gate_on_one_channel_against_float64(dtype):
    """Gated DeltaNet's in-kernel gate (FLA's g = -exp(A_log) softplus(z + dt_bias), one per token and value
    head) in the gate's own launches on one channel ([..., HV, 1]): g, dz, dA_log and ddt_bias (one per head)
    against float64 autograd, with saturated z and a partial program."""
    HV, T = 3, 2 * ROWS_PER_PROGRAM + 7
    gen = torch.Generator().manual_seed(4)
    z0 = (4 * torch.randn(2, T, HV, 1, generator=gen)).to(dtype)
    z0[0, :3, 0, 0] = torch.tensor([-40.0, 40.0, 0.0])
    A0, b0 = 0.5 * torch.randn(HV, generator=gen), 0.5 * torch.randn(HV, generator=gen)
    dg = torch.randn(2, T, HV, 1, generator=gen)
    plan = _gdn_gate_plan("float32" if dtype == F32 else "float16")
    assert plan.decay == "scalar" and ChunkTrainConfig.gate_launchable(plan)
    _, z, _, _ = _gate_against_float64(
        plan, z0, A0, b0, dg, lambda rz, rA, rb: -rA.exp()[:, None] * torch.nn.functional.softplus(rz + rb[:, None]))
    assert z.grad.dtype == dtype


@pytest.mark.parametrize("dtype", [F32, F16])
def test_gated_deltanet_layer_call_runs_the_plain_member_on_the_launched_gate(monkeypatch, dtype):
    """A Gated DeltaNet training call with FLA's in-kernel gate launches the gate apart (the heuristic in half
    precision; asked for in fp32) and runs the member with g given on its own heuristic configs (the folded
    backward), fed a float32 g [B, T, HV]; output and every gradient (z, A_log, dt_bias included) against
    float64 autograd through the recurrence, GVA and a T that leaves partial chunks; the layer plan's launches
    (gate_launch off) agree."""
    import torch.nn.functional as F

    from kdagen.cache.heuristics import default_train_config
    from kdagen.spec.reference import naive_recurrent_gdn

    seen = []
    apply = C.ChunkFunction.apply

    def spy(*args):
        seen.append((args[3], args[-1]))
        return apply(*args)

    monkeypatch.setattr(C.ChunkFunction, "apply", spy)
    gen = torch.Generator().manual_seed(6)
    B, T, H, HV, K, V = 1, 45, 1, 2, 32, 16
    x0 = dict(q=torch.randn(B, T, H, K, generator=gen), k=F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
              v=torch.randn(B, T, HV, V, generator=gen), z=torch.randn(B, T, HV, generator=gen),
              beta=torch.rand(B, T, HV, generator=gen), A_log=0.5 * torch.randn(HV, generator=gen),
              dt_bias=torch.randn(HV, generator=gen), h0=torch.randn(B, HV, K, V, generator=gen))
    half = ("q", "k", "v", "beta")
    r = {n: t.to(F64).requires_grad_(True) for n, t in x0.items()}
    ro, rh = naive_recurrent_gdn(r["q"], r["k"], r["v"], -r["A_log"].exp() * F.softplus(r["z"] + r["dt_bias"]),
                                 r["beta"], initial_state=r["h0"], output_final_state=True)
    ref = torch.autograd.grad(ro.sum() + rh.sum(), list(r.values()))
    runs = {}
    for launched in (True, False):
        x = {n: (t.to(dtype) if n in half else t).clone().requires_grad_(True) for n, t in x0.items()}
        cfg = None if dtype == F16 and launched else plain_train(gate_launch=launched)
        o, ht = kdagen.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["z"], x["beta"], initial_state=x["h0"],
                                              output_final_state=True, use_gate_in_kernel=True, A_log=x["A_log"],
                                              dt_bias=x["dt_bias"], config=cfg)
        grads = torch.autograd.grad(o.float().sum() + ht.sum(), list(x.values()))
        runs[launched] = (o.float().detach(), grads)
        tol = 1e-5 if dtype == F32 else 5e-3
        rel = lambda a, b: ((a.detach().to(F64) - b.detach()).norm() / b.detach().norm()).item()  # noqa: E731
        assert rel(o, ro) <= tol and rel(ht, rh) <= tol, (launched, rel(o, ro), rel(ht, rh))
        for n, a, b in zip(x, grads, ref):
            assert a.shape == b.shape and rel(a, b) <= tol, (launched, n, rel(a, b))
    (g_on, run_on), (g_off, run_off) = seen
    call, cfg, bcfg, _ = run_on
    assert g_on.dtype == F32 and g_on.shape == (B, T, HV) and not call.plan.gate_in_kernel
    assert call.plan.decay == "scalar" and not cfg.gate_launch
    if dtype == F16:  # the heuristic's gate launch, and the plain member's own configs (its folded backward)
        assert default_train_config(run_off[0].plan).gate_launch and bcfg.folds_intra(call.plan)
        assert cfg.chunk_size == default_train_config(call.plan, call.shape).chunk_size
    assert run_off[0].plan.gate_in_kernel and not run_off[1].launches_gate(run_off[0].plan)
    for a, b in zip(runs[True][1], runs[False][1]):
        assert torch.allclose(a.float(), b.float(), rtol=1e-2 if dtype == F16 else 1e-4, atol=1e-3 if dtype == F16 else 1e-5)
