"""The state passes read only the causal part of the A_qk (and general DPLR's A_qv) tiles, in the CPU
interpreter.

Both passes load A's [C, C] tile of a chunk under its rows' mask only and apply the causal mask to
the loaded values (a mask that varies along the tile's contiguous axis would leave the load too
narrow for an asynchronous copy on the GPU; tests/sm90/test_pipelined_loads_sm90.py checks that part).
What they must not do is let the values above the diagonal in: the training forward's buffers are
zeroed there, but the backward's re-run of general DPLR's intra launch writes into ``torch.empty``
buffers.  Here the strictly upper part of every chunk's tile is overwritten with NaN after the
forward, and the fused forward state pass (which forms O from A_qk) and the reverse state pass are
run again: every output must equal the clean run's bit for bit.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import kda_training_launches as _kda
from plain_configs import plain_bwd, plain_train


from kdagen.ops.dplr import chunk_dplr_bwd_launches

F32 = torch.float32
C = 32
FUSED = plain_train(state_block_v=16, split_output=False)  # the pass that forms O itself
BWD = plain_bwd(state_block_v=16)


def _dplr(T=45):
    gen = torch.Generator().manual_seed(5)
    K, V = 32, 24
    q = torch.randn(1, T, 1, K, generator=gen)
    k = torch.randn(1, T, 1, K, generator=gen) * K ** -0.5
    v = torch.randn(1, T, 2, V, generator=gen)
    a = F.normalize(torch.randn(1, T, 2, K, generator=gen), dim=-1)
    b = -torch.rand(1, T, 2, 1, generator=gen) * a
    gk = F.logsigmoid(torch.randn(1, T, 2, K, generator=gen) + 2.0)
    do = torch.randn(1, T, 2, V, generator=gen)
    return chunk_dplr_bwd_launches(q, k, v, a, b, gk, initial_state=torch.randn(1, 2, K, V, generator=gen),
                                   output_final_state=True, config=FUSED, bwd_config=BWD, do=do)


def _poison_upper(a: torch.Tensor, bounds) -> int:
    """NaN above the diagonal of every chunk's [C, C] tile of ``a`` ([B, T, HV, C]); chunks start at each
    sequence's first token.  The count of entries written."""
    n = 0
    for bos, eos in bounds:
        for t0 in range(bos, eos, C):
            for i in range(min(C, eos - t0)):
                if i + 1 < C:
                    a[:, t0 + i, :, i + 1:] = float("nan")
                    n += a[:, t0 + i, :, i + 1:].numel()
    return n


def _outputs(ln, names):
    return {n: ln.args[n].clone() for n in names if isinstance(ln.args.get(n), torch.Tensor)}


CASES = [
    ("kda-T45", lambda: _kda(F32, 32, 24, FUSED, BWD, T=45), [(0, 45)], False),
    ("kda-varlen", lambda: _kda(F32, 32, 24, FUSED, BWD, T=53, cu=[0, 1, 20, 53]), [(0, 1), (1, 20), (20, 53)], False),
    ("dplr-T45", _dplr, [(0, 45)], True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_state_passes_ignore_what_lies_above_the_diagonal(case):
    _, build, bounds, dplr = case
    fwd, bwd, _ = build()
    for ln in list(fwd) + list(bwd):
        ln()
    state = fwd[1]
    rev = next(ln for ln in bwd if ln.kernel == "chunk_bwd_state")
    assert state.kernel == "chunk_state" and state.constexprs["WRITE_O"]
    names_fwd, names_rev = ("o", "ht", "hs", "vn"), ("du", "dhs", "dh0", "dv0")
    clean = _outputs(state, names_fwd), _outputs(rev, names_rev)
    assert "o" in clean[0] and {"du", "dhs"} <= set(clean[1]) and (("dv0" in clean[1]) == dplr)
    tiles = [rev.args["aqk"]] + ([rev.args["aqv"]] if dplr else [])
    tiles += [t for t in (state.args["aqk"], state.args.get("aqv")) if isinstance(t, torch.Tensor)]
    assert sum(_poison_upper(t, bounds) for t in {id(t): t for t in tiles}.values()) > 0
    for ln, names, ref in ((state, names_fwd, clean[0]), (rev, names_rev, clean[1])):
        for n in ref:  # the outputs start from garbage too: the pass must write every element again
            ln.args[n].fill_(float("nan"))
        ln()
        for n, want in ref.items():
            got = ln.args[n]
            assert torch.isfinite(got.float()).all(), f"{ln.kernel}: {n} took the NaN above the diagonal"
            assert torch.equal(got, want), f"{ln.kernel}: {n} differs by {(got - want).abs().max()}"
