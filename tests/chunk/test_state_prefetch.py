"""The state passes' prefetch (``ChunkTrainConfig.state_prefetch``: U of the next chunk loaded one
iteration ahead in the training forward's state pass, which loads G_n ahead either way;
``ChunkBwdConfig.state_prefetch``:
G_n of the chunk before in the reverse pass), in the CPU interpreter.

The prefetch only moves loads earlier, so every output of a training step -- o, the final state,
the per-chunk states, V', and every gradient -- must equal the plain pass's bit for bit, at the
edges the prefetch touches: the first and the last chunk of a sequence, a last chunk shorter
than C, empty and one-token sequences of a packed batch, K masked in the state tile, and the
decay kinds (per channel, scalar, none).  The gradients of the plain pass against float64 are
tests/chunk/test_ops_chunk_bwd.py's.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from conftest import kda_training_launches as _kda
from plain_configs import plain_bwd, plain_train

import kdagen.spec as S
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.config import ChunkBwdConfig, ChunkTrainConfig, ConfigError
from kdagen.ops.member import chunk_member_launches

F32, F16 = torch.float32, torch.float16
FWD_NAMES = ("o", "ht", "hs", "vn")


def _member(member, dtype, K, V, config, bwd_config, T=45):
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, T, 1, K, generator=gen).to(dtype)
    k = F.normalize(torch.randn(1, T, 1, K, generator=gen), dim=-1).to(dtype)
    v = torch.randn(1, T, 2, V, generator=gen).to(dtype)
    beta = torch.rand(1, T, 2, generator=gen).to(dtype)
    g = F.logsigmoid(torch.randn(1, T, 2, generator=gen) + 1.0).to(dtype) if member == "gdn" else None
    spec = S.gdn() if member == "gdn" else S.deltanet()
    do = torch.randn(1, T, 2, V, generator=gen).to(dtype)
    return chunk_member_launches(spec, q, k, v, g, beta, training=True, output_final_state=True,
                                 initial_state=torch.randn(1, 2, K, V, generator=gen), config=config,
                                 bwd_config=bwd_config, do=do)


def _text(launch) -> str:
    return open(inspect.getsourcefile(launch.fn.fn)).read()


def _run(launches, prefetch=None):
    fwd, bwd, out = launches
    if prefetch is not None:  # the launches rendered what the configs ask
        state = next(ln for ln in bwd if ln.kernel == "chunk_bwd_state")
        assert ("b_u_next" in _text(fwd[1])) == prefetch
        assert ("b_gn_next" in _text(state)) == (prefetch and "deltanet" not in state.fn.fn.__name__)
    for ln in list(fwd) + list(bwd):
        ln()
    state = fwd[1].args
    res = {n: state[n] for n in FWD_NAMES if isinstance(state.get(n), torch.Tensor) and state[n].numel() > 1}
    res.update({n: t for n, t in out.items() if isinstance(t, torch.Tensor)})
    return res


CASES = [
    # (id, builder(config, bwd_config))
    ("kda-fp32-K64", lambda c, b: _kda(F32, 64, 32, c, b)),
    ("kda-fp32-K40-masked", lambda c, b: _kda(F32, 40, 24, c, b, T=33)),
    ("kda-fp16-varlen-empty-and-one", lambda c, b: _kda(F16, 32, 40, c, b, T=53, cu=[0, 0, 1, 20, 20, 53])),
    ("gdn-scalar-decay-fp32", lambda c, b: _member("gdn", F32, 32, 32, c, b)),
    ("deltanet-no-decay-fp16", lambda c, b: _member("deltanet", F16, 32, 32, c, b, T=64)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_prefetch_equals_the_plain_pass(case):
    _, build = case
    base_t, base_b = plain_train(state_block_v=16), plain_bwd(state_block_v=16)
    plain = _run(build(base_t, base_b), prefetch=False)
    pre = _run(build(base_t.replace(state_prefetch=True), base_b.replace(state_prefetch=True)), prefetch=True)
    assert set(plain) == set(pre) and {"o", "hs", "dq", "dk", "dv"} <= set(plain)
    for n in plain:
        assert torch.isfinite(plain[n].float()).all(), n
        assert torch.equal(plain[n], pre[n]), f"{n}: max diff {(plain[n].float() - pre[n].float()).abs().max()}"


def _state_source(kernel, config):
    plan = lower(S.kda(), 64, 64, "bfloat16", "chunk")
    return render(kernel, plan, config).text


def test_prefetch_is_in_the_source_and_named_in_its_header():
    """The option changes the generated source (a loop-carried next-chunk tile) and the header line
    names it, so a cached kernel of one setting is never taken for the other."""
    # (the forward pass loads G_n a chunk ahead either way: the option is U's there)
    for kernel, cfg, tile in (("chunk_state", plain_train(), "b_u_next"),
                              ("chunk_bwd_state", plain_bwd(), "b_gn_next")):
        off = _state_source(kernel, cfg)
        on = _state_source(kernel, cfg.replace(state_prefetch=True))
        assert tile in on and tile not in off
        assert "state_prefetch=True" in on and "state_prefetch=False" in off
    assert "b_gn_next" in _state_source("chunk_state", plain_train())


def test_prefetch_must_be_a_bool():
    with pytest.raises(ConfigError, match="state_prefetch must be a bool"):
        ChunkTrainConfig(state_prefetch=1)
    with pytest.raises(ConfigError, match="state_prefetch must be a bool"):
        ChunkBwdConfig(state_prefetch="yes")

