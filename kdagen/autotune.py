"""Tuning kdagen's own kernels: the candidates the search spaces admit for a GPU, their
compile-only check for a GPU that is not present, and — on a matching GPU — the
correctness-gated, timed search that writes winners to the cache.

The generic Optuna engine is :mod:`kdagen.tune`; this module supplies what it searches
(configs), how a candidate is built, checked against the float64 reference, and timed.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import torch

from .config import ChunkBwdConfig, ChunkFwdConfig
from .gpus import GpuProfile
from .heuristics import default_chunk_bwd_config, default_chunk_config, default_recurrent_config
from .isolation import IsolatedCandidate
from .kernels import compile_for_target
from .lower import Plan, lower
from .search_space import SearchSpace, load_space
from .spec import Recurrence
from .structure import safe_sub_chunk

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
DTYPE_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # worker arguments
FINALISTS = 3  # configs re-timed interleaved at the end of each stage

TOLERANCE = {torch.bfloat16: 6e-3, torch.float16: 2e-3, torch.float32: 1e-4}
FAMILIES = ("chunk_fwd", "chunk_bwd", "recurrent")


def _progress(msg: str, enabled: bool = True):
    if enabled:
        print(msg, file=sys.stderr, flush=True)


def space_context(plan: Plan, spec: Recurrence, gpu: GpuProfile, elem_bytes: int) -> dict:
    bound = safe_sub_chunk(spec)
    return dict(K=plan.K, V=plan.V, safe_sub_chunk=bound.length or 0,
                smem_limit=gpu.smem_per_block_bytes, elem_bytes=elem_bytes)


def default_for(family: str, plan: Plan, shape_hint: dict | None = None, fwd_config: ChunkFwdConfig | None = None):
    """The heuristic config of a family; the backward's takes the forward's chunk lengths."""
    if family == "chunk_fwd":
        return default_chunk_config(plan, shape_hint)
    if family == "chunk_bwd":
        fwd = fwd_config or default_chunk_config(plan, shape_hint)
        return default_chunk_bwd_config(plan).replace(chunk_size=fwd.chunk_size, sub_chunk=fwd.sub_chunk)
    return default_recurrent_config(plan)


def stage_candidates(space: SearchSpace, context: dict, stage: str | None, default) -> list:
    """Candidates of one separately-timed stage: the stage's own fields vary, every other
    field keeps the default's value; duplicates are dropped, order is kept."""
    cands = space.candidates(context)
    if stage is None:
        return cands
    fields_ = space.stages[stage]
    out, seen = [], set()
    for c in cands:
        proj = default.replace(**{f: getattr(c, f) for f in fields_})
        canon = proj.canonical()
        if canon not in seen:
            seen.add(canon)
            out.append(proj)
    return out


# --- compile-only ---------------------------------------------------------------------

CHECK_T_MAX = 1024  # tokens of the correctness check (the timed shape's heads, one sequence)
COMPILE_SHAPE = (1, 64, 1, 1)  # (B, T, H, HV) compiled for when no tuning shape is given


def check_shape(family: str, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The shape a candidate is built and checked at for a timed ``shape`` (B, T, H, HV): one
    sequence of ``min(T, CHECK_T_MAX)`` tokens with the timed heads (decode: the timed batch,
    one token).  Triton specialises its kernels alike for both, so each compiles once."""
    B, T, H, HV = shape
    return (B, 1, H, HV) if family == "recurrent" else (1, min(T, CHECK_T_MAX), H, HV)


def _dummy_inputs(plan: Plan, dtype: torch.dtype, shape: tuple[int, int, int, int]):
    """Zero inputs of ``shape`` (B, T, H, HV) on the CPU, dtypes as the tuner's inputs."""
    B, T, H, HV = shape
    K, V = plan.K, plan.V
    q = torch.zeros(B, T, H, K, dtype=dtype)
    return dict(q=q, k=q.clone(), v=torch.zeros(B, T, HV, V, dtype=dtype), g=torch.zeros(B, T, HV, K),
                beta=torch.zeros(B, T, HV, dtype=dtype), initial_state=torch.zeros(B, HV, K, V))


def launches_for(plan: Plan, config, dtype: torch.dtype, spec_args: dict,
                 shape: tuple[int, int, int, int] = COMPILE_SHAPE, fwd_config: ChunkFwdConfig | None = None,
                 with_forward: bool = False):
    """The launches (kernels + arguments) a config produces for inputs of ``shape`` (B, T, H,
    HV), on CPU tensors.  A backward config: its three launches, after (``with_forward``)
    the training forward's and the backward's re-run of the intra launch (``fwd_config``'s,
    default: the heuristic at the backward's chunk lengths)."""
    from .ops.chunk import chunk_kda_launches
    from .ops.recurrent import prepare_recurrent
    from .runtime import build
    from .validate import check_inputs

    x = _dummy_inputs(plan, dtype, shape)
    if isinstance(config, ChunkFwdConfig):
        launches, _ = chunk_kda_launches(**x, output_final_state=True, config=config, **spec_args)
        return launches
    if isinstance(config, ChunkBwdConfig):
        from .ops.chunk_bwd import chunk_kda_bwd_launches

        fwd_cfg = (fwd_config or default_chunk_config(plan)).replace(chunk_size=config.chunk_size,
                                                                     sub_chunk=config.sub_chunk)
        fwd, bwd, _ = chunk_kda_bwd_launches(**x, output_final_state=True, config=fwd_cfg, bwd_config=config,
                                             with_rerun=with_forward, **spec_args)
        return list(fwd) + list(bwd) if with_forward else bwd
    built = build(plan, config)
    dims, _ = check_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=None,
                           initial_state=x["initial_state"], cu_seqlens=None)
    launch, _ = prepare_recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.1,
                                  initial_state=x["initial_state"], output_final_state=True,
                                  cu_seqlens=None, state_indices=None, dims=dims, plan=plan, built=built)
    return [launch]


@dataclass
class CompileSurvey:
    family: str
    stage: str | None
    total: int = 0
    survivors: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # (config, reason)


def family_spec(family: str, spec_args: dict) -> Recurrence:
    """The spec a family's op builds its kernels for, given the op arguments (g given
    directly) that tuning passes: ``chunk_kda`` takes ``safe_gate`` and ``lower_bound``;
    ``fused_recurrent_kda`` has no ``safe_gate`` (FLA's signature), so its kernel is the
    direct gate's whatever the bound.  Plans, cache keys and studies are made from this spec,
    so a stored winner has the key the op looks up."""
    from .ops.common import select_spec

    safe = bool(spec_args.get("safe_gate", False)) and family != "recurrent"
    return select_spec(False, safe, spec_args.get("lower_bound"), False, False)


@functools.lru_cache(maxsize=64)
def _worker_plan(family: str, K: int, V: int, dtype_name: str, spec_args: tuple):
    """(op arguments, dtype, plan) rebuilt in a worker process from plain arguments (once per
    process: lowering runs sympy)."""
    args = dict(spec_args)
    dtype = DTYPES[dtype_name]
    return args, dtype, lower_for(family_spec(family, args), family, K, V, dtype)


def _compile_one(family: str, K: int, V: int, dtype_name: str, spec_args: tuple, shape: tuple, config: dict,
                 which: int | None, arch: int, smem_limit: int, gpu_name: str,
                 fwd_config: dict | None = None) -> str | None:
    """Compile one candidate's kernel(s) for ``arch``, specialised for inputs of ``shape``;
    None if it fits, else why it was dropped.  ``which``: one launch's index (None: every
    launch -- for a backward config with the training forward of ``fwd_config``).  A
    top-level function of plain arguments, so a worker process can run it."""
    from .config import config_from_dict
    from triton.backends.compiler import GPUTarget

    args, dtype, plan = _worker_plan(family, K, V, dtype_name, spec_args)
    cfg = config_from_dict(family, config)
    fcfg = None if fwd_config is None else config_from_dict("chunk_fwd", fwd_config)
    try:
        launches = launches_for(plan, cfg, dtype, args, tuple(shape), fcfg, with_forward=which is None)
        for ln in (launches if which is None else [launches[which]]):
            rep = compile_for_target(ln.fn, ln.args, ln.constexprs, GPUTarget("cuda", arch, 32),
                                     ln.num_warps, ln.num_stages)
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


def _compile_args(family: str, plan: Plan, dtype, spec_args: dict, cshape: tuple, gpu: GpuProfile):
    """The plain arguments of :func:`_compile_one` around a config: (those before it, those after)."""
    return ((family, plan.K, plan.V, DTYPE_SHORT[dtype], tuple(sorted(spec_args.items())), cshape),
            (gpu.arch, gpu.smem_per_block_bytes, gpu.name))


def compile_check(family: str, plan: Plan, spec: Recurrence, spec_args: dict, gpu: GpuProfile,
                  dtype: torch.dtype, space: SearchSpace | None = None, progress: bool = True,
                  jobs: int = 1, shape: tuple[int, int, int, int] | None = None,
                  pool: CompilePool | None = None) -> list[CompileSurvey]:
    """Compile every candidate's kernels for ``gpu``'s architecture (no GPU needed); drop the
    ones that fail to compile or exceed the GPU's shared memory per block.  ``jobs`` > 1
    compiles in that many worker processes (Triton compiles one kernel per thread).

    ``shape``: a tuning shape (B, T, H, HV).  The kernels are specialised as Triton's JIT
    specialises them at that shape's check shape (:func:`check_shape`,
    :func:`kdagen.kernels.jit_source`), so on that GPU the tuner finds them in Triton's cache
    and does not compile them again.  ``pool``: the compile processes to use (default: its own)."""
    space = space or load_space(family)
    ctx = space_context(plan, spec, gpu, torch.tensor([], dtype=dtype).element_size())
    default = default_for(family, plan)
    stages = list(space.stages) if space.stages else [None]
    common, gpu_args = _compile_args(family, plan, dtype, spec_args,
                                     check_shape(family, shape) if shape is not None else COMPILE_SHAPE, gpu)
    surveys = []
    own = pool is None
    if own:
        pool = CompilePool(jobs)
    try:
        for s_idx, stage in enumerate(stages):
            cands = stage_candidates(space, ctx, stage, default)
            survey = CompileSurvey(family, stage, total=len(cands))
            which = s_idx if stage is not None else None
            label = f"{family}{'/' + stage if stage else ''}"
            t0 = time.time()
            reasons: dict[int, str | None] = {}

            def report(n_done):
                ok = sum(1 for r in reasons.values() if r is None)
                _progress(f"  [{label} {n_done}/{len(cands)}] {ok} ok, {n_done - ok} dropped "
                          f"({time.time() - t0:.0f}s)", progress)

            if jobs > 1 and len(cands) > 2:
                ex = pool.get()
                futs = {ex.submit(_compile_one, *common, c.to_dict(), which, *gpu_args): i
                        for i, c in enumerate(cands)}
                for fut in as_completed(futs):
                    reasons[futs[fut]] = fut.result()
                    report(len(reasons))
            else:
                for i, c in enumerate(cands):
                    reasons[i] = _compile_one(*common, c.to_dict(), which, *gpu_args)
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
               gpu: GpuProfile, fwd_config: ChunkFwdConfig | None = None, progress: bool = True,
               pool: CompilePool | None = None) -> float:
    """Compile every ``(stage, config)``'s launches (a backward config's with the training
    forward of ``fwd_config``) for ``gpu``, specialised at ``shape``'s check shape, in
    ``jobs`` compile processes (``pool``'s when given), before the sequential timed search:
    the tuner's builds then load them from Triton's cache.  Returns the seconds it took.
    A config that does not compile is left for the tuner to record as a failed trial."""
    if jobs <= 1 or len(staged) < 2:
        return 0.0
    t0 = time.time()
    common, gpu_args = _compile_args(family, plan, dtype, spec_args, check_shape(family, shape), gpu)
    fdict = None if fwd_config is None else fwd_config.to_dict()
    own = pool is None
    if own:
        pool = CompilePool(min(jobs, len(staged)))
    lost = []
    try:
        ex = pool.get()
        futs = [ex.submit(_compile_one, *common, c.to_dict(), None, *gpu_args, fdict) for _, c in staged]
        for n, fut in enumerate(as_completed(futs), 1):
            if fut.exception() is not None:  # the worker died (BrokenProcessPool): not a compile error
                lost.append(fut.exception())
            if n == len(futs) or n % 8 == 0:
                _progress(f"  [{family} precompile {n}/{len(futs)}] ({time.time() - t0:.0f}s)", progress)
    finally:
        if own:
            pool.close()
        elif lost:
            pool.discard()
    if lost:
        _progress(f"  [{family} precompile] {len(lost)} of {len(futs)} not compiled, a worker died "
                  f"({type(lost[0]).__name__}); the tuner compiles them itself", progress)
    return time.time() - t0


# --- on a GPU: correctness-gated timing -------------------------------------------------

def _inputs(B, T, H, HV, K, V, dtype, device, seed):
    """Random KDA inputs drawn on ``device`` (fast at the timed shapes), gate in [-5, 0)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=gen, device=device)  # noqa: E731
    q = rnd(B, T, H, K)
    k = torch.nn.functional.normalize(rnd(B, T, H, K), dim=-1)
    v = rnd(B, T, HV, V)
    g = -5.0 * torch.sigmoid(rnd(B, T, HV, K) + 2.0)
    beta = torch.sigmoid(rnd(B, T, HV))
    h0 = 0.1 * rnd(B, HV, K, V)
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g, beta=beta.to(dtype), initial_state=h0)


def check_heads(H: int, HV: int) -> list[int]:
    """Value heads the float64 reference checks: the first and the last, from different q/k
    head groups when there are several groups (heads are independent in KDA)."""
    return sorted({0, HV - 1}) if H > 1 or HV == 1 else [0]


class KernelCandidate:
    """build / check / time of one family (and stage) for :func:`kdagen.tune.tune`.

    ``build`` and ``check`` run at the check shape: one sequence of ``min(T, 1024)`` tokens
    with the timed shape's heads, so Triton specialises (H, HV and the divisibility of T and
    of the chunk count) exactly as for the timed shape and each candidate compiles once.
    The float64 reference (kdagen's chunkwise one, which the tests hold to the token-by-token
    recurrence within 1e-10) sees only :func:`check_heads` (the recurrence is per value
    head), which keeps it cheap for any head count; it runs in float64 on the candidate's
    device (on a CPU the backward's reference and its gradients take about 1.1 s at
    K = V = 128, two heads and 1024 tokens: per candidate, per shape)."""

    def __init__(self, family: str, stage: str | None, plan: Plan, spec_args: dict, dtype: torch.dtype,
                 shape: tuple[int, int, int, int], device="cuda", fwd_config: ChunkFwdConfig | None = None):
        self.family, self.stage, self.plan, self.spec_args = family, stage, plan, spec_args
        self.dtype, self.shape, self.device = dtype, shape, device
        self.fwd_config = fwd_config
        self.tolerance = TOLERANCE[dtype]
        self.check_shape = check_shape(family, shape)
        self._x = None  # the timed shape's inputs, made on first use
        self._seed = 0
        self.shared_inputs_from = None  # another stage's candidate whose timed inputs to use

    @property
    def timed_inputs(self):
        if self.shared_inputs_from is not None and self.shared_inputs_from is not self:
            return self.shared_inputs_from.timed_inputs
        if self._x is None:
            B, T, H, HV = self.shape
            self._x = _inputs(B, T, H, HV, self.plan.K, self.plan.V, self.dtype, self.device, seed=1234)
        return self._x

    def _fwd(self, config, x, **kw):
        import kdagen

        if self.family == "recurrent":  # (fused_recurrent_kda takes no safe_gate, as in FLA)
            args = {n: a for n, a in self.spec_args.items() if n != "safe_gate"}
            return kdagen.fused_recurrent_kda(**x, output_final_state=True, config=config, **args, **kw)
        fcfg = config if self.family == "chunk_fwd" else self.fwd_config
        return kdagen.chunk_kda(**x, output_final_state=True, config=fcfg, **self.spec_args, **kw)

    def _fwd_bwd(self, config, x, do, dht):
        from .ops.chunk_bwd import chunk_bwd_config

        leaves = {n: x[n].detach().requires_grad_(True) for n in GRAD_INPUTS}
        with chunk_bwd_config(config):
            o, s = self._fwd(None, {**x, **leaves})
        grads = torch.autograd.grad((o, s), [leaves[n] for n in GRAD_INPUTS], (do, dht))
        return dict(zip(GRAD_INPUTS, grads))

    def _check_inputs(self, seed):
        B, T, H, HV = self.check_shape
        return _inputs(B, T, H, HV, self.plan.K, self.plan.V, self.dtype, self.device, seed=seed)

    def build(self, config):
        x = self._check_inputs(seed=0)
        if self.family == "chunk_bwd":
            gen = torch.Generator(device="cpu").manual_seed(1)
            do = torch.randn(x["v"].shape, generator=gen).to(self.device, self.dtype)
            self._fwd_bwd(config, x, do, torch.zeros_like(x["initial_state"]))
        else:
            self._fwd(config, x)  # compiles (Triton JIT) and launches once
        if self.device == "cuda":
            torch.cuda.synchronize()
        return config

    def check(self, config) -> float:
        """Relative error against the float64 recurrence on fresh random inputs (the largest
        over the outputs -- or, for the backward, every gradient -- of the checked heads)."""
        from .reference import naive_chunk_kda, naive_recurrent_kda

        self._seed += 1
        x = self._check_inputs(seed=10_000 + self._seed)
        ref_fn = naive_recurrent_kda if self.family == "recurrent" else naive_chunk_kda
        B, T, H, HV = self.check_shape
        sel = check_heads(H, HV)
        qk_sel = [hv // (HV // H) for hv in sel]
        err = lambda a, b: ((a.double() - b).norm() / b.norm().clamp_min(1e-300)).item()  # noqa: E731

        def ref_inputs():  # float64 where the candidate runs: on a GPU the reference runs there too
            r = dict(q=x["q"][:, :, qk_sel], k=x["k"][:, :, qk_sel], v=x["v"][:, :, sel], g=x["g"][:, :, sel],
                     beta=x["beta"][:, :, sel], initial_state=x["initial_state"][:, sel])
            return {n: t.detach().double() for n, t in r.items()}

        if self.family != "chunk_bwd":
            o, s = self._fwd(config, x)
            r = ref_inputs()
            ref_o, ref_s = ref_fn(r["q"], r["k"], r["v"], r["g"], r["beta"],
                                  initial_state=r["initial_state"], output_final_state=True)
            e = max(err(o[:, :, sel], ref_o), err(s[:, sel], ref_s))
            return float("nan") if e != e else e
        # backward: upstream gradients only on the checked value heads, so the q/k gradient of
        # a checked head's group is that head's alone
        gen = torch.Generator(device="cpu").manual_seed(20_000 + self._seed)
        do = torch.zeros(x["v"].shape)
        dht = torch.zeros(x["initial_state"].shape)
        do[:, :, sel] = torch.randn(do[:, :, sel].shape, generator=gen)
        dht[:, sel] = torch.randn(dht[:, sel].shape, generator=gen)
        do, dht = do.to(self.device, self.dtype), dht.to(self.device)
        got = self._fwd_bwd(config, x, do, dht)
        r = {n: t.requires_grad_(True) for n, t in ref_inputs().items()}
        ref_o, ref_s = ref_fn(r["q"], r["k"], r["v"], r["g"], r["beta"],
                              initial_state=r["initial_state"], output_final_state=True)
        ref = torch.autograd.grad((ref_o, ref_s), [r[n] for n in GRAD_INPUTS],
                                  (do[:, :, sel].double(), dht[:, sel].double()))
        e = 0.0
        for n, gr in zip(GRAD_INPUTS, ref):
            t = got[n]
            t = t[:, :, qk_sel] if n in ("q", "k") else t[:, sel] if n == "initial_state" else t[:, :, sel]
            e = max(e, err(t, gr))
        return float("nan") if e != e else e

    def time(self, config) -> float:
        from triton.testing import do_bench

        x = self.timed_inputs
        if self.family == "chunk_fwd":
            from .ops.chunk import chunk_kda_launches

            launches, _ = chunk_kda_launches(**x, output_final_state=True, config=config, **self.spec_args)
            which = {"intra": [0], "state": [1], None: [0, 1]}[self.stage]
            if self.stage == "state":
                launches[0]()  # the state pass reads what the intra launch writes
            fn = lambda: [launches[i]() for i in which]  # noqa: E731
        elif self.family == "chunk_bwd":
            from .ops.chunk_bwd import chunk_kda_bwd_launches

            do = torch.ones_like(x["v"])
            fwd, bwd, _ = chunk_kda_bwd_launches(**x, output_final_state=True, config=self.fwd_config,
                                                 bwd_config=config, do=do, **self.spec_args)
            which = {"state": [0], "dqkw": [1], "intra": [2], None: [0, 1, 2]}[self.stage]
            for ln in list(fwd) + list(bwd)[:which[0]]:  # what the timed launch reads
                ln()
            fn = lambda: [bwd[i]() for i in which]  # noqa: E731
        else:
            # decode: the op's one launch, replayed from a CUDA graph as a decode loop runs it.
            # Timing the eager op measured its Python work instead: on the H200 (run 10) the 16
            # configs at B=1 came out at 29-81 us in two clusters, for a kernel of a few us
            from .ops.recurrent import fused_recurrent_kda_launch

            args = {n: a for n, a in self.spec_args.items() if n != "safe_gate"}
            fn, _, _ = fused_recurrent_kda_launch(**x, output_final_state=True, config=config, **args)
        if self.device == "cpu":  # the Triton interpreter: exercises the search, times nothing real
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        if self.family == "recurrent":
            from triton.testing import do_bench_cudagraph

            return float(do_bench_cudagraph(fn, rep=50, return_mode="median"))
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


GRAD_INPUTS = ("q", "k", "v", "g", "beta", "initial_state")


class StagedCandidates:
    """The candidates of every stage of a family at one shape, sharing the timed inputs; its
    methods take ``(stage, config)``.  What an isolated worker holds for a whole family."""

    def __init__(self, family: str, stages: tuple, plan: Plan, spec_args: dict, dtype: torch.dtype,
                 shape: tuple[int, int, int, int], device="cuda", fwd_config: ChunkFwdConfig | None = None):
        self.by_stage = {st: KernelCandidate(family, st, plan, spec_args, dtype, shape, device, fwd_config)
                         for st in stages}
        first = next(iter(self.by_stage.values()))
        for c in self.by_stage.values():
            c.shared_inputs_from = first

    def build(self, arg):
        stage, config = arg
        return self.by_stage[stage].build(config)

    def check(self, arg):
        stage, config = arg
        return self.by_stage[stage].check(config)

    def time(self, arg):
        stage, config = arg
        return self.by_stage[stage].time(config)


class StageView:
    """One stage of a :class:`StagedCandidates` living behind an
    :class:`~kdagen.isolation.IsolatedCandidate`, as the tuner's candidate protocol."""

    def __init__(self, isolated: IsolatedCandidate, stage: str | None, tolerance: float):
        self.isolated, self.stage, self.tolerance = isolated, stage, tolerance

    def build(self, config):
        return self.isolated.build((self.stage, config))

    def check(self, built) -> float:
        return self.isolated.check((self.stage, built))

    def time(self, built) -> float:
        return self.isolated.time((self.stage, built))


def tune_family(family: str, plan: Plan, spec: Recurrence, spec_args: dict, gpu: GpuProfile, dtype,
                shape: tuple[int, int, int, int], space: SearchSpace | None = None, seed: int = 0,
                progress: bool = True, candidates_by_stage: dict | None = None, jobs: int = 1,
                fwd_config: ChunkFwdConfig | None = None, isolate: bool = False, device: str = "cuda",
                worker: IsolatedCandidate | None = None, pool: CompilePool | None = None):
    """Tune one family at one shape on the current GPU; returns (winner, time_ms, default_ms, results).

    ``jobs`` > 1 compiles the candidates for ``gpu`` in that many processes first (``pool``'s,
    when given).  ``isolate``: build, check and time the candidates in a worker process
    (:mod:`kdagen.isolation`), so a config that faults the GPU is one failed trial; ``worker``:
    the isolated worker to use (it is remade with this shape's candidates and left open).
    ``fwd_config``: for ``chunk_bwd``, the forward config at this shape (its chunk lengths
    are the backward's; default: the forward's heuristic)."""
    from .paths import studies_dir
    from .tune import recorded_results, tune
    from .tuned import source_hash

    space = space or load_space(family)
    ctx = space_context(plan, spec, gpu, torch.tensor([], dtype=dtype).element_size())
    hint = {"N": shape[0], "HV": shape[3]}
    if family == "chunk_bwd" and fwd_config is None:
        fwd_config = default_chunk_config(plan, hint)
    default = default_for(family, plan, hint, fwd_config)
    stages = list(space.stages) if space.stages else [None]
    results = {}
    studies_dir().mkdir(parents=True, exist_ok=True)
    cands_by_stage = {}
    for stage in stages:
        cands = (candidates_by_stage or {}).get(stage) or stage_candidates(space, ctx, stage, default)
        if family == "chunk_bwd":  # the forward's chunk lengths
            cands = [c.replace(chunk_size=default.chunk_size, sub_chunk=default.sub_chunk) for c in cands]
        cands_by_stage[stage] = cands
    # the templates' hash is in the name: a study measured on other kernels is not resumed
    names = {stage: (f"{family}-{stage or 'all'}-{plan.spec_hash}-{source_hash(family)}-K{plan.K}-V{plan.V}-"
                     f"{plan.dtype}-{'x'.join(map(str, shape))}-{gpu.name}-{space.fingerprint()}"
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
    precompile(family, plan, spec_args, dtype, shape, list(todo.values()), jobs, gpu, fwd_config, progress, pool)
    make = (StagedCandidates, family, tuple(stages), plan, spec_args, dtype, shape)
    isolated = None
    if worker is not None:
        worker.remake(*make, device=device, fwd_config=fwd_config)
        isolated = worker
    elif isolate:
        isolated = IsolatedCandidate(*make, device=device, fwd_config=fwd_config)
    try:
        for stage in stages:
            name = names[stage]
            if isolated is not None:
                cand = StageView(isolated, stage, TOLERANCE[dtype])
            else:
                cand = KernelCandidate(family, stage, plan, spec_args, dtype, shape, device, fwd_config)
            results[stage] = tune(cands_by_stage[stage], cand, study_name=name, storage_path=journals[stage],
                                  default_config=default, seed=seed, progress=progress, finalists=FINALISTS)
    finally:
        if isolated is not None and isolated is not worker:
            isolated.close()
    if stages == [None]:
        r = results[None]
        return r.winner, r.winner_time_ms, r.default_time_ms, results
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
            best = (total, merged)
    default_ms = None
    if all(results[s].default_time_ms is not None for s in stages):
        default_ms = sum(results[s].default_time_ms for s in stages)
    if best is None:
        return None, None, default_ms, results
    return best[1], best[0], default_ms, results


def _ok_times(result):
    out = [(f.config, f.median_ms) for f in result.finalists if f.median_ms is not None and not f.dropped]
    seen = {c.canonical() for c, _ in out}
    for t in result.trials:
        if t.status == "ok" and t.time_ms is not None and t.config.canonical() not in seen:
            out.append((t.config, t.time_ms))
    return out


def _ok_configs(result):
    return [c for c, _ in _ok_times(result)]


def lower_for(spec: Recurrence, family: str, K: int, V: int, dtype: torch.dtype, gate_in_kernel: bool = False) -> Plan:
    from .ops.common import DTYPE_NAMES

    form = "recurrent" if family == "recurrent" else "chunk"
    return lower(spec, K, V, DTYPE_NAMES[dtype], form, gate_in_kernel)
