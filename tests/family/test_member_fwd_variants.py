"""A member's inference forward under ChunkFwdConfig variants of its heuristic default, in Triton's
interpreter: 32- or 64-row chunks, 16- or 32-wide state tiles give the default's answer to fp32
rounding, through the op and launch by launch (the solve, then the state pass)."""
from __future__ import annotations

import pytest
import torch

from cases import inputs

import kdagen
from kdagen import load_spec
from kdagen.cache.heuristics import default_chunk_config
from kdagen.ops.family import gdn_spec
from kdagen.ops.member import _prepare_chunk, chunk_member_launches

VARIANTS = {"default": {}, "c32": dict(chunk_size=32), "bv16": dict(state_block_v=16)}


# FLA's recipe in fp32 (tests/cases.py; B=1, T=70, H=HV=2, K=V=32): l2-normalised k (raw for gdn_layer: the
# kernels normalise it), beta = sigmoid, g = logsigmoid, an initial state of 0.1 N(0, 1); gdn_layer takes the raw
# gate and Mamba-style A_log, dt_bias (FLA's in-kernel gate)
DRAWS = {"gdn": dict(beta="sigmoid", decays=None, state_scale=0.1),
         "gdn_layer": dict(key="raw", beta="sigmoid", gate="raw", params="mamba", state_scale=0.1)}


def _call_args(member, x):
    """(spec, q, k, v, g, beta, keywords) of kdagen's member launches."""
    kw = dict(initial_state=x.h0)
    if member == "gdn_layer":
        kw.update(use_gate_in_kernel=True, A_log=x.A_log, dt_bias=x.dt_bias, use_qk_l2norm_in_kernel=True)
        return gdn_spec(True, True), x.q, x.k, x.v, x.g, x.beta, kw
    return load_spec(member), x.q, x.k, x.v, x.g, x.beta, kw


@pytest.mark.parametrize("member", ["gdn", "gdn_layer"])
def test_variants_run_each_launch_and_agree_with_the_default(member):
    x = inputs("gdn", 1, 70, 2, 2, 32, 32, **DRAWS[member])
    spec, q, k, v, g, beta, kw = _call_args(member, x)
    call, _, _ = _prepare_chunk(spec, q, k, v, g, beta, training=False, **kw)
    base = default_chunk_config(call.plan, call.shape)
    op_kw = {n: t for n, t in x.tensors("A_log", "dt_bias").items() if t is not None}
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
            o, s = kdagen.chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta,
                                                 initial_state=x.h0, output_final_state=True,
                                                 config=cfg, **op_kw)
        if ref is None:
            ref = (o.clone(), s.clone())
        # 32- or 64-row chunks, 16- or 32-wide tiles: the same answer
        assert (o - ref[0]).abs().max() < 1e-5 and (s - ref[1]).abs().max() < 1e-5, name
    assert base.replace(**VARIANTS["c32"]).chunk_size == 32 and base.replace(**VARIANTS["bv16"]).state_block_v == 16
