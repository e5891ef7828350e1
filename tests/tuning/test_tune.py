import math
import re
from collections import Counter

import optuna
import pytest

from kdagen.config import RecurrentConfig
from kdagen.tuning.space import load_space
from kdagen.tuning.engine import TuneError, tune

TOL = 1e-3


def recurrent_configs():
    return [RecurrentConfig(block_v=bv, num_warps=nw) for bv in (16, 32, 64, 128) for nw in (1, 2, 4, 8)]


def base_time(c):
    # Deterministic, distinct times: bigger tiles + 4 warps are faster.
    return 1.0 + abs(c.num_warps - 4) * 0.1 + (128 - c.block_v) / 128 + c.block_v * 1e-4


class Fake:
    """A fake kernel: `times` per config, `wrong` configs give a large error, `broken` ones
    fail to build, `explode_after` raises KeyboardInterrupt at that build call."""

    def __init__(self, times=base_time, wrong=(), broken=(), nan=(), explode_after=None,
                 retimes=None):
        self.times, self.wrong, self.broken, self.nan = times, set(wrong), dict(broken), set(nan)
        self.explode_after = explode_after
        self.retimes = retimes or {}
        self.builds, self.checks, self.timed = Counter(), Counter(), Counter()
        self.order = []

    def build(self, cfg):
        if self.explode_after is not None and sum(self.builds.values()) >= self.explode_after:
            raise KeyboardInterrupt
        self.builds[cfg] += 1
        if cfg in self.broken:
            raise self.broken[cfg]
        return cfg

    def check(self, built):
        self.checks[built] += 1
        if built in self.nan:
            return float("nan")
        return 0.5 if built in self.wrong else 1e-6

    def time(self, built):
        self.timed[built] += 1
        self.order.append(built)
        if built in self.retimes and self.timed[built] > 1:
            return self.retimes[built]
        return self.times(built)


def run(tmp_path, fake, cands=None, name="s", **kw):
    kw.setdefault("progress", False)
    kw.setdefault("tolerance", TOL)
    return tune(recurrent_configs() if cands is None else cands, fake, study_name=name,
                storage_path=tmp_path / "journal.log", **kw)


def fastest(cands, exclude=()):
    return min((c for c in cands if c not in exclude), key=base_time)


def test_correct_fastest_wins_and_wrong_fastest_is_rejected(tmp_path):
    cands = recurrent_configs()
    wrong = RecurrentConfig(block_v=16, num_warps=1)
    fake = Fake(times=lambda c: 0.01 if c == wrong else base_time(c), wrong=[wrong])
    res = run(tmp_path, fake)
    assert res.winner == fastest(cands) != wrong
    assert res.winner_time_ms == pytest.approx(base_time(res.winner))
    assert res.winner_error == pytest.approx(1e-6)
    assert (res.n_tried, res.n_rejected, res.n_failed, res.n_measured) == (16, 1, 0, 16)
    assert res.complete and res.sampler == "BruteForceSampler" and res.seed == 0
    assert fake.timed[wrong] == 0  # never timed, let alone retimed
    rec = next(r for r in res.trials if r.config == wrong)
    assert rec.status == "rejected" and "tolerance" in rec.reason
    # In the journal: a FAIL trial with the reason, no inf value anywhere.
    study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log"))))
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.FAIL] == 1
    assert states[optuna.trial.TrialState.COMPLETE] == 15
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL][0]
    assert failed.user_attrs["status"] == "rejected" and failed.value is None
    assert all(math.isfinite(t.value) for t in study.trials if t.value is not None)


def test_nan_error_is_rejected(tmp_path):
    cands = recurrent_configs()
    best = fastest(cands)
    res = run(tmp_path, Fake(nan=[best]))
    assert res.winner == fastest(cands, exclude=[best]) and res.n_rejected == 1


def test_build_errors_are_failed_trials(tmp_path):
    from triton.runtime.errors import OutOfResources

    cands = recurrent_configs()
    best = fastest(cands)
    oom = RecurrentConfig(block_v=128, num_warps=2)
    fake = Fake(broken={best: RuntimeError("compile failed: bad tile"),
                        oom: OutOfResources(300000, 232448, "shared memory")})
    res = run(tmp_path, fake)
    assert res.winner == fastest(cands, exclude=[best, oom])
    assert res.n_failed == 2 and res.n_rejected == 0
    by_cfg = {r.config: r for r in res.trials}
    assert by_cfg[best].status == "failed" and by_cfg[best].stage == "build"
    assert "compile failed" in by_cfg[best].reason
    assert by_cfg[oom].reason.startswith("OutOfResources")
    assert fake.checks[best] == 0 and fake.timed[oom] == 0


def test_interrupted_study_resumes_without_remeasuring(tmp_path):
    cands = recurrent_configs()
    first = Fake(explode_after=3)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, first)
    done = set(first.checks)
    assert len(done) == 3 and sum(first.checks.values()) == 3
    second = Fake()
    res = run(tmp_path, second)
    assert res.n_resumed == 3 and res.n_measured == 13 and res.n_tried == 16
    assert not done & set(second.checks)  # finished configs are never checked again
    assert all(n == 1 for n in second.checks.values()) and len(second.checks) == 13
    assert res.winner == fastest(cands)
    # A third run measures nothing new at all (only re-times the finalists).
    third = Fake()
    res3 = run(tmp_path, third)
    assert res3.n_measured == 0 and res3.n_resumed == 16 and not third.checks
    assert res3.winner == res.winner


def test_interrupt_resume_with_tpe_and_budget(tmp_path):
    space = load_space("chunk_fwd")
    cands = space.candidates(dict(K=64, V=64, safe_sub_chunk=32, smem_limit=232448))
    assert len(cands) > 256

    def t(c):
        return 1.0 + c.chunk_size / 100 + c.state_block_v / 1000 + c.state_num_stages / 10

    first = Fake(times=t)
    res1 = run(tmp_path, first, cands=cands, n_trials=8, name="tpe")
    assert res1.sampler == "TPESampler" and res1.n_measured == 8 and not res1.complete
    second = Fake(times=t)
    res2 = run(tmp_path, second, cands=cands, n_trials=8, name="tpe")
    assert res2.n_resumed == 8 and res2.n_measured == 8 and res2.n_tried == 16
    assert not set(first.checks) & set(second.checks)


def test_other_candidate_list_under_same_study_is_refused(tmp_path):
    run(tmp_path, Fake(), n_trials=2)
    with pytest.raises(TuneError, match="another candidate list"):
        run(tmp_path, Fake(), cands=recurrent_configs()[:5])


def test_near_ties_are_broken_deterministically(tmp_path):
    a = RecurrentConfig(block_v=64, num_warps=4)
    b = RecurrentConfig(block_v=128, num_warps=4)
    cands = [a, b, RecurrentConfig(block_v=16, num_warps=1)]
    expected = min((a, b), key=lambda c: c.canonical())
    winners = []
    for i, (ta, tb) in enumerate([(1.00, 1.01), (1.01, 1.00)]):
        times = {a: ta, b: tb, cands[2]: 5.0}
        res = run(tmp_path, Fake(times=times.get), cands=cands, name=f"tie{i}", seed=i)
        winners.append(res.winner)
    assert winners == [expected, expected]
    # Outside tie_rel the faster one wins.
    times = {a: 1.0, b: 1.5, cands[2]: 5.0}
    assert run(tmp_path, Fake(times=times.get), cands=cands, name="notie").winner == a
    times = {a: 1.5, b: 1.0, cands[2]: 5.0}
    assert run(tmp_path, Fake(times=times.get), cands=cands, name="notie2").winner == b


def test_finalists_are_retimed_interleaved_and_medians_decide(tmp_path):
    cands = recurrent_configs()
    lucky = fastest(cands)  # fastest in the search, slow when re-timed (a noisy outlier)
    fake = Fake(retimes={lucky: 50.0})
    res = run(tmp_path, fake, finalists=3, retime_rounds=5)
    assert res.winner != lucky
    finalists = [f.config for f in res.finalists]
    assert len(finalists) == 3 and finalists[0] == lucky
    for f in res.finalists:
        assert len(f.times_ms) == 5
    assert res.winner == min(res.finalists[1:], key=lambda f: f.median_ms).config
    # Interleaved: the 15 re-timing calls alternate between the finalists.
    retime_order = fake.order[-15:]
    for i in range(5):
        assert set(retime_order[3 * i: 3 * i + 3]) == set(finalists)
    # ... and rotate, so no finalist is always timed first.
    assert len({retime_order[3 * i] for i in range(5)}) == 3


def test_default_config_is_timed_and_reported(tmp_path):
    cands = recurrent_configs()
    default = RecurrentConfig(block_v=32, num_warps=4, num_stages=2)  # not in the list
    res = run(tmp_path, Fake(), default_config=default)
    assert res.default_time_ms == pytest.approx(base_time(default))
    assert res.winner == fastest(cands)
    assert res.speedup == pytest.approx(base_time(default) / base_time(res.winner))
    wrong_default = Fake(wrong=[default])
    res = run(tmp_path, wrong_default, default_config=default, name="s2")
    assert res.default_time_ms is None and "rejected" in res.default_reason


def test_plain_callable_candidate(tmp_path):
    res = tune(recurrent_configs(), base_time, study_name="fn",
               storage_path=tmp_path / "j.log", progress=False)
    assert res.winner == fastest(recurrent_configs())


def test_progress_bar_and_silence(tmp_path, capsys):
    run(tmp_path, Fake(), progress=True, name="p1")
    err = capsys.readouterr().err
    assert re.search(r"\[1/16 \d+s\] best", err) and re.search(r"\[16/16 \d+s\] best", err) and "block_v=" in err
    run(tmp_path, Fake(), progress=False, name="p2")
    assert capsys.readouterr().err == ""


def test_same_seed_same_sampling_order(tmp_path):
    orders = []
    for i in range(2):
        fake = Fake()
        run(tmp_path / str(i), fake, n_trials=6, seed=7)
        orders.append(list(fake.checks))
    assert orders[0] == orders[1]


def test_tolerance_required():
    class NoTol(Fake):
        pass

    with pytest.raises(ValueError, match="tolerance"):
        tune(recurrent_configs(), NoTol(), study_name="x", storage_path="/nonexistent/x.log",
             progress=False)


@pytest.mark.slow
def test_tpe_covers_the_whole_list_without_remeasuring(tmp_path):
    # TPE re-proposes measured configs; the engine replays their result and steers the
    # next trial to an untried config, so the full list is covered with one measurement each.
    cands = load_space("chunk_fwd").candidates(dict(K=64, V=64, safe_sub_chunk=32, smem_limit=232448))
    cands = [c for c in cands if c.solve_load_ahead == 0 and c.state_segment_chunks == 0]  # 384 of the 1,536
    # 3/4 of the configs are wrong: failed trials make TPE repeat itself a lot.
    wrong = [c for c in cands if c.chunk_size == 64 or c.state_num_warps == 8]
    fake = Fake(times=lambda c: 1.0 + c.chunk_size / 100 + c.state_block_v / 1000, wrong=wrong)
    res = run(tmp_path, fake, cands=cands, name="full")
    assert res.sampler == "TPESampler" and res.complete and res.n_measured == len(cands)
    assert res.n_rejected == len(wrong) and res.winner not in wrong
    assert set(fake.checks) == set(cands) and set(fake.checks.values()) == {1}
    study = optuna.load_study(study_name="full", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log"))))
    dups = [t for t in study.trials if t.user_attrs.get("duplicate")]
    assert len(study.trials) == len(cands) + len(dups)
    assert 0 < len(dups) <= len(cands)  # TPE did repeat itself; each replayed duplicate is followed by an untried config


def test_where_the_time_went_is_reported(tmp_path, capsys):
    """Each measured trial records the wall time of its build, check and time phases; the
    result sums them (this call's measurements only, not resumed ones) and the summary says
    so: the tuning run's wall time must be explainable from its log."""
    import time

    class Slow(Fake):
        def check(self, built):
            time.sleep(0.02)
            return super().check(built)

    cands = recurrent_configs()[:4]
    res = run(tmp_path, Slow(), cands=cands, progress=True)
    ph = res.phase_seconds
    assert all(set(t.seconds) == {"build", "check", "time"} for t in res.trials)
    assert 4 * 0.02 <= ph["check"] < res.search_seconds and ph["build"] < ph["check"]
    assert re.search(r"search \d+\.\ds \(build \d+\.\d, check \d+\.\d, time \d+\.\d\), final \d+\.\ds",
                     capsys.readouterr().err)
    again = run(tmp_path, Slow(), cands=cands)
    assert again.n_resumed == 4 and again.phase_seconds == {"build": 0.0, "check": 0.0, "time": 0.0}
