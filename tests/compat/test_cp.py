"""Context parallelism (``cp_context``): the ranks of a gloo group (spawned CPU processes, the
kernels in Triton's interpreter) together give the one-process call's outputs, final states and
every gradient (tokens concatenated over the ranks; the final state and the gradients of the
tensors every rank holds whole -- initial_state, A_log, dt_bias -- summed over them).  One spawn
per group size runs all of its cases; :mod:`cp_worker` is the harness."""
from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

import cp_worker as W
from conftest import TOL, assert_close

import kdagen
from kdagen.ops.cp import split_context

ALL_FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 state_v_first=True)


def _cases(world):
    """Each group size's cases: every chunk op, its in-kernel flags, GVA, initial and final states,
    sequence boundaries on and off the rank edges, sequences over several ranks, empty ranks,
    ranks of fewer tokens than a chunk, zero-length sequences, FLA's context object, inference,
    fixed-length batches of several rows."""
    if world == 2:
        return [
            # KDA, every flag, GVA, a boundary exactly on the rank edge
            W.make_case("chunk_kda", [48, 30, 18], seed=1, HV=4, h0=True, final=True, flags=ALL_FLAGS),
            W.make_case("chunk_gated_delta_rule", [70, 26], seed=2, HV=4, h0=True, final=True, flags=ALL_FLAGS),
            # FLA's context object (no initial/final state there), an inference call
            W.make_case("chunk_kda", [20, 76], seed=3, fla_context=True),
            W.make_case("chunk_kda", [60, 36], seed=4, h0=True, final=True, grad=False),
            # refusals raised on every rank (rank 1 breaks its call), none hanging
            W.make_case("chunk_kda", [50, 46], seed=5, mutate="V"),
            W.make_case("chunk_gated_delta_rule", [50, 46], seed=5, mutate="cu_seqlens"),
            W.make_case("chunk_kda", [50, 46], seed=5, mutate="shape"),
            W.make_case("chunk_kda", [50, 46], seed=5, mutate="nan", flags=dict(check_inputs=True)),
            # the same refusal in an inference call, where rank 1 (continuing a sequence) runs in two phases
            W.make_case("chunk_kda", [50, 46], seed=5, mutate="nan", flags=dict(check_inputs=True), grad=False),
            W.make_case("chunk_kda", [50, 46], seed=5, mutate="context"),
            W.make_case("chunk_kda", [50, 46], seed=5, mutate="rows"),
            # a fixed-length batch: every row split over the ranks, every flag, GVA
            W.make_case("chunk_kda", [80], seed=13, batch=2, HV=4, h0=True, final=True, flags=ALL_FLAGS),
        ]
    if world == 3:
        return [
            # one sequence over every rank (the middle rank's transition), gates at the bound
            W.make_case("chunk_kda", [96], seed=6, h0=True, final=True, gate="bound",
                        flags=dict(safe_gate=True, lower_bound=-5.0)),
            # a first rank of 5 tokens (part of one chunk), DeltaNet with GVA
            W.make_case("chunk_delta_rule", [10, 86], seed=7, HV=4, h0=True, final=True, rank_lengths=[5, 60, 31]),
            W.make_case("chunk_gla", [50, 46], seed=8, K=32, V=16, h0=True, final=True),
            # an inference call whose rank 1 is refused while rank 2 runs in two phases: the refusal reaches
            # rank 2 through the one collective, entered inside its op's forward, and nothing waits
            W.make_case("chunk_kda", [96], seed=5, mutate="nan", flags=dict(check_inputs=True), grad=False),
            # the widened call as two calls ([v] and [0]: V + K above the op's head-dim limit)
            W.make_case("chunk_kda", [8, 88], seed=12, HV=4, h0=True, final=True, split_wide=True,
                        flags=ALL_FLAGS),
        ]
    return [
        # an empty rank inside a sequence, a zero-length sequence, uneven ranks
        W.make_case("chunk_kda", [20, 0, 50, 26], seed=9, HV=4, h0=True, final=True, rank_lengths=[33, 0, 40, 23],
                    flags=ALL_FLAGS),
        W.make_case("chunk_dplr_delta_rule", [96], seed=10, h0=True, final=True, rank_lengths=[30, 0, 40, 26]),
        W.make_case("chunk_gated_delta_rule", [7, 60, 29], seed=11, rank_lengths=[0, 40, 56, 0], final=True),
        # a fixed-length batch of three rows over uneven ranks, one empty and one of part of a chunk
        W.make_case("chunk_gla", [72], seed=14, batch=3, h0=True, final=True, rank_lengths=[36, 0, 5, 31]),
    ]


EXPECTED = {"V": "disagree on V", "cu_seqlens": "disagrees with cp_context.cu_seqlens",
            "shape": "per-token input", "nan": "NaN",
            "context": "built for rank 0 of 2", "rows": "needs a context built from one row's offsets"}


@pytest.mark.slow  # spawned processes, each running the interpreter
@pytest.mark.parametrize("world", [2, 3, 4])
def test_context_parallel_ranks_give_the_one_process_call(world, tmp_path):
    cases = _cases(world)
    refs = [None if c["mutate"] else W.reference(c) for c in cases]
    torch.save(cases, tmp_path / "cases.pt")
    env = {"KDAGEN_CACHE_DIR": os.environ["KDAGEN_CACHE_DIR"]}
    mp.spawn(W.worker, args=(world, str(tmp_path / "init"), str(tmp_path / "cases.pt"), str(tmp_path)),
             nprocs=world)
    os.environ.update(env)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for i, case in enumerate(cases):
        what = f"{case['op']} case {i}"
        if case["mutate"]:
            errors = [p[i]["error"] for p in per_rank]
            assert all(e is not None for e in errors), f"{what}: some rank returned instead of raising: {errors}"
            if case["mutate"] == "rows":  # refused on every rank alike
                assert all(EXPECTED["rows"] in e for e in errors), errors
                continue
            assert EXPECTED[case["mutate"]] in errors[1], f"{what}: rank 1 said {errors[1]!r}"
            others = {"V": EXPECTED["V"], "nan": "call on rank(s) [1]"}.get(case["mutate"], "rank(s) [1]")
            assert all(others in e for r, e in enumerate(errors) if r != 1), errors
            continue
        got = W.gather([p[i] for p in per_rank])
        if case["grad"]:  # the training case's inference twin: the same outputs and final states
            refs[i].update(o_inf=refs[i]["o"], ht_inf=refs[i]["ht"])
        for key, ref in refs[i].items():
            if ref is None:
                assert got.get(key) is None, f"{what}: {key} should be None"
                continue
            assert got[key] is not None, f"{what}: no {key}"
            assert_close(got[key], ref, 2 * TOL[torch.float32], f"{what}: {key}")
        if case["final"]:  # each final state comes from exactly one rank
            owners = (torch.stack([p[i]["ht"].flatten(1).abs().sum(1) > 0 for p in per_rank]).sum(0))
            assert owners.tolist() == [1] * len(owners), f"{what}: final-state rows per rank {owners.tolist()}"


def test_build_cp_context_splits_like_fla_and_refuses_without_a_group():
    cu = torch.tensor([0, 20, 20, 70, 96])
    with pytest.raises(ValueError, match="process group"):
        kdagen.build_cp_context(cu)
    got = [split_context(cu.tolist(), r, 4, [33, 0, 40, 23]) for r in range(4)]
    got = [(c["cu_seqlens"], c["pre_num_ranks"], c["post_num_ranks"], c["seq_ids"], c["final_empty"],
            c["is_first_rank"], c["is_last_rank"]) for c in got]
    assert got == [([0, 20, 33], 0, 2, (0, 2), (1,), True, False),
                   ([0], 0, 0, (), (), True, True),
                   ([0, 37, 40], 2, 1, (2, 3), (), False, False),
                   ([0, 23], 1, 0, (3,), (), False, True)]
    # FLA's equal split: 96 tokens over 4 ranks of 24
    even = [split_context(cu.tolist(), r, 4) for r in range(4)]
    assert [c["cu_seqlens"] for c in even] == [[0, 20, 24], [0, 24], [0, 22, 24], [0, 24]]
    assert [(c["pre_num_ranks"], c["post_num_ranks"], c["pre_num_conv_tokens"]) for c in even] == \
        [(0, 2, 0), (1, 1, 4), (2, 1, 28), (1, 0, 2)]
    assert [c["final_empty"] for c in even] == [(1,), (), (), ()]
    with pytest.raises(ValueError, match="multiple"):
        split_context([0, 10], 1, 4)
    with pytest.raises(ValueError, match="rank_lengths"):
        split_context(cu.tolist(), 0, 4, [50, 50, 0, -4])


def test_an_op_under_a_context_without_a_process_group_is_a_value_error():
    x = W.make_case("chunk_kda", [16])["x"]
    ctx = kdagen.CPContext(cu_seqlens=torch.tensor([0, 16]), pre_num_ranks=0, post_num_ranks=0)
    for op, args in (("chunk_kda", (x["q"], x["k"], x["v"], x["g"], x["beta"])),
                     ("chunk_gated_delta_rule", (x["q"], x["k"], x["v"], x["g"][..., 0], x["beta"])),
                     ("chunk_delta_rule", (x["q"], x["k"], x["v"], x["beta"])),
                     ("chunk_gla", (x["q"], x["k"], x["v"], x["g"]))):
        with pytest.raises(ValueError, match="process group"):
            getattr(kdagen, op)(*args, cp_context=ctx)
    with pytest.raises(ValueError, match="build_cp_context"):
        kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], cp_context=object())


@pytest.mark.slow
def test_the_gpu_bench_parses_and_runs_its_cpu_dry_run(tmp_path):
    """tests/gpu/cp_bench.py (run on a GPU by hand) imports, parses its arguments and runs one
    tiny case in the interpreter, writing its JSON."""
    import importlib.util
    import json
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "gpu", "cp_bench.py")
    spec = importlib.util.spec_from_file_location("cp_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.parse([])
    assert (args.T, args.H, args.K, args.V, args.splits) == (1 << 20, 32, 128, 128, "2,4,8")
    out = bench.main(["--T", "64", "--H", "2", "--K", "16", "--V", "16", "--splits", "2", "--mode", "fwd",
                      "--out", str(tmp_path)])
    (row,) = out["rows"]
    assert row["cp"] == 2 and row["rank_ms"] > 0 and row["collective_bytes"] == 4 * 2 * 2 * 16 * 32
    assert json.load(open(tmp_path / "cp_bench.json"))["rows"][0]["cp"] == 2


@pytest.mark.parametrize("dtype,eps", [(torch.float32, 2.0 ** -23), (torch.float16, 2.0 ** -10),
                                       (torch.bfloat16, 2.0 ** -7)])
@pytest.mark.parametrize("B", [1, 3])
def test_the_first_sequences_outputs_are_corrected_within_the_dtypes_rounding(dtype, eps, B):
    """A rank that continues a sequence forms its outputs as o(0) + Q h from the widened call's [o(0) | Q] and the
    chained start state h (float32): in half precision through one batched GEMM per row (h rounded to the dtype,
    as the kernels round the state for their products).  Each element is within a few roundings of the exact sum
    of the rounded inputs, relative to the magnitudes summed, and the result is laid out as the op returns o."""
    from kdagen.ops.cp import corrected_outputs
    g = torch.Generator().manual_seed(B)
    T, HV, K, V = 37, 4, 16, 24
    ow = torch.randn(B, T, HV, V + K, generator=g).to(dtype)
    h = torch.randn(B, HV, K, V, generator=g)
    got = corrected_outputs(ow, h, V)
    assert got.dtype == dtype and got.shape == (B, T, HV, V) and got.is_contiguous()
    o0, Q = ow[..., :V].double(), ow[..., V:].double()
    exact = o0 + torch.einsum("bthk,bhkv->bthv", Q, h.double())
    scale = o0.abs() + torch.einsum("bthk,bhkv->bthv", Q.abs(), h.double().abs())
    # h's rounding (one eps per product), the accumulation's (fp32) and the output's: 3 eps of the magnitudes
    assert ((got.double() - exact).abs() <= 3 * eps * scale + 1e-30).all(), ((got.double() - exact).abs() / scale).max()


def _two_phase(op, split, args, h0, cu, **kw):
    """One inference call of ``op`` (optionally as the two-phase rank ``split``): (o, final states)."""
    import contextlib
    from kdagen.ops.cp import rank_split
    with torch.no_grad(), (rank_split(split) if split is not None else contextlib.nullcontext()):
        return getattr(kdagen, op)(*args, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                   cu_seqlens_cpu=cu, **kw)


# every layout for a per-channel and a per-row decay; the members without a decay or a rank-1 part (their own
# branches of the piece launch) on one sequence, whole and in segments
TWO_PHASE_CASES = ([(op, layout, seg) for op in ("chunk_kda", "chunk_gated_delta_rule")
                    for layout in ("one", "last", "rows") for seg in (0, 2)]
                   + [(op, "one", seg) for op in ("chunk_delta_rule", "chunk_gla") for seg in (0, 2)])


@pytest.mark.parametrize("op,layout,segments", TWO_PHASE_CASES)
def test_a_rank_continuing_a_sequence_runs_its_forward_in_two_phases(op, layout, segments):
    """An inference call of a rank that continues a sequence (kdagen.ops.cp.RankSplit), in one process with
    the collective stubbed: the op's forward hands over the end state from a zero start E and the transition
    M of the sequences named -- the whole local sequence ('one'), the last of several ('last'), every row of a
    fixed-length batch ('rows'); with ``segments``, under the sequence-parallel pass (segments of two chunks of
    32, folded into each sequence's pieces, an odd count among them) -- and its outputs and final states are the
    ordinary call's from the start state(s) the stub returns.  E and M are checked against the ordinary call's
    final states, which are affine in the start state: f(h) = M h + E (E from a zero start; M on the start that
    call ran from)."""
    from kdagen.config import ChunkFwdConfig
    from kdagen.ops.cp import RankSplit
    lengths, batch, seqs = {"one": ([150], 1, (0,)), "last": ([21, 80, 70], 1, (2,)), "rows": ([100], 2, None)}[layout]
    kw = dict(config=ChunkFwdConfig(chunk_size=32, state_segment_chunks=segments)) if segments else {}
    case = W.make_case(op, lengths, h0=True, batch=batch, K=16, V=24, seed=len(lengths) + batch)
    x = case["x"]
    if "g" in x:  # decays weak enough that the start state still reaches the end (M well above rounding)
        x["g"] = x["g"] * 0.02
    args = [x[n] for n in ("q", "k", "v") + W.OPS[op]]
    cu = None if batch > 1 else case["cu"]
    own = x["initial_state"].float()
    g = torch.Generator().manual_seed(7)
    start = torch.randn(own[:batch].shape, generator=g) * 0.5  # what the stubbed collective answers
    seen = {}

    def publish(he, hm):
        seen.update(he=he.clone(), hm=hm.clone())
        return start
    h0 = own.clone()
    h0[:batch] = 0  # the continued sequence's (every row's) start: not known before the collective
    split = RankSplit(seqs, batch > 1, publish)
    o, ht = _two_phase(op, split, args, h0, cu, **kw)
    assert split.used and split.shared is start
    want = own.clone()
    want[:batch] = start
    ro, rht = _two_phase(op, None, args, want, cu)
    tol = 2 * TOL[torch.float32]
    assert_close(o, ro, tol, f"{op} {layout}: o")
    assert_close(ht, rht, tol, f"{op} {layout}: final states")
    _, f0 = _two_phase(op, None, args, torch.zeros_like(own), cu)
    for j, s in enumerate(range(batch) if seqs is None else seqs):
        assert_close(seen["he"][j], f0[s], tol, f"{op} {layout}: E of sequence {s}")
        assert_close(seen["hm"][j] @ want[s], rht[s] - f0[s], tol, f"{op} {layout}: M of sequence {s}")


def test_a_forward_that_cannot_run_in_two_phases_refuses_before_anything_runs():
    """An inference call on the training forward's launches (a member at chunk length 16) cannot split its
    pass from its solve: it raises NotSplit before the collective (run_cp then takes the widened call)."""
    from kdagen.ops.cp import NotSplit, RankSplit
    case = W.make_case("chunk_gated_delta_rule", [40], h0=True)
    x = case["x"]
    args = [x[n] for n in ("q", "k", "v") + W.OPS["chunk_gated_delta_rule"]]
    called = []
    split = RankSplit((0,), False, lambda he, hm: called.append(1))
    with pytest.raises(NotSplit):
        _two_phase("chunk_gated_delta_rule", split, args, x["initial_state"], case["cu"], chunk_size=16)
    assert split.used and not called
