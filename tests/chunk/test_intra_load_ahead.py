"""The training forward's intra launch with its loads issued ahead (``ChunkTrainConfig.intra_load_ahead``:
every row-block's q, k and g loads at the top of the K tile, held in their own dtype until used), in the
CPU interpreter.

The option only moves loads earlier, so every output of a training step -- o, the final state, the
per-chunk states, V', and every gradient (the backward re-runs the intra launch's products from what
the forward kept) -- must equal the default's bit for bit: KDA with a whole and a masked K tile, a
packed batch with empty and one-token sequences, a scalar decay (GDN) and none (DeltaNet), and more
than one K tile per program.
"""
from __future__ import annotations

import pytest
import torch

from test_state_prefetch import CASES, F32, _kda, _run, _state_source, _text

from plain_configs import plain_bwd, plain_train

from kdagen.config import ChunkTrainConfig, ConfigError

LA_CASES = CASES + [
    # two K tiles per program: the loads are issued at the top of each
    ("kda-fp32-two-k-tiles", lambda c, b: _kda(F32, 64, 32, c.replace(intra_block_k=32), b, T=40)),
]


@pytest.mark.parametrize("case", LA_CASES, ids=[c[0] for c in LA_CASES])
def test_load_ahead_equals_the_default(case):
    _, build = case
    base_t, base_b = plain_train(state_block_v=16), plain_bwd(state_block_v=16)
    plain_launches = build(base_t, base_b)
    assert "b_q_1" not in _text(plain_launches[0][0])
    plain = _run(plain_launches)
    ahead_launches = build(base_t.replace(intra_load_ahead=True), base_b)
    assert "b_q_1 = tl.load" in _text(ahead_launches[0][0])  # the second row-block's load, issued ahead
    ahead = _run(ahead_launches)
    assert set(plain) == set(ahead) and {"o", "hs", "dq", "dk", "dv"} <= set(plain)
    for n in plain:
        assert torch.isfinite(plain[n].float()).all(), n
        assert torch.equal(plain[n], ahead[n]), f"{n}: max diff {(plain[n].float() - ahead[n].float()).abs().max()}"


def test_load_ahead_is_named_in_the_header_and_checked():
    off = _state_source("chunk_intra", plain_train())
    on = _state_source("chunk_intra", plain_train(intra_load_ahead=True))
    assert "intra_load_ahead=True" in on and "intra_load_ahead=False" in off
    # issued ahead in the loaded dtype, widened where used
    assert "b_q, b_k, b_z = b_q_1.to(tl.float32)" in on
    with pytest.raises(ConfigError, match="intra_load_ahead must be a bool"):
        ChunkTrainConfig(intra_load_ahead=1)
