"""kdagen's tuning driver: stage-separable search of the chunk form (each launch timed
alone, winners combined per chunk length) and the correctness gate, with a fake timer so
it runs without a GPU."""
import torch

from kdagen.cache.heuristics import default_config
from kdagen.tuning import candidates as CA, compile_pool as CP, driver as D, families as F
from kdagen.config import ChunkFwdConfig
from kdagen.cache.gpus import get_profile
from kdagen.cache.heuristics import default_chunk_config, default_train_config
from kdagen.ops.inputs import select_spec
from kdagen.tuning.space import SearchSpace

SPACE = SearchSpace.from_dict({
    "kernel": "chunk_fwd",
    "params": {"chunk_size": [32, 64], "intra_num_warps": [4, 8], "state_block_v": [16, 32]},
    "stages": {"intra": {"launch": "chunk_solve", "fields": ["chunk_size", "intra_num_warps"]},
               "state": {"launch": "chunk_pass", "fields": ["chunk_size", "state_block_v"]}},
})


class FakeCandidate:
    """Times are a made-up function of the fields of the stage being tuned; intra_num_warps=4
    with chunk_size=64 is 'fastest' but numerically wrong and must be rejected."""

    tolerance = 1e-3

    def __init__(self, family, launch, plan, spec_args, dtype, shape, device="cuda", fwd_config=None,
                 state_dtype=None):
        self.stage = {"chunk_solve": "intra", "chunk_pass": "state"}[launch]

    def build(self, config):
        return config

    def check(self, config):  # wrong: 1.0; otherwise a made-up small error that names the config
        if self.stage == "intra":
            return 1.0 if (config.chunk_size, config.intra_num_warps) == (64, 4) else 1e-6 * config.intra_num_warps
        return 1e-7 * config.state_block_v

    def time(self, config):
        if self.stage == "intra":
            return {(32, 4): 3.0, (32, 8): 2.0, (64, 4): 0.1, (64, 8): 2.5}[(config.chunk_size, config.intra_num_warps)]
        return {(32, 16): 1.0, (32, 32): 0.9, (64, 16): 0.2, (64, 32): 0.3}[(config.chunk_size, config.state_block_v)]


def test_stage_candidates_vary_only_their_stage(monkeypatch):
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_fwd", 64, 64, torch.float32)
    ctx = F.space_context(plan, spec, get_profile("h200"), 4)
    d = default_chunk_config(plan)
    intra = F.stage_candidates(SPACE, ctx, "intra", d)
    assert len(intra) == 4 and {c.state_block_v for c in intra} == {d.state_block_v}
    state = F.stage_candidates(SPACE, ctx, "state", d)
    assert len(state) == 4 and {c.intra_num_warps for c in state} == {d.intra_num_warps}


def test_tune_family_combines_the_best_stage_per_chunk_length(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(D, "KernelCandidate", FakeCandidate)
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_fwd", 64, 64, torch.float32)
    winner, ms, default_ms, error, results = D.tune_family("chunk_fwd", plan, spec, {}, get_profile("h200"),
                                                    torch.float32, (1, 256, 1, 1), space=SPACE, progress=False)
    # C=64: intra best *valid* is 8 warps (2.5; 4 warps is wrong), state best 0.2 -> 2.7
    # C=32: intra 2.0 + state 0.9 -> 2.9; so C=64 wins with the correct intra config
    assert isinstance(winner, ChunkFwdConfig)
    assert (winner.chunk_size, winner.intra_num_warps, winner.state_block_v) == (64, 8, 16)
    assert abs(ms - 2.7) < 1e-9
    assert results["intra"].n_rejected >= 1
    # the winner's error is what was measured for the stage configs it combines: the larger
    assert error == max(1e-6 * 8, 1e-7 * 16)


# ------------------------------------------------------------- the real candidate, on CPU

import pytest  # noqa: E402

from kdagen.config import ChunkBwdConfig, RecurrentConfig  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("family,launch,shape", [("chunk_fwd", "chunk_pass", (2, 40, 2, 4)),
                                                 ("chunk_bwd", "chunk_bwd_dqkw", (1, 40, 1, 2)),
                                                 ("chunk_bwd", "chunk_bwd_intra", (2, 40, 2, 4)),
                                                 ("recurrent", None, (3, 1, 2, 2))])
def test_kernel_candidate_checks_the_timed_heads_against_float64(family, launch, shape):
    """build/check of the real candidate (Triton interpreter, fp32): the check shape keeps the
    timed shape's heads (so Triton specialises alike), the default config passes the gate,
    and a wrong answer on a checked head -- only there -- fails it."""
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, family, 16, 16, torch.float32)
    cand = CA.KernelCandidate(family, launch, plan, dict(safe_gate=True, lower_bound=-5.0), torch.float32, shape,
                             device="cpu")
    B, T, H, HV = shape
    assert cand.check_shape[2:] == (H, HV) and cand.check_shape[1] == min(T, F.CHECK_T_MAX)
    default = default_config(family, plan, {"N": B, "HV": HV})
    assert cand.check(cand.build(default)) < cand.tolerance
    sel = CA.check_heads(H, HV)
    unchecked = [h for h in range(HV) if h not in sel]

    def perturb(heads):
        if family == "chunk_bwd":
            real = cand._fwd_bwd

            def wrong(config, x, do, dht):
                got = real(config, x, do, dht)
                got["v"] = got["v"].clone()
                got["v"][:, :, heads] += 1.0
                return got
            return "_fwd_bwd", wrong
        real = cand._fwd

        def wrong(config, x, **kw):
            o, s = real(config, x, **kw)
            o = o.clone()
            o[:, :, heads] += 1.0
            return o, s
        return "_fwd", wrong

    name, fn = perturb(sel[-1:])
    setattr(cand, name, fn)
    assert cand.check(default) > 10 * cand.tolerance
    delattr(cand, name)  # back to the real method
    if unchecked:
        name, fn = perturb(unchecked)
        setattr(cand, name, fn)
        assert cand.check(default) < cand.tolerance


def test_default_for_backward_takes_the_forward_chunk_lengths():
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_bwd", 64, 64, torch.float32)
    fwd = default_chunk_config(plan).replace(chunk_size=64)
    d = default_config("chunk_bwd", plan, None, fwd)
    assert isinstance(d, ChunkBwdConfig) and (d.chunk_size, d.sub_chunk) == (64, fwd.sub_chunk)
    assert isinstance(default_config("recurrent", plan), RecurrentConfig)


@pytest.mark.slow
def test_isolated_staged_tuning_end_to_end_on_cpu(tmp_path, monkeypatch):
    """tune_family as `kdagen build` runs it (every stage measured in one worker process),
    on the interpreter: the backward's three stages are built, checked against float64 and
    'timed', and a winner comes back at the forward's chunk length."""
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_bwd", 16, 16, torch.float32)
    space = SearchSpace.from_dict({"kernel": "chunk_bwd", "params": {"dqkw_block_k": [16]},
                                   "stages": {"state": {"launch": "chunk_bwd_state", "fields": ["state_block_v"]},
                                              "dqkw": {"launch": "chunk_bwd_dqkw", "fields": ["dqkw_block_k"]},
                                              "intra": {"launch": "chunk_bwd_intra", "fields": ["intra_block_k"]}}})
    fwd = default_train_config(plan).replace(chunk_size=16)
    winner, ms, default_ms, error, results = D.tune_family(
        "chunk_bwd", plan, spec, dict(safe_gate=True, lower_bound=-5.0), get_profile("h200"), torch.float32,
        (1, 40, 1, 2), space=space, progress=False, isolate=True, device="cpu", fwd_config=fwd)
    assert isinstance(winner, ChunkBwdConfig) and winner.chunk_size == 16 and winner.dqkw_block_k == 16
    assert set(results) == {"state", "dqkw", "intra"} and ms > 0 and default_ms > 0
    for r in results.values():
        assert r.n_failed == 0 and r.n_rejected == 0 and all(t.error < 1e-4 for t in r.trials)
    measured = {t.config.canonical(): t.error for r in results.values() for t in r.trials}
    parts = [measured[c.canonical()] for c in (winner,) if c.canonical() in measured]
    assert 0 < error < 1e-4 and error >= max(parts, default=0.0)


def _die(*args, **kw):
    import os
    os._exit(5)


@pytest.mark.slow
def test_precompile_survives_a_dying_worker(monkeypatch, capsys):
    """A precompile worker that dies (not a Python error: the process ends) stops the
    precompile pool, not the tuning run."""
    monkeypatch.setattr(CP, "_compile_one", _die)
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_fwd", 16, 16, torch.float32)
    d = default_chunk_config(plan)
    secs = CP.precompile("chunk_fwd", plan, {}, torch.float32, (1, 64, 1, 1), [("intra", d), ("state", d)], jobs=2,
                        gpu=get_profile("h200"))
    assert secs >= 0 and "a worker died" in capsys.readouterr().err


def _record_pid(*args, **kw):
    import os
    from pathlib import Path

    (Path(os.environ["KDAGEN_TEST_PIDS"]) / f"{os.getpid()}-{args[6]['state_block_v']}").touch()


@pytest.mark.slow
def test_a_shared_pool_compiles_every_shape_in_the_same_workers(tmp_path, monkeypatch):
    """`kdagen build` passes one CompilePool to its compile-check and every shape's precompile:
    the same worker processes serve them all (their start-up is paid once); when a worker dies
    the pool is replaced and the next precompile runs in new workers."""
    monkeypatch.setenv("KDAGEN_TEST_PIDS", str(tmp_path))
    monkeypatch.setattr(CP, "_compile_one", _record_pid)
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_fwd", 16, 16, torch.float32)
    d = default_chunk_config(plan)
    h200 = get_profile("h200")

    def pids(bv):
        CP.precompile("chunk_fwd", plan, {}, torch.float32, (1, 64, 1, 1), [("state", d.replace(state_block_v=bv))] * 6,
                     jobs=2, gpu=h200, pool=pool, progress=False)
        return {f.name.split("-")[0] for f in tmp_path.glob(f"*-{bv}")}

    with CP.CompilePool(2) as pool:
        first, second = pids(16), pids(32)
        # no new worker starts (one of the two may serve a whole batch alone)
        assert first and second and second <= first and len(first) <= 2
        monkeypatch.setattr(CP, "_compile_one", _die)
        CP.precompile("chunk_fwd", plan, {}, torch.float32, (1, 64, 1, 1), [("intra", d)] * 2, jobs=2, gpu=h200,
                     pool=pool, progress=False)
        assert pool.replaced == 1
        monkeypatch.setattr(CP, "_compile_one", _record_pid)
        third = pids(64)
        assert third and not third & first


def test_resumed_study_precompiles_only_what_it_will_build(tmp_path, monkeypatch):
    """A second run of the same studies measures nothing again, so it compiles ahead only
    the default and the fastest configs it re-times, and comes to the same winner."""
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(D, "KernelCandidate", FakeCandidate)
    monkeypatch.setattr(D, "FINALISTS", 1)
    compiled = []
    monkeypatch.setattr(D, "precompile", lambda fam, plan, sa, dt, shape, todo, *a, **k: compiled.append(todo))
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_fwd", 64, 64, torch.float32)
    run = lambda: D.tune_family("chunk_fwd", plan, spec, {}, get_profile("h200"),  # noqa: E731
                                torch.float32, (1, 256, 1, 1), space=SPACE, progress=False)
    first = run()
    second = run()
    assert first[0] == second[0] and abs(first[1] - second[1]) < 1e-9
    assert all(r.n_resumed == len(r.trials) for r in second.results.values())
    d = default_chunk_config(plan, {"N": 1, "HV": 1})
    assert len(compiled[0]) == 8  # 4 + 4 candidates (the default is one of each stage's)
    by_stage = {}
    for stage, cfg in compiled[1]:
        by_stage.setdefault(stage, set()).add((cfg.chunk_size, cfg.intra_num_warps, cfg.state_block_v))
    # intra: the fastest valid (C=32, 8 warps: 2.0) and the default; state: the fastest (C=64, BV=16) and the default
    dk = (d.chunk_size, d.intra_num_warps, d.state_block_v)
    assert by_stage == {"intra": {(32, 8, d.state_block_v), dk}, "state": {(64, d.intra_num_warps, 16), dk}}


def test_decode_is_timed_as_the_ops_launch_not_the_eager_op(monkeypatch):
    """The recurrent candidate times the op's one launch (under CUDA-graph replay on a GPU),
    not the eager op, whose Python work would hide the configs' differences."""
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "recurrent", 16, 16, torch.float32)
    cand = CA.KernelCandidate("recurrent", None, plan, dict(safe_gate=True, lower_bound=-5.0), torch.float32,
                             (2, 1, 1, 2), device="cpu")
    default = default_config("recurrent", plan)

    def no_eager(*a, **k):
        raise AssertionError("timed through the eager op")

    monkeypatch.setattr(cand, "_fwd", no_eager)
    assert cand.time(default) > 0


def test_a_study_of_other_kernels_is_not_resumed(tmp_path, monkeypatch):
    """Editing a family's templates changes its source hash, and with it the study: trials
    measured on the old kernels are not replayed as if they were the new ones'."""
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(D, "KernelCandidate", FakeCandidate)
    monkeypatch.setattr(D, "precompile", lambda *a, **k: None)
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_fwd", 64, 64, torch.float32)
    run = lambda: D.tune_family("chunk_fwd", plan, spec, {}, get_profile("h200"),  # noqa: E731
                                torch.float32, (1, 256, 1, 1), space=SPACE, progress=False).results
    run()
    assert all(r.n_resumed == len(r.trials) for r in run().values())  # same kernels: resumed
    monkeypatch.setattr(D, "source_hash", lambda family: "0123456789abcdef")
    assert all(r.n_resumed == 0 for r in run().values())  # edited templates: measured again


def test_compile_check_compiles_the_launch_each_stage_names(monkeypatch):
    """A stage is compiled by the kernel its space names, whatever the stages' order in the
    file (the state stage listed first still compiles the state pass)."""
    from kdagen.kernels import CompileReport

    compiled = []

    def fake_compile(fn, args, constexprs, target, num_warps, num_stages, keep=None):
        compiled.append(fn.__name__)
        return CompileReport(fn.__name__, "cuda:90", 0, num_warps, None, None)

    monkeypatch.setattr(CP, "compile_for_target", fake_compile)
    space = SearchSpace.from_dict({
        "kernel": "chunk_fwd", "params": {"chunk_size": [32], "state_block_v": [16]},
        "stages": {"state": {"launch": "chunk_pass", "fields": ["state_block_v"]},
                   "intra": {"launch": "chunk_solve", "fields": ["chunk_size"]}}})
    spec = select_spec(False, True, -5.0, False, False)
    plan = F.lower_for(spec, "chunk_fwd", 16, 16, torch.float32)
    surveys = CP.compile_check("chunk_fwd", plan, spec, {"safe_gate": True, "lower_bound": -5.0},
                               get_profile("h200"), torch.float32, space=space, progress=False)
    assert [s.stage for s in surveys] == ["state", "intra"] and all(s.survivors for s in surveys)
    assert [n.split("_", 1)[1].rsplit("_", 1)[0] for n in compiled] == ["chunk_pass", "chunk_solve"]
