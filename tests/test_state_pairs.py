"""The training state pass in pairs of chunks (``ChunkTrainConfig.state_pairs``, DeltaNet: no decay, a
rank-1 part): one step per two chunks, chunk b's W and U composed onto the state entering the pair
(templates/chunk_state.py.j2).  In the interpreter (fp32, fp16):

* what the pass writes -- V' per row, the state entering every chunk, the final state, and the output
  where the pass forms it (WRITE_O) -- equals the per-chunk pass's to float rounding, on odd chunk counts
  (a pair whose second chunk is past the end), varlen with length-0/1 sequences, K over masked rows;
* DeltaNet's outputs and gradients through it match float64 autograd through the token-by-token
  recurrence;
* only no-decay plans with a rank-1 part read the field.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from conftest import F64, assert_close

import kdagen.spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import family_kernels, render
from kdagen.config import ChunkTrainConfig, ConfigError
from kdagen.ops.member import chunk_member, chunk_member_launches
from kdagen.spec.reference import naive_recurrent_deltanet

F32, F16 = torch.float32, torch.float16


def _inputs(dtype, T, HV, K, V, N, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, 1, K, generator=gen).to(dtype)
    k = F.normalize(torch.randn(1, T, 1, K, generator=gen), dim=-1).to(dtype)
    v = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    beta = torch.rand(1, T, HV, generator=gen).to(dtype)
    h0 = torch.randn(N, HV, K, V, generator=gen)
    return q, k, v, beta, h0


def _forward(dtype, T, K, V, cu, config):
    HV = 2
    q, k, v, beta, h0 = _inputs(dtype, T, HV, K, V, len(cu) - 1 if cu else 1, seed=21)
    fwd, _, _ = chunk_member_launches(S.deltanet(), q, k, v, None, beta, training=True, output_final_state=True,
                                      initial_state=h0, cu_seqlens=torch.tensor(cu) if cu else None, config=config)
    for ln in fwd:
        ln()
    st = fwd[1]
    assert st.kernel == "chunk_state"
    return st, {n: st.args[n].clone() for n in ("vn", "hs", "ht")}, fwd[-1].args["o"].clone()


CASES = [
    # (id, dtype, T, K, V, cu_seqlens, split_output)
    ("fp32-odd-chunk-count", F32, 70, 32, 32, None, True),
    ("fp32-even-fused-output", F32, 128, 32, 32, None, False),
    ("fp16-varlen-len0-len1", F16, 101, 32, 32, [0, 0, 1, 70, 101], True),
    ("fp32-K40-masked-fused-output-varlen", F32, 101, 40, 24, [0, 0, 1, 70, 101], False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_state_pass_in_pairs_matches_it_per_chunk(case):
    _, dtype, T, K, V, cu, split = case
    base = ChunkTrainConfig(state_block_v=16, split_output=split)
    st0, per_chunk, o0 = _forward(dtype, T, K, V, cu, base)
    st1, paired, o1 = _forward(dtype, T, K, V, cu, base.replace(state_pairs=True))
    assert "i_p in range" in inspect.getsource(st1.fn.fn) and "i_p in range" not in inspect.getsource(st0.fn.fn)
    assert st1.constexprs["WRITE_O"] == (not split)
    tol = 2e-6 if dtype == F32 else 2e-3
    for n, want in list(per_chunk.items()) + [("o", o0)]:
        got = paired[n] if n != "o" else o1
        a, b = got.float(), want.float()
        assert torch.isfinite(a).all() and b.abs().max() > 1e-2, n
        assert (a - b).abs().max() <= tol * b.abs().max(), f"{n}: max difference {(a - b).abs().max()}"


@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_deltanet_through_paired_state_pass_matches_the_recurrence(dtype):
    """Output, final state and every gradient against float64: varlen (sequences of 0, 1, 69 and 31 tokens:
    a pair and a chunk alone, then one alone), GVA, an initial state."""
    T, HV, K, V = 101, 2, 32, 24
    cu = [0, 0, 1, 70, 101]
    q, k, v, beta, h0 = _inputs(dtype, T, HV, K, V, len(cu) - 1, seed=22)
    gen = torch.Generator().manual_seed(23)
    do = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    dht = torch.randn(h0.shape, generator=gen)
    names = ("q", "k", "v", "beta", "h0")
    xs = {n: x.clone().requires_grad_() for n, x in zip(names, (q, k, v, beta, h0))}
    cfg = ChunkTrainConfig(state_block_v=16, split_output=True, state_pairs=True)
    o, ht = chunk_member(S.deltanet(), xs["q"], xs["k"], xs["v"], None, xs["beta"], initial_state=xs["h0"],
                         output_final_state=True, cu_seqlens=torch.tensor(cu), config=cfg)
    mine = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), [xs[n] for n in names])
    x64 = {n: x.to(F64).requires_grad_() for n, x in zip(names, (q, k, v, beta, h0))}
    ro, rh = naive_recurrent_deltanet(x64["q"], x64["k"], x64["v"], x64["beta"], initial_state=x64["h0"],
                                      output_final_state=True, cu_seqlens=torch.tensor(cu))
    ref = torch.autograd.grad((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum(), [x64[n] for n in names])
    tol = {F32: 1e-5, F16: 5e-3}[dtype]
    assert_close(o.float(), ro, tol, "o")
    assert_close(ht.float(), rh, tol, "final state")
    for n, a, b in zip(names, mine, ref):
        assert_close(a.float(), b, tol, f"d{n}")


def test_state_pairs_is_read_by_no_decay_rank1_plans_only():
    dn = lower(S.deltanet(), 64, 64, "bfloat16", "chunk")
    cfg = ChunkTrainConfig(state_pairs=True)
    assert cfg.pairs_state(dn) and not ChunkTrainConfig().pairs_state(dn)
    assert "state_pairs=True" in render("chunk_state", dn, cfg).text
    for name in ("kda", "gdn", "gla", "dplr"):
        spec = S.get_spec("kda", lower_bound=-5.0) if name == "kda" else S.get_spec(name)
        plan = lower(spec, 64, 64, "bfloat16", "chunk")
        assert not cfg.pairs_state(plan), name
        for kernel in family_kernels("chunk_train", plan, cfg):
            assert "state_pairs" not in render(kernel, plan, cfg).text, (name, kernel)
    with pytest.raises(ConfigError, match="state_pairs"):
        ChunkTrainConfig(state_pairs="yes")
