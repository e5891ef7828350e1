"""The backward's reverse state pass never runs 64-row chunks on 16-wide V tiles: on the H200 that
combination gave wrong dk, dv, dbeta and dh0 (docs/decisions/0028-reverse-pass-min-tile.md; exact in the
interpreter), so configs refuse it, the heuristic and the tuner widen the tile, and a head dim
too narrow for the wider tile is refused with a message that names the way out."""
import pytest
import torch

import kdagen
import kdagen.spec as S
from kdagen.cache.heuristics import default_chunk_bwd_config, default_config
from kdagen.codegen.lower import lower
from kdagen.config import ChunkBwdConfig, ChunkTrainConfig, ConfigError, min_state_block_v
from kdagen.ops.member import chunk_member_launches
from kdagen.spec.reference import naive_recurrent_deltanet

from conftest import TOL, assert_close
from plain_configs import plain_bwd, plain_train


def test_min_tile_is_half_the_chunk():
    assert [min_state_block_v(c) for c in (16, 32, 64, 128)] == [16, 16, 32, 64]


def test_config_refuses_the_narrow_tile_on_long_chunks():
    ChunkBwdConfig(chunk_size=32, sub_chunk=16, state_block_v=16)  # measured right on the GPU: allowed
    ChunkBwdConfig(chunk_size=64, sub_chunk=32, state_block_v=32)
    with pytest.raises(ConfigError, match="state_block_v must be >= chunk_size / 2 = 32"):
        ChunkBwdConfig(chunk_size=64, sub_chunk=32, state_block_v=16)
    with pytest.raises(ConfigError, match="state_block_v"):
        ChunkBwdConfig(state_block_v=16).replace(chunk_size=64, sub_chunk=16)


def test_with_chunking_widens_only_what_is_too_narrow():
    narrow = ChunkBwdConfig(state_block_v=16, state_num_stages=3)
    c64 = narrow.with_chunking(64, 32)
    assert (c64.chunk_size, c64.sub_chunk, c64.state_block_v, c64.state_num_stages) == (64, 32, 32, 3)
    assert narrow.with_chunking(32, 16) == narrow
    wide = ChunkBwdConfig(state_block_v=64)
    assert wide.with_chunking(64, 32).state_block_v == 64


def test_heuristic_few_program_tile_on_short_and_long_chunks():
    """Few state programs (2 x 16 value heads): the 32-wide tile four stages deep on 32-row chunks
    (docs/decisions/0018-reverse-state-pass.md; 16-wide before its A_qk tile was loaded ahead), 32-wide (the
    least there) three deep on 64-row ones -- four stages of 64-row tiles exceed shared memory -- whether the
    heuristic is asked for 64-row chunks or its 32-row config is moved onto them (with_chunking, as a training
    call at chunk_size=64 does)."""
    plan = lower(S.get_spec("kda", lower_bound=-5.0), 128, 128, "bfloat16", "chunk")
    few = {"N": 2, "HV": 16}
    c32 = default_chunk_bwd_config(plan, few)
    assert (c32.state_block_v, c32.state_num_stages) == (32, 4)
    c64 = default_config("chunk_bwd", plan, few, ChunkTrainConfig(chunk_size=64, sub_chunk=32))
    assert (c64.chunk_size, c64.state_block_v, c64.state_num_stages) == (64, 32, 3)
    moved = c32.with_chunking(64, 32)
    assert (moved.chunk_size, moved.state_block_v, moved.state_num_stages) == (64, 32, 3)
    assert c32.with_chunking(32, 16) == c32  # the same chunks: unchanged
    assert ChunkBwdConfig(chunk_size=64, sub_chunk=32, state_num_stages=4).with_chunking(64, 32).state_num_stages == 4


def test_training_at_64_row_chunks_runs_the_wide_tile():
    """A training call at chunk_size=64 whose heuristic tile would be 16 wide (few programs) runs the
    reverse pass on 32, and the op's gradients at chunk_size=64 match float64 (the interpreter, fp32)."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 70, 2, 32, generator=gen), torch.nn.functional.normalize(torch.randn(1, 70, 2, 32, generator=gen), dim=-1)
    v, beta = torch.randn(1, 70, 2, 32, generator=gen), torch.rand(1, 70, 2, generator=gen)
    h0 = torch.randn(1, 2, 32, 32, generator=gen)
    spec = kdagen.load_spec("deltanet")
    _, bwd, _ = chunk_member_launches(spec, q, k, v, None, beta, training=True, config=plain_train(chunk_size=64, sub_chunk=32),
                                      bwd_config=plain_bwd(state_block_v=16).with_chunking(64, 32),
                                      initial_state=h0, output_final_state=True)
    state = [ln for ln in bwd if ln.kernel == "chunk_bwd_state"][0]
    assert (state.constexprs["BT"], state.constexprs["BV"]) == (64, 32)
    # the op itself at chunk_size=64 (heuristic configs: 2 heads, few programs), against float64 autograd
    xs = dict(q=q, k=k, v=v, beta=beta, h0=h0)
    do, dht = torch.randn(1, 70, 2, 32, generator=gen), torch.randn(1, 2, 32, 32, generator=gen)
    x64 = {n: t.double().requires_grad_() for n, t in xs.items()}
    ro, rh = naive_recurrent_deltanet(x64["q"], x64["k"], x64["v"], x64["beta"], initial_state=x64["h0"],
                                      output_final_state=True)
    ref = torch.autograd.grad((ro * do.double()).sum() + (rh * dht.double()).sum(), list(x64.values()))
    xl = {n: t.clone().requires_grad_() for n, t in xs.items()}
    o, ht = kdagen.chunk_delta_rule(xl["q"], xl["k"], xl["v"], xl["beta"], initial_state=xl["h0"],
                                    output_final_state=True, chunk_size=64)
    got = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), list(xl.values()))
    for n, a, b in zip(xs, got, ref):
        assert_close(a, b, TOL[torch.float32], f"d{n} at chunk_size=64")


def test_a_head_dim_too_narrow_for_long_chunks_is_refused():
    """V=16 allows no 32-wide tile: training at chunk_size=64 says so and names chunk_size=32."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 40, 1, 16, generator=gen), torch.randn(1, 40, 1, 16, generator=gen)
    v, beta = torch.randn(1, 40, 1, 16, generator=gen), torch.rand(1, 40, 1, generator=gen)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    with pytest.raises(ValueError, match=r"chunk_size=32"):
        o, _ = kdagen.chunk_delta_rule(*leaves, beta, chunk_size=64)
        o.sum().backward()
