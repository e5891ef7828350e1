"""Gated DeltaNet, DeltaNet, GLA and general DPLR: kdagen's ops against flash-linear-attention's ops of the same
name, in one process, on the same inputs (gla5: GLA with g >= -5, which kdagen is told with
safe_gate=True, lower_bound=-5; FLA's chunk_gla on the same inputs).

    PYTHONPATH=/tmp/site:. python3 bench/family_vs_fla.py --out "$OUT" [--only gdn,fwd] [--budget 540]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/family_vs_fla.py --smoke --out /tmp/x   # CPU smoke run

Per member (gdn: chunk_gated_delta_rule / fused_recurrent_gated_delta_rule; deltanet:
chunk_delta_rule / fused_recurrent_delta_rule; gla: chunk_gla / fused_recurrent_gla; dplr:
chunk_dplr_delta_rule / fused_recurrent_dplr_delta_rule, FLA's rows alone while kdagen has no such op), bf16 q/k/v/beta, fp32 g and states:
1. ``errors``: both libraries' bf16 forward (o, final state) and gradients against float64
   autograd through the token-by-token recurrence (kdagen.spec.reference), at small shapes;
2. ``fwd``: forward median ms (triton.testing.do_bench) at (B, T, H, K=V) = (1, 8192, 96, 128) and
   (2, 16384, 16, 128), and the ratio FLA / kdagen;
3. ``fwdbwd``: forward + backward (all of q, k, v, g, beta, initial_state) at the same shapes;
4. ``decode``: one token at B = 1 and 256, H = 32, K = V = 128, CUDA-graph replay, fp32 states:
   FLA's fused_recurrent op (initial_state in, final state out), kdagen's the same way and with
   its in-place state pool (``ssm_state_indices``);
5. ``profile``: each library's forward+backward kernel by kernel (torch.profiler) at the first shape.
The forward sections of every member run first, the gradients' last (FLA 0.6.0's GDN backward
autotunes for minutes and then refuses to run on Triton < 3.7.1 with Hopper: a backward that
raised once is not asked again for that member, and its rows say why).
FLA runs each op once per shape before anything is timed (its autotuning compiles for minutes;
``--warm-workers N`` first compiles its candidates in N parallel processes, as
bench/forward_vs_fla.py does).  ``--budget`` bounds the whole run: what is left out when it runs
out is logged as skipped, and the table and family.json (under --out) always hold what was
measured.  ``--smoke``: tiny shapes, no FLA needed, and on the CPU (Triton's interpreter) wall
times from time.perf_counter instead of do_bench: it checks the script, not the speed.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

T0 = time.time()
LOG: list[str] = []
RES: dict = {"rows": [], "errors": [], "skipped": []}
MEMBERS = ("gdn", "deltanet", "gla", "gla5", "dplr", "dplr5")  # gla5/dplr5: g >= -5 promised to kdagen (safe_gate)
# GDN's layer-call forms, run only when named in --only, both with FLA's in-kernel gate (g raw, A_log, dt_bias):
# gdn_gate the gate alone, gdn_layer the gate and use_qk_l2norm_in_kernel on raw q and k (Qwen3-Next's call)
GATED = ("gdn_gate", "gdn_layer")
LAYER_MEMBERS = GATED
PASSES = ("errors", "fwd", "fwdbwd", "decode", "profile")
SHAPES = [(1, 8192, 96, 128), (2, 16384, 16, 128)]
DECODE = [(1, 32, 128), (256, 32, 128)]  # (B, H, K=V)
ERROR_SHAPES = [(1, 1024, 4, 128), (2, 333, 2, 128)]
SMOKE_SHAPES = [(1, 40, 2, 32)]
SMOKE_DECODE = [(2, 2, 32)]
SMOKE_ERROR_SHAPES = [(1, 37, 1, 32)]
RESERVE = {"fwd": 20.0, "fwdbwd": 45.0}  # seconds a GPU timing section needs left to start (compiles, warm-up)
GRAD = {"gdn": ("q", "k", "v", "g", "beta", "initial_state"),
        # Gated DeltaNet with FLA's in-kernel gate: g raw, -exp(A_log) softplus(g + dt_bias) formed in the kernels
        "gdn_gate": ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"),
        "gdn_layer": ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"), "deltanet": ("q", "k", "v", "beta", "initial_state"),
        "gla": ("q", "k", "v", "g", "initial_state"), "gla5": ("q", "k", "v", "g", "initial_state"),
        "dplr": ("q", "k", "v", "a", "b", "gk", "initial_state"),
        "dplr5": ("q", "k", "v", "a", "b", "gk", "initial_state")}


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def dump(out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "family.json"), "w") as f:
        json.dump(RES, f, indent=1)
    with open(os.path.join(out, "family.log"), "w") as f:
        f.write("\n".join(LOG))


class Budget:
    def __init__(self, seconds):
        self.deadline = T0 + seconds

    def left(self):
        return self.deadline - time.time()

    def ok(self, what, need=0.0):
        if self.left() > need:
            return True
        RES["skipped"].append(what)
        log(f"  skipped (budget): {what}")
        return False


# ------------------------------------------------------------------------------- the ops
def ops(member, lib):
    """(chunk op, recurrent op) of a library, or None when it cannot be imported."""
    if lib == "kdagen":
        import functools

        import kdagen
        if member in ("gdn",) + GATED:
            return kdagen.chunk_gated_delta_rule, kdagen.fused_recurrent_gated_delta_rule
        if member == "gla":
            return kdagen.chunk_gla, kdagen.fused_recurrent_gla
        if member == "gla5":  # the caller promises g >= -5 (the inputs keep it): factorised diagonal tiles
            return functools.partial(kdagen.chunk_gla, safe_gate=True, lower_bound=-5.0), kdagen.fused_recurrent_gla
        if member == "dplr5":  # the caller promises gk >= -5 (the inputs keep it): factorised diagonal tiles
            return (functools.partial(kdagen.chunk_dplr_delta_rule, safe_gate=True, lower_bound=-5.0),
                    kdagen.fused_recurrent_dplr_delta_rule)
        if member == "dplr":
            if not hasattr(kdagen, "chunk_dplr_delta_rule"):
                log("kdagen has no chunk_dplr_delta_rule in this build: FLA's rows only")
                return None
            return kdagen.chunk_dplr_delta_rule, getattr(kdagen, "fused_recurrent_dplr_delta_rule", None)
        return kdagen.chunk_delta_rule, kdagen.fused_recurrent_delta_rule
    try:
        if member in ("dplr", "dplr5"):
            from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule, fused_recurrent_dplr_delta_rule
            return chunk_dplr_delta_rule, fused_recurrent_dplr_delta_rule
        if member in ("gla", "gla5"):
            from fla.ops.gla import chunk_gla, fused_recurrent_gla
            return chunk_gla, fused_recurrent_gla
        if member in ("gdn",) + GATED:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
            return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
        return chunk_delta_rule, fused_recurrent_delta_rule
    except Exception as e:  # noqa: BLE001
        log(f"FLA's {member} ops not importable: {type(e).__name__}: {e}")
        return None


def call_chunk(member, fn, x):
    if member in ("dplr", "dplr5"):
        return fn(x["q"], x["k"], x["v"], x["a"], x["b"], x["gk"], initial_state=x["initial_state"],
                  output_final_state=True)
    if member in ("gla", "gla5"):
        return fn(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"], output_final_state=True)
    if member == "gdn":
        return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True)
    if member in GATED:
        return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True,
                  use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                  use_qk_l2norm_in_kernel=member == "gdn_layer")
    return fn(x["q"], x["k"], x["v"], x["beta"], initial_state=x["initial_state"], output_final_state=True)


def call_recurrent(member, fn, x, **kw):
    if member in ("dplr", "dplr5"):
        return fn(x["q"], x["k"], x["v"], x["a"], x["b"], x["gk"], initial_state=x["initial_state"],
                  output_final_state=True, **kw)
    if member in ("gla", "gla5"):
        return fn(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"], output_final_state=True, **kw)
    if member == "gdn":
        return fn(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], initial_state=x["initial_state"],
                  output_final_state=True, **kw)
    if member in GATED:
        return fn(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], initial_state=x["initial_state"],
                  output_final_state=True, use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                  use_qk_l2norm_in_kernel=member == "gdn_layer", **kw)
    return fn(x["q"], x["k"], x["v"], x["beta"], initial_state=x["initial_state"], output_final_state=True, **kw)


def inputs(member, B, T, H, K, V, dev, seed=0):
    """FLA's recipe: l2-normalised k, beta = sigmoid, g = logsigmoid (fp32), fp32 initial state;
    q, k, v, beta in bf16 (float32 on the CPU: the interpreter cannot run bf16)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    if member != "gdn_layer":  # gdn_layer: raw q and k, l2-normalised in the kernels
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    if member in ("gla", "gla5"):
        x = dict(q=q, k=k, v=v)
    elif member in ("dplr", "dplr5"):  # FLA's convention S <- Diag(exp gk) S + b (a^T S) + k v^T: a unit read vector and
        # b = -beta * a (RWKV-7's pairing), so each step's transition Diag(exp gk) - beta a a^T stays contractive
        a = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
        x = dict(q=q, k=k, v=v, a=a, b=-torch.sigmoid(torch.randn(B, T, H, 1, generator=gen)) * a)
    else:
        x = dict(q=q, k=k, v=v, beta=torch.sigmoid(torch.randn(B, T, H, generator=gen)))
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    x = {n: t.to(dev, dt) for n, t in x.items()}
    if member == "gdn":
        x["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen) + 2.0).to(dev)
    if member in GATED:  # the raw gate and Mamba-style parameters (A in [1, 16], dt in [1e-3, 0.1]), fp32
        x["g"] = torch.randn(B, T, H, generator=gen).to(dev)
        x["A_log"] = torch.log(1.0 + 15.0 * torch.rand(H, generator=gen)).to(dev)
        dt = torch.exp(torch.rand(H, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        x["dt_bias"] = (dt + torch.log(-torch.expm1(-dt))).to(dev)  # softplus(dt_bias) = dt
    if member in ("gla", "gla5"):  # a per-channel log decay (FLA's GLA recipe); gla5 keeps g >= -5
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 2.0)
        x["g"] = (g.clamp(min=-5.0) if member == "gla5" else g).to(dev)
    if member in ("dplr", "dplr5"):  # dplr5 keeps gk >= -5
        gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 2.0)
        x["gk"] = (gk.clamp(min=-5.0) if member == "dplr5" else gk).to(dev)
    x["initial_state"] = (0.1 * torch.randn(B, H, K, V, generator=gen)).to(dev)
    return x


# ------------------------------------------------------------------------------- timing
def bench_ms(fn, cuda):
    if cuda:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    times = []
    for _ in range(2):  # the interpreter: a check that it runs, not a measurement
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def graph_us(fn, cuda):
    """Median µs of one replay of ``fn`` captured in a CUDA graph (the interpreter: eager)."""
    if not cuda:
        return bench_ms(fn, False) * 1e3
    from triton.testing import do_bench
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return float(do_bench(graph.replay, warmup=50, rep=300, return_mode="median")) * 1e3


def fwdbwd_fn(member, fn, x):
    names = GRAD[member]
    leaves = {n: x[n].detach().clone().requires_grad_(True) for n in names}
    xx = {**x, **leaves}
    o, s = call_chunk(member, fn, xx)
    do, ds = torch.randn_like(o), torch.randn_like(s)

    def run():
        o, s = call_chunk(member, fn, xx)
        return torch.autograd.grad((o, s), [leaves[n] for n in names], (do, ds))
    return run


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ------------------------------------------------------------------------------- FLA warm-up
def _warm_worker(index, count, queue, members, shapes, unguarded=False):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fla_warm import keep_share_of_configs

    if unguarded:
        lift_fla_gdn_guard()
    keep_share_of_configs(index, count)
    done = 0
    for member in members:
        f = ops(member, "fla")
        if f is None:
            continue
        for B, T, H, D in shapes:
            try:
                x = inputs(member, B, T, H, D, D, "cuda")
                with torch.no_grad():
                    call_chunk(member, f[0], x)
                if member in ("gdn",) + GATED and fla_gdn_backward_guard():
                    continue
                fwdbwd_fn(member, f[0], x)()
                torch.cuda.synchronize()
                done += 1
            except Exception as e:  # noqa: BLE001
                queue.put((index, f"{member} {(B, T, H, D)}: {type(e).__name__}: {str(e)[:160]}"))
            torch.cuda.empty_cache()
    queue.put((index, f"done {done}"))


def warm_parallel(workers, members, shapes, budget_s):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_warm_worker, args=(i, workers, queue, members, shapes, UNGUARDED["on"]))
             for i in range(workers)]
    for p in procs:
        p.start()
    deadline = time.time() + budget_s
    for p in procs:
        p.join(max(1.0, deadline - time.time()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    msgs = []
    while not queue.empty():
        msgs.append(queue.get())
    log(f"FLA warm-up workers: {workers} in {time.time() - T0:.0f}s; "
        + "; ".join(m for _, m in msgs if not m.startswith("done"))[:400])


# ------------------------------------------------------------------------------- sections
# a library's backward that raised once for a member (FLA 0.6.0's GDN backward refuses to run on
# Triton < 3.7.1 with Hopper, after minutes of autotuning): not asked again
BWD_REFUSED: dict = {}


def _bwd_refused(lib, member):
    return BWD_REFUSED.get((lib, member))


# --fla-gdn-unguarded: FLA's GDN backward timed with its Triton-version guard lifted (time only)
UNGUARDED = {"on": False}


def lift_fla_gdn_guard():
    """Lift FLA 0.6.0's guard on its gated chunk_bwd_dqkwg (Triton >= 3.4, < 3.7.1, Hopper) so its GDN
    training can be timed beside kdagen's.  FLA says that kernel gives wrong results on this Triton
    (its issue #640): the time is FLA's, its gradients are not trusted (the errors pass shows them)."""
    import importlib
    mod = importlib.import_module("fla.ops.common.chunk_o")
    mod.TRITON_ABOVE_3_7_1 = True
    UNGUARDED["on"] = True


def fla_gdn_backward_guard() -> str | None:
    """FLA 0.6.0 refuses its GDN backward on Triton >= 3.4, < 3.7.1 with a Hopper GPU (its
    chunk_bwd_dqkwg guard) -- but only after minutes of autotuning the backward's first kernels:
    the same condition, read from FLA's own flags, so the bench skips it up front."""
    if UNGUARDED["on"]:
        return None
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except Exception:  # noqa: BLE001 - another FLA version: ask the op itself
        return None
    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        return ("RuntimeError (FLA's guard, not run): Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect "
                "results for gated chunk_bwd_dqkwg (see #640)")
    return None


def _refuse_bwd(lib, member, e):
    msg = f"{type(e).__name__}: {str(e)[:200]}"
    BWD_REFUSED[(lib, member)] = msg
    log(f"  {lib}'s {member} backward raised; not asked again: {msg}")
    return msg


def _reference(member, x, names, dev):
    from kdagen.spec.reference import (naive_recurrent_deltanet, naive_recurrent_dplr, naive_recurrent_gdn,
                                       naive_recurrent_gla)
    r = {n: x[n].double().requires_grad_(True) for n in names}
    if member in ("dplr", "dplr5"):  # kdagen's reference subtracts a b^T: FLA's b (a^T S) is a_ref = -b, b_ref = a
        ro, rs = naive_recurrent_dplr(r["q"], r["k"], r["v"], -r["b"], r["a"], r["gk"],
                                      initial_state=r["initial_state"], output_final_state=True)
    elif member in ("gla", "gla5"):
        ro, rs = naive_recurrent_gla(r["q"], r["k"], r["v"], r["g"], initial_state=r["initial_state"],
                                     output_final_state=True)
    elif member in GATED:
        g = -torch.exp(r["A_log"]) * torch.nn.functional.softplus(r["g"] + r["dt_bias"])
        q, k = r["q"], r["k"]
        if member == "gdn_layer":  # FLA's l2norm: x / sqrt(sum x^2 + 1e-6)
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        ro, rs = naive_recurrent_gdn(q, k, r["v"], g, r["beta"], initial_state=r["initial_state"],
                                     output_final_state=True)
    elif member == "gdn":
        ro, rs = naive_recurrent_gdn(r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["initial_state"],
                                     output_final_state=True)
    else:
        ro, rs = naive_recurrent_deltanet(r["q"], r["k"], r["v"], r["beta"], initial_state=r["initial_state"],
                                          output_final_state=True)
    return r, ro, rs


def errors(member, libs, shapes, dev, budget, grads):
    """bf16 errors against float64: the forward (chunk o and final state, recurrent o), or with
    ``grads`` every gradient of the chunk op (a separate row, run after every forward section)."""
    kind = "gradients" if grads else "forward"
    for B, T, H, D in shapes:
        if not budget.ok(f"errors ({kind}) {member} {(B, T, H, D)}"):
            return
        x = inputs(member, B, T, H, D, D, dev)
        names = GRAD[member]
        r, ro, rs = _reference(member, x, names, dev)
        row = dict(member=member, kind=kind, shape=[B, T, H, D])
        if grads:
            gen = torch.Generator().manual_seed(7)
            do = torch.randn(ro.shape, generator=gen).to(dev)
            ds = torch.randn(rs.shape, generator=gen).to(dev)
            rg = torch.autograd.grad((ro, rs), [r[n] for n in names], (do.double(), ds.double()))
        for lib, (chunk, recurrent) in libs.items():
            try:
                if not grads:
                    with torch.no_grad():
                        o, s = call_chunk(member, chunk, x)
                        oc = None if recurrent is None else call_recurrent(member, recurrent, x)[0]
                    row[lib] = dict(o=rel(o, ro), final_state=rel(s, rs))
                    if oc is not None:
                        row[lib]["recurrent_o"] = rel(oc, ro)
                    continue
                if _bwd_refused(lib, member):
                    row[lib] = dict(error=_bwd_refused(lib, member))
                    continue
                leaves = {n: x[n].detach().clone().requires_grad_(True) for n in names}
                o2, s2 = call_chunk(member, chunk, {**x, **leaves})
                try:
                    gr = torch.autograd.grad((o2, s2), [leaves[n] for n in names], (do.to(o2.dtype), ds))
                except Exception as e:  # noqa: BLE001
                    row[lib] = dict(error=_refuse_bwd(lib, member, e))
                    continue
                row[lib] = {f"d{n}": rel(a, b) for n, a, b in zip(names, gr, rg)}
            except Exception as e:  # noqa: BLE001
                row[lib] = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
        RES["errors"].append(row)
        row["t_s"] = round(time.time() - T0, 1)
        log(f"  errors {row}")


def timings(member, libs, shapes, p, dev, budget, out):
    """``p``: "fwd" or "fwdbwd", at every shape; each library's first call (FLA's autotuning) is
    made before anything is timed."""
    cuda = dev == "cuda"
    for B, T, H, D in shapes:
        if not budget.ok(f"{p} {member} {(B, T, H, D)}", need=RESERVE[p] if cuda else 0.0):
            continue
        x = inputs(member, B, T, H, D, D, dev)
        row = dict(member=member, pass_=p, shape=[B, T, H, D])
        for lib, (chunk, _) in libs.items():
            if p == "fwdbwd" and _bwd_refused(lib, member):
                row[f"{lib}_error"] = _bwd_refused(lib, member)
                continue
            try:
                if p == "fwd":
                    def fn(chunk=chunk):
                        with torch.no_grad():
                            return call_chunk(member, chunk, x)
                else:
                    fn = fwdbwd_fn(member, chunk, x)
                t = time.time()
                fn()
                if cuda:
                    torch.cuda.synchronize()
                row[f"{lib}_first_call_s"] = time.time() - t
                row[f"{lib}_ms"] = bench_ms(fn, cuda)
            except Exception as e:  # noqa: BLE001
                row[f"{lib}_error"] = (_refuse_bwd(lib, member, e) if p == "fwdbwd"
                                       else f"{type(e).__name__}: {str(e)[:200]}")
            if cuda:
                torch.cuda.empty_cache()
        if "fla_ms" in row and "kdagen_ms" in row:
            row["ratio"] = row["fla_ms"] / row["kdagen_ms"]
        RES["rows"].append(row)
        row["t_s"] = round(time.time() - T0, 1)  # when the row finished: where a run spends its budget
        log(f"  {row}")
        dump(out)
        del x


def profile(member, libs, shape, dev, budget, out, top=12):
    """Per-kernel GPU time (torch.profiler, mean of 3 calls) of each library's forward+backward at
    one shape: where each library's training step spends its time, kernel by kernel."""
    if dev != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile as tprofile
    B, T, H, D = shape
    if not budget.ok(f"profile {member} {shape}", need=RESERVE["fwdbwd"]):
        return
    x = inputs(member, B, T, H, D, D, dev)
    for lib, (chunk, _) in libs.items():
        if _bwd_refused(lib, member):
            continue
        try:
            fn = fwdbwd_fn(member, chunk, x)
            fn()
            torch.cuda.synchronize()
            with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            log(f"  profile {member} {lib}: {type(e).__name__}: {str(e)[:160]}")
            continue
        rows = []
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t > 0:
                rows.append((t / 3 / 1e3, e.count // 3, e.key[:80]))
        rows.sort(reverse=True)
        entry = dict(member=member, lib=lib, shape=list(shape), total_ms=sum(r[0] for r in rows),
                     kernels=[dict(ms=round(ms, 4), count=c, name=n) for ms, c, n in rows[:top]])
        RES.setdefault("profiles", []).append(entry)
        log(f"  profile fwd+bwd {member} {lib} {shape}: {entry['total_ms']:.3f} ms of kernels per call")
        for ms, c, n in rows[:top]:
            log(f"    {ms:8.3f} ms  x{c:<3} {n}")
        dump(out)
        torch.cuda.empty_cache()


def decode(member, libs, shapes, dev, budget, out):
    cuda = dev == "cuda"
    for B, H, D in shapes:
        if not budget.ok(f"decode {member} B={B}"):
            return
        x = inputs(member, B, 1, H, D, D, dev)
        row = dict(member=member, pass_="decode", shape=[B, 1, H, D])
        for lib, (_, recurrent) in libs.items():
            if recurrent is None:
                continue
            try:
                with torch.no_grad():
                    fn = lambda recurrent=recurrent: call_recurrent(member, recurrent, x)  # noqa: E731
                    row[f"{lib}_graph_us"] = graph_us(fn, cuda)
                    if lib == "kdagen":  # the serving form: the pool updated in place, o into a buffer
                        pool = x["initial_state"].clone()
                        idx = torch.arange(B, dtype=torch.int32, device=dev)
                        buf = torch.empty_like(x["v"])
                        xp = dict(x, initial_state=pool)
                        fp = lambda: call_recurrent(member, recurrent, xp, ssm_state_indices=idx, out=buf)  # noqa: E731
                        row["kdagen_pool_graph_us"] = graph_us(fp, cuda)
            except Exception as e:  # noqa: BLE001
                row[f"{lib}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if "fla_graph_us" in row and "kdagen_graph_us" in row:
            row["ratio"] = row["fla_graph_us"] / row["kdagen_graph_us"]
        # the state read and written once is the floor: 2 * B * H * K * V * 4 bytes
        row["state_MB"] = 2 * B * H * D * D * 4 / 1e6
        RES["rows"].append(row)
        row["t_s"] = round(time.time() - T0, 1)  # when the row finished: where a run spends its budget
        log(f"  {row}")
        dump(out)


def table():
    log("\n| member | pass | B, T, H, K=V | kdagen | FLA | FLA/kdagen | kdagen pool (decode) |")
    log("|---|---|---|---|---|---|---|")
    for r in RES["rows"]:
        unit = "us" if r["pass_"] == "decode" else "ms"
        key = "graph_us" if unit == "us" else "ms"
        kd, fl = r.get(f"kdagen_{key}", math.nan), r.get(f"fla_{key}", math.nan)
        err = r.get("kdagen_error") or r.get("fla_error") or ""
        pool = f"{r['kdagen_pool_graph_us']:.1f} us" if "kdagen_pool_graph_us" in r else ""
        log(f"| {r['member']} | {r['pass_']} | {', '.join(map(str, r['shape']))} | {kd:.3f} {unit} | {fl:.3f} {unit} | "
            f"{r.get('ratio', math.nan):.2f}x | {pool} {err[:60]} |")
    if RES["errors"]:
        log("\n| member | bf16 error vs float64 | B, T, H, K=V | lib | relative errors |")
        log("|---|---|---|---|---|")
        for r in RES["errors"]:
            for lib in ("kdagen", "fla"):
                e = r.get(lib)
                if not e:
                    continue
                vals = (f"error: {e['error'][:80]}" if "error" in e
                        else ", ".join(f"{n} {v:.2e}" for n, v in e.items()))
                log(f"| {r['member']} | {r['kind']} | {', '.join(map(str, r['shape']))} | {lib} | {vals} |")
    if RES["skipped"]:
        log(f"skipped for the budget: {RES['skipped']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--only", default="", help="comma-separated members (gdn, deltanet, gla, gla5, dplr) and/or passes "
                                               "(errors, fwd, fwdbwd, decode, profile)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds the whole run may take")
    ap.add_argument("--warm-workers", type=int, default=0, help="processes compiling FLA's candidates first")
    ap.add_argument("--warm-budget", type=float, default=180.0)
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--forward-errors-only", action="store_true",
                    help="the errors pass without its gradient rows (their float64 autograd takes minutes per row)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on the CPU in the interpreter")
    ap.add_argument("--fla-gdn-unguarded", action="store_true",
                    help="time FLA's GDN backward with its Triton < 3.7.1 Hopper guard lifted (its gradients are "
                         "wrong there, FLA #640: the time is its, the errors are reported, not trusted)")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    unknown = only - set(MEMBERS) - set(LAYER_MEMBERS) - set(PASSES)
    if unknown:
        ap.error(f"--only: unknown {sorted(unknown)}; members {MEMBERS + LAYER_MEMBERS}, passes {PASSES}")
    members = [m for m in MEMBERS + LAYER_MEMBERS if m in only] or list(MEMBERS)
    passes = [p for p in PASSES if p in only] or list(PASSES)
    budget = Budget(args.budget)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("no GPU: run the smoke test in Triton's interpreter (TRITON_INTERPRET=1 ... --smoke)")
    shapes, dshapes, eshapes = ((SMOKE_SHAPES, SMOKE_DECODE, SMOKE_ERROR_SHAPES) if args.smoke
                                else (SHAPES, DECODE, ERROR_SHAPES))
    import triton

    import kdagen
    RES["meta"] = dict(device=torch.cuda.get_device_name() if cuda else "cpu (interpreter)", torch=torch.__version__,
                       triton=triton.__version__, kdagen=kdagen.__version__, smoke=args.smoke,
                       when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), members=members, passes=passes)
    if args.fla_gdn_unguarded and not args.no_fla:
        lift_fla_gdn_guard()
        RES["meta"]["fla_gdn_unguarded"] = True
    log(json.dumps(RES["meta"]))
    try:
        if cuda and not args.no_fla and args.warm_workers > 0:
            warm_parallel(args.warm_workers, members, shapes, min(args.warm_budget, max(budget.left() - 60, 1)))
        libs = {}
        for member in members:
            kd = ops(member, "kdagen")
            libs[member] = {} if kd is None else {"kdagen": kd}
            fla = None if args.no_fla else ops(member, "fla")
            if fla is not None:
                libs[member]["fla"] = fla
                guard = fla_gdn_backward_guard() if member in ("gdn",) + GATED else None
                if guard:
                    BWD_REFUSED[("fla", member)] = guard
                    log(f"  fla's {member} backward: {guard}")
        for member in [m for m in members if not libs[m]]:
            log(f"{member}: neither library has its ops here; left out")
            members.remove(member)
        # the forward passes of every member first, the gradients last: a backward that autotunes for
        # minutes (or a spent budget) cannot cost the forward rows
        for member in members:
            log(f"\n== {member} forward: {', '.join(libs[member])} [t={time.time() - T0:.0f}s]")
            if "errors" in passes:
                errors(member, libs[member], eshapes, dev, budget, grads=False)
                dump(args.out)
            if "fwd" in passes:
                timings(member, libs[member], shapes, "fwd", dev, budget, args.out)
            if "decode" in passes:
                decode(member, libs[member], dshapes, dev, budget, args.out)
        for member in members:
            log(f"\n== {member} gradients: {', '.join(libs[member])} [t={time.time() - T0:.0f}s]")
            if "errors" in passes and not args.forward_errors_only:
                errors(member, libs[member], eshapes, dev, budget, grads=True)
                dump(args.out)
            if "fwdbwd" in passes:
                timings(member, libs[member], shapes, "fwdbwd", dev, budget, args.out)
            if "profile" in passes:
                profile(member, libs[member], shapes[0], dev, budget, args.out)
    finally:
        table()
        log(f"done in {time.time() - T0:.0f}s")
        dump(args.out)
    return RES


if __name__ == "__main__":
    main()
