"""Configs are kept clear of what Triton 3.6 miscompiles for sm_90 (kdagen.cache.miscompiles): the
heuristics' configs, a tuned winner and a config stepped down for shared memory alike; a config the
caller gives is run as given."""
from __future__ import annotations

import pytest
from kdagen.cache import heuristics as Hs
from kdagen.cache import lookup
from kdagen.cache.miscompiles import avoid_miscompiles, legal
from kdagen.codegen.lower import lower
from kdagen.ops.dplr import dplr_spec
from kdagen.ops.family import gdn_spec, gla_spec
from kdagen import spec as S

SPECS = {"kda": lambda: S.kda(S.gate_direct(None)), "gdn": lambda: gdn_spec(), "delta": lambda: S.deltanet(),
         "gla": lambda: gla_spec(None), "dplr": lambda: dplr_spec(None)}


@pytest.mark.parametrize("member", list(SPECS))
@pytest.mark.parametrize("K", [64, 100, 128])
def test_float32_backward_never_pipelines_dqkw(member, K):
    plan = lower(SPECS[member](), K, K, "float32", "chunk")
    b = Hs.default_config("chunk_bwd", plan, {"N": 2, "HV": 4})
    assert b.dqkw_num_stages == 1
    assert avoid_miscompiles("chunk_bwd", plan, b.replace(dqkw_num_stages=3)).dqkw_num_stages == 1


@pytest.mark.parametrize("member", ["kda", "gla"])
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_precision_backward_keeps_its_pipeline(member, dt):
    plan = lower(SPECS[member](), 128, 128, dt, "chunk")
    b = Hs.default_chunk_bwd_config(plan, {"N": 2, "HV": 4})
    assert b.dqkw_num_stages > 1
    assert avoid_miscompiles("chunk_bwd", plan, b) == b


@pytest.mark.parametrize("K,partial", [(40, True), (60, True), (100, True), (200, True), (24, False), (64, False),
                                       (96, False), (128, False)])
def test_dplr_loops_ending_on_a_partial_k_tile_are_not_pipelined(K, partial):
    plan = lower(dplr_spec(None), K, K, "float16", "chunk")
    t = Hs.default_train_config(plan).replace(intra_block_k=32, intra_num_stages=2)
    got = avoid_miscompiles("chunk_train", plan, t)
    assert got.intra_num_stages == (1 if partial else 2)
    b = Hs.default_chunk_bwd_config(plan).replace(intra_block_k=32, intra_num_stages=2)
    assert avoid_miscompiles("chunk_bwd", plan, b).intra_num_stages == (1 if partial else 2)


def test_other_members_keep_their_intra_pipeline_at_partial_tiles():
    plan = lower(S.kda(S.gate_direct(None)), 60, 60, "float16", "chunk")
    t = Hs.default_train_config(plan).replace(intra_block_k=32, intra_num_stages=2)
    assert avoid_miscompiles("chunk_train", plan, t) == t


def test_a_tuned_winner_is_made_legal_and_a_given_config_is_not(monkeypatch):
    """The ops resolve the backward's config through lookup (tuned winners) and then make it legal; a
    config the caller passes runs as given."""
    plan = lower(gla_spec(None), 64, 64, "float32", "chunk")
    winner = Hs.default_chunk_bwd_config(plan).replace(dqkw_num_stages=2)
    monkeypatch.setattr(lookup, "lookup_winner", lambda *a, **k: winner if a[1] == "chunk_bwd" else None)
    assert legal("chunk_bwd", plan, lookup.resolve("chunk_bwd", plan, None, {})).dqkw_num_stages == 1
    given = winner.replace(dqkw_num_stages=3)
    assert lookup.resolve("chunk_bwd", plan, given, {}) is given


@pytest.mark.parametrize("member", ["gdn", "delta"])
def test_bf16_training_at_v16_keeps_32_row_chunks(member):
    """64-row chunks need a reverse-pass V tile of 32: a bf16 Gated DeltaNet / DeltaNet at V=16 (which FLA
    takes) trains on 32-row chunks instead of being refused (found by the GPU sweep)."""
    for V, rows in ((16, 32), (32, 64)):
        plan = lower(SPECS[member](), 16, V, "bfloat16", "chunk")
        t = Hs.default_config("chunk_train", plan, {"N": 1, "HV": 2})
        b = Hs.default_config("chunk_bwd", plan, {"N": 1, "HV": 2}, t)
        if member == "gdn" or rows == 32:
            assert t.chunk_size == b.chunk_size == rows
        b.reverse_pass_block_v(plan)  # refuses a tile too narrow for the chunks
