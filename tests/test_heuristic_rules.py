"""The heuristics as a table (kdagen/cache/heuristics.py): every rule names a decision record that exists,
the thresholds live only in the named constants beside the rules, and the tuning cache's key carries what the
recurrent form's rules branch on (the state's layout, a decode step) so a call finds the winners timed like it."""
import ast
from pathlib import Path

import pytest

import kdagen.cache.keys as keys
import kdagen.cache.lookup as tuned
from kdagen.cache import heuristics as H
from kdagen.cache.gpus import get_profile
from kdagen.cache.store import TuningCache, make_entry
from kdagen.codegen.lower import lower
from kdagen.config import RecurrentConfig
from kdagen.ops.inputs import select_spec

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path(H.__file__)


def test_every_rule_names_an_existing_decision_record():
    records = {p.name for p in (ROOT / "docs" / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md")}
    rules = [r for _, table, _ in H.RULES.values() for r in table]
    assert len(rules) >= 30 and set(H.RULES) == {"chunk_fwd", "chunk_train", "chunk_bwd", "recurrent"}
    for rule in rules:
        assert rule.record in records, (rule.name, rule.record)
        assert rule.name and callable(rule.when) and rule.set


def _numbers(node):
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) in (int, float)]


def test_thresholds_live_only_in_named_constants():
    """No number in a function's body but 0 and 1 (the functions evaluate the table), and no number compared
    with in a rule's predicate but 0: a threshold is a named constant (module level, upper case)."""
    tree = ast.parse(SOURCE.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:
                bad = [n.value for n in _numbers(stmt) if n.value not in (0, 1)]
                assert not bad, f"{node.name}: numbers {bad} (name them beside the rules)"
    tables = [n for n in tree.body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id.endswith("_RULES") for t in n.targets)]
    assert len(tables) == 4
    for table in tables:
        for cmp in (n for n in ast.walk(table) if isinstance(n, ast.Compare)):
            bad = [n.value for n in _numbers(cmp) if n.value != 0]
            assert not bad, f"line {cmp.lineno}: a threshold {bad} compared with in a rule (name it)"
    for node in tree.body:  # the constants are module-level names
        if isinstance(node, ast.Assign) and _numbers(node) and not any(
                isinstance(t, ast.Name) and t.id.endswith("_RULES") for t in node.targets):
            assert all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets), ast.dump(node)[:80]


def test_applied_rules_explain_a_config():
    plan = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)
    names = [r.record for r in H.applied("chunk_fwd", H.Features.of(plan, {"T": 65536, "B": 1, "N": 1, "HV": 8}))]
    assert names[0].startswith("0002") and "0004-sequence-parallel-segment-pass.md" in names
    rec = lower(select_spec(False, False, None, False, False), 128, 128, "float32", "recurrent", False)
    (only,) = H.applied("recurrent", H.Features.of(rec, {"T": 1, "B": 8, "N": 8, "HV": 4}))
    assert only.record == "0022-decode-fp32-tiles-by-pairs.md"


# --------------------------------------------------------------------------- the cache key




def _rec():
    return lower(select_spec(False, False, None, False, False), 64, 64, "float32", "recurrent", False)


def test_the_recurrent_bucket_carries_the_layout_and_the_decode_step():
    step = {"T": 1, "B": 48, "N": 48}
    assert keys.call_bucket("recurrent", step) == keys.shape_bucket("recurrent", 1, 48, 48) == "s64"
    assert keys.call_bucket("recurrent", dict(step, state_v_first=False)) == "s64"  # old caches' buckets
    assert keys.call_bucket("recurrent", dict(step, state_v_first=True)) == "s64_vk"
    assert keys.call_bucket("recurrent", dict(step, T=4)) == "s64_tokens"
    assert keys.call_bucket("recurrent", {"T": 96, "B": 1, "N": 48, "state_v_first": True}) == "s64_vk_tokens"
    # the chunk forms' heuristics read neither: their buckets are unchanged
    assert keys.call_bucket("chunk_fwd", {"T": 4096, "B": 4, "N": 4, "state_v_first": True}) == "t16384_s4"


@pytest.mark.parametrize("stored_v_first", [True, False])
def test_a_winner_is_found_only_by_calls_of_its_state_layout(h200, stored_v_first):
    plan = _rec()
    step = {"T": 1, "B": 8, "N": 8, "HV": 4}
    won = RecurrentConfig(block_v=16, num_warps=2, readout="updated")
    TuningCache(h200.name).store(keys.cache_key(plan, "recurrent", dict(step, state_v_first=stored_v_first), h200),
                                 make_entry(config=won.to_dict(), kernel="recurrent", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    for v_first in (True, False):
        shape = dict(step, state_v_first=v_first)
        want = won if v_first == stored_v_first else H.default_recurrent_config(plan, "float32", shape)
        assert want != won or v_first == stored_v_first
        assert tuned.resolve("recurrent", plan, None, shape) == want, v_first
    # a call with more tokens than sequences is not the decode step the winner was timed on
    more = dict(step, T=4, state_v_first=stored_v_first)
    assert tuned.resolve("recurrent", plan, None, more) == H.default_recurrent_config(plan, "float32", more)


def test_an_old_cache_entry_reads_as_a_k_v_decode_step(h200):
    """A key written before the layout was keyed (bucket "s8") is a [K, V] decode step's winner."""
    plan = _rec()
    won = RecurrentConfig(block_v=16, num_warps=2, readout="updated")
    old = keys.CacheKey.create(kernel="recurrent", spec_hash=plan.tuning_spec_hash,
                               source_hash=keys.source_hash("recurrent"), K=64, V=64, dtype="float32",
                               state_dtype="float32", shape_bucket="s8", gpu=h200)
    TuningCache(h200.name).store(old, make_entry(config=won.to_dict(), kernel="recurrent", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    assert tuned.resolve("recurrent", plan, None, {"T": 1, "B": 8, "N": 8}) == won
    assert tuned.resolve("recurrent", plan, None, {"T": 1, "B": 8, "N": 8, "state_v_first": True}) != won


def test_the_tuner_records_the_layout_and_step_it_times():
    from kdagen.tuning.driver import tuning_shapes

    for shape, hint in tuning_shapes("recurrent", 64, [], [1, 16]):
        assert hint["state_v_first"] is False and hint["B"] * hint["T"] <= hint["N"]
        assert keys.call_bucket("recurrent", hint) == keys.shape_bucket("recurrent", 1, hint["B"], hint["N"])


# The fields where a config dataclass's default differs from the heuristic's config for KDA (g given, bound
# -5) in bf16 at K=V=128 without a shape (an fp32 decode state): construction defaults are not what runs
# (kdagen/cache/heuristics.py's docstring).  A change to either side shows here.
DEFAULT_MISMATCH = {
    "chunk_fwd": {"solve_load_ahead": (0, 2)},
    "chunk_train": {"intra_block_k": (64, 128), "state_block_v": (64, 32), "state_num_stages": (2, 3),
                    "inverse_precision": ("ieee", "tf32"), "diag_precision": ("input", "tf32"),
                    "intra_load_ahead": (False, True), "split_output": (False, True), "out_block_v": (64, 128)},
    "chunk_bwd": {"state_num_stages": (2, 3), "dqkw_block_k": (64, 128), "dqkw_block_v": (32, 64),
                  "intra_block_v": (32, 64), "intra_num_warps": (4, 2), "inverse_precision": ("ieee", "tf32"),
                  "intra_split": (False, True), "diag_precision": ("input", "tf32"), "rerun_num_warps": (4, 1),
                  "state_prefetch": (False, True)},
    "recurrent": {"block_v": (32, 64), "num_warps": (4, 2), "readout": ("updated", "loaded")},
}


@pytest.mark.parametrize("family", sorted(DEFAULT_MISMATCH))
def test_where_dataclass_defaults_differ_from_the_heuristic(family):
    from kdagen.config import CONFIG_TYPES

    form = "recurrent" if family == "recurrent" else "chunk"
    plan = lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", form, False)
    ran, built = H.default_config(family, plan).to_dict(), CONFIG_TYPES[family]().to_dict()
    assert {k: (built[k], ran[k]) for k in built if built[k] != ran[k]} == DEFAULT_MISMATCH[family]


@pytest.mark.parametrize("dtype,expect", [("bfloat16", "tf32"), ("float16", "ieee"), ("float32", "ieee")])
@pytest.mark.parametrize("member", ["kda", "gdn"])
def test_the_training_inverse_is_tf32_only_in_bf16(member, dtype, expect):
    """tf32 dots for the training launches' triangular inverse only where the result is rounded coarser than
    tf32 (bf16): fp16 rounds to tf32's 10 bits, and tf32 dots put its output error above FLA's on
    ill-conditioned keys (docs/decisions/0014-training-inverse-tf32.md)."""
    from kdagen.spec import get_spec
    spec = select_spec(False, True, -5.0, False, False) if member == "kda" else get_spec("gdn")
    plan = lower(spec, 128, 128, dtype, "chunk", False)
    train = H.default_config("chunk_train", plan)
    assert train.inverse_precision == expect
    assert H.default_config("chunk_bwd", plan, train_config=train).inverse_precision == expect
