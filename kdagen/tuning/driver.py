"""The tuning driver: tune one family at one shape (:func:`tune_family`: every stage searched
by the engine, :mod:`kdagen.tuning.engine`, and the fastest stages combined per chunk length),
and what ``kdagen build`` runs -- the plans of every family and head dim (:func:`plans_for`), the
compile-check of every candidate config (:func:`compile_all`: on the matching GPU, where the tuner then
loads them, or when asked), on the matching GPU the tuning of every shape with the winners stored in the
cache (:func:`tune_and_store`), and the binaries the ops will run, compiled and kept
(:func:`keep_binaries`)."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, NamedTuple

import torch

from ..cache.gpus import GpuProfile
from ..cache.heuristics import default_config, default_train_config, worth_timing
from ..cache.keys import cache_key, lookup_keys, source_hash
from ..cache.paths import studies_dir
from ..cache.store import TuningCache, make_entry
from ..codegen.lower import Plan
from ..config import ChunkTrainConfig, config_from_dict
from ..dtypes import dtype as as_dtype
from ..spec import Recurrence
from .candidates import KernelCandidate, StagedCandidates, StageView
from .compile_pool import CompilePool, compile_check, keep_binaries as _keep, precompile
from .engine import recorded_results, tune
from .families import (TOLERANCE, check_tunable, elem_bytes, families_for, family_spec, lower_for, op_args,
                       space_context, space_for, stage_candidates)
from .isolation import IsolatedCandidate
from .space import SearchSpace

FINALISTS = 3  # configs re-timed interleaved at the end of each stage


def _print(line: str, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


class FamilyResult(NamedTuple):
    winner: Any | None  # the config (None: no candidate passed)
    time_ms: float | None  # its time: the sum of its stages' times
    default_ms: float | None  # the heuristic default's, likewise (None: it failed somewhere)
    error: float | None  # the largest error measured for the stage configs the winner combines
    results: dict  # stage -> the engine's TuneResult


def tune_family(family: str, plan: Plan, spec: Recurrence, spec_args: dict, gpu: GpuProfile, dtype,
                shape: tuple[int, int, int, int], space: SearchSpace | None = None, seed: int = 0,
                progress: bool = True, candidates_by_stage: dict | None = None, jobs: int = 1,
                fwd_config: ChunkTrainConfig | None = None, isolate: bool = False, device: str = "cuda",
                worker: IsolatedCandidate | None = None, pool: CompilePool | None = None,
                state_dtype=torch.float32) -> FamilyResult:
    """Tune one family at one shape on the current GPU, with initial states of ``state_dtype``.

    ``jobs`` > 1 compiles the candidates for ``gpu`` in that many processes first (``pool``'s,
    when given).  ``isolate``: build, check and time the candidates in a worker process
    (:mod:`kdagen.tuning.isolation`), so a config that faults the GPU is one failed trial; ``worker``:
    the isolated worker to use (it is remade with this shape's candidates and left open).
    ``fwd_config``: for ``chunk_bwd``, the training forward's config at this shape (its chunk
    lengths are the backward's; default: its heuristic)."""
    space = space or space_for(family, plan)
    ctx = space_context(plan, spec, gpu, elem_bytes(dtype))
    hint = {"N": shape[0], "HV": shape[3], "T": shape[1], "T_max": shape[1]}
    if family == "chunk_bwd" and fwd_config is None:
        fwd_config = default_train_config(plan, hint)
    default = default_config(family, plan, hint, fwd_config)
    stages = list(space.stages) if space.stages else [None]
    results = {}
    studies_dir().mkdir(parents=True, exist_ok=True)
    cands_by_stage = {}
    for stage in stages:
        cands = (candidates_by_stage or {}).get(stage) or stage_candidates(space, ctx, stage, default)
        if family == "chunk_bwd":  # the forward's chunk lengths
            cands = list(dict.fromkeys(c.with_chunking(default.chunk_size, default.sub_chunk) for c in cands))
        # not at this shape: the sequence-parallel pass where it cannot win (the heuristic's reason)
        cands_by_stage[stage] = [c for c in cands if worth_timing(family, plan, c, hint)] or cands
    # the templates' hash is in the name: a study measured on other kernels is not resumed
    names = {stage: (f"{family}-{stage or 'all'}-{plan.tuning_spec_hash}-{source_hash(family)}-K{plan.K}-V{plan.V}-"
                     f"{plan.dtype}-{as_dtype(state_dtype).name}-{'x'.join(map(str, shape))}-{gpu.name}-"
                     f"{space.fingerprint()}"
                     f"{'-C' + str(default.chunk_size) if family == 'chunk_bwd' else ''}") for stage in stages}
    journals = {stage: studies_dir() / f"{name}.journal" for stage, name in names.items()}
    # every stage's candidates compiled at once, then one worker measures them all; a resumed
    # study needs only its unmeasured candidates, the default and its fastest few (re-timed)
    todo = {}
    for st, cs in cands_by_stage.items():
        done = recorded_results(names[st], journals[st])
        fastest = sorted((t, c) for c, t in done.items() if t is not None)[:FINALISTS]
        keep = {c for _, c in fastest}
        for c in cs + [default]:
            canon = c.canonical()
            if canon not in done or canon in keep or c is default:
                todo[(st, canon)] = (st, c)
    precompile(family, plan, spec_args, dtype, shape, list(todo.values()), jobs, gpu, fwd_config, progress, pool,
               state_dtype=state_dtype)
    make = (StagedCandidates, family, tuple((st, space.stage_launches.get(st)) for st in stages), plan, spec_args,
            dtype, shape)
    isolated = None
    if worker is not None:
        worker.remake(*make, device=device, fwd_config=fwd_config, state_dtype=state_dtype)
        isolated = worker
    elif isolate:
        isolated = IsolatedCandidate(*make, device=device, fwd_config=fwd_config, state_dtype=state_dtype)
    try:
        for stage in stages:
            name = names[stage]
            if isolated is not None:
                cand = StageView(isolated, stage, TOLERANCE[as_dtype(dtype).name])
            else:
                cand = KernelCandidate(family, space.stage_launches.get(stage), plan, spec_args, dtype, shape, device,
                                       fwd_config, state_dtype)
            results[stage] = tune(cands_by_stage[stage], cand, study_name=name, storage_path=journals[stage],
                                  default_config=default, seed=seed, progress=progress, finalists=FINALISTS)
    finally:
        if isolated is not None and isolated is not worker:
            isolated.close()
    if stages == [None]:
        r = results[None]
        return FamilyResult(r.winner, r.winner_time_ms, r.default_time_ms, r.winner_error, results)
    # combine per chunk size: the fastest intra and the fastest state launch for each C
    best = None
    for C in sorted({c.chunk_size for r in results.values() for c in _ok_configs(r)}):
        parts = []
        for stage in stages:
            ok = [(t, c) for c, t in _ok_times(results[stage]) if c.chunk_size == C]
            if not ok:
                break
            parts.append(min(ok, key=lambda tc: (tc[0], tc[1].canonical())))
        if len(parts) != len(stages):
            continue
        total = sum(t for t, _ in parts)
        fields_by_stage = {s: space.stages[s] for s in stages}
        merged = default
        for s, (_, c) in zip(stages, parts):
            merged = merged.replace(**{f: getattr(c, f) for f in fields_by_stage[s]})
        if best is None or total < best[0]:
            errors = [_error(results[s], c) for s, (_, c) in zip(stages, parts)]
            best = (total, merged, None if None in errors else max(errors))
    default_ms = None
    if all(results[s].default_time_ms is not None for s in stages):
        default_ms = sum(results[s].default_time_ms for s in stages)
    if best is None:
        return FamilyResult(None, None, default_ms, None, results)
    return FamilyResult(best[1], best[0], default_ms, best[2], results)


def _error(result, config) -> float | None:
    """The error measured for ``config`` in a stage's search (a trial's, or the default's)."""
    canon = config.canonical()
    for t in result.trials:
        if t.config.canonical() == canon and t.error is not None:
            return t.error
    if result.default_config is not None and result.default_config.canonical() == canon:
        return result.default_error
    return None


def _ok_times(result):
    out = [(f.config, f.median_ms) for f in result.finalists if f.median_ms is not None and not f.dropped]
    seen = {c.canonical() for c, _ in out}
    for t in result.trials:
        if t.status == "ok" and t.time_ms is not None and t.config.canonical() not in seen:
            out.append((t.config, t.time_ms))
    return out


def _ok_configs(result):
    return [c for c, _ in _ok_times(result)]


def duration(ms: float) -> str:
    """A kernel time for people: microseconds below 0.1 ms (decode steps), else milliseconds."""
    return f"{ms * 1e3:.2f} us" if ms < 0.1 else f"{ms:.3f} ms"


def error_text(error: float | None) -> str:
    """A winner's measured relative error against float64, for people."""
    return "not measured" if error is None else f"{error:.1e}"


DECODE_HEADS = 32  # the value heads of a decode tuning shape given as a batch alone


def tuning_shapes(family: str, K: int, shapes: list[tuple[int, int, int, int]],
                  decode_batches: list) -> list[tuple[tuple, dict]]:
    """((B, T, H, HV), call shape) of each shape a family is tuned at for head dim K: the chunk
    forms at the ``shapes`` (B, T, H, K) with that K, decode at ``decode_batches`` -- each a batch (on
    :data:`DECODE_HEADS` heads) or a (batch, value heads) pair.  The call shape holds every feature the
    heuristics read from an op's call (its value heads too: the state-pass programs, the decode step's
    pairs), so the heuristic config tuned against and kept is the one the op runs there, and its key
    (keys.call_bucket) names them."""
    if family == "recurrent":
        # a decode step (one token per sequence) on [.., K, V] states: what the key records (keys.call_bucket)
        pairs = [(d, DECODE_HEADS) if isinstance(d, int) else tuple(d) for d in decode_batches]
        return [((b, 1, hv, hv), dict(T=1, B=b, N=b, HV=hv, state_v_first=False)) for b, hv in pairs]
    return [((B, T, H, H), dict(T=T, B=B, N=B, HV=H)) for B, T, H, Ks in shapes if Ks == K]


def plans_for(spec_args: dict, dtype, head_dims: list[tuple[int, int]], families: list[str]) -> dict:
    """``{(K, V, family): (plan, spec)}`` of every family this build generates at every head dim (a
    general DPLR spec's families are those :func:`~.families.families_for` maps them to)."""
    plans = {}
    for K, V in head_dims:
        for fam in families_for(spec_args, families):
            spec = family_spec(fam, spec_args)
            plans[(K, V, fam)] = (lower_for(spec, fam, K, V, dtype), spec)
    return plans


def compile_all(gpu: GpuProfile, spec_args: dict, dtype, head_dims: list[tuple[int, int]], families: list[str],
                shapes, decode_batches, pool: CompilePool, space: SearchSpace | None = None, quiet: bool = False,
                echo: Callable[..., None] = _print, state_dtype="fp32", on_progress=None) -> tuple[dict, int]:
    """Compile-check every family at every head dim for ``gpu`` (specialised as the first tuning
    shape will run them, so that on that GPU the tuner loads these binaries).  Returns
    ``({(K, V, family): (plan, spec, surveys)}, the number of stages left without a config)``.
    ``on_progress``: :func:`compile_check`'s.  ``families`` are :data:`~.families.FAMILIES`' names;
    a general DPLR spec compiles the families :func:`~.families.families_for` maps them to
    (its chunk forward is ``chunk_train``)."""
    surveys_all, n_empty = {}, 0
    for (K, V, fam), (plan, spec) in plans_for(spec_args, dtype, head_dims, families).items():
        first = tuning_shapes(fam, K, shapes, decode_batches)[:1]
        surveys = compile_check(fam, plan, spec, spec_args, gpu, as_dtype(dtype).torch, space=space,
                                progress=not quiet, jobs=pool.jobs, shape=first[0][0] if first else None,
                                pool=pool, state_dtype=as_dtype(state_dtype).torch, on_progress=on_progress)
        for s in surveys:
            label = f"{fam}{'/' + s.stage if s.stage else ''} K={K} V={V}"
            echo(f"  {label}: {len(s.survivors)}/{s.total} candidate configs compiled for "
                 f"{gpu.name}; {len(s.failures)} dropped")
            for cfg, why in s.failures[:5]:
                echo(f"      dropped {cfg.short()}: {why}")
            n_empty += not s.survivors
        surveys_all[(K, V, fam)] = (plan, spec, surveys)
    return surveys_all, n_empty


def tune_and_store(gpu: GpuProfile, spec_args: dict, dtype, surveys_all: dict, shapes, decode_batches,
                   space: SearchSpace | None = None, seed: int = 0, quiet: bool = False,
                   pool: CompilePool | None = None, echo: Callable[..., None] = _print,
                   state_dtype="fp32", on_tuned=None) -> TuningCache:
    """Tune every compile-checked family of :func:`compile_all` at its shapes on this GPU (the
    backward at its own chunk length, see below), with initial states of ``state_dtype``, and
    store the winners with their measured errors.  The backward is tuned with the training
    forward (:class:`~kdagen.config.ChunkTrainConfig`) at its own heuristic chunk length: the
    inference forward's winner does not run in training.  ``pool``: the compile processes for the
    compiles ahead of each search (none: nothing is compiled ahead).  ``echo(line, err=False)``
    prints.  ``on_tuned(family, K, V, shape, winner, time_ms, default_ms, error)``: called after
    each family and shape (``winner`` None: no candidate passed)."""
    dtype, state = as_dtype(dtype).torch, as_dtype(state_dtype)
    cache = TuningCache(gpu.name)
    # one isolated worker measures every family and shape: its start-up is paid once
    with IsolatedCandidate(StagedCandidates) as worker:
        for (K, V, fam), (plan, spec, surveys) in surveys_all.items():
            by_stage = {s.stage: s.survivors for s in surveys}
            for shape, hint in tuning_shapes(fam, K, shapes, decode_batches):
                t0 = time.time()
                winner, ms, default_ms, error, _ = tune_family(
                    fam, plan, spec, spec_args, gpu, dtype, shape, space=space, seed=seed, progress=not quiet,
                    candidates_by_stage=by_stage, jobs=pool.jobs if pool else 1,
                    isolate=True, worker=worker, pool=pool,
                    state_dtype=state.torch)
                if on_tuned is not None:
                    on_tuned(fam, K, V, shape, winner, ms, default_ms, error)
                if winner is None:
                    echo(f"  {fam} K={K} V={V} shape {shape}: no candidate passed the correctness gate", err=True)
                    continue
                cache.store(cache_key(plan, fam, hint, gpu, state.name), make_entry(
                    config=winner.to_dict(), kernel=fam, time_ms=ms, error=error, default_time_ms=default_ms))
                sp = f" (x{default_ms / ms:.2f} vs default {duration(default_ms)})" if default_ms else ""
                echo(f"  tuned {fam} K={K} V={V} shape {shape}: {duration(ms)}{sp}, error {error_text(error)} in "
                     f"{time.time() - t0:.0f}s -> {winner.short()}")
                if default_ms is None:  # what users run untuned failed here: say so
                    echo(f"  warning: {fam} K={K} V={V} shape {shape}: the heuristic default config failed "
                         f"to build, check or time at this shape (see the trials' reasons above); the stored "
                         f"winner was not compared with it", err=True)
    echo(f"winners stored in {cache.path}")
    return cache


class Kept(NamedTuple):
    """A config the ops run on the build's GPU at one tuning shape, compiled for it and kept."""

    family: str
    K: int
    V: int
    shape: tuple  # (B, T, H, HV)
    config: Any
    tuned: bool  # a stored winner (else the heuristic's config)
    why: str | None  # why it did not compile (None: kept)


def keep_binaries(gpu: GpuProfile, spec_args: dict, dtype, plans: dict, shapes, decode_batches,
                  pool: CompilePool, cache: TuningCache | None = None, state_dtype="fp32") -> list[Kept]:
    """Compile for ``gpu`` and keep (:mod:`kdagen.cache.binaries`) what the ops will run there at each
    family's tuning shapes: the winner ``cache`` holds for the shape, else the heuristic's config (a
    backward with the training forward it runs beside).  ``plans``: :func:`plans_for`'s (or
    :func:`compile_all`'s) dict, the plan first in each value."""
    state = as_dtype(state_dtype)
    tuned = cache or TuningCache(gpu.name)
    targets, rows = [], []
    for (K, V, fam), (plan, *_) in plans.items():
        for shape, hint in tuning_shapes(fam, K, shapes, decode_batches):
            found = []

            def pick(family, **kw):
                keys = lookup_keys(plan, family, hint, gpu, state.name)  # as the ops look winners up
                entry = next((e for e in map(tuned.lookup, keys) if e is not None), None)
                found.append(entry is not None)
                return config_from_dict(family, entry["config"]) if entry else default_config(family, plan, hint, **kw)
            fwd = None
            if fam == "chunk_bwd":
                fwd = pick("chunk_train")
                config = pick("chunk_bwd", train_config=fwd).with_chunking(fwd.chunk_size, fwd.sub_chunk)
            else:
                config = pick(fam)
            targets.append((fam, plan, spec_args, shape, config, fwd))
            rows.append((fam, K, V, shape, config, all(found)))
    whys = _keep(targets, as_dtype(dtype).torch, gpu, pool, state_dtype=state.torch)
    return [Kept(*row, why) for row, why in zip(rows, whys)]
