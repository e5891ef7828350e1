"""Compile-only checks for a GPU that is not here: every candidate's kernels compiled for its
architecture in spawned worker processes (:class:`CompilePool`), dropping the ones that fail
or exceed its shared memory (:func:`compile_check`), and the tuner's compiles ahead of a
timed search (:func:`precompile`).  No worker touches a GPU."""
from __future__ import annotations

import functools
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import torch
from triton.backends.compiler import GPUTarget

from ..cache.gpus import GpuProfile
from ..cache.heuristics import default_config, default_train_config
from ..codegen.lower import Plan
from ..config import ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig, config_from_dict
from ..dtypes import dtype as as_dtype
from ..kernels import build, compile_for_target, specialisation, with_repairs
from ..ops.chunk import chunk_kda_bwd_launches, chunk_kda_launches
from ..ops.inputs import check_inputs
from ..ops.recurrent import prepare_recurrent
from ..spec import Recurrence
from .families import (COMPILE_SHAPE, check_shape, elem_bytes, family_spec, log_progress, lower_for, op_args,
                       space_context, space_for, stage_candidates, timed_launches, uses_kda_ops)
from .space import SearchSpace


@dataclass
class CompileSurvey:
    """What the compile-check of one stage (or a whole family) of candidates found."""

    family: str
    stage: str | None
    total: int = 0
    survivors: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # (config, reason)


def _dummy_inputs(plan: Plan, dtype: torch.dtype, shape: tuple[int, int, int, int], state_dtype=torch.float32):
    """Zero inputs of ``shape`` (B, T, H, HV) on the CPU, dtypes as the tuner's inputs."""
    B, T, H, HV = shape
    K, V = plan.K, plan.V
    q = torch.zeros(B, T, H, K, dtype=dtype)
    return dict(q=q, k=q.clone(), v=torch.zeros(B, T, HV, V, dtype=dtype), g=torch.zeros(B, T, HV, K),
                beta=torch.zeros(B, T, HV, dtype=dtype), initial_state=torch.zeros(B, HV, K, V, dtype=state_dtype))


def launches_for(plan: Plan, config, dtype: torch.dtype, spec_args: dict,
                 shape: tuple[int, int, int, int] = COMPILE_SHAPE, fwd_config: ChunkTrainConfig | None = None,
                 with_forward: bool = False, state_dtype=torch.float32, pdl: bool | None = None,
                 with_states: bool = True):
    """The launches (kernels + arguments) a config produces for inputs of ``shape`` (B, T, H,
    HV), on CPU tensors.  A backward config: its three launches, after (``with_forward``)
    the training forward's and the backward's re-run of the intra launch (``fwd_config``'s,
    default: the heuristic at the backward's chunk lengths); ``state_dtype``: initial_state's.
    ``pdl``: whether a decode launch waits on the previous grid (programmatic dependent launch), as the
    op decides it on the GPU it runs on (:func:`target_pdl`); None: as on these CPU tensors (never).
    ``with_states``: a chunk call with an initial state and output_final_state (False: neither, as a
    training step calls it -- the state passes' USE_H0 / STORE_HT kernels differ); a decode launch always
    has its state."""
    x = _dummy_inputs(plan, dtype, shape, state_dtype)
    if not with_states and isinstance(config, (ChunkFwdConfig, ChunkBwdConfig, ChunkTrainConfig)):
        x["initial_state"] = None
    if not uses_kda_ops(spec_args):  # any other spec: the member entries, its inputs in its layout
        return _member_launches(plan, config, x, spec_args, fwd_config, with_forward, pdl, with_states)
    if isinstance(config, ChunkFwdConfig):
        launches, _ = chunk_kda_launches(**x, output_final_state=with_states, config=config, **op_args(spec_args))
        return launches
    if isinstance(config, ChunkBwdConfig):
        fwd_cfg = (fwd_config or default_train_config(plan)).replace(chunk_size=config.chunk_size,
                                                                     sub_chunk=config.sub_chunk)
        fwd, bwd, _ = chunk_kda_bwd_launches(**x, output_final_state=with_states, config=fwd_cfg, bwd_config=config,
                                             with_rerun=with_forward, **op_args(spec_args))
        return list(fwd) + list(bwd) if with_forward else bwd
    return [_recurrent_launch(plan, config, x, x["initial_state"], None, pdl=pdl)]


def target_pdl(arch: int) -> bool:
    """Whether the decode op launches with programmatic dependent launch on a GPU of compute capability
    ``arch`` (``ops.recurrent``: PDL and sm_90 on) -- part of the kernel's specialisation, so a binary
    kept for that GPU must be compiled with it."""
    from ..ops import recurrent

    return bool(recurrent.PDL) and arch >= 90


def _recurrent_launch(plan: Plan, config, x: dict, initial_state, state_indices, cu_seqlens=None,
                      state_v_first: bool = False, **force):
    """KDA's recurrent launch on the CPU inputs ``x`` (a state pool when ``state_indices`` are
    given, laid out [.., V, K] with ``state_v_first``; packed sequences with ``cu_seqlens``);
    ``force``: prepare_recurrent's by_slot / pdl."""
    dims, _ = check_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=None, initial_state=initial_state,
                           cu_seqlens=cu_seqlens, state_indices=state_indices, state_v_first=state_v_first)
    launch, _ = prepare_recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.1, initial_state=initial_state,
                                  output_final_state=state_indices is None, cu_seqlens=cu_seqlens,
                                  state_indices=state_indices, dims=dims, plan=plan, built=build(plan, config),
                                  state_v_first=state_v_first, **force)
    return launch


def _member_launches(plan: Plan, config, x: dict, spec_args: dict, fwd_config, with_forward: bool,
                     pdl: bool | None = None, with_states: bool = True):
    """:func:`launches_for` of a spec that runs through the member entries."""
    from . import member_ops as M

    if isinstance(config, ChunkTrainConfig):  # general DPLR's chunk forward (families.DPLR_CHUNK_FAMILY)
        spec = family_spec("chunk_train", spec_args)
        return M.chunk_train_launches(spec, M.member_inputs(spec, x), config, final_state=with_states)
    if isinstance(config, (ChunkFwdConfig, ChunkBwdConfig)):
        spec = family_spec("chunk_fwd", spec_args)
        x = M.member_inputs(spec, x)
        if isinstance(config, ChunkFwdConfig):
            return M.chunk_fwd_launches(spec, x, config, final_state=with_states)
        fwd_cfg = (fwd_config or default_train_config(plan)).replace(chunk_size=config.chunk_size,
                                                                     sub_chunk=config.sub_chunk)
        fwd, bwd = M.chunk_bwd_launches(spec, x, fwd_cfg, config, with_rerun=with_forward, final_state=with_states)
        return list(fwd) + list(bwd) if with_forward else bwd
    spec = family_spec("recurrent", spec_args)
    return [M.recurrent_launch(spec, M.member_inputs(spec, x), config, pdl=pdl)]


def pool_launch_for(plan: Plan, config, dtype: torch.dtype, shape: tuple[int, int, int, int] = COMPILE_SHAPE,
                    state_dtype=torch.float32, pdl: bool = False, *, slots: torch.Tensor | None = None,
                    packed: bool = False, by_slot: bool | None = True, state_v_first: bool = False):
    """The launch KDA's decode step on a state pool runs with ``config`` (inputs of ``shape``, a pool
    of B + 4 slots): its programs over the pool's slots (the slot grid, taken here at any size unless
    ``by_slot`` is None -- the heuristic's choice -- or False) and, with ``pdl``, a programmatic
    dependent launch -- what a serving engine runs, beside the tuner's batch launch
    (:func:`launches_for`).  ``slots``: sequence n's slot (default n); ``packed``: the B sequences
    of T tokens packed into one row with cu_seqlens, as engines call it; ``state_v_first``: the pool
    laid out [B + 4, HV, V, K]."""
    B, T, H, HV = shape
    pool = torch.zeros((B + 4, HV) + ((plan.V, plan.K) if state_v_first else (plan.K, plan.V)), dtype=state_dtype)
    x = _dummy_inputs(plan, dtype, (1, B * T, H, HV) if packed else shape, state_dtype)
    return _recurrent_launch(plan, config, x, pool, torch.arange(B, dtype=torch.int32) if slots is None else slots,
                             cu_seqlens=torch.arange(B + 1) * T if packed else None, by_slot=by_slot, pdl=pdl,
                             state_v_first=state_v_first)


@functools.lru_cache(maxsize=64)
def _worker_plan(family: str, K: int, V: int, dtype_name: str, spec_args: tuple):
    """(op arguments, dtype, plan) rebuilt in a worker process from plain arguments (once per
    process: lowering runs sympy)."""
    args = dict(spec_args)
    dtype = as_dtype(dtype_name).torch
    return args, dtype, lower_for(family_spec(family, args), family, K, V, dtype)


def checked_launches(family: str, plan: Plan, cfg, dtype: torch.dtype, args: dict, shape: tuple, fcfg,
                     which: str | None, state_dtype: torch.dtype, pdl: bool, keep: bool) -> list:
    """The launches :func:`_compile_one` compiles for a candidate (before their repair launches): a stage's
    kernel, or every launch of the config (``which`` None); a decode config's pool step beside its batch
    launch; and, when the binaries are kept, a chunk call without states too (a training step's: its state
    passes are other kernels, USE_H0 / STORE_HT off), so that a first call finds either."""
    launches = launches_for(plan, cfg, dtype, args, shape, fcfg, with_forward=which is None,
                            state_dtype=state_dtype, pdl=pdl)
    # a stage's kernel, or the launches standing in for it (the sequence-parallel state pass's), as the
    # tuner times them (families.timed_launches: with dqkw for a fold's intra stage)
    checked = list(launches if which is None else timed_launches(launches, which, plan))
    if family == "recurrent" and uses_kda_ops(args):  # and the decode step on a pool, as an engine runs it
        checked.append(pool_launch_for(plan, cfg, dtype, shape, state_dtype, pdl=pdl))
    if keep and family != "recurrent":  # (only the kernels that differ: the state passes)
        bare = launches_for(plan, cfg, dtype, args, shape, fcfg, with_forward=which is None,
                            state_dtype=state_dtype, pdl=pdl, with_states=False)
        seen = {_specialisation(ln) for ln in checked}
        checked += [ln for ln in (bare if which is None else timed_launches(bare, which, plan))
                    if _specialisation(ln) not in seen]
    return checked


def _specialisation(ln) -> tuple:
    return specialisation(ln.fn, list(ln.args.values()), ln.constexprs, ln.num_warps, ln.num_stages)


def _compile_one(family: str, K: int, V: int, dtype_name: str, spec_args: tuple, shape: tuple, config: dict,
                 which: str | None, arch: int, smem_limit: int, gpu_name: str,
                 fwd_config: dict | None = None, state_dtype: str = "fp32", keep: bool = False) -> str | None:
    """Compile one candidate's kernel(s) for ``arch``, specialised for inputs of ``shape``;
    None if it fits, else why it was dropped.  ``which``: the one kernel to compile (None: every
    launch -- for a backward config with the training forward of ``fwd_config``).  ``keep``: keep the
    binaries (:mod:`kdagen.cache.binaries`).  A top-level function of plain arguments, so a worker
    process can run it."""

    args, dtype, plan = _worker_plan(family, K, V, dtype_name, spec_args)
    cfg = config_from_dict(family, config)
    fcfg = None if fwd_config is None else config_from_dict("chunk_train", fwd_config)
    pdl = target_pdl(arch)  # decode launches as the op makes them on that GPU
    try:
        checked = checked_launches(family, plan, cfg, dtype, args, tuple(shape), fcfg, which,
                                   as_dtype(state_dtype).torch, pdl, keep)
        # each launch and the repair launch that follows it (a checked diagonal's: REPAIR=True)
        kept = dict(gpu=gpu_name, family=family, K=K, V=V, dtype=dtype_name, config=cfg.canonical()) if keep else None
        for ln in with_repairs(checked):
            rep = compile_for_target(ln.fn, ln.args, ln.constexprs, GPUTarget("cuda", arch, 32),
                                     ln.num_warps, ln.num_stages, keep=kept)
            if rep.shared_bytes > smem_limit:
                return f"needs {rep.shared_bytes} B of shared memory, {gpu_name} has {smem_limit}"
    except Exception as e:  # noqa: BLE001 - any compiler failure drops the config
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        return f"{type(e).__name__}: {msg}"
    return None


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


class CompilePool:
    """Spawned compile processes kept for a series of compile-checks and precompiles (`kdagen
    build`: every family and shape), so each worker imports torch, Triton and kdagen and
    lowers its plans once.  No worker touches a GPU: kernels are compiled for a target
    (:func:`kdagen.kernels.compile_for_target`), so no candidate can fault one.  A pool whose
    worker died is replaced on the next use."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self._pool = None
        self.replaced = 0

    def get(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self.replaced += 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _compile_args(family: str, plan: Plan, dtype, spec_args: dict, cshape: tuple, gpu: GpuProfile, state_dtype):
    """The plain arguments of :func:`_compile_one` around a config: (those before it, those after,
    the keyword ones)."""
    return ((family, plan.K, plan.V, as_dtype(dtype).short, tuple(sorted(spec_args.items())), cshape),
            (gpu.arch, gpu.smem_per_block_bytes, gpu.name), {"state_dtype": as_dtype(state_dtype).short})


def compile_check(family: str, plan: Plan, spec: Recurrence, spec_args: dict, gpu: GpuProfile,
                  dtype: torch.dtype, space: SearchSpace | None = None, progress: bool = True,
                  jobs: int = 1, shape: tuple[int, int, int, int] | None = None,
                  pool: CompilePool | None = None, state_dtype=torch.float32,
                  on_progress=None) -> list[CompileSurvey]:
    """Compile every candidate's kernels for ``gpu``'s architecture (no GPU needed); drop the
    ones that fail to compile or exceed the GPU's shared memory per block.  ``jobs`` > 1
    compiles in that many worker processes (Triton compiles one kernel per thread).

    ``shape``: a tuning shape (B, T, H, HV).  The kernels are specialised as Triton's JIT
    specialises them at that shape's check shape (:func:`check_shape`,
    :func:`kdagen.kernels.jit_source`), so on that GPU the tuner finds them in Triton's cache
    and does not compile them again.  ``pool``: the compile processes to use (default: its own).
    ``on_progress(label, n_done, n_total, n_ok)``: called as candidates finish, instead of the
    progress lines (:class:`kdagen.tuning.report.Progress`)."""
    space = space or space_for(family, plan)
    ctx = space_context(plan, spec, gpu, elem_bytes(dtype))
    default = default_config(family, plan)
    stages = list(space.stages) if space.stages else [None]
    common, gpu_args, kw = _compile_args(family, plan, dtype, spec_args,
                                         check_shape(family, shape) if shape is not None else COMPILE_SHAPE, gpu,
                                         state_dtype)
    surveys = []
    own = pool is None
    if own:
        pool = CompilePool(jobs)
    try:
        for stage in stages:
            cands = stage_candidates(space, ctx, stage, default)
            survey = CompileSurvey(family, stage, total=len(cands))
            which = space.stage_launches[stage] if stage is not None else None
            label = f"{family}{'/' + stage if stage else ''}"
            t0 = time.time()
            reasons: dict[int, str | None] = {}

            def report(n_done):
                ok = sum(1 for r in reasons.values() if r is None)
                if on_progress is not None:
                    return on_progress(label, n_done, len(cands), ok)
                log_progress(f"  [{label} {n_done}/{len(cands)}] {ok} ok, {n_done - ok} dropped "
                          f"({time.time() - t0:.0f}s)", progress)

            if on_progress is not None:
                on_progress(label, 0, len(cands), 0)
            if jobs > 1 and len(cands) > 2:
                ex = pool.get()
                futs = {ex.submit(_compile_one, *common, c.to_dict(), which, *gpu_args, **kw): i
                        for i, c in enumerate(cands)}
                for fut in as_completed(futs):
                    reasons[futs[fut]] = fut.result()
                    report(len(reasons))
            else:
                for i, c in enumerate(cands):
                    reasons[i] = _compile_one(*common, c.to_dict(), which, *gpu_args, **kw)
                    report(len(reasons))
            for i, c in enumerate(cands):  # candidate order, whatever the completion order
                if reasons[i] is None:
                    survey.survivors.append(c)
                else:
                    survey.failures.append((c, reasons[i]))
            surveys.append(survey)
    finally:
        if own:
            pool.close()
    return surveys


def precompile(family: str, plan: Plan, spec_args: dict, dtype, shape, staged: list, jobs: int,
               gpu: GpuProfile, fwd_config: ChunkTrainConfig | None = None, progress: bool = True,
               pool: CompilePool | None = None, state_dtype=torch.float32) -> float:
    """Compile every ``(stage, config)``'s launches (a backward config's with the training
    forward of ``fwd_config``) for ``gpu``, specialised at ``shape``'s check shape, in
    ``jobs`` compile processes (``pool``'s when given), before the sequential timed search:
    the tuner's builds then load them from Triton's cache.  Returns the seconds it took.
    A config that does not compile is left for the tuner to record as a failed trial."""
    if jobs <= 1 or len(staged) < 2:
        return 0.0
    t0 = time.time()
    common, gpu_args, kw = _compile_args(family, plan, dtype, spec_args, check_shape(family, shape), gpu, state_dtype)
    fdict = None if fwd_config is None else fwd_config.to_dict()
    own = pool is None
    if own:
        pool = CompilePool(min(jobs, len(staged)))
    lost = []
    try:
        ex = pool.get()
        futs = [ex.submit(_compile_one, *common, c.to_dict(), None, *gpu_args, fdict, **kw) for _, c in staged]
        for n, fut in enumerate(as_completed(futs), 1):
            if fut.exception() is not None:  # the worker died (BrokenProcessPool): not a compile error
                lost.append(fut.exception())
            if n == len(futs) or n % 8 == 0:
                log_progress(f"  [{family} precompile {n}/{len(futs)}] ({time.time() - t0:.0f}s)", progress)
    finally:
        if own:
            pool.close()
        elif lost:
            pool.discard()
    if lost:
        log_progress(f"  [{family} precompile] {len(lost)} of {len(futs)} not compiled, a worker died "
                  f"({type(lost[0]).__name__}); the tuner compiles them itself", progress)
    return time.time() - t0


def keep_binaries(targets: list[tuple[str, Plan, dict, tuple, dict, ChunkTrainConfig | None]], dtype, gpu: GpuProfile,
                  pool: CompilePool, state_dtype=torch.float32) -> list[str]:
    """Compile and keep (:mod:`kdagen.cache.binaries`) the kernels the ops will run on ``gpu``: each target
    is ``(family, plan, spec_args, shape, config, training forward config or None)``, compiled specialised as
    the ops specialise ``shape`` (B, T, H, HV) -- every launch of the config, the training forward's with a
    backward's.  Returns, for each target in order, why it did not compile (None: kept).  Targets that
    compile the same kernels (the same config at two shapes the ops specialise alike) compile once."""
    calls = {}  # the compile of each distinct call, by its arguments
    order = []
    for family, plan, spec_args, shape, config, fwd in targets:
        common, gpu_args, kw = _compile_args(family, plan, dtype, spec_args, check_shape(family, shape), gpu,
                                             state_dtype)
        call = (*common, config.to_dict(), None, *gpu_args, None if fwd is None else fwd.to_dict())
        key = repr((call, sorted(kw.items())))
        calls.setdefault(key, (call, {**kw, "keep": True}))
        order.append(key)
    if pool.jobs > 1 and len(calls) > 1:
        ex = pool.get()
        futs = {key: ex.submit(_compile_one, *call, **kw) for key, (call, kw) in calls.items()}
        whys = {key: fut.result() for key, fut in futs.items()}
    else:
        whys = {key: _compile_one(*call, **kw) for key, (call, kw) in calls.items()}
    return [whys[key] for key in order]
