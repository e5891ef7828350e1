"""A generic, resumable Optuna tuning engine.

The engine knows nothing about kernels.  The caller passes the candidate configs (e.g.
``SearchSpace.candidates(context)``) and a *candidate* object implementing::

    build(config) -> built      # compile; may raise (OutOfResources, compile errors, ...)
    check(built) -> float       # relative error vs a reference on fresh random inputs
    time(built) -> float        # milliseconds

Every config goes through build -> check -> time.  An exception at any stage makes a
FAILED trial; an error above ``tolerance`` (or NaN) makes a REJECTED trial (also an Optuna
``FAIL`` state, never an ``inf`` value): a fast wrong config can never win.  The reason is
kept in the trial's user attrs.

The study lives in an Optuna journal file (``JournalStorage(JournalFileBackend(path))``),
so an interrupted run resumes: configs with a result in the journal are not measured
again.  The sampler draws a categorical index into the candidate list — ``BruteForceSampler``
for lists of at most 256 configs, ``TPESampler`` otherwise, both seeded.

After the search the best ``finalists`` configs (and the default config, if given) are
re-timed interleaved over ``retime_rounds`` rounds; the lowest median wins, and configs
within ``tie_rel`` of it are tied, the tie going to the smallest canonical string.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

BRUTE_FORCE_MAX = 256
_USER_ATTR_FP = "kdagen_candidates_sha256"


class TuneError(RuntimeError):
    pass


@runtime_checkable
class Candidate(Protocol):
    def build(self, config: Any) -> Any: ...

    def check(self, built: Any) -> float: ...

    def time(self, built: Any) -> float: ...


@dataclass
class FunctionCandidate:
    """Adapter for plain callables: ``time_fn(built) -> ms``; ``build_fn`` defaults to the
    identity, ``check_fn`` to "always exact" (0.0)."""

    time_fn: Callable[[Any], float]
    build_fn: Callable[[Any], Any] | None = None
    check_fn: Callable[[Any], float] | None = None
    tolerance: float = math.inf

    def build(self, config: Any) -> Any:
        return config if self.build_fn is None else self.build_fn(config)

    def check(self, built: Any) -> float:
        return 0.0 if self.check_fn is None else self.check_fn(built)

    def time(self, built: Any) -> float:
        return self.time_fn(built)


def as_candidate(obj: Any) -> Candidate:
    if all(callable(getattr(obj, m, None)) for m in ("build", "check", "time")):
        return obj
    if callable(obj):
        return FunctionCandidate(time_fn=obj)
    raise TypeError("tune: `candidate` must have build/check/time methods or be a callable "
                    "config -> milliseconds")


@dataclass
class TrialRecord:
    index: int  # into the candidate list (-1 for a default config outside it)
    config: Any
    status: str  # "ok" | "failed" | "rejected"
    time_ms: float | None = None
    error: float | None = None
    stage: str | None = None  # build | check | time, where a failure happened
    reason: str | None = None
    trial_number: int | None = None
    resumed: bool = False  # result read back from the journal of an earlier run
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of build / check / time

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Finalist:
    config: Any
    search_time_ms: float | None
    times_ms: list[float] = field(default_factory=list)
    median_ms: float | None = None
    is_default: bool = False
    dropped: str | None = None  # why it left the final (re-build / re-time failure)


@dataclass
class TuneResult:
    winner: Any | None
    winner_time_ms: float | None
    winner_error: float | None
    default_config: Any | None
    default_time_ms: float | None
    default_reason: str | None  # why the default has no time, if it has none
    default_error: float | None  # its measured error (None: not measured)
    n_candidates: int
    n_tried: int  # configs with a result (incl. resumed ones)
    n_failed: int
    n_rejected: int
    n_measured: int  # measured by this call
    n_resumed: int  # results reused from the journal
    complete: bool  # every candidate has a result
    seed: int
    sampler: str
    study_name: str
    storage_path: str
    tolerance: float
    trials: list[TrialRecord]
    finalists: list[Finalist]
    search_seconds: float = 0.0  # measuring the configs without a result
    final_seconds: float = 0.0  # the default's measurement and the interleaved re-timing

    @property
    def ok(self) -> bool:
        return self.winner is not None

    @property
    def phase_seconds(self) -> dict[str, float]:
        """Wall time of this call's measurements by phase (build, check, time)."""
        out = {"build": 0.0, "check": 0.0, "time": 0.0}
        for t in self.trials:
            if not t.resumed:
                for k, v in t.seconds.items():
                    out[k] += v
        return out

    @property
    def speedup(self) -> float | None:
        if self.winner_time_ms and self.default_time_ms:
            return self.default_time_ms / self.winner_time_ms
        return None

    def summary(self) -> str:
        if self.winner is None:
            head = "no valid config"
        else:
            head = f"winner {self.winner_time_ms:.4g} ms {_short(self.winner)}"
            if self.default_time_ms:
                head += f" (default {self.default_time_ms:.4g} ms, x{self.speedup:.2f})"
        ph = self.phase_seconds
        return (f"{head}; tried {self.n_tried}/{self.n_candidates} (measured {self.n_measured}, "
                f"resumed {self.n_resumed}), failed {self.n_failed}, rejected {self.n_rejected}, "
                f"sampler {self.sampler}, seed {self.seed}; search {self.search_seconds:.1f}s (build "
                f"{ph['build']:.1f}, check {ph['check']:.1f}, time {ph['time']:.1f}), final {self.final_seconds:.1f}s")


class _TrialFailed(Exception):
    """Raised inside the objective so Optuna records a FAIL trial (caught by optimize)."""


def _canonical(cfg: Any) -> str:
    if hasattr(cfg, "canonical"):
        return cfg.canonical()
    return repr(cfg)


def _short(cfg: Any) -> str:
    return cfg.short() if hasattr(cfg, "short") else str(cfg)


def _cfg_dict(cfg: Any) -> Any:
    return cfg.to_dict() if hasattr(cfg, "to_dict") else repr(cfg)


def _derived_seed(seed: int, canon: str) -> int:
    return int(hashlib.sha256(f"{seed}:{canon}".encode()).hexdigest()[:8], 16)


def seed_everything(seed: int) -> None:
    """Seed ``random`` and, when already imported, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        with contextlib.suppress(Exception):
            np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            torch.manual_seed(seed)  # also seeds every CUDA device


def _describe(e: BaseException) -> str:
    name = type(e).__name__
    try:
        from triton.runtime.errors import OutOfResources

        if isinstance(e, OutOfResources):
            name = "OutOfResources"
    except ImportError:  # pragma: no cover
        pass
    msg = str(e).strip().splitlines()
    text = f"{name}: {msg[0]}" if msg else name
    return text if len(text) <= 300 else text[:297] + "..."


def _measure(candidate: Candidate, cfg: Any, index: int, tolerance: float,
             seed: int) -> tuple[TrialRecord, Any]:
    """build -> check -> time one config; never raises an ``Exception`` (BaseException such
    as KeyboardInterrupt goes through)."""
    seed_everything(_derived_seed(seed, _canonical(cfg)))
    rec = TrialRecord(index=index, config=cfg, status="failed")

    def timed(phase: str, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            rec.seconds[phase] = time.perf_counter() - t0

    try:
        built = timed("build", candidate.build, cfg)
    except Exception as e:
        rec.stage, rec.reason = "build", _describe(e)
        return rec, None
    try:
        err = float(timed("check", candidate.check, built))
    except Exception as e:
        rec.stage, rec.reason = "check", _describe(e)
        return rec, None
    rec.error = err
    if math.isnan(err) or err > tolerance:
        rec.status, rec.stage = "rejected", "check"
        rec.reason = f"relative error {err:.3g} > tolerance {tolerance:.3g}"
        return rec, None
    try:
        t = float(timed("time", candidate.time, built))
    except Exception as e:
        rec.stage, rec.reason = "time", _describe(e)
        return rec, None
    if not math.isfinite(t) or t <= 0:
        rec.stage, rec.reason = "time", f"invalid time {t!r} ms"
        return rec, None
    rec.status, rec.time_ms = "ok", t
    return rec, built


class _Progress:
    def __init__(self, enabled: bool, total: int):
        self.enabled = enabled
        self.total = total
        self.tty = enabled and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self.t0 = time.monotonic()

    def update(self, done: int, best: TrialRecord | None, last: TrialRecord) -> None:
        if not self.enabled:
            return
        head = f"[{done}/{self.total} {time.monotonic() - self.t0:.0f}s]"
        best_s = f"best {best.time_ms:.4g} ms {_short(best.config)}" if best else "best -"
        line = f"{head} {best_s}"
        if not last.ok:
            line += f" | last {last.status}: {last.reason}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:200])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write("\n")
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self.tty = False


def _finished_trials(study: Any):
    """(canonical config, status, trial) of each trial with a result, first occurrence only:
    status "ok" (measured), or "failed" / "rejected".  Replays of a known config, and trials
    that were interrupted, killed or never ran, are skipped: they hold no result."""
    from optuna.trial import TrialState

    seen = set()
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        canon = ua.get("canonical")
        if canon is None or ua.get("duplicate") or canon in seen:
            continue
        if t.state == TrialState.COMPLETE:
            status = "ok"
        elif t.state == TrialState.FAIL and ua.get("status") in ("failed", "rejected"):
            status = ua["status"]
        else:
            continue
        seen.add(canon)
        yield canon, status, t


def _records_from_study(study: Any, index_of: dict[str, int], configs: list[Any]) -> dict[str, TrialRecord]:
    out: dict[str, TrialRecord] = {}
    for canon, status, t in _finished_trials(study):
        if canon not in index_of:
            continue
        idx = index_of[canon]
        err = t.user_attrs.get("error")
        err = float(err) if isinstance(err, (int, float, str)) else None
        if status == "ok":
            out[canon] = TrialRecord(idx, configs[idx], "ok", time_ms=t.value, error=err,
                                     trial_number=t.number, resumed=True)
        else:
            out[canon] = TrialRecord(idx, configs[idx], status, error=err, stage=t.user_attrs.get("stage"),
                                     reason=t.user_attrs.get("reason"), trial_number=t.number, resumed=True)
    return out


def recorded_results(study_name: str, storage_path: str | Path) -> dict[str, float | None]:
    """What a study already holds, without creating it: canonical config -> its time (ms)
    for a measured trial, None for a failed or rejected one ({} when there is no study).
    Used to compile ahead only what a resumed run will still build."""
    import optuna

    storage_path = Path(storage_path)
    if not storage_path.exists():
        return {}
    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(storage_path)))
        try:
            study = optuna.load_study(study_name=study_name, storage=storage)
        except KeyError:
            return {}
        out: dict[str, float | None] = {}
        for canon, status, t in _finished_trials(study):
            out[canon] = float(t.value) if status == "ok" else None
        return out
    finally:
        optuna.logging.set_verbosity(old)


def _make_sampler(n: int, seed: int) -> tuple[Any, str]:
    import optuna

    if n <= BRUTE_FORCE_MAX:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.BruteForceSampler(seed=seed), "BruteForceSampler"
    return optuna.samplers.TPESampler(seed=seed), "TPESampler"


def tune(candidates: list[Any], candidate: Any, *, study_name: str,
         storage_path: str | Path, tolerance: float | None = None,
         default_config: Any | None = None, seed: int = 0, n_trials: int | None = None,
         finalists: int = 3, retime_rounds: int = 5, tie_rel: float = 0.02,
         progress: bool = True) -> TuneResult:
    """Search ``candidates`` with Optuna and return the verified fastest config.

    ``candidate``: an object with ``build/check/time`` (see module doc) or a plain callable
    ``config -> ms`` (no build, no check).  ``tolerance``: the largest accepted relative
    error (defaults to ``candidate.tolerance``).  ``n_trials``: at most this many configs
    are measured by this call (None: all the ones without a result).  ``default_config``:
    the heuristic config; it is measured too, takes part in the final re-timing, and may
    win.  Re-running with the same ``study_name``/``storage_path`` and the same candidate
    list resumes the study; another candidate list under the same study is an error.
    """
    import optuna

    candidate = as_candidate(candidate)
    if tolerance is None:
        tolerance = getattr(candidate, "tolerance", None)
        if tolerance is None:
            raise ValueError("tune: pass tolerance= (or give the candidate a .tolerance)")
    tolerance = float(tolerance)
    if n_trials is not None and n_trials < 0:
        raise ValueError("tune: n_trials must be >= 0")

    # Deduplicate (keeping the first occurrence) so one config has one index.
    configs: list[Any] = []
    canons: list[str] = []
    index_of: dict[str, int] = {}
    for cfg in candidates:
        c = _canonical(cfg)
        if c not in index_of:
            index_of[c] = len(configs)
            configs.append(cfg)
            canons.append(c)
    n = len(configs)
    fingerprint = hashlib.sha256("\n".join(canons).encode()).hexdigest()

    storage_path = Path(storage_path)
    storage_path.parent.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    old_verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampler, sampler_name = _make_sampler(n, seed)
    try:
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(storage_path)))
        study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler,
                                    direction="minimize", load_if_exists=True)
        fp = study.user_attrs.get(_USER_ATTR_FP)
        if fp is None:
            study.set_user_attr(_USER_ATTR_FP, fingerprint)
            study.set_user_attr("n_candidates", n)
            study.set_user_attr("seed", seed)
        elif fp != fingerprint:
            raise TuneError(
                f"study {study_name!r} in {storage_path} was created for another candidate list "
                f"({study.user_attrs.get('n_candidates')} configs, now {n}); use another "
                f"study name or delete {storage_path}")

        records = _records_from_study(study, index_of, configs)
        n_resumed = len(records)
        untried = [i for i in range(n) if canons[i] not in records]
        budget = len(untried) if n_trials is None else min(n_trials, len(untried))
        bar = _Progress(progress, len(records) + budget)
        if progress and n_resumed:
            bar.message(f"resuming study {study_name!r}: {n_resumed}/{n} configs already measured")
        rng = random.Random(seed)
        keep = max(1, finalists)
        builds: dict[str, Any] = {}
        state = {"measured": 0, "dup": False}
        choices = list(range(n))

        def best_ok() -> list[TrialRecord]:
            ok = [r for r in records.values() if r.ok]
            ok.sort(key=lambda r: (r.time_ms, canons[r.index]))
            return ok

        def objective(trial: Any) -> float:
            idx = trial.suggest_categorical("idx", choices)
            canon = canons[idx]
            trial.set_user_attr("canonical", canon)
            trial.set_user_attr("config", _cfg_dict(configs[idx]))
            prev = records.get(canon)
            state["dup"] = prev is not None
            if prev is not None:  # sampled again: replay the known result, measure nothing
                trial.set_user_attr("duplicate", True)
                if prev.ok:
                    return float(prev.time_ms)
                raise _TrialFailed(prev.reason or prev.status)
            rec, built = _measure(candidate, configs[idx], idx, tolerance, seed)
            rec.trial_number = trial.number
            for k in ("status", "stage", "reason", "error"):
                v = getattr(rec, k)
                if v is not None:
                    trial.set_user_attr(k, v if not isinstance(v, float) or math.isfinite(v) else str(v))
            records[canon] = rec
            state["measured"] += 1
            ranking = best_ok()
            if rec.ok:
                builds[canon] = built
                top = {canons[r.index] for r in ranking[:keep]}
                for c in [c for c in builds if c not in top]:
                    del builds[c]
            bar.update(len(records), ranking[0] if ranking else None, rec)
            if rec.ok:
                return float(rec.time_ms)
            raise _TrialFailed(rec.reason)

        def enqueue_untried() -> bool:
            rest = [i for i in range(n) if canons[i] not in records]
            if not rest:
                return False
            study.enqueue_trial({"idx": rng.choice(rest)})
            return True

        def callback(study_: Any, _frozen: Any) -> None:
            if state["measured"] >= budget or len(records) >= n:
                study_.stop()
            elif state["dup"]:
                enqueue_untried()  # guarantees progress even when the sampler repeats itself

        t_search = time.perf_counter()
        stalls = 0
        while state["measured"] < budget and len(records) < n:
            before = state["measured"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.optimize(objective, n_trials=2 * (budget - before) + 4,
                               catch=(_TrialFailed,), callbacks=[callback])
            if state["measured"] == before:
                # e.g. BruteForceSampler stops when every index has a finished trial, counting
                # trials an interrupt marked failed; feed it the untried ones explicitly.
                stalls += 1
                if stalls > 3 or not enqueue_untried():
                    break
            else:
                stalls = 0

        search_seconds = time.perf_counter() - t_search
        # ------------------------------------------------------------ final re-timing
        t_final = time.perf_counter()
        ranking = best_ok()
        contenders: list[tuple[Finalist, Any, str]] = []
        for r in ranking[:keep]:
            canon = canons[r.index]
            fin = Finalist(config=r.config, search_time_ms=r.time_ms)
            built = builds.get(canon)
            if built is None:  # measured by an earlier run: build it again
                try:
                    built = candidate.build(r.config)
                except Exception as e:
                    fin.dropped = f"re-build failed: {_describe(e)}"
            contenders.append((fin, built, canon))

        default_time: float | None = None
        default_reason: str | None = None
        default_error: float | None = None
        if default_config is not None:
            dcanon = _canonical(default_config)
            hit = next((f for f, _, c in contenders if c == dcanon), None)
            if dcanon in records:
                default_error = records[dcanon].error
            if hit is not None:
                hit.is_default = True
            else:
                prev = records.get(dcanon)
                if prev is not None and not prev.ok:
                    default_reason = f"{prev.status}: {prev.reason}"
                else:
                    drec, dbuilt = _measure(candidate, default_config, index_of.get(dcanon, -1),
                                            tolerance, seed)
                    default_error = drec.error
                    if drec.ok:
                        contenders.append((Finalist(config=default_config, search_time_ms=drec.time_ms,
                                                    is_default=True), dbuilt, dcanon))
                    else:
                        default_reason = f"{drec.status}: {drec.reason}"

        alive = [(f, b, c) for f, b, c in contenders if f.dropped is None]
        rounds = max(0, int(retime_rounds))
        for rnd in range(rounds):
            k = rnd % len(alive) if alive else 0
            for fin, built, _ in alive[k:] + alive[:k]:  # rotate: no fixed position bias
                if fin.dropped is not None:
                    continue
                try:
                    t = float(candidate.time(built))
                    if not math.isfinite(t) or t <= 0:
                        raise ValueError(f"invalid time {t!r} ms")
                    fin.times_ms.append(t)
                except Exception as e:
                    fin.dropped = f"re-time failed: {_describe(e)}"
        for fin, _, _ in contenders:
            if fin.dropped is None:
                fin.median_ms = statistics.median(fin.times_ms) if fin.times_ms else fin.search_time_ms

        finals = [(f, c) for f, _, c in contenders if f.dropped is None and f.median_ms is not None]
        winner = winner_time = winner_error = None
        if finals:
            best = min(f.median_ms for f, _ in finals)
            tied = [(f, c) for f, c in finals if f.median_ms <= best * (1.0 + tie_rel)]
            wf, wc = min(tied, key=lambda fc: fc[1])
            winner, winner_time = wf.config, wf.median_ms
            wrec = records.get(wc)
            winner_error = wrec.error if wrec is not None else default_error
        for f, _, _ in contenders:
            if f.is_default and f.median_ms is not None:
                default_time = f.median_ms
            elif f.is_default and default_reason is None:
                default_reason = f.dropped

        final_seconds = time.perf_counter() - t_final
        all_records = sorted(records.values(), key=lambda r: (r.trial_number is None, r.trial_number or 0))
        result = TuneResult(
            winner=winner, winner_time_ms=winner_time, winner_error=winner_error,
            default_config=default_config, default_time_ms=default_time,
            default_reason=default_reason, default_error=default_error, n_candidates=n, n_tried=len(records),
            n_failed=sum(r.status == "failed" for r in records.values()),
            n_rejected=sum(r.status == "rejected" for r in records.values()),
            n_measured=state["measured"], n_resumed=n_resumed, complete=len(records) >= n,
            seed=seed, sampler=sampler_name, study_name=study_name,
            storage_path=str(storage_path), tolerance=tolerance, trials=all_records,
            finalists=[f for f, _, _ in contenders], search_seconds=search_seconds,
            final_seconds=final_seconds)
        bar.message(result.summary())
        return result
    finally:
        optuna.logging.set_verbosity(old_verbosity)
