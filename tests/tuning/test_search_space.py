import json
from pathlib import Path

import pytest

from kdagen.config import ChunkFwdConfig, ChunkTrainConfig, RecurrentConfig
from kdagen.tuning.space import SearchSpace, SearchSpaceError, estimate_smem, load_space, safe_eval

H100_SMEM = 232448
CTX = dict(K=128, V=128, safe_sub_chunk=32, smem_limit=H100_SMEM)


def test_default_chunk_fwd_space():
    space = load_space("chunk_fwd")
    # ... x factor_precision x segments x load_ahead x k_tile (intra_num_warps 2, 4, 8: three)
    assert space.kernel == "chunk_fwd" and space.size == 2 * 3 * 3 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2
    cands = space.candidates(CTX)
    assert cands and all(isinstance(c, ChunkFwdConfig) for c in cands)
    assert all(c.intra_num_stages == ChunkFwdConfig().intra_num_stages for c in cands)  # default
    assert {c.sub_chunk for c in cands} == {16} and {c.chunk_size for c in cands} == {32, 64}
    assert {c.inverse_precision for c in cands} == {"bf16", "tf32"} and {c.state_prefetch for c in cands} == {True, False}
    assert {c.solve_load_ahead for c in cands} == {0, 2}
    # the solve over K tiles: at 2 and 4 warps, its loads where it reads them; whole rows at 4 and 8 warps
    tiled = {(c.intra_num_warps, c.solve_load_ahead) for c in cands if c.solve_k_tile}
    assert {c.solve_k_tile for c in cands} == {0, 16} and tiled == {(2, 0), (4, 0)}
    assert {c.intra_num_warps for c in cands if not c.solve_k_tile} == {4, 8}
    assert cands == space.candidates(dict(CTX))  # deterministic order
    assert len(set(cands)) == len(cands)
    assert {c.state_segment_chunks for c in cands} == {0, 32}
    wide = space.candidates(dict(CTX, K=256, V=256))  # the sequence-parallel pass takes K <= 128
    assert wide and {c.state_segment_chunks for c in wide} == {0}


def test_the_forward_candidates_do_not_depend_on_the_gate_bound():
    """The inference kernels check each sub-tile's decay span at run time (the element-wise path
    takes any sub-tile over it), so an unbounded gate (safe_sub_chunk 0) has the same candidates.
    The training forward's sub-tiles rely on the bound, and its space says so."""
    space = load_space("chunk_fwd")
    assert space.candidates(dict(CTX, safe_sub_chunk=0)) == space.candidates(CTX)
    train = SearchSpace.from_dict({"kernel": "chunk_train", "params": {"chunk_size": [32, 64], "sub_chunk": [16, 32]},
                                   "constraints": ["sub_chunk <= max(safe_sub_chunk, 16)"]})
    for ssc in (16, 0):  # 0: the gate has no lower bound -> sub_chunk must be 16
        cands = train.candidates(dict(CTX, safe_sub_chunk=ssc))
        assert cands and {c.sub_chunk for c in cands} == {16}


def test_smem_limit_filters():
    space = load_space("chunk_fwd")
    assert space.candidates(dict(CTX, smem_limit=1024)) == []
    full = space.candidates(CTX)
    small = space.candidates(dict(CTX, smem_limit=101376))
    assert 0 < len(small) < len(full)
    assert all(estimate_smem("chunk_fwd", c, 128, 128, 2) <= 101376 for c in small)


def test_small_v_limits_state_block_v():
    cands = load_space("chunk_fwd").candidates(dict(CTX, V=16))
    assert {c.state_block_v for c in cands} == {16}


def test_recurrent_space():
    space = load_space("recurrent")
    assert space.size == 192
    cands = space.candidates(dict(K=128, V=128, smem_limit=H100_SMEM))
    # persistent programs on one warp are left out (slower on the H200), persistent programs are the
    # pipelined ones (num_stages 2: docs/decisions/0021-decode-half-pool-persistent.md), and pipelining
    # is a persistent program's choice only:
    # per block_v and readout, one-item programs on 4 warp counts, pipelined ones at 4 and 16 per SM on 3
    assert len(cands) == 4 * 2 * (4 + 3 + 3) and all(isinstance(c, RecurrentConfig) for c in cands)
    assert not [c for c in cands if c.programs_per_sm and c.num_warps == 1]
    assert {(c.programs_per_sm, c.num_stages) for c in cands} == {(0, 1), (4, 2), (16, 2)}
    assert {c.readout for c in cands} == {"updated", "loaded"}


def test_estimate_smem_counts_the_pipelined_decode_buffers():
    """One-item decode programs keep the state in registers; pipelined persistent ones buffer, per
    stage, the state tile (fp32 at most) and the token's slices.
    (sm_90 compile of BV=64, 2 stages, bf16 pool: 35 KB; fp32 pool: 68 KB -- tests/sm90/test_compile_sm90.py.)"""
    plain = RecurrentConfig(block_v=64)
    assert estimate_smem("recurrent", plain, 128, 128, 2) == (2 * 128 + 64) * 2
    piped = plain.replace(programs_per_sm=4, num_stages=2)
    assert estimate_smem("recurrent", piped, 128, 128, 2) == 2 * (128 * 64 * 4 + (3 * 128 + 64) * 4)
    assert estimate_smem("recurrent", piped.replace(num_stages=3), 128, 128, 2) > estimate_smem(
        "recurrent", piped, 128, 128, 2)
    # one program per item pipelines nothing, whatever its num_stages
    assert estimate_smem("recurrent", piped.replace(programs_per_sm=0), 128, 128, 2) == (2 * 128 + 64) * 2


def test_estimate_smem_formula():
    c = ChunkFwdConfig(chunk_size=64, state_block_v=32, state_num_stages=2)
    solve = 4 * 32 * 128 * 2 + 4 * 4 * 32 * 32
    state = 2 * (3 * 64 * 128 + 64 * 64) * 2 + (128 + 64) * 32 * 2
    assert estimate_smem("chunk_fwd", c, 128, 128, 2) == max(solve, state)
    assert estimate_smem("chunk_fwd", c.replace(state_num_stages=3), 128, 128, 2) > max(solve, state)
    # the sequence-parallel pass's chaining launch: a K x K fp32 transition and the K x BV state
    c32 = ChunkFwdConfig(chunk_size=32, state_block_v=64, state_num_stages=2)
    assert estimate_smem("chunk_fwd", c32, 128, 128, 2) == 2 * (3 * 32 * 128 + 32 * 32) * 2 + (128 + 32) * 64 * 2
    assert estimate_smem("chunk_fwd", c32.replace(state_segment_chunks=16), 128, 128, 2) == 4 * (128 * 128 + 128 * 64)
    assert estimate_smem("chunk_fwd", c.replace(state_segment_chunks=16), 128, 128, 2) == max(solve, state)
    t = ChunkTrainConfig(chunk_size=64, intra_block_k=64, intra_num_stages=2, state_block_v=32, state_num_stages=2)
    intra = 2 * 2 * 64 * 64 * 2 + 4 * 64 * 64 + 64 * 32 * 2
    state = 2 * ((3 * 64 * 128 + 64 * 64) * 2 + 64 * 32 * 2)
    assert estimate_smem("chunk_train", t, 128, 128, 2) == max(intra, state)
    assert estimate_smem("recurrent", RecurrentConfig(), 128, 128, 2) < 4096


def test_safe_eval_arithmetic_and_logic():
    names = {"a": 3, "b": 5, "s": "ieee"}
    assert safe_eval("min(a, b) + 2 * b <= 13 and not a > b", names) is True
    assert safe_eval("max(a, b, 7) // 2 == 3 and abs(-a) % 2 == 1", names) is True
    assert safe_eval("s == 'ieee' or a / 0", names) is True  # short-circuits
    assert safe_eval("2 ** a", names) == 8
    assert safe_eval("1 < a < b", names) is True


@pytest.mark.parametrize("expr", [
    "__import__('os')",
    "__import__('os').system('true')",
    "a.__class__",
    "(1).real",
    "open('x')",
    "[x for x in (1, 2)]",
    "lambda: 1",
    "a[0]",
    "min(*b)",
    "max(a, key=abs)",
    "__builtins__",
    "'a' * 10 ** 9",
    "2 ** 10 ** 6",
    "a = 1",
])
def test_safe_eval_rejects_unsafe(expr):
    with pytest.raises(ValueError):
        safe_eval(expr, {"a": 1, "b": [1]})


def test_safe_eval_rejects_dunder_names_even_if_defined():
    with pytest.raises(ValueError):
        safe_eval("__x__ + 1", {"__x__": 1})


def test_safe_eval_unknown_name():
    with pytest.raises(ValueError, match="unknown name 'nope'"):
        safe_eval("nope > 1", {"a": 1})


def _write(tmp_path, d, name="space.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_user_space_file_loads(tmp_path):
    p = _write(tmp_path, {"kernel": "recurrent", "version": 1,
                          "params": {"block_v": [32, 64], "num_warps": [2, 4]},
                          "constraints": ["block_v * num_warps <= 128"]})
    for arg in (p, str(p)):
        space = load_space(arg)
        assert space.source == str(p) and space.size == 4
        cands = space.candidates(dict(K=64, V=64))
        assert [(c.block_v, c.num_warps) for c in cands] == [(32, 2), (32, 4), (64, 2)]


def test_unsafe_constraint_in_file_names_the_file(tmp_path):
    p = _write(tmp_path, {"kernel": "recurrent", "params": {"block_v": [32]},
                          "constraints": ["__import__('os').getpid() > 0"]})
    with pytest.raises(SearchSpaceError) as ei:
        load_space(p)
    assert str(p) in str(ei.value)


def test_unknown_param_names_the_file(tmp_path):
    p = _write(tmp_path, {"kernel": "chunk_fwd", "params": {"chunk": [64]}})
    with pytest.raises(SearchSpaceError) as ei:
        load_space(p)
    assert str(p) in str(ei.value) and "'chunk'" in str(ei.value) and "chunk_size" in str(ei.value)


def test_value_rejected_by_config_names_the_file(tmp_path):
    p = _write(tmp_path, {"kernel": "chunk_fwd", "params": {"chunk_size": [48, 64]}})
    with pytest.raises(SearchSpaceError) as ei:
        load_space(p)
    msg = str(ei.value)
    assert str(p) in msg and "chunk_size" in msg and "48" in msg


def test_bad_files(tmp_path):
    for d in ({"kernel": "nope", "params": {}},
              {"kernel": "recurrent", "version": 2, "params": {}},
              {"kernel": "recurrent", "params": {"block_v": []}},
              {"kernel": "recurrent", "params": {"block_v": 32}},
              {"kernel": "recurrent", "params": {"block_v": [32, 32]}},
              {"kernel": "recurrent", "params": {}, "extra": 1}):
        with pytest.raises(SearchSpaceError):
            load_space(_write(tmp_path, d))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(SearchSpaceError, match="not valid JSON"):
        load_space(bad)
    with pytest.raises(SearchSpaceError):
        load_space("no_such_kernel")


def test_combination_rejected_by_config_is_skipped(tmp_path):
    # sub_chunk=64 is valid with chunk_size=64 but not with 32: that pair is skipped.
    p = _write(tmp_path, {"kernel": "chunk_train",
                          "params": {"chunk_size": [32, 64], "sub_chunk": [16, 64]}})
    cands = load_space(p).candidates(dict(K=64, V=64))
    assert [(c.chunk_size, c.sub_chunk) for c in cands] == [(32, 16), (64, 16), (64, 64)]


def test_missing_context_name_is_an_error():
    with pytest.raises(ValueError, match="smem_limit"):
        load_space("chunk_fwd").candidates(dict(K=64, V=64))


def test_packaged_lookup_falls_back_to_repo_dir(monkeypatch):
    import importlib.resources as ir

    def boom(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(ir, "files", boom)
    space = load_space("recurrent")
    assert Path(space.source).parent.name == "search_spaces"


def test_packaged_lookup_uses_importlib_resources(monkeypatch, tmp_path):
    import importlib.resources as ir

    (tmp_path / "recurrent.json").write_text(json.dumps(
        {"kernel": "recurrent", "params": {"block_v": [64]}}))
    monkeypatch.setattr(ir, "files", lambda name: tmp_path)
    space = load_space("recurrent")
    assert space.source == str(tmp_path / "recurrent.json") and space.size == 1


def test_fingerprint_ignores_source_but_not_content(tmp_path):
    a = load_space("recurrent")
    d = a.to_dict()
    b = load_space(_write(tmp_path, d))
    assert a.fingerprint() == b.fingerprint()
    d["params"]["num_warps"] = [4]
    assert load_space(_write(tmp_path, d, "c.json")).fingerprint() != a.fingerprint()


def test_packaged_spaces_present_in_repo():
    root = Path(__file__).resolve().parents[2] / "search_spaces"
    assert (root / "chunk_fwd.json").is_file() and (root / "recurrent.json").is_file()


def test_a_stage_names_the_launch_it_times():
    d = {"kernel": "chunk_fwd", "params": {"chunk_size": [32]},
         "stages": {"state": {"launch": "chunk_pass", "fields": ["state_block_v"]},
                    "intra": {"launch": "chunk_solve", "fields": ["intra_num_warps"]}}}
    space = SearchSpace.from_dict(d)
    assert space.stage_launches == {"state": "chunk_pass", "intra": "chunk_solve"}
    assert SearchSpace.from_dict(space.to_dict()).stage_launches == space.stage_launches
    for bad in ({"state": {"launch": "chunk_bwd_state", "fields": ["state_block_v"]}},  # another family's
                {"state": ["state_block_v"]},  # no launch named
                {"a": {"launch": "chunk_pass", "fields": []}, "b": {"launch": "chunk_pass", "fields": []}}):
        with pytest.raises(SearchSpaceError, match="launch"):
            SearchSpace.from_dict({**d, "stages": bad})
