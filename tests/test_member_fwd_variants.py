"""A member's inference forward under ChunkFwdConfig variants of its heuristic default, in Triton's
interpreter: 32- or 64-row chunks, 16- or 32-wide state tiles give the default's answer to fp32
rounding, through the op and launch by launch (the solve, then the state pass)."""
from __future__ import annotations

import math

import pytest
import torch

import kdagen
from kdagen import load_spec
from kdagen.cache.heuristics import default_chunk_config
from kdagen.ops.family import gdn_spec
from kdagen.ops.member import _prepare_chunk, chunk_member_launches

VARIANTS = {"default": {}, "c32": dict(chunk_size=32), "bv16": dict(state_block_v=16)}


def _inputs(member, B=1, T=70, H=2, K=32, V=32, seed=0):
    """FLA's recipe in fp32: l2-normalised k (raw for gdn_layer: the kernels normalise it), beta = sigmoid,
    g = logsigmoid; gdn_layer takes the raw gate and Mamba-style A_log, dt_bias (FLA's in-kernel gate)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    if member != "gdn_layer":
        k = torch.nn.functional.normalize(k, dim=-1)
    x = dict(q=q, k=k, v=torch.randn(B, T, H, V, generator=gen), beta=torch.sigmoid(torch.randn(B, T, H, generator=gen)))
    if member == "gdn":
        x["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen) + 2.0)
    else:
        x["g"] = torch.randn(B, T, H, generator=gen)
        x["A_log"] = torch.log(1.0 + 15.0 * torch.rand(H, generator=gen))
        dt = torch.exp(torch.rand(H, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        x["dt_bias"] = dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) = dt
    x["initial_state"] = 0.1 * torch.randn(B, H, K, V, generator=gen)
    return x


def _call_args(member, x):
    """(spec, q, k, v, g, beta, keywords) of kdagen's member launches."""
    kw = dict(initial_state=x["initial_state"])
    if member == "gdn_layer":
        kw.update(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"], use_qk_l2norm_in_kernel=True)
        return gdn_spec(True, True), x["q"], x["k"], x["v"], x["g"], x["beta"], kw
    return load_spec(member), x["q"], x["k"], x["v"], x["g"], x["beta"], kw


@pytest.mark.parametrize("member", ["gdn", "gdn_layer"])
def test_variants_run_each_launch_and_agree_with_the_default(member):
    x = _inputs(member)
    spec, q, k, v, g, beta, kw = _call_args(member, x)
    call, _, _ = _prepare_chunk(spec, q, k, v, g, beta, training=False, **kw)
    base = default_chunk_config(call.plan, call.shape)
    op_kw = {n: x[n] for n in ("A_log", "dt_bias") if n in x}
    if member == "gdn_layer":
        op_kw.update(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True)
    ref = None
    for name, fields in VARIANTS.items():
        cfg = base.replace(**fields)
        with torch.no_grad():
            launches, _ = chunk_member_launches(spec, q, k, v, g, beta, config=cfg, output_final_state=True, **kw)
            assert {ln.kernel for ln in launches} == {"chunk_solve", "chunk_pass"}, name
            for ln in launches:
                ln()
            o, s = kdagen.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                                 initial_state=x["initial_state"], output_final_state=True,
                                                 config=cfg, **op_kw)
        if ref is None:
            ref = (o.clone(), s.clone())
        # 32- or 64-row chunks, 16- or 32-wide tiles: the same answer
        assert (o - ref[0]).abs().max() < 1e-5 and (s - ref[1]).abs().max() < 1e-5, name
    assert base.replace(**VARIANTS["c32"]).chunk_size == 32 and base.replace(**VARIANTS["bv16"]).state_block_v == 16
