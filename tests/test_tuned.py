"""The runtime's use of the tuning cache: exact-key look-ups, heuristic fallback, and a bad
cache never breaking a forward pass.  The runtime never tunes."""
import warnings

import pytest

import kdagen.cache.keys as keys
import kdagen.cache.lookup as tuned
from kdagen.cache.store import TuningCache, make_entry
from kdagen.config import ChunkFwdConfig, RecurrentConfig
from kdagen.cache.gpus import get_profile
from kdagen.cache.heuristics import default_chunk_config, default_recurrent_config
from kdagen.codegen.lower import lower
from kdagen.ops.inputs import select_spec


def chunk_kernels(plan, config, shape):
    return tuned.resolve("chunk_fwd", plan, config, shape)


def recurrent_kernels(plan, config, shape):
    return tuned.resolve("recurrent", plan, config, shape)


@pytest.fixture
def h200(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    prof = get_profile("h200")
    monkeypatch.setattr(tuned, "_current_gpu", lambda: prof)
    tuned._cache_for.cache_clear()
    tuned._MEMO.clear()
    yield prof
    tuned._cache_for.cache_clear()
    tuned._MEMO.clear()


def _plan(form="chunk", K=64):
    return lower(select_spec(False, True, -5.0, False, False), K, K, "float32", form, False)


SHAPE = {"T": 4096, "B": 4, "N": 4}


def test_cached_winner_is_used_for_its_exact_key(h200):
    plan = _plan()
    won = ChunkFwdConfig(chunk_size=16, sub_chunk=16, intra_block_k=32, state_block_v=16)
    TuningCache(h200.name).store(keys.cache_key(plan, "chunk_fwd", SHAPE, h200),
                                 make_entry(config=won.to_dict(), kernel="chunk_fwd", time_ms=1.0, error=0.0))
    assert chunk_kernels(plan, None, SHAPE) == won
    # same bucket (4096 tokens, 4 sequences) -> same winner; another bucket or head dim -> heuristic
    assert chunk_kernels(plan, None, {"T": 4000, "B": 4, "N": 4}) == won
    assert chunk_kernels(plan, None, {"T": 4096, "B": 16, "N": 16}) == default_chunk_config(plan)
    other = _plan(K=96)
    assert chunk_kernels(other, None, SHAPE) == default_chunk_config(other)
    # an explicit config always wins
    mine = ChunkFwdConfig(chunk_size=64)
    assert chunk_kernels(plan, mine, SHAPE) == mine


def test_recurrent_winner_and_fallback(h200):
    plan = _plan("recurrent")
    assert recurrent_kernels(plan, None, {"T": 1, "B": 8, "N": 8}) == default_recurrent_config(plan)
    won = RecurrentConfig(block_v=16, num_warps=2)
    TuningCache(h200.name).store(keys.cache_key(plan, "recurrent", {"T": 1, "B": 8, "N": 8}, h200),
                                 make_entry(config=won.to_dict(), kernel="recurrent", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    assert recurrent_kernels(plan, None, {"T": 1, "B": 8, "N": 8}) == won


def test_corrupt_cache_warns_and_falls_back(h200, tmp_path):
    (tmp_path / "h200.json").write_text("{ not json")
    plan = _plan()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cfg = chunk_kernels(plan, None, SHAPE)
    assert cfg == default_chunk_config(plan)
    assert any("h200.json" in str(x.message) for x in w)


def test_no_gpu_means_heuristics(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "_current_gpu", lambda: None)
    plan = _plan()
    assert tuned.lookup_winner(plan, "chunk_fwd", SHAPE) is None


def test_source_hash_follows_the_templates(monkeypatch, tmp_path):
    import shutil

    import kdagen.resources as res

    a = keys.source_hash("chunk_fwd")
    copy = tmp_path / "templates"
    shutil.copytree(res.templates_dir(), copy)
    (copy / "chunk_state.py.j2").write_text((copy / "chunk_state.py.j2").read_text() + "\n# edited\n")
    monkeypatch.setattr(keys, "templates_dir", lambda: copy)
    keys.source_hash.cache_clear()
    try:
        assert keys.source_hash("chunk_fwd") != a
        assert keys.source_hash("recurrent") == keys.source_hash("recurrent")
    finally:
        keys.source_hash.cache_clear()


def test_default_state_tile_follows_the_number_of_state_programs():
    plan = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    few = default_chunk_config(plan, {"N": 2, "HV": 16})  # 2*16*4 = 128 programs at BV=32
    many = default_chunk_config(plan, {"N": 1, "HV": 96})  # 384 programs at BV=32
    assert (few.state_block_v, few.state_num_warps) == (16, 4)
    assert (many.state_block_v, many.state_num_warps) == (32, 2)
    assert default_chunk_config(plan) == many  # no shape: the default measured at (1, 8192, 96, 128)
