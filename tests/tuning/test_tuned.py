"""The runtime's use of the tuning cache: exact-key look-ups, heuristic fallback, and a bad
cache never breaking a forward pass.  The runtime never tunes."""
import warnings

import pytest

from plain_configs import plain_decode, plain_fwd

import kdagen.cache.keys as keys
import kdagen.spec as S
import kdagen.cache.lookup as tuned
from kdagen.cache.store import TuningCache, make_entry
from kdagen.config import RecurrentConfig
from kdagen.cache.gpus import get_profile
from kdagen.cache.heuristics import (default_chunk_bwd_config, default_chunk_config, default_recurrent_config,
                                     default_train_config)
from kdagen.codegen.lower import lower
from kdagen.ops.inputs import select_spec
from kdagen.spec.recurrence import MEMBERS


def chunk_kernels(plan, config, shape):
    return tuned.resolve("chunk_fwd", plan, config, shape)


def recurrent_kernels(plan, config, shape):
    return tuned.resolve("recurrent", plan, config, shape)




def _plan(form="chunk", K=64):
    return lower(select_spec(False, True, -5.0, False, False), K, K, "float32", form, False)


SHAPE = {"T": 4096, "B": 4, "N": 4}


def test_cached_winner_is_used_for_its_exact_key(h200):
    plan = _plan()
    won = plain_fwd(chunk_size=32, intra_num_warps=8, state_block_v=16)
    assert won != default_chunk_config(plan)
    TuningCache(h200.name).store(keys.cache_key(plan, "chunk_fwd", SHAPE, h200),
                                 make_entry(config=won.to_dict(), kernel="chunk_fwd", time_ms=1.0, error=0.0))
    assert chunk_kernels(plan, None, SHAPE) == won
    # same bucket (4096 tokens, 4 sequences) -> same winner; another bucket or head dim -> heuristic
    assert chunk_kernels(plan, None, {"T": 4000, "B": 4, "N": 4}) == won
    assert chunk_kernels(plan, None, {"T": 4096, "B": 16, "N": 16}) == default_chunk_config(plan)
    other = _plan(K=96)
    assert chunk_kernels(other, None, SHAPE) == default_chunk_config(other)
    # an explicit config always wins
    mine = plain_fwd(chunk_size=64)
    assert chunk_kernels(plan, mine, SHAPE) == mine


def test_the_forward_heuristic():
    """Measured on the H200 (docs/decisions/0002-inference-forward-64-row-chunks.md): with the solve's
    loads issued ahead (solve_load_ahead=2) the layer's call (gate, l2-norm and beta sigmoid in the kernel)
    is faster with 64-row chunks, as the plain call; many short packed sequences take 32-row chunks
    (docs/decisions/0003-packed-short-sequences-32-row-chunks.md).  A scalar decay's solve has no choice of
    load order (the field is not read: it keeps 0)."""
    given = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk")
    in_kernel = lower(select_spec(True, True, -5.0, True, True), 128, 128, "bfloat16", "chunk", True)
    for plan in (given, in_kernel):
        d = default_chunk_config(plan)
        assert (d.chunk_size, d.state_block_v, d.solve_load_ahead) == (64, 32, 2)
    assert default_chunk_config(in_kernel) == default_chunk_config(given)
    # 64 sequences of 512 tokens on average, 32 heads: 8,192 state-pass programs of few chunks each
    packed = {"T": 32768, "B": 1, "N": 64, "HV": 32, "T_max": 1030}
    d = default_chunk_config(given, packed)
    assert (d.chunk_size, d.state_block_v, d.state_prefetch) == (32, 32, False)  # no hand prefetch there
    assert default_chunk_config(given, dict(packed, T_max=32768)) == d  # device-only offsets: T_max unknown (T)
    # one long sequence of few heads: the sequence-parallel pass on 64-wide V tiles
    # (docs/decisions/0004-sequence-parallel-segment-pass.md)
    long = default_chunk_config(given, {"T": 65536, "B": 1, "N": 1, "HV": 8})
    assert (long.state_segment_chunks, long.state_block_v, long.state_prefetch) == (32, 64, False)
    assert default_chunk_config(given).state_prefetch and default_chunk_config(given).state_segment_chunks == 0
    # the same tokens in 16 sequences (2,048 on average), fewer programs: 64-row chunks
    assert default_chunk_config(given, dict(packed, N=16)).chunk_size == 64
    assert default_chunk_config(given, dict(packed, HV=4)).chunk_size == 64  # 1,024 programs
    assert default_chunk_config(given, {"T": 8192, "B": 1, "N": 1, "HV": 96}).chunk_size == 64
    assert default_chunk_config(given, {"T": 1024, "B": 8, "N": 8, "HV": 8}).chunk_size == 64  # 256 programs
    gdn = lower(MEMBERS["gdn"](), 128, 128, "bfloat16", "chunk")
    assert gdn.diag_mode == "scalar" and default_chunk_config(gdn).solve_load_ahead == 0


def test_recurrent_winner_and_fallback(h200):
    plan = _plan("recurrent")
    assert recurrent_kernels(plan, None, {"T": 1, "B": 8, "N": 8}) == default_recurrent_config(plan)
    # a half-width pool has its own heuristic (half the bytes per program: narrower tiles, one warp)
    half = tuned.resolve("recurrent", plan, None, {"T": 1, "B": 8, "N": 8}, "bfloat16")
    assert half == default_recurrent_config(plan, "bfloat16") != default_recurrent_config(plan)
    assert (half.block_v, half.num_warps, half.readout, half.programs_per_sm) == (32, 1, "loaded", 0)
    # many items (B=256 sequences x 32 value heads, one 64-wide V tile at K=V=64): persistent
    # programs whose item loop Triton pipelines, 4 per SM; four times as many items: 16 per SM
    many = tuned.resolve("recurrent", plan, None, {"T": 1, "B": 256, "N": 256, "HV": 32}, "bfloat16")
    assert (many.block_v, many.num_warps, many.readout, many.programs_per_sm, many.num_stages) == (
        64, 2, "loaded", 4, 2)
    more = tuned.resolve("recurrent", plan, None, {"T": 1, "B": 1024, "N": 1024, "HV": 32}, "bfloat16")
    assert (more.programs_per_sm, more.num_stages) == (16, 2)
    assert tuned.resolve("recurrent", plan, None, {"T": 1, "B": 256, "N": 256, "HV": 32}) == default_recurrent_config(plan)
    won = plain_decode(block_v=16, num_warps=2)
    TuningCache(h200.name).store(keys.cache_key(plan, "recurrent", {"T": 1, "B": 8, "N": 8}, h200),
                                 make_entry(config=won.to_dict(), kernel="recurrent", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    assert recurrent_kernels(plan, None, {"T": 1, "B": 8, "N": 8}) == won
    assert recurrent_kernels(plan, None, {"T": 1, "B": 8, "N": 8, "state_v_first": False}) == won
    # the tuner times [K, V] states: a call on a [V, K] pool takes the heuristic, not that winner
    assert recurrent_kernels(plan, None, {"T": 1, "B": 8, "N": 8, "state_v_first": True}) == default_recurrent_config(plan)


def test_a_v_first_decode_call_does_not_take_a_winner_timed_on_k_v_states(h200):
    """End to end through fused_recurrent_kda's launch description: the stored winner for the call's key
    runs on a [N, HV, K, V] state and not on a [N, HV, V, K] one (shape's state_v_first reaches resolve)."""
    import torch

    from kdagen.ops.recurrent import fused_recurrent_kda_launch

    N, H, K = 2, 2, 64
    plan = lower(select_spec(False, False, None, False, False), K, K, "float32", "recurrent", False)
    won = RecurrentConfig(block_v=16, num_warps=4, readout="updated")
    assert won != default_recurrent_config(plan, "float32", {"N": N, "HV": H})
    TuningCache(h200.name).store(keys.cache_key(plan, "recurrent", {"T": 1, "B": N, "N": N}, h200),
                                 make_entry(config=won.to_dict(), kernel="recurrent", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    x = dict(q=torch.randn(N, 1, H, K), k=torch.randn(N, 1, H, K), v=torch.randn(N, 1, H, K),
             g=-torch.rand(N, 1, H, K), beta=torch.rand(N, 1, H))
    for v_first, want in ((False, won),
                          (True, default_recurrent_config(plan, "float32", {"N": N, "HV": H, "state_v_first": True}))):
        desc = fused_recurrent_kda_launch(**x, initial_state=torch.zeros(N, H, K, K), state_v_first=v_first)[0]
        assert (desc.constexprs["BV"], desc.num_warps) == (min(want.block_v, K), want.num_warps), v_first


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


@pytest.fixture
def editable_copy(tmp_path, monkeypatch):
    """kdagen's modules and templates copied to ``tmp_path``, with the source hash reading the
    copy: ``edit(relative path, text)`` appends to a file of it and returns every family's hash."""
    import shutil

    from kdagen.codegen import sources
    from kdagen.resources import templates_dir

    pkg, tpl = tmp_path / "kdagen", tmp_path / "templates"
    shutil.copytree(sources.PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__", "templates",
                                                                            "search_spaces"))
    shutil.copytree(templates_dir(), tpl)
    monkeypatch.setattr(sources, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(sources, "templates_dir", lambda: tpl)

    def hashes():
        keys.source_hash.cache_clear()
        return {f: keys.source_hash(f) for f in ("chunk_fwd", "chunk_bwd", "recurrent")}

    def edit(rel, text="\n# edited\n"):
        path = tmp_path / rel
        path.write_text(path.read_text() + text) if path.exists() else path.write_text(text)
        return hashes()

    yield edit, hashes
    keys.source_hash.cache_clear()


def test_a_change_to_the_code_that_renders_kernels_invalidates_their_winners(editable_copy):
    """The source hash in a winner's key covers what the kernel text is made from: the
    templates, and the lowering and rendering code with everything it imports (spec, printer,
    config and dtype vocabularies) -- not only the templates."""
    edit, hashes = editable_copy
    before = hashes()
    for rel in ("kdagen/codegen/lower.py", "kdagen/codegen/render.py", "kdagen/codegen/triton_printer.py",
                "kdagen/spec/gates.py", "kdagen/spec/structure.py", "kdagen/dtypes.py", "kdagen/config.py",
                "templates/_header.py.j2"):
        after = edit(rel)
        assert all(after[f] != before[f] for f in before), rel
        before = after


def test_a_partial_invalidates_the_families_whose_templates_use_it(editable_copy):
    """A shared partial is part of what a kernel is made from where a template includes or imports it:
    _macros.py.j2 feeds the chunk families' kernels, not the recurrent form's."""
    edit, hashes = editable_copy
    before = hashes()
    after = edit("templates/_macros.py.j2")
    assert all(after[f] != before[f] for f in ("chunk_fwd", "chunk_bwd"))
    assert after["recurrent"] == before["recurrent"]


def test_a_template_invalidates_only_its_familys_winners(editable_copy):
    edit, hashes = editable_copy
    before = hashes()
    after = edit("templates/chunk_pass.py.j2")
    assert after["chunk_fwd"] != before["chunk_fwd"]
    assert (after["chunk_bwd"], after["recurrent"]) == (before["chunk_bwd"], before["recurrent"])
    # the training forward's templates are not the inference forward's
    again = edit("templates/chunk_state.py.j2")
    assert again["chunk_fwd"] == after["chunk_fwd"]


def test_code_that_does_not_render_kernels_leaves_the_winners_alone(editable_copy):
    edit, hashes = editable_copy
    before = hashes()
    for rel in ("kdagen/cli.py", "kdagen/spec/reference.py", "kdagen/spec/verify.py", "kdagen/tuning/driver.py",
                "kdagen/ops/chunk.py", "kdagen/cache/store.py", "kdagen/kernels.py"):
        assert edit(rel) == before, rel


def test_a_module_that_rendering_comes_to_import_is_counted(editable_copy):
    """No list of files to keep: a new module the codegen imports (even inside a function)
    becomes an input of the hash."""
    edit, hashes = editable_copy
    edit("kdagen/codegen/helper.py", "X = 1\n")
    before = edit("kdagen/codegen/render.py", "\n\ndef _uses_helper():\n    from . import helper\n")
    assert edit("kdagen/codegen/helper.py") != before


def test_the_cache_key_carries_the_source_hash():
    plan = _plan()
    key = keys.cache_key(plan, "chunk_fwd", SHAPE, get_profile("h200"))
    assert key.source_hash == keys.source_hash("chunk_fwd") != keys.source_hash("recurrent")


def test_default_state_tile_of_the_training_forward_follows_the_number_of_state_programs():
    # the fused pass (fp32 inputs here): narrower V tiles with few state programs
    plan32 = lower(select_spec(False, True, -5.0, False, False), 128, 128, "float32", "chunk", False)
    few = default_train_config(plan32, {"N": 2, "HV": 16})  # 2*16*4 = 128 programs at BV=32
    many = default_train_config(plan32, {"N": 1, "HV": 96})  # 384 programs at BV=32
    assert (few.state_block_v, few.state_num_warps, few.split_output) == (16, 4, False)
    assert (many.state_block_v, many.state_num_warps, many.split_output) == (32, 2, False)
    assert default_train_config(plan32) == many  # no shape: the default measured at (1, 8192, 96, 128)
    # half precision, K <= 128: the output split out of the pass, the states-only pass on 4 warps,
    # 3 stages, 32-wide tiles with few programs (and without a shape), 64-wide with many, the
    # output launch on [C, 128] tiles over 64-wide K (docs/decisions/0009-split-output-launch.md)
    plan = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    for shape, bv in (({"N": 2, "HV": 16}, 32), ({"N": 1, "HV": 96}, 64), (None, 32)):
        c = default_train_config(plan, shape)
        assert (c.split_output, c.state_block_v, c.state_num_warps, c.state_num_stages) == (True, bv, 4, 3)
        assert (c.out_block_v, c.out_block_k, c.out_num_warps) == (128, 64, 4)
    # general DPLR and K > 128 keep the fused pass
    dplr = lower(S.dplr(S.gate_direct(-5.0)), 128, 128, "bfloat16", "chunk", False)
    assert not default_train_config(dplr).split_output
    assert not default_train_config(lower(select_spec(False, True, -5.0, False, False), 256, 256, "bfloat16",
                                          "chunk", False)).split_output
    # a KDA call without a bound (checked diagonal, element-wise columns as its fallback) takes the bounded
    # call's tiles (docs/decisions/0012-bounded-tiles-for-checked-diagonal.md): intra gradients on 2 warps,
    # the whole K row in the forward's intra tile; fp16 (element-wise diagonal, no check) keeps 4 warps and
    # 32-wide tiles; GLA (no rank-1 part) its 32-wide tile
    free = lower(select_spec(False, False, None, False, False), 128, 128, "bfloat16", "chunk", False)
    assert default_chunk_bwd_config(free).intra_num_warps == default_chunk_bwd_config(plan).intra_num_warps == 2
    assert default_train_config(free).intra_block_k == default_train_config(plan).intra_block_k == 128
    free16 = lower(select_spec(False, False, None, False, False), 128, 128, "float16", "chunk", False)
    assert default_chunk_bwd_config(free16).intra_num_warps == 4 and default_train_config(free16).intra_block_k == 32
    gla = lower(S.gla(S.gate_direct(None)), 128, 128, "bfloat16", "chunk", False)
    gla5 = lower(S.gla(S.gate_direct(-5.0)), 128, 128, "bfloat16", "chunk", False)
    # GLA's 32-wide tile with a promised bound as without (docs/decisions/0013-gate-bound-checked-by-repair-launches.md)
    assert default_train_config(gla).intra_block_k == default_train_config(gla5).intra_block_k == 32
    # a promised bound checked by repair launches, except general DPLR's (its check is in-kernel: 5-7%)
    assert default_train_config(plan).check_gate_bound and default_chunk_bwd_config(plan).check_gate_bound
    dplr = lower(S.dplr(S.gate_direct(-5.0)), 128, 128, "bfloat16", "chunk", False)
    assert not default_train_config(dplr).check_gate_bound and not default_chunk_bwd_config(dplr).check_gate_bound
    # the intra launch's loads issued ahead in half precision (docs/decisions/0008-training-intra-loads-ahead.md),
    # not for fp32 inputs (unmeasured)
    assert all(default_train_config(plan, s).intra_load_ahead for s in ({"N": 2, "HV": 16}, {"N": 1, "HV": 96}))
    fp32 = lower(select_spec(False, True, -5.0, False, False), 128, 128, "float32", "chunk", False)
    assert not default_train_config(fp32).intra_load_ahead


def test_default_inference_forward_by_head_dim():
    """64-row chunks (two 32-row halves) with a 3-deep state pipeline up to K=128; above it the
    state pass's tiles are twice as wide, and 32-row chunks on two stages keep them in shared
    memory.  fp16 takes the tf32 inverse (its range), bf16 the bf16 one."""
    sel = select_spec(False, True, -5.0, False, False)
    c128 = default_chunk_config(lower(sel, 128, 128, "bfloat16", "chunk", False), {"N": 2, "HV": 16})
    assert (c128.chunk_size, c128.state_num_stages, c128.state_block_v, c128.inverse_precision) == (64, 3, 32, "bf16")
    c256 = default_chunk_config(lower(sel, 256, 256, "bfloat16", "chunk", False))
    assert (c256.chunk_size, c256.state_num_stages, c256.intra_num_warps) == (32, 2, 8)
    assert default_chunk_config(lower(sel, 64, 64, "float16", "chunk", False)).inverse_precision == "tf32"
    assert default_chunk_config(lower(sel, 64, 16, "bfloat16", "chunk", False)).state_block_v == 16


def test_backward_heuristic_takes_the_measured_tiles_for_half_precision():
    """docs/decisions/0016-backward-tiles.md: for bf16, K=V=128, the chunk-parallel launch on [128, 64] (K, V)
    tiles; docs/decisions/0018-reverse-state-pass.md: the reverse state pass on 64-wide V tiles with >= 256
    programs at BV=32, 32-wide below (16-wide before its A_qk tile was loaded ahead); fp32 (unmeasured) and
    K > 128 keep the narrower tiles."""
    from kdagen.cache.heuristics import default_chunk_bwd_config, default_config

    bf16 = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    many = default_chunk_bwd_config(bf16, {"N": 1, "HV": 96})  # 384 programs at BV=32
    few = default_chunk_bwd_config(bf16, {"N": 2, "HV": 16})  # 128
    assert (many.dqkw_block_k, many.dqkw_block_v, many.state_block_v) == (128, 64, 64)
    assert (few.dqkw_block_k, few.dqkw_block_v, few.state_block_v) == (128, 64, 32)
    assert (few.state_num_stages, many.state_num_stages) == (4, 3)  # docs/decisions/0018-reverse-state-pass.md
    assert default_chunk_bwd_config(bf16).state_block_v == 32  # no shape: the middle
    # the family entry point hands the shape through
    assert default_config("chunk_bwd", bf16, {"T": 16384, "B": 2, "N": 2, "HV": 16}).state_block_v == 32
    tiny = default_chunk_bwd_config(bf16, {"N": 1, "HV": 1})
    assert tiny.state_block_v == 32 and default_chunk_bwd_config(bf16, {"N": 1, "HV": 2000}).state_block_v == 64
    f32 = default_chunk_bwd_config(_plan("chunk", K=128), {"N": 1, "HV": 96})
    assert (f32.dqkw_block_k, f32.dqkw_block_v, f32.state_block_v) == (64, 32, 32)
    wide = lower(select_spec(False, True, -5.0, False, False), 256, 256, "bfloat16", "chunk", False)
    assert (default_chunk_bwd_config(wide, {"N": 1, "HV": 96}).dqkw_block_k,
            default_chunk_bwd_config(wide, {"N": 1, "HV": 96}).state_block_v) == (64, 32)


def test_float32_decode_takes_narrow_tiles_for_few_pairs():
    """A float32 decode state with few (sequence, value head) pairs: the 16-wide tile on one warp
    (B=1 at H=32), the 32-wide one up to 1,024 pairs (B=16), the 64-wide tile on 2 warps beyond
    (B=256) with KDA's loaded readout (272.5 against the updated readout's 275.3 us, one process:
    docs/decisions/0023-decode-loaded-readout.md); general DPLR keeps its updated readout and takes 32 / 2
    warps beyond the few (docs/decisions/0022-decode-fp32-tiles-by-pairs.md), and the other structures keep
    the updated readout at many pairs (measured with it).
    Without a shape hint: the 64-wide tile."""
    def tile(c):
        return c.block_v, c.num_warps, c.readout

    def pick(plan, N):
        return tile(default_recurrent_config(plan, "float32", {"N": N, "HV": 32}))

    kda = lower(S.kda(), 128, 128, "bfloat16", "recurrent")
    assert pick(kda, 1) == (16, 1, "loaded")
    assert pick(kda, 16) == (32, 1, "loaded")
    assert pick(kda, 256) == (64, 2, "loaded") == tile(default_recurrent_config(kda))
    from kdagen.ops.family import gdn_spec
    gdn = lower(gdn_spec(False, False), 128, 128, "bfloat16", "recurrent")
    assert gdn.decay == "scalar" and pick(gdn, 256) == (64, 2, "updated")
    dplr = lower(S.dplr(), 128, 128, "bfloat16", "recurrent")
    assert pick(dplr, 1) == (16, 1, "updated")
    assert pick(dplr, 16) == pick(dplr, 256) == (32, 2, "updated")
    small = lower(S.kda(), 32, 32, "float32", "recurrent")  # V=32: the 64-wide tile is V itself
    assert pick(small, 256)[0] == 32 and pick(small, 1)[0] == 16


def test_training_diagonal_in_fp32_for_bf16_bounded_gates_only():
    """Issue 17's error bar (docs/decisions/0015-diag-precision-tf32.md): the factorised diagonal sub-tiles' operands in
    fp32 on tf32 dots, in the training forward and the backward, for bf16 KDA-structure plans whose diagonal is
    factorised (a promised bound, or the in-kernel gate's); unbounded gates (element-wise diagonal), fp16, GLA
    and general DPLR keep the input dtype (unmeasured); and the rendered launches carry it."""
    from kdagen.codegen.render import render

    def both(plan):
        return default_train_config(plan).diag_precision, default_chunk_bwd_config(plan).diag_precision

    bounded = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    layer = lower(select_spec(True, True, -5.0, True, True), 128, 128, "bfloat16", "chunk", True)
    assert bounded.diag_mode == layer.diag_mode == "factorised"
    assert both(bounded) == both(layer) == ("tf32", "tf32")
    unbounded = lower(select_spec(False, False, None, False, False), 128, 128, "bfloat16", "chunk", False)
    fp16 = lower(select_spec(False, True, -5.0, False, False), 128, 128, "float16", "chunk", False)
    gla = lower(S.gla(S.gate_direct(-5.0)), 128, 128, "bfloat16", "chunk", False)
    dplr = lower(S.dplr(S.gate_direct(-5.0)), 128, 128, "bfloat16", "chunk", False)
    assert unbounded.diag_mode == "elementwise" and gla.diag_mode == "factorised"
    for plan in (unbounded, fp16, gla, dplr):
        assert both(plan) == ("input", "input"), plan.spec_name
    # the diagonal's key factor exp(a - G) k enters its dots in fp32, not rounded to bf16, in both launches
    for kernel, cfg in (("chunk_intra", default_train_config(bounded)),
                        ("chunk_bwd_intra", default_chunk_bwd_config(bounded))):
        src = render(kernel, bounded, cfg).text
        kb = [ln.strip() for ln in src.splitlines() if ln.strip().startswith("b_kb = ")]
        assert kb and all(ln.endswith(".to(tl.float32)") for ln in kb), (kernel, kb)
        assert "diag_precision=tf32" in src, kernel


def test_training_inverse_on_tf32_dots_in_bf16_only():
    """The training launches' triangular inverse (forward intra, backward wy) runs on tf32 dots for bf16
    plans (every bf16 gradient error unchanged, the step 2% faster) and on fp32 FMAs for fp16 plans (tf32 put
    fp16's output error at 6x FLA's on FLA's own test_gdn inputs), for fp32 plans (the interpreter's exactness
    bar) and for general DPLR (unmeasured): docs/decisions/0014-training-inverse-tf32.md."""
    sel = select_spec(False, True, -5.0, False, False)
    for dt, expect in (("bfloat16", "tf32"), ("float16", "ieee"), ("float32", "ieee")):
        plan = lower(sel, 128, 128, dt, "chunk", False)
        assert default_train_config(plan).inverse_precision == expect, dt
        assert default_chunk_bwd_config(plan).inverse_precision == expect, dt
    dplr = lower(S.dplr(S.gate_direct(-5.0)), 128, 128, "bfloat16", "chunk", False)
    assert default_train_config(dplr).inverse_precision == "ieee" == default_chunk_bwd_config(dplr).inverse_precision
    # the rendered wy launch carries it into its inverse's dots
    from kdagen.codegen.render import render
    src = render("chunk_bwd_wy", lower(sel, 128, 128, "bfloat16", "chunk", False),
                 default_chunk_bwd_config(lower(sel, 128, 128, "bfloat16", "chunk", False))).text
    assert 'input_precision="tf32"' in src and 'input_precision="ieee"' not in src


def test_deltanet_backward_folds_its_split_intra_launch_by_default():
    """Issue 15 (docs/decisions/0020-intra-backward-folded.md): without a decay, or with a scalar
    one given as g, the half-precision backward's split intra gradients are folded into dqkw and the wy
    launch (no chunk_bwd_intra launch), with the wy launch's K loop on 64-wide tiles; a per-channel decay,
    an in-kernel gate, fp32 plans and 64-row chunks keep the launches as they were."""
    from kdagen.codegen.render import family_kernels

    for dt in ("bfloat16", "float16"):
        for spec in (S.deltanet(), S.gdn(S.gate_direct(None))):
            dn = lower(spec, 128, 128, dt, "chunk", False)
            cfg = default_chunk_bwd_config(dn)
            assert cfg.folds_intra(dn) and cfg.intra_block_k == 64, (dt, spec.name)
            kinds = family_kernels("chunk_bwd", dn, cfg)
            assert "chunk_bwd_intra" not in kinds and "chunk_bwd_wy" in kinds
            narrow = lower(spec, 32, 32, dt, "chunk", False)  # the tile follows the head dim
            assert default_chunk_bwd_config(narrow).intra_block_k == narrow.BK == 32
    fp32 = lower(S.deltanet(), 128, 128, "float32", "chunk", False)
    assert not default_chunk_bwd_config(fp32).folds_intra(fp32)
    kda = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    from kdagen.ops.family import gdn_spec
    gdn_gik = lower(gdn_spec(True, True), 128, 128, "bfloat16", "chunk", True)  # FLA's in-kernel gate: dz in the intra launch
    assert gdn_gik.gate_in_kernel and gdn_gik.decay == "scalar"
    for plan in (kda, gdn_gik):
        cfg = default_chunk_bwd_config(plan)
        assert cfg.splits_intra(plan) and not cfg.folds_intra(plan), plan.spec_name
        assert "chunk_bwd_intra" in family_kernels("chunk_bwd", plan, cfg)


def test_gated_deltanet_and_few_head_deltanet_train_on_64_row_chunks_in_bf16():
    """Issue 15 (docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md): Gated DeltaNet's bf16 training
    step (g given, the folded backward) runs on 64-row chunks of two 32-row sub-tiles, forward and backward
    alike, with the reverse pass on 64-wide V tiles and 8 warps when there are many state programs and on
    32-wide tiles and 4 warps when there are few (or the shape is not known); DeltaNet's with few state
    programs only; fp16, fp32, KDA and the in-kernel gate's plan keep 32."""
    from kdagen.cache.heuristics import default_config, trains_on_64_row_chunks
    from kdagen.ops.family import gdn_spec

    gdn = lower(S.gdn(S.gate_direct(None)), 128, 128, "bfloat16", "chunk", False)
    assert trains_on_64_row_chunks(gdn)
    for shape, bv, warps in (({"N": 1, "HV": 96}, 64, 8), ({"N": 2, "HV": 16}, 32, 4), (None, 32, 4)):
        t = default_train_config(gdn, shape)
        b = default_config("chunk_bwd", gdn, shape)
        assert (t.chunk_size, t.sub_chunk) == (b.chunk_size, b.sub_chunk) == (64, 32), shape
        assert (b.state_block_v, b.state_num_warps, b.state_num_stages) == (bv, warps, 3), shape
        assert b.folds_intra(gdn) and b.reruns_from_saved(gdn), shape
    narrow = lower(S.gdn(S.gate_direct(None)), 64, 64, "bfloat16", "chunk", False)
    assert default_train_config(narrow).chunk_size == 64
    # DeltaNet: 64 rows with few state programs only (+2.5% there, -3 to -8% with many:
    # docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md)
    dn = lower(S.deltanet(), 128, 128, "bfloat16", "chunk", False)
    for shape, chunk in (({"N": 2, "HV": 16}, 64), ({"N": 1, "HV": 96}, 32), (None, 32)):
        assert trains_on_64_row_chunks(dn, shape) == (chunk == 64)
        b = default_config("chunk_bwd", dn, shape)
        assert default_train_config(dn, shape).chunk_size == b.chunk_size == chunk, shape
        assert b.state_num_warps == 4 and b.folds_intra(dn)
    kda = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    others = [lower(S.gdn(S.gate_direct(None)), 128, 128, dt, "chunk", False) for dt in ("float16", "float32")]
    others += [lower(S.deltanet(), 128, 128, "float16", "chunk", False), kda,
               lower(gdn_spec(True, True), 128, 128, "bfloat16", "chunk", True),
               lower(S.gdn(S.gate_direct(None)), 256, 256, "bfloat16", "chunk", False)]
    for plan in others:
        for shape in ({"N": 1, "HV": 96}, {"N": 2, "HV": 16}):
            assert not trains_on_64_row_chunks(plan, shape), (plan.spec_name, plan.dtype, plan.K)
            b = default_config("chunk_bwd", plan, shape)
            assert default_train_config(plan, shape).chunk_size == b.chunk_size == 32, (plan.spec_name, shape)
            assert b.state_num_warps == 4


def test_gated_deltanets_bf16_inference_forward_takes_32_row_chunks_with_many_state_programs():
    """docs/decisions/0005-gdn-inference-32-row-chunks.md: a scalar decay's bf16 inference forward is
    faster on 32-row chunks once the state pass has more programs than one per SM (192 and up: 2.6-11%),
    slower with fewer (128: +23%).  The in-kernel gate's plan follows; KDA, DeltaNet, fp16 and an unknown
    shape keep 64 rows; the pass keeps its prefetch (only the packed-short-sequence rule turns it off)."""
    from kdagen.cache.heuristics import SCALAR_DECAY_C32_PROGRAMS, infers_on_32_row_chunks
    from kdagen.ops.family import gdn_spec

    gdn = lower(S.gdn(S.gate_direct(None)), 128, 128, "bfloat16", "chunk", False)
    layer = lower(gdn_spec(True, True), 128, 128, "bfloat16", "chunk", True)
    many, few = {"N": 1, "HV": 96, "T": 8192}, {"N": 2, "HV": 16, "T": 16384}
    for plan in (gdn, layer):
        assert infers_on_32_row_chunks(plan, many) and not infers_on_32_row_chunks(plan, few)
        c = default_chunk_config(plan, many)
        assert (c.chunk_size, c.state_prefetch, c.state_block_v, c.state_segment_chunks) == (32, True, 32, 0)
        assert default_chunk_config(plan, few).chunk_size == 64 and default_chunk_config(plan).chunk_size == 64
    # the threshold: 4 V tiles of 32 per head at V=128
    heads = SCALAR_DECAY_C32_PROGRAMS // 4
    assert default_chunk_config(gdn, {"N": 1, "HV": heads, "T": 8192}).chunk_size == 32
    assert default_chunk_config(gdn, {"N": 1, "HV": heads - 1, "T": 8192}).chunk_size == 64
    kda = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    for plan in (kda, lower(S.deltanet(), 128, 128, "bfloat16", "chunk", False),
                 lower(S.gdn(S.gate_direct(None)), 128, 128, "float16", "chunk", False)):
        assert default_chunk_config(plan, many).chunk_size == 64, (plan.spec_name, plan.dtype)


@pytest.mark.parametrize("layer", [False, True], ids=["g-given", "layer-call"])
def test_the_32_row_inference_forward_matches_the_recurrence(layer):
    """The config the heuristic gives at many state programs (32-row chunks, the pass prefetching), run
    in the interpreter (fp32; varlen with sequences of 0, 1, 19 and 33 tokens, GVA, an initial state)
    against the float64 recurrence; with ``layer`` FLA's in-kernel gate and l2-norm on raw q and k."""
    import torch

    import kdagen
    from kdagen.ops.family import gdn_spec
    from kdagen.spec.reference import naive_recurrent_gdn

    plan = lower(gdn_spec(True, True) if layer else S.gdn(S.gate_direct(None)), 128, 128, "bfloat16", "chunk", layer)
    cfg = default_chunk_config(plan, {"N": 1, "HV": 96, "T": 8192})
    assert cfg.chunk_size == 32 and cfg.state_prefetch
    gen = torch.Generator().manual_seed(5)
    T, H, HV, K, V = 53, 1, 2, 32, 48
    cu = torch.tensor([0, 0, 1, 20, 53])
    q, k = torch.randn(1, T, H, K, generator=gen), 2 * torch.randn(1, T, H, K, generator=gen)
    if not layer:
        k = torch.nn.functional.normalize(k, dim=-1)
    v, beta = torch.randn(1, T, HV, V, generator=gen), torch.rand(1, T, HV, generator=gen)
    z = torch.randn(1, T, HV, generator=gen)
    h0 = 0.3 * torch.randn(4, HV, K, V, generator=gen)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, config=cfg)
    if layer:
        A_log, dt_bias = torch.log(1 + 3 * torch.rand(HV, generator=gen)), 0.5 * torch.randn(HV, generator=gen)
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=True)
        g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(z.double() + dt_bias.double())
        qr, kr = (torch.nn.functional.normalize(t.double(), dim=-1) for t in (q, k))
    else:
        g = torch.nn.functional.logsigmoid(z.double())
        z = g.float()
        qr, kr = q.double(), k.double()
    with torch.no_grad():
        o, ht = kdagen.chunk_gated_delta_rule(q, k, v, z, beta, **kw)
    ro, rs = naive_recurrent_gdn(qr, kr, v.double(), g, beta.double(), initial_state=h0.double(),
                                 output_final_state=True, cu_seqlens=cu)
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    assert rel(o, ro) < 1e-5 and rel(ht, rs) < 1e-5


def test_a_v_first_fp32_state_takes_narrower_tiles_with_few_pairs():
    """KDA on a [V, K] float32 state (docs/decisions/0025-decode-vk-pool.md): 4-wide tiles on one warp at
    B=1 (32 pairs), 8-wide at B=16 (512 pairs), and the [K, V] choice (64 / 2) with many pairs; other
    structures, and [K, V] states, as before."""
    kda = lower(select_spec(False, False, None, False, False), 128, 128, "bfloat16", "recurrent", False)
    got = lambda plan, n, vf: default_recurrent_config(plan, "float32", {"N": n, "HV": 32, "state_v_first": vf})  # noqa: E731
    pick = lambda c: (c.block_v, c.num_warps, c.readout, c.programs_per_sm)  # noqa: E731
    assert pick(got(kda, 1, True)) == (4, 1, "loaded", 0) and pick(got(kda, 1, False)) == (16, 1, "loaded", 0)
    assert pick(got(kda, 16, True)) == (8, 1, "loaded", 0) and pick(got(kda, 16, False)) == (32, 1, "loaded", 0)
    assert got(kda, 256, True) == got(kda, 256, False) and pick(got(kda, 256, True)) == (64, 2, "loaded", 0)
    # a half-width pool keeps its own choice in either layout
    assert (default_recurrent_config(kda, "bfloat16", {"N": 256, "HV": 32, "state_v_first": True})
            == default_recurrent_config(kda, "bfloat16", {"N": 256, "HV": 32}))
    for member in ("dplr", "gdn"):  # (unmeasured on [V, K]: their [K, V] choices)
        plan = lower(MEMBERS[member](), 128, 128, "bfloat16", "recurrent")
        assert got(plan, 1, True) == got(plan, 1, False) and got(plan, 16, True) == got(plan, 16, False)


def test_a_v_first_fp32_pool_on_the_slot_grid_takes_lean_eight_row_tiles():
    """KDA's fp32 pool laid out [V, K] with many pairs, where a decode step's call (no more tokens than
    sequences, packed or batch) runs on the slot grid (a pool of at most twice the sequences): 8-row tiles on one
    warp with the lean body, no register cap (docs/decisions/0026-lean-decode-step-vk-fp32.md: on an H200
    97.1-97.4% of copy uncapped against 96.4-96.5% under 72); with more tokens than sequences (row 0 would
    run the longer items one at a time), without a pool, with one too large for the slot grid, on a [K, V]
    pool or with a K the tile does not cover whole, not."""
    kda = lower(select_spec(False, False, None, False, False), 128, 128, "bfloat16", "recurrent", False)

    def got(n, vf, P, plan=kda, B=1, T=None):  # packed by default: B=1, T = n tokens
        return default_recurrent_config(plan, "float32", {"N": n, "HV": 32, "state_v_first": vf, "P": P,
                                                          "B": B, "T": n if T is None else T})
    pick = lambda c: (c.block_v, c.num_warps, c.readout, c.lean)  # noqa: E731
    lean = (8, 1, "loaded", True)
    assert pick(got(256, True, 260)) == lean and pick(got(256, True, 512)) == lean
    assert pick(got(256, True, 260, B=256, T=1)) == lean  # the batch form's decode step
    assert pick(got(256, True, 260, T=200)) == lean  # fewer tokens than sequences (some items empty)
    for n, vf, P, B, T in ((256, True, 0, 1, 256), (256, True, 513, 1, 256), (256, False, 260, 1, 256),
                           (16, True, 20, 1, 16), (256, True, 260, 1, 257), (256, True, 260, 1, 1024),
                           (256, True, 260, 256, 2)):
        assert not got(n, vf, P, B=B, T=T).lean, (n, vf, P, B, T)
    assert pick(got(256, True, 0)) == (64, 2, "loaded", False)
    assert pick(got(256, True, 260, T=1024)) == (64, 2, "loaded", False)  # a prefill's call: not lean
    odd = lower(select_spec(False, False, None, False, False), 96, 128, "bfloat16", "recurrent", False)
    assert pick(got(256, True, 260, odd)) == (8, 1, "loaded", False)  # K=96 in a 128-wide tile: the general body
    wide = lower(select_spec(False, False, None, False, False), 256, 128, "bfloat16", "recurrent", False)
    assert not got(256, True, 260, wide).lean
    gdn = lower(MEMBERS["gdn"](), 128, 128, "bfloat16", "recurrent")
    assert not got(256, True, 260, gdn).lean
