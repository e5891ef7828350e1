"""The tuner's candidates on a GPU: build a config's kernels, check them against the float64
reference, and time them (:class:`KernelCandidate`); the stages of a family behind one
isolated worker process (:class:`StagedCandidates`, :class:`StageView`).

The KDA member's candidates run through ``chunk_kda`` / ``fused_recurrent_kda`` and are checked
against ``naive_chunk_kda`` / ``naive_recurrent_kda``; any other spec's (``spec_args["spec"]``:
gdn, deltanet, a spec file) through the member entries in the spec's own input layout, checked
against the spec's own float64 recurrence (:mod:`kdagen.tuning.member_ops`)."""
from __future__ import annotations

import time

import torch

from ..codegen.lower import Plan
from ..config import ChunkTrainConfig
from ..dtypes import dtype as as_dtype
from ..ops.chunk import chunk_bwd_config, chunk_kda, chunk_kda_bwd_launches, chunk_kda_launches
from ..ops.recurrent import fused_recurrent_kda, fused_recurrent_kda_launch
from ..spec.reference import naive_chunk_kda, naive_recurrent_kda
from . import member_ops as M
from .families import TOLERANCE, check_shape, op_args, timed_launches
from .isolation import IsolatedCandidate


def random_inputs(B, T, H, HV, K, V, dtype, device, seed, state_dtype=torch.float32):
    """Random KDA inputs drawn on ``device`` (fast at the timed shapes), gate in [-5, 0)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=gen, device=device)  # noqa: E731
    q = rnd(B, T, H, K)
    k = torch.nn.functional.normalize(rnd(B, T, H, K), dim=-1)
    v = rnd(B, T, HV, V)
    g = -5.0 * torch.sigmoid(rnd(B, T, HV, K) + 2.0)
    beta = torch.sigmoid(rnd(B, T, HV))
    h0 = 0.1 * rnd(B, HV, K, V)
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g, beta=beta.to(dtype), initial_state=h0.to(state_dtype))


def check_heads(H: int, HV: int) -> list[int]:
    """Value heads the float64 reference checks: the first and the last, from different q/k
    head groups when there are several groups (heads are independent in KDA)."""
    return sorted({0, HV - 1}) if H > 1 or HV == 1 else [0]


class KernelCandidate:
    """build / check / time of one family for :func:`kdagen.tuning.engine.tune`; ``launch``: the
    kernel whose launches are timed (a stage's, from its search space; None: all the family's).

    ``build`` and ``check`` run at the check shape: one sequence of ``min(T, 1024)`` tokens
    with the timed shape's heads, so Triton specialises (H, HV and the divisibility of T and
    of the chunk count) exactly as for the timed shape and each candidate compiles once.
    The float64 reference (kdagen's chunkwise one, which the tests hold to the token-by-token
    recurrence within 1e-10) sees only :func:`check_heads` (the recurrence is per value
    head), which keeps it cheap for any head count; it runs in float64 on the candidate's
    device (on a CPU the backward's reference and its gradients take about 1.1 s at
    K = V = 128, two heads and 1024 tokens: per candidate, per shape)."""

    def __init__(self, family: str, launch: str | None, plan: Plan, spec_args: dict, dtype: torch.dtype,
                 shape: tuple[int, int, int, int], device="cuda", fwd_config: ChunkTrainConfig | None = None,
                 state_dtype=torch.float32):
        self.family, self.launch, self.plan, self.spec_args = family, launch, plan, spec_args
        self.state_dtype = state_dtype
        self.dtype, self.shape, self.device = dtype, shape, device
        self.fwd_config = fwd_config
        self.tolerance = TOLERANCE[as_dtype(dtype).name]
        self.check_shape = check_shape(family, shape)
        self._x = None  # the timed shape's inputs, made on first use
        self._seed = 0
        self.shared_inputs_from = None  # another stage's candidate whose timed inputs to use
        # any spec but KDA's runs through the member entries, in its own layout (member_ops)
        self.member = M.member_spec(family, spec_args)

    @property
    def timed_inputs(self):
        if self.shared_inputs_from is not None and self.shared_inputs_from is not self:
            return self.shared_inputs_from.timed_inputs
        if self._x is None:
            B, T, H, HV = self.shape
            self._x = self._layout(random_inputs(B, T, H, HV, self.plan.K, self.plan.V, self.dtype, self.device,
                                                 seed=1234, state_dtype=self.state_dtype))
        return self._x

    def _layout(self, x):
        return x if self.member is None else M.member_inputs(self.member, x)

    def _fwd(self, config, x, **kw):
        if self.member is not None:
            return M.forward(self.member, self.family, config if self.family != "chunk_bwd" else self.fwd_config, x,
                             **kw)
        if self.family == "recurrent":  # (fused_recurrent_kda takes no safe_gate, as in FLA)
            args = {n: a for n, a in op_args(self.spec_args).items() if n != "safe_gate"}
            return fused_recurrent_kda(**x, output_final_state=True, config=config, **args, **kw)
        fcfg = config if self.family == "chunk_fwd" else self.fwd_config
        return chunk_kda(**x, output_final_state=True, config=fcfg, **op_args(self.spec_args), **kw)

    def _fwd_bwd(self, config, x, do, dht):
        names = [n for n in GRAD_INPUTS if x.get(n) is not None]
        leaves = {n: x[n].detach().requires_grad_(True) for n in names}
        with chunk_bwd_config(config):
            o, s = self._fwd(None, {**x, **leaves})
        grads = torch.autograd.grad((o, s), [leaves[n] for n in names], (do, dht))
        return dict(zip(names, grads))

    def _check_inputs(self, seed):
        B, T, H, HV = self.check_shape
        return self._layout(random_inputs(B, T, H, HV, self.plan.K, self.plan.V, self.dtype, self.device, seed=seed,
                                          state_dtype=self.state_dtype))

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
        self._seed += 1
        x = self._check_inputs(seed=10_000 + self._seed)
        ref_fn = naive_recurrent_kda if self.family == "recurrent" else naive_chunk_kda
        if self.member is not None:  # the spec's own recurrence, from its expressions
            spec = self.member
            ref_fn = lambda q, k, v, g, beta, **kw: M.reference(  # noqa: E731
                spec, dict(q=q, k=k, v=v, g=g, beta=beta, a=kw.get("a"), b=kw.get("b"),
                           initial_state=kw["initial_state"]))
        B, T, H, HV = self.check_shape
        sel = check_heads(H, HV)
        qk_sel = [hv // (HV // H) for hv in sel]
        err = lambda a, b: ((a.double() - b).norm() / b.norm().clamp_min(1e-300)).item()  # noqa: E731

        def ref_inputs():  # float64 where the candidate runs: on a GPU the reference runs there too
            r = dict(q=x["q"][:, :, qk_sel], k=x["k"][:, :, qk_sel], v=x["v"][:, :, sel],
                     g=None if x["g"] is None else x["g"][:, :, sel],
                     beta=None if x["beta"] is None else x["beta"][:, :, sel], initial_state=x["initial_state"][:, sel])
            for n in ("a", "b"):  # general DPLR's vectors
                if x.get(n) is not None:
                    r[n] = x[n][:, :, sel]
            return {n: None if t is None else t.detach().double() for n, t in r.items()}

        if self.family != "chunk_bwd":
            o, s = self._fwd(config, x)
            r = ref_inputs()
            extra = {n: r[n] for n in ("a", "b") if n in r}
            ref_o, ref_s = ref_fn(r["q"], r["k"], r["v"], r["g"], r["beta"],
                                  initial_state=r["initial_state"], output_final_state=True, **extra)
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
        r = {n: None if t is None else t.requires_grad_(True) for n, t in ref_inputs().items()}
        ref_o, ref_s = ref_fn(r["q"], r["k"], r["v"], r["g"], r["beta"],
                              initial_state=r["initial_state"], output_final_state=True)
        names = [n for n in GRAD_INPUTS if r.get(n) is not None]
        ref = torch.autograd.grad((ref_o, ref_s), [r[n] for n in names],
                                  (do[:, :, sel].double(), dht[:, sel].double()))
        e = 0.0
        for n, gr in zip(names, ref):
            t = got[n]
            t = t[:, :, qk_sel] if n in ("q", "k") else t[:, sel] if n == "initial_state" else t[:, :, sel]
            e = max(e, err(t, gr))
        return float("nan") if e != e else e

    def time(self, config) -> float:
        from triton.testing import do_bench

        x = self.timed_inputs
        if self.member is not None:
            if self.family == "recurrent":
                fn = M.recurrent_launch(self.member, x, config)
            else:
                if self.family == "chunk_train":  # general DPLR's chunk forward
                    before, launches = [], M.chunk_train_launches(self.member, x, config)
                elif self.family == "chunk_fwd":
                    before, launches = [], M.chunk_fwd_launches(self.member, x, config)
                else:
                    before, launches = M.chunk_bwd_launches(self.member, x, self.fwd_config, config,
                                                            do=torch.ones_like(x["v"]))
                timed = timed_launches(launches, self.launch, self.plan)
                for ln in list(before) + list(launches[:launches.index(timed[0])]):  # what the timed launches read
                    ln()
                fn = lambda: [ln() for ln in timed]  # noqa: E731
        elif self.family == "recurrent":
            # decode: the op's one launch, replayed from a CUDA graph as a decode loop runs it (the
            # eager op's Python work, tens of us, would hide the differences of a few-us kernel)
            args = {n: a for n, a in op_args(self.spec_args).items() if n != "safe_gate"}
            fn, _, _ = fused_recurrent_kda_launch(**x, output_final_state=True, config=config, **args)
        else:
            if self.family == "chunk_fwd":
                launches, _ = chunk_kda_launches(**x, output_final_state=True, config=config,
                                                 **op_args(self.spec_args))
                before = []
            else:
                before, launches, _ = chunk_kda_bwd_launches(
                    **x, output_final_state=True, config=self.fwd_config, bwd_config=config,
                    do=torch.ones_like(x["v"]), **op_args(self.spec_args))
            timed = timed_launches(launches, self.launch, self.plan)
            for ln in list(before) + list(launches[:launches.index(timed[0])]):  # what the timed launches read
                ln()
            fn = lambda: [ln() for ln in timed]  # noqa: E731
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
    methods take ``(stage, config)``.  What an isolated worker holds for a whole family.
    ``stages``: (stage, the kernel it times) pairs."""

    def __init__(self, family: str, stages: tuple, plan: Plan, spec_args: dict, dtype: torch.dtype,
                 shape: tuple[int, int, int, int], device="cuda", fwd_config: ChunkTrainConfig | None = None,
                 state_dtype=torch.float32):
        self.by_stage = {st: KernelCandidate(family, launch, plan, spec_args, dtype, shape, device, fwd_config,
                                             state_dtype) for st, launch in stages}
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
    :class:`~kdagen.tuning.isolation.IsolatedCandidate`, as the tuner's candidate protocol."""

    def __init__(self, isolated: IsolatedCandidate, stage: str | None, tolerance: float):
        self.isolated, self.stage, self.tolerance = isolated, stage, tolerance

    def build(self, config):
        return self.isolated.build((self.stage, config))

    def check(self, built) -> float:
        return self.isolated.check((self.stage, built))

    def time(self, built) -> float:
        return self.isolated.time((self.stage, built))
