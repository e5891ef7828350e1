"""Candidates measured in a worker process (kdagen.isolation): a config that faults the GPU,
crashes or hangs is one failed trial, and the next config gets a fresh worker.  A fake
candidate stands in for the GPU (its 'CUDA error' is the message a real fault raises)."""
import os
import time

import pytest

from kdagen.tuning.isolation import CandidateError, IsolatedCandidate, is_fatal
from kdagen.tuning.engine import tune

pytestmark = pytest.mark.slow  # subprocesses, compiles or long interpreter runs

FAULT = "CUDA error: an illegal memory access was encountered"


class Flaky:
    """build(cfg) misbehaves by name; time() answers with the worker's pid."""

    tolerance = 1e-3

    def __init__(self, base: float = 1.0):
        self.base = base

    def build(self, cfg):
        if cfg == "fault":
            raise RuntimeError(FAULT)
        if cfg == "crash":
            os._exit(3)
        if cfg == "hang":
            time.sleep(120)
        if cfg == "oom":
            raise ValueError("out of resources: shared memory")
        return cfg

    def check(self, cfg):
        return 0.0

    def time(self, cfg):
        return {"a": 2.0, "b": 1.0}.get(cfg, float(os.getpid())) * self.base


class Broken:
    def __init__(self):
        raise RuntimeError("no GPU here")


class SlowStart(Flaky):
    """A candidate whose making takes a while (imports, inputs on the GPU)."""

    def __init__(self, seconds: float):
        time.sleep(seconds)
        super().__init__()


def test_start_up_has_its_own_limit():
    """Making the worker may take longer than a config may take to answer (a loaded machine, a
    slow import): the start-up's limit is separate from the calls', and it still applies."""
    with IsolatedCandidate(SlowStart, 2.0, timeout_s=1.0) as c:
        assert c.build("x") == "x" and c.restarts == 0
        with pytest.raises(CandidateError, match="build: no answer from the worker within 1s"):
            c.build("hang")
    with IsolatedCandidate(SlowStart, 3.0, timeout_s=1.0, start_timeout_s=0.5) as c:
        with pytest.raises(CandidateError, match="start: no answer from the worker within 0s"):
            c.build("x")


def test_answers_come_from_a_worker_that_is_reused():
    with IsolatedCandidate(Flaky, 1.0) as c:
        assert c.build("x") == "x" and c.check("x") == 0.0
        pid = c.time("x")
        assert pid != os.getpid() and c.time("y") == pid and c.tolerance == Flaky.tolerance


def test_an_ordinary_error_fails_the_call_and_keeps_the_worker():
    with IsolatedCandidate(Flaky) as c:
        pid = c.time("x")
        with pytest.raises(CandidateError, match="ValueError: out of resources"):
            c.build("oom")
        assert c.time("x") == pid and c.restarts == 0


@pytest.mark.parametrize("bad,match", [("fault", "illegal memory access.*worker restarted"),
                                       ("crash", "worker died"), ("hang", "no answer")])
def test_a_fault_crash_or_hang_gets_a_fresh_worker(bad, match):
    with IsolatedCandidate(Flaky, timeout_s=5.0) as c:
        pid = c.time("x")
        with pytest.raises(CandidateError, match=match):
            c.build(bad)
        assert c.restarts == 1
        assert c.build("x") == "x" and c.time("x") != pid  # a new process answers


def test_a_candidate_that_cannot_be_made_is_an_error():
    with IsolatedCandidate(Broken) as c:
        with pytest.raises(CandidateError, match="no GPU here"):
            c.build("x")


def test_fatal_markers():
    assert is_fatal("AcceleratorError", "anything") and is_fatal("RuntimeError", FAULT)
    assert not is_fatal("OutOfResources", "out of resource: shared memory")


def test_a_faulting_config_does_not_poison_the_study(tmp_path):
    """The failure mode seen on an H200 during `kdagen build`'s tuning: one faulting config made
    every later trial in the process fail.  Isolated, only that trial fails."""
    with IsolatedCandidate(Flaky, timeout_s=30.0) as c:
        res = tune(["fault", "a", "crash", "b"], c, study_name="iso", storage_path=tmp_path / "j.log",
                   seed=0, progress=False)
    by = {r.config: r for r in res.trials}
    assert by["fault"].status == "failed" and "illegal memory access" in by["fault"].reason
    assert by["crash"].status == "failed" and "died" in by["crash"].reason
    assert by["a"].status == by["b"].status == "ok"
    assert res.winner == "b" and res.n_failed == 2


def test_remake_swaps_the_candidate_in_the_same_worker():
    """`kdagen build` measures every shape of every family through one worker: remake gives
    it the next candidate without a new process; a candidate that cannot be made is an
    error and the following one starts a fresh worker."""
    with IsolatedCandidate(Flaky, 1.0) as c:
        pid = c.time("x")
        c.remake(Flaky, 2.0)
        assert c.time("x") == 2.0 * pid and c.restarts == 0  # same process, new candidate
        with pytest.raises(CandidateError, match="no GPU here"):
            c.remake(Broken)
        assert c.restarts == 1
        c.remake(Flaky, 3.0)  # no live worker: the next call starts one with this candidate
        new_pid = c.time("x") / 3.0
        assert new_pid != pid and c.time("a") == 6.0


def test_remake_after_a_fault_starts_with_the_new_candidate():
    with IsolatedCandidate(Flaky, timeout_s=5.0) as c:
        with pytest.raises(CandidateError, match="illegal memory access"):
            c.build("fault")
        c.remake(Flaky, 0.5)
        assert c.time("b") == 0.5
