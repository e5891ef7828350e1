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
from kdagen.config import ChunkFwdConfig, RecurrentConfig
from kdagen.ops.inputs import select_spec

ROOT = Path(__file__).resolve().parents[2]
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
    assert names == ["0004-sequence-parallel-segment-pass.md"]  # the one departure from the defaults
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


def test_a_winner_is_found_by_calls_of_its_value_heads_and_an_older_one_by_any():
    """The heuristics branch on the state-pass programs (sequences x value heads x tiles): a chunk call's bucket
    carries its value heads (rounded up to a power of two), so a winner timed at 16 heads is not served to
    a call of 64; a winner stored before the heads were keyed is found by a call of any count."""
    call = {"T": 8192, "B": 1, "N": 1}
    assert keys.call_bucket("chunk_fwd", dict(call, HV=16)) == "t8192_s1_h16"
    assert keys.call_bucket("chunk_fwd", dict(call, HV=12)) == "t8192_s1_h16"
    assert keys.call_bucket("chunk_fwd", dict(call, HV=16), heads=False) == "t8192_s1"
    assert keys.lookup_buckets("chunk_fwd", dict(call, HV=16)) == [True, False]
    assert keys.lookup_buckets("chunk_fwd", call) == [False]
    # the decode step's too (its heuristic counts (sequence, value head) pairs), before the layout and step
    assert keys.call_bucket("recurrent", {"T": 1, "B": 48, "N": 48, "HV": 32, "state_v_first": True}) == "s64_h32_vk"
    assert keys.call_bucket("recurrent", {"T": 1, "B": 48, "N": 48, "HV": 32}, heads=False) == "s64"
    assert keys.lookup_buckets("recurrent", {"T": 1, "B": 48, "N": 48, "HV": 32}) == [True, False]


@pytest.mark.parametrize("stored", ["heads", "older"])
def test_the_ops_find_a_winner_of_their_value_heads_or_an_older_one(h200, stored):
    plan = _reference("chunk_fwd")
    call = {"T": 8192, "B": 1, "N": 1, "HV": 16}
    won = ChunkFwdConfig(state_block_v=16, state_num_warps=2)
    key = keys.cache_key(plan, "chunk_fwd", call, h200, heads=stored == "heads")
    TuningCache(h200.name).store(key, make_entry(config=won.to_dict(), kernel="chunk_fwd", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    assert tuned.resolve("chunk_fwd", plan, None, call) == won
    assert tuned.resolve("chunk_fwd", plan, None, dict(call, HV=13)) == won  # the same power of two
    other = dict(call, HV=64)
    want = won if stored == "older" else H.default_chunk_config(plan, other)
    assert (tuned.resolve("chunk_fwd", plan, None, other) == won) == (stored == "older")
    assert tuned.resolve("chunk_fwd", plan, None, other) == want


def test_the_buckets_carry_a_packed_calls_longest_sequence_and_a_pool_steps_slot_grid():
    """The two features the heuristics read besides sequences, tokens, heads, layout and step: the longest
    sequence of a packed forward (the segment pass) where it is not in the mean length's bucket, and whether a
    decode step on a pool goes over its slots (heuristics.slot_grid)."""
    packed = {"T": 16384, "B": 1, "N": 4, "HV": 2}
    assert keys.call_bucket("chunk_fwd", dict(packed, T_max=4096)) == "t16384_s4_h2"  # even: as timed
    assert keys.call_bucket("chunk_fwd", dict(packed, T_max=3000)) == "t16384_s4_h2"  # the same power of two
    assert keys.call_bucket("chunk_fwd", dict(packed, T_max=15000)) == "t16384_s4_h2_l16384"
    assert keys.call_bucket("chunk_fwd", {"T": 4096, "B": 4, "N": 4, "HV": 2, "T_max": 4096}) == "t16384_s4_h2"
    # the training forms' heuristics do not read it
    assert keys.call_bucket("chunk_train", dict(packed, T_max=15000)) == "t16384_s4_h2"
    step = {"T": 1, "B": 256, "N": 256, "HV": 32, "state_v_first": True}
    assert keys.call_bucket("recurrent", dict(step, P=300)) == "s256_h32_vk_grid"
    assert keys.call_bucket("recurrent", dict(step, P=3000)) == "s256_h32_vk"  # too many slots per sequence
    assert keys.call_bucket("recurrent", dict(step, P=0)) == keys.call_bucket("recurrent", step) == "s256_h32_vk"
    assert keys.call_bucket("recurrent", dict(step, B=1, T=512, P=300)) == "s256_h32_vk_tokens"  # not a step


def test_a_winner_timed_at_one_length_is_not_served_to_a_call_packed_around_one_long_sequence(h200):
    """A winner tuned at four sequences of 4096 tokens (no segment pass: 64 chunks each) is found by the same
    tokens packed evenly, but not by a pack whose longest sequence (15,000 tokens, 235 chunks) the heuristic
    gives the sequence-parallel pass."""
    plan = _reference("chunk_fwd")
    timed = {"T": 4096, "B": 4, "N": 4, "HV": 2, "T_max": 4096}
    won = ChunkFwdConfig(state_block_v=16, state_num_warps=2)
    TuningCache(h200.name).store(keys.cache_key(plan, "chunk_fwd", timed, h200),
                                 make_entry(config=won.to_dict(), kernel="chunk_fwd", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    assert tuned.resolve("chunk_fwd", plan, None, timed) == won
    even = {"T": 16384, "B": 1, "N": 4, "HV": 2, "T_max": 4096}
    assert tuned.resolve("chunk_fwd", plan, None, even) == won
    uneven = dict(even, T_max=15000)
    got = tuned.resolve("chunk_fwd", plan, None, uneven)
    assert got == H.default_chunk_config(plan, uneven) and got.state_segment_chunks > 0


def test_a_decode_winner_timed_off_the_slot_grid_is_not_served_to_a_step_on_it(h200):
    """KDA's fp32 [V, K] pool: a step of 256 sequences x 32 heads over 300 slots takes the slot grid (lean 8-row
    tiles); a winner timed without a pool is found by the step over 3,000 slots (the batch grid) only."""
    plan = _reference("recurrent")
    step = {"T": 1, "B": 256, "N": 256, "HV": 32, "state_v_first": True}
    won = RecurrentConfig(block_v=32, num_warps=4, readout="updated")
    TuningCache(h200.name).store(keys.cache_key(plan, "recurrent", step, h200),
                                 make_entry(config=won.to_dict(), kernel="recurrent", time_ms=0.01, error=0.0))
    tuned._MEMO.clear()
    assert tuned.resolve("recurrent", plan, None, dict(step, P=3000)) == won
    grid = dict(step, P=300)
    got = tuned.resolve("recurrent", plan, None, grid)
    assert got == H.default_recurrent_config(plan, "float32", grid) and got.lean and got.block_v == 8


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
    for hv in (4, 32):  # written before the value heads were keyed: found by a step of any count
        assert tuned.resolve("recurrent", plan, None, {"T": 1, "B": 8, "N": 8, "HV": hv}) == won
    assert tuned.resolve("recurrent", plan, None, {"T": 1, "B": 8, "N": 8, "state_v_first": True}) != won


def test_the_tuner_records_the_layout_and_step_it_times():
    from kdagen.tuning.driver import tuning_shapes

    got = tuning_shapes("recurrent", 64, [], [1, 16, (4, 64), (8, 12)])
    assert [shape for shape, _ in got] == [(1, 1, 32, 32), (16, 1, 32, 32), (4, 1, 64, 64), (8, 1, 12, 12)]
    for (B, _, _, HV), hint in got:  # a batch alone on 32 value heads, a (batch, heads) pair on its own
        assert hint["state_v_first"] is False and hint["B"] * hint["T"] <= hint["N"] and hint["HV"] == HV
        heads = 1 << (HV - 1).bit_length()
        assert keys.call_bucket("recurrent", hint) == keys.shape_bucket("recurrent", 1, B, B) + f"_h{heads}"


def _reference(family):
    """The reference call: KDA (g given, bound -5) in bf16 at K=V=128, no shape (an fp32 decode state)."""
    form = "recurrent" if family == "recurrent" else "chunk"
    return lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", form, False)


@pytest.mark.parametrize("family", sorted(H.RULES))
def test_dataclass_defaults_are_the_heuristic_for_the_reference_call(family):
    """Each config dataclass's field defaults are its family's heuristic config for the reference call, which
    no rule matches: the rules are departures from the defaults (kdagen/cache/heuristics.py's docstring)."""
    from kdagen.config import CONFIG_TYPES

    plan = _reference(family)
    assert H.default_config(family, plan) == CONFIG_TYPES[family]()
    assert H.applied(family, H.Features.of(plan)) == []


def test_the_recurrent_backward_default_is_its_dataclass_default():
    from kdagen.config import RecurrentBwdConfig
    from kdagen.ops.recurrent_bwd import current_config

    assert current_config(_reference("recurrent")) == RecurrentBwdConfig()


def test_fp32_departs_to_the_plain_kernels():
    """fp32 KDA at K=V=128: the rules for fp32 inputs take the training forward and the backward back to the
    plain kernels (O from the state pass, loads where first read, one intra gradient launch, exact dots), on
    the tiles K=V=128 takes; the forward and the decode step keep the defaults."""
    from plain_configs import plain_bwd, plain_train

    plan = lower(select_spec(False, True, -5.0, False, False), 128, 128, "float32", "chunk", False)
    assert H.default_train_config(plan) == plain_train(intra_block_k=128, state_block_v=32, state_num_warps=2)
    assert H.default_chunk_bwd_config(plan) == plain_bwd()
    assert H.default_chunk_config(plan) == ChunkFwdConfig()
    rec = lower(select_spec(False, True, -5.0, False, False), 128, 128, "float32", "recurrent", False)
    assert H.default_recurrent_config(rec) == RecurrentConfig()


def _grid():
    """Features over members, head dims, dtypes, state dtypes and call shapes: the calls the rules tell apart."""
    from kdagen.ops.family import gdn_spec
    from kdagen.spec import get_spec

    members = [(select_spec(False, True, -5.0, False, False), False), (select_spec(False, False, None, False, False),
                                                                       False),
               (select_spec(True, True, -5.0, True, True), True), (get_spec("gdn"), False), (gdn_spec(True, True), True),
               (get_spec("deltanet"), False), (get_spec("gla"), False), (get_spec("gla", lower_bound=-5.0), False),
               (get_spec("dplr"), False)]
    shapes = [None, {"N": 1, "HV": 4, "T": 8192, "B": 1}, {"N": 16, "HV": 32, "T": 4096, "B": 16},
              {"N": 1, "HV": 2, "T": 262144, "B": 1, "T_max": 262144}, {"N": 64, "HV": 32, "T": 32768, "B": 1},
              {"N": 1, "HV": 8, "T": 1, "B": 1}, {"N": 8, "HV": 32, "T": 1, "B": 8},
              {"N": 8, "HV": 32, "T": 1, "B": 8, "state_v_first": True},
              {"N": 256, "HV": 32, "T": 1, "B": 256, "P": 300, "state_v_first": True},
              {"N": 1024, "HV": 32, "T": 1, "B": 1024}]
    for spec, gik in members:
        for K, V in ((16, 16), (64, 64), (128, 128), (256, 256), (512, 512)):
            for dt in ("bfloat16", "float16", "float32"):
                for form in ("chunk", "recurrent"):
                    try:
                        plan = lower(spec, K, V, dt, form, gik)
                    except Exception:  # noqa: BLE001 -- a member's head-dim limits
                        continue
                    for shape in shapes:
                        for sd in (("float32", "bfloat16") if form == "recurrent" else ("float32",)):
                            for chunking in (H.TRAIN_CHUNKING, H.LONG_CHUNKING):
                                yield form, H.Features.of(plan, shape, sd, chunking)


def test_every_rule_is_taken_somewhere():
    """No rule is dead: each matches some call of the grid (a recurrent rule: is the first to match)."""
    taken = set()
    for form, f in _grid():
        fams = ("recurrent",) if form == "recurrent" else ("chunk_fwd", "chunk_train", "chunk_bwd")
        for fam in fams:
            if fam == "chunk_fwd" and f.dplr:
                continue
            taken.update(id(r) for r in H.applied(fam, f))
    dead = [(fam, r.name) for fam, (_, table, _) in H.RULES.items() for r in table if id(r) not in taken]
    assert not dead


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


@pytest.mark.parametrize("shape", [(1, 8192, 16, 128), (2, 16384, 16, 128), (4, 4096, 32, 128), (16, 2048, 64, 64)])
def test_the_config_tuned_against_and_kept_at_a_tuning_shape_is_the_one_the_op_runs_there(h200, shape):
    """`kdagen build` keeps (and the tuner times as its default) the heuristic config at each tuning shape's
    call shape: it must be what chunk_kda and fused_recurrent_kda resolve at that shape, or a first call
    compiles other kernels than the kept ones (a call shape without the value heads gave the backward's
    reverse pass 3 stages where the op, seeing few state programs, runs 4)."""
    import torch

    from kdagen.ops.chunk import prepare_kda
    from kdagen.ops.chunk_call import chunk_configs
    from kdagen.ops.inputs import check_inputs
    from kdagen.tuning.driver import tuning_shapes

    B, T, heads, K = shape
    bf = torch.bfloat16
    plan = lower(select_spec(False, True, -5.0, False, False), K, K, "bfloat16", "chunk", False)
    x = [torch.empty(B, T, heads, K, dtype=bf) for _ in range(3)] + [torch.empty(B, T, heads, K),
                                                                     torch.empty(B, T, heads, dtype=bf)]
    call, _ = prepare_kda(*x, safe_gate=True, lower_bound=-5.0, in_kernel=False)
    op_train, op_bwd = chunk_configs(call, None, None, True)
    op_fwd, _ = chunk_configs(prepare_kda(*x, safe_gate=True, lower_bound=-5.0)[0], None, None, False)
    ((_, hint),) = tuning_shapes("chunk_bwd", K, [shape], [])
    fwd = H.default_config("chunk_train", plan, hint)
    assert (fwd, H.default_config("chunk_bwd", plan, hint, fwd).with_chunking(fwd.chunk_size, fwd.sub_chunk)) == \
        (op_train, op_bwd)
    assert H.default_config("chunk_fwd", plan, tuning_shapes("chunk_fwd", K, [shape], [])[0][1]) == op_fwd
    # decode: a step of B sequences on 32 heads from fp32 states
    rplan = lower(select_spec(False, True, -5.0, False, False), K, K, "bfloat16", "recurrent", False)
    ((_, hint),) = tuning_shapes("recurrent", K, [], [B])
    q = torch.empty(B, 1, 32, K, dtype=bf)
    dims, _ = check_inputs(q, q, q, torch.empty(B, 1, 32, K), torch.empty(B, 1, 32, dtype=bf), scale=None,
                           initial_state=torch.empty(B, 32, K, K), cu_seqlens=None)
    assert H.default_config("recurrent", rplan, hint) == tuned.resolve("recurrent", rplan, None,
                                                                      dims.decode_shape(False))
