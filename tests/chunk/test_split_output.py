"""The training forward's output out of its state pass (``ChunkTrainConfig.split_output``): the
pass writes the per-chunk states and V' only (chunk_state with WRITE_O=False) and a chunk-parallel
launch, chunk_out, forms O = qg S_c + A_qk V' (general DPLR: + A_qv V) from them.  In the CPU
interpreter:

- every member (KDA, GDN, DeltaNet, GLA, general DPLR), fp32 and fp16, at the edges the new launch
  touches: a last chunk shorter than C, K not a multiple of the output launch's K tile, packed
  sequences with empty and one-token ones, GVA: the per-chunk states, V', the final state and every
  gradient equal the fused pass's bit for bit (the same pass computes them; the backward does not read
  O), and O equals the fused pass's to the dtype's rounding (only its summation order differs);
- O and the gradients of the ops with the split against the float64 recurrence;
- the generated source: the output launch is built only for a config that splits, the state pass
  keeps its output products behind WRITE_O, and calls that keep no states (inference) run the fused pass.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cases import make_inputs
from conftest import kda_training_launches as _kda, F64, assert_close
from plain_configs import plain_bwd, plain_train

import kdagen
import kdagen.spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import family_kernels, render
from kdagen.config import ChunkTrainConfig, ConfigError
from kdagen.ops.dplr import chunk_dplr_bwd_launches, chunk_dplr_launches
from kdagen.ops.member import chunk_member_launches
from kdagen.spec.reference import naive_recurrent_gdn, naive_recurrent_kda

F32, F16 = torch.float32, torch.float16
O_TOL = {F32: 1e-6, F16: 2e-3}  # the split's O against the fused pass's (summation order only)
SPLIT = dict(split_output=True, out_block_v=16, out_block_k=16)


def _member(member, dtype, K, V, config, bwd_config, T=45):
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, T, 1, K, generator=gen).to(dtype)
    k = F.normalize(torch.randn(1, T, 1, K, generator=gen), dim=-1).to(dtype)
    v = torch.randn(1, T, 2, V, generator=gen).to(dtype)
    do = torch.randn(1, T, 2, V, generator=gen).to(dtype)
    h0 = torch.randn(1, 2, K, V, generator=gen)
    if member == "gla":  # a per-channel gate, no rank-1 part
        g = F.logsigmoid(torch.randn(1, T, 2, K, generator=gen) + 2.0).to(dtype)
        return chunk_member_launches(S.gla(), q, k, v, g, None, training=True, output_final_state=True,
                                     initial_state=h0, config=config, bwd_config=bwd_config, do=do)
    beta = torch.rand(1, T, 2, generator=gen).to(dtype)
    g = F.logsigmoid(torch.randn(1, T, 2, generator=gen) + 1.0).to(dtype) if member == "gdn" else None
    spec = S.gdn() if member == "gdn" else S.deltanet()
    return chunk_member_launches(spec, q, k, v, g, beta, training=True, output_final_state=True, initial_state=h0,
                                 config=config, bwd_config=bwd_config, do=do)


def _dplr(dtype, K, V, config, bwd_config, T=37):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, T, 1, K, generator=gen).to(dtype)
    k = (torch.randn(1, T, 1, K, generator=gen) * K ** -0.5).to(dtype)
    v = torch.randn(1, T, 2, V, generator=gen).to(dtype)
    a = F.normalize(torch.randn(1, T, 2, K, generator=gen), dim=-1)
    b = (-torch.rand(1, T, 2, 1, generator=gen) * a).to(dtype)
    gk = F.logsigmoid(torch.randn(1, T, 2, K, generator=gen) + 2.0)
    do = torch.randn(1, T, 2, V, generator=gen).to(dtype)
    return chunk_dplr_bwd_launches(q, k, v, a.to(dtype), b, gk, initial_state=torch.randn(1, 2, K, V, generator=gen),
                                   output_final_state=True, config=config, bwd_config=bwd_config, do=do)


def _run(launches, split):
    fwd, bwd, out = launches
    kinds = [ln.kernel for ln in fwd]
    assert kinds == (["chunk_intra", "chunk_state", "chunk_out"] if split else ["chunk_intra", "chunk_state"])
    assert fwd[1].constexprs["WRITE_O"] is (not split)
    for ln in list(fwd) + list(bwd):
        ln()
    state = fwd[1].args
    res = {n: state[n] for n in ("o", "ht", "hs", "vn") if isinstance(state.get(n), torch.Tensor)}
    res.update({n: t for n, t in out.items() if isinstance(t, torch.Tensor)})
    return res


CASES = [
    # (id, builder(config, bwd_config), dtype)
    ("kda-fp32-K64-T45", lambda c, b: _kda(F32, 64, 32, c, b), F32),
    ("kda-fp32-K40-masked", lambda c, b: _kda(F32, 40, 24, c, b, T=33), F32),
    ("kda-fp16-varlen-empty-and-one", lambda c, b: _kda(F16, 32, 40, c, b, T=53, cu=[0, 0, 1, 20, 20, 53]), F16),
    ("kda-fp32-T1", lambda c, b: _kda(F32, 32, 32, c, b, T=1, HV=1), F32),
    ("gdn-scalar-decay-fp32", lambda c, b: _member("gdn", F32, 32, 48, c, b), F32),
    ("deltanet-no-decay-fp16", lambda c, b: _member("deltanet", F16, 48, 32, c, b, T=64), F16),
    ("gla-no-rank1-fp32", lambda c, b: _member("gla", F32, 32, 32, c, b, T=39), F32),
    ("dplr-fp32-K48", lambda c, b: _dplr(F32, 48, 32, c, b), F32),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_split_equals_the_fused_pass(case):
    _, build, dt = case
    base_t, base_b = plain_train(state_block_v=16), plain_bwd(state_block_v=16)
    fused = _run(build(base_t, base_b), split=False)
    split = _run(build(base_t.replace(**SPLIT), base_b), split=True)
    assert set(fused) == set(split) and {"o", "hs", "vn", "ht", "dq", "dk", "dv"} <= set(fused)
    for n in fused:
        assert torch.isfinite(fused[n].float()).all(), n
        if n == "o":
            assert_close(split[n], fused[n].float(), O_TOL[dt], "O of the split against the fused pass")
        else:
            assert torch.equal(fused[n], split[n]), f"{n}: max diff {(fused[n].float() - split[n].float()).abs().max()}"


def test_kda_op_with_the_split_against_float64():
    """chunk_kda, training, with the split: O, the final state and every gradient against float64
    autograd through the token-by-token recurrence (packed sequences, GVA, K not a tile multiple)."""
    x = make_inputs(1, 41, 1, 2, 40, 24, dtype=F32, seed=11, cu_seqlens=[0, 1, 1, 30, 41])
    names = ("q", "k", "v", "g", "beta", "h0")
    leaves = {n: getattr(x, n).clone().requires_grad_() for n in names}
    cfg = plain_train(state_block_v=16, **SPLIT)
    o, ht = kdagen.chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                             initial_state=leaves["h0"], output_final_state=True, cu_seqlens=x.cu_seqlens,
                             safe_gate=True, lower_bound=-5.0, config=cfg)
    r = {n: getattr(x, n).to(F64).requires_grad_() for n in names}
    ro, rh = naive_recurrent_kda(r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["h0"],
                                 output_final_state=True, cu_seqlens=x.cu_seqlens)
    assert_close(o, ro, 1e-5, "o")
    assert_close(ht, rh, 1e-5, "final state")
    gen = torch.Generator().manual_seed(2)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    got = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), [leaves[n] for n in names])
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [r[n] for n in names])
    for n, a, b in zip(names, got, ref):
        assert_close(a, b, 1e-5, f"d{n}")


def test_gdn_op_with_the_split_fp16_against_float64():
    """chunk_gated_delta_rule, training in fp16, with the split: O, the final state and the gradients of
    q, k, v and beta against float64 autograd."""
    gen = torch.Generator().manual_seed(6)
    T, K, V = 50, 32, 32
    x = dict(q=torch.randn(1, T, 2, K, generator=gen), k=F.normalize(torch.randn(1, T, 2, K, generator=gen), dim=-1),
             v=torch.randn(1, T, 2, V, generator=gen), beta=torch.rand(1, T, 2, generator=gen))
    g = F.logsigmoid(torch.randn(1, T, 2, generator=gen) + 1.0)
    h0 = torch.randn(1, 2, K, V, generator=gen)
    leaves = {n: t.half().requires_grad_() for n, t in x.items()}
    o, ht = kdagen.chunk_gated_delta_rule(leaves["q"], leaves["k"], leaves["v"], g, leaves["beta"], initial_state=h0,
                                          output_final_state=True, config=plain_train(state_block_v=16, **SPLIT))
    r = {n: t.half().to(F64).requires_grad_() for n, t in x.items()}
    ro, rh = naive_recurrent_gdn(r["q"], r["k"], r["v"], g.to(F64), r["beta"], initial_state=h0.to(F64),
                                 output_final_state=True)
    assert o.dtype == F16
    assert_close(o, ro, 5e-3, "o")
    assert_close(ht, rh, 5e-3, "final state")
    do = torch.randn(o.shape, generator=gen)
    got = torch.autograd.grad((o.float() * do).sum() + ht.sum(), list(leaves.values()))
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + rh.sum(), list(r.values()))
    for n, a, b in zip(leaves, got, ref):
        assert_close(a, b, 5e-3, f"d{n}")


def test_sources_and_the_calls_that_take_it():
    plan = lower(S.kda(), 64, 64, "bfloat16", "chunk")
    off, on = plain_train(), plain_train(split_output=True)
    assert family_kernels("chunk_train", plan, off) == ("chunk_intra", "chunk_state", "qk_l2norm")
    assert family_kernels("chunk_train", plan, on)[-1] == "chunk_out"
    text = render("chunk_out", plan, on).text
    assert "out_block_k=64" in text and "tl.dot(b_qg" in text and "aqv" not in text
    assert "aqv" in render("chunk_out", lower(S.dplr(S.gate_direct(None)), 64, 64, "bfloat16", "chunk"), on).text
    state = render("chunk_state", plan, off).text
    assert "if WRITE_O:" in state and "tl.store(o +" in state
    # an inference call keeps no per-chunk states (general DPLR's runs the training kernels): the fused
    # pass, whatever the config says, and its O equals the training call's with the split
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 20, 1, 32, generator=gen) for _ in range(3))
    a = F.normalize(torch.randn(1, 20, 1, 32, generator=gen), dim=-1)
    b, gk = -0.5 * a, F.logsigmoid(torch.randn(1, 20, 1, 32, generator=gen) + 2.0)
    launches, (o_inf, _, _) = chunk_dplr_launches(q, k, v, a, b, gk, config=plain_train(**SPLIT))
    assert [ln.kernel for ln in launches] == ["chunk_intra", "chunk_state"] and launches[1].constexprs["WRITE_O"]
    for ln in launches:
        ln()
    launches, (o_train, _, _) = chunk_dplr_launches(q, k, v, a, b, gk, training=True,
                                                                    config=plain_train(**SPLIT))
    assert [ln.kernel for ln in launches] == ["chunk_intra", "chunk_state", "chunk_out"]
    for ln in launches:
        ln()
    assert_close(o_train, o_inf, 1e-6, "O of the split against the inference call's fused pass")
    with pytest.raises(ConfigError, match="out_block_v"):
        ChunkTrainConfig(out_block_v=48)
    with pytest.raises(ConfigError, match="split_output must be a bool"):
        ChunkTrainConfig(split_output=1)
