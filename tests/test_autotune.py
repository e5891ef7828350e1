"""kdagen's tuning driver: stage-separable search of the chunk form (each launch timed
alone, winners combined per chunk length) and the correctness gate, with a fake timer so
it runs without a GPU."""
import torch

import kdagen.autotune as A
from kdagen.config import ChunkFwdConfig
from kdagen.gpus import get_profile
from kdagen.heuristics import default_chunk_config
from kdagen.ops.common import select_spec
from kdagen.search_space import SearchSpace

SPACE = SearchSpace.from_dict({
    "kernel": "chunk_fwd",
    "params": {"chunk_size": [32, 64], "intra_block_k": [32, 64], "state_block_v": [16, 32]},
    "stages": {"intra": ["chunk_size", "intra_block_k"], "state": ["chunk_size", "state_block_v"]},
})


class FakeCandidate:
    """Times are a made-up function of the fields of the stage being tuned; intra_block_k=32
    with chunk_size=64 is 'fastest' but numerically wrong and must be rejected."""

    tolerance = 1e-3

    def __init__(self, family, stage, plan, spec_args, dtype, shape, device="cuda"):
        self.stage = stage

    def build(self, config):
        return config

    def check(self, config):
        return 1.0 if (self.stage == "intra" and config.chunk_size == 64 and config.intra_block_k == 32) else 0.0

    def time(self, config):
        if self.stage == "intra":
            return {(32, 32): 3.0, (32, 64): 2.0, (64, 32): 0.1, (64, 64): 2.5}[(config.chunk_size, config.intra_block_k)]
        return {(32, 16): 1.0, (32, 32): 0.9, (64, 16): 0.2, (64, 32): 0.3}[(config.chunk_size, config.state_block_v)]


def test_stage_candidates_vary_only_their_stage(monkeypatch):
    spec = select_spec(False, True, -5.0, False, False)
    plan = A.lower_for(spec, "chunk_fwd", 64, 64, torch.float32)
    ctx = A.space_context(plan, spec, get_profile("h200"), 4)
    d = default_chunk_config(plan)
    intra = A.stage_candidates(SPACE, ctx, "intra", d)
    assert len(intra) == 4 and {c.state_block_v for c in intra} == {d.state_block_v}
    state = A.stage_candidates(SPACE, ctx, "state", d)
    assert len(state) == 4 and {c.intra_block_k for c in state} == {d.intra_block_k}


def test_tune_family_combines_the_best_stage_per_chunk_length(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(A, "KernelCandidate", FakeCandidate)
    spec = select_spec(False, True, -5.0, False, False)
    plan = A.lower_for(spec, "chunk_fwd", 64, 64, torch.float32)
    winner, ms, default_ms, results = A.tune_family("chunk_fwd", plan, spec, {}, get_profile("h200"),
                                                    torch.float32, (1, 256, 1, 1), space=SPACE, progress=False)
    # C=64: intra best *valid* is BK=64 (2.5; BK=32 is wrong), state best 0.2 -> 2.7
    # C=32: intra 2.0 + state 0.9 -> 2.9; so C=64 wins with the correct intra config
    assert isinstance(winner, ChunkFwdConfig)
    assert (winner.chunk_size, winner.intra_block_k, winner.state_block_v) == (64, 64, 16)
    assert abs(ms - 2.7) < 1e-9
    assert results["intra"].n_rejected >= 1
