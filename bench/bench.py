"""One script that checks and times kdagen against flash-linear-attention (FLA) in one
process, on the same inputs.  Run on a GPU machine:

    PYTHONPATH=. python bench/bench.py --out "$OUT" [--suite check,fwd,variants,bwd_check,fwdbwd,bwd_variants,decode,decode_variants] [--no-fla]

Prints a short table last and writes the full log and a JSON of every number to --out.
Absolute times only mean something on a GPU; report ratios.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kdagen  # noqa: E402
from kdagen.config import ChunkFwdConfig, RecurrentConfig  # noqa: E402
from kdagen.spec.reference import naive_recurrent_kda  # noqa: E402
from kdagen.ops.chunk import chunk_kda_launches  # noqa: E402

LOWER = -5.0
RESULTS: dict = {"rows": []}
LOG = []


OUT_DIR = "."


T_START = time.time()


def log(*a):
    s = " ".join(str(x) for x in a)
    if s.startswith("\n=="):
        s = f"{s} [t={time.time() - T_START:.0f}s]"
    print(s, flush=True)
    LOG.append(s)


def dump():
    """Write what has been measured so far (a run cut by its time limit still leaves its rows)."""
    with open(os.path.join(OUT_DIR, "bench.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
    with open(os.path.join(OUT_DIR, "bench.log"), "w") as f:
        f.write("\n".join(LOG))


def profile_top(fn, label, n_iter=3, top=14):
    """Per-kernel GPU time of one call of ``fn`` (torch.profiler, mean over n_iter calls)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n_iter):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((t / n_iter / 1e3, e.count // n_iter, e.key[:90]))
    rows.sort(reverse=True)
    log(f"  profile {label}: total {sum(r[0] for r in rows):.3f} ms per call")
    for ms, cnt, name in rows[:top]:
        log(f"    {ms:8.3f} ms  x{cnt:<3} {name}")
    return rows


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def inputs(B, T, H, K, V, HV=None, dtype=torch.bfloat16, seed=0, h0=True, device="cuda"):
    HV = HV or H
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = LOWER * torch.sigmoid(torch.randn(B, T, HV, K, generator=gen) + 2.0)  # in [-5, 0)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    s0 = torch.randn(B, HV, K, V, generator=gen) * 0.1 if h0 else None
    cast = lambda x: x.to(device=device, dtype=dtype)  # noqa: E731
    out = dict(q=cast(q), k=cast(k), v=cast(v), g=g.to(device), beta=cast(beta),
               initial_state=None if s0 is None else s0.to(device))
    return out


def fla_ops():
    try:
        from fla.ops.kda import chunk_kda as fchunk, fused_recurrent_kda as frec
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as frec_fwd
        import fla
        return fchunk, frec, frec_fwd, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        log("FLA not importable:", repr(e))
        return None, None, None, None


def ceilings():
    n = 1 << 28  # 1 GiB fp32
    a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    bw = 2 * a.numel() * 4 / (ms * 1e-3) / 1e9
    log(f"device copy: {bw:.0f} GB/s (read+write, 1 GiB, median)")
    RESULTS["copy_gbs"] = bw
    del a, b
    torch.cuda.empty_cache()
    return bw


def check(fchunk, frec):
    """bf16 correctness against the float64 recurrence, kdagen and FLA side by side."""
    log("\n== correctness (bf16 inputs, fp32 g in [-5,0), fp32 state) vs float64 recurrence ==")
    cases = [(1, 1024, 4, 128, 128, None, False), (2, 333, 2, 128, 128, 4, False),
             (1, 512, 2, 96, 192, None, False), (1, 700, 2, 64, 64, None, True)]
    for B, T, H, K, V, HV, varlen in cases:
        x = inputs(B, T, H, K, V, HV)
        cu = None
        if varlen:
            cu = torch.tensor([0, 1, 100, 165, T], dtype=torch.long, device="cuda")
            x["initial_state"] = torch.randn(4, HV or H, K, V, device="cuda") * 0.1
        ref_o, ref_s = naive_recurrent_kda(*(x[n].cpu() for n in ("q", "k", "v", "g", "beta")),
                                           initial_state=x["initial_state"].cpu(), output_final_state=True,
                                           cu_seqlens=None if cu is None else cu.cpu())
        row = dict(case=f"chunk B={B} T={T} H={H} HV={HV or H} K={K} V={V}{' varlen' if varlen else ''}")
        o, s = kdagen.chunk_kda(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER, cu_seqlens=cu)
        torch.cuda.synchronize()
        row.update(kdagen_o=rel(o, ref_o), kdagen_state=rel(s, ref_s), kdagen_nan=bool(torch.isnan(o).any()))
        o2, s2 = kdagen.chunk_kda(**x, output_final_state=True, cu_seqlens=cu)  # unbounded-gate path
        row.update(kdagen_unsafe_o=rel(o2, ref_o))
        o3, s3 = kdagen.fused_recurrent_kda(**x, output_final_state=True, cu_seqlens=cu)
        row.update(kdagen_rec_o=rel(o3, ref_o), kdagen_rec_state=rel(s3, ref_s))
        if fchunk is not None:
            try:
                fo, fs = fchunk(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER, cu_seqlens=cu)
                row.update(fla_o=rel(fo, ref_o), fla_state=rel(fs, ref_s))
            except Exception as e:  # noqa: BLE001
                row.update(fla_error=repr(e)[:200])
        RESULTS["rows"].append(dict(kind="check", **row))
        log(json.dumps(row))


def peak_gib(fn):
    """Peak device memory of one call beyond what is allocated before it (GiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 30


def bench_plan(K, V, dtype=torch.bfloat16):
    """The chunk-form plan of the benchmark's op calls (safe gate, lower bound LOWER)."""
    from kdagen.codegen.lower import lower
    from kdagen.dtypes import dtype as as_dtype
    from kdagen.ops.inputs import select_spec

    return lower(select_spec(False, True, LOWER, False, False), K, V, as_dtype(dtype).name, "chunk", False)


def layer_plan(K, dtype=torch.bfloat16):
    """The chunk-form plan of the layer call (layer_inputs' flags: in-kernel gate with A_log and
    dt_bias, lower bound LOWER)."""
    from kdagen.codegen.lower import lower
    from kdagen.dtypes import dtype as as_dtype
    from kdagen.ops.inputs import select_spec

    return lower(select_spec(True, True, LOWER, True, True), K, K, as_dtype(dtype).name, "chunk", True)


def shape_hint(B, T, H):
    """The shape the ops resolve configs at, for a fixed-length batch."""
    return {"T": T, "B": B, "N": B, "HV": H}


def resolved_bwd_config(B, T, H, K):
    """The backward config kdagen's op resolves at this shape (tuned winner, else heuristic)."""
    from kdagen.cache.lookup import resolve

    return resolve("chunk_bwd", bench_plan(K, K), None, shape_hint(B, T, H))


def used_configs(B, T, H, K):
    """The forward and backward configs kdagen's op picks at this shape (a tuned winner from
    KDAGEN_CACHE_DIR, else the heuristic), so that each timing names what it timed."""
    from kdagen.cache.lookup import lookup_winner, resolve

    plan = bench_plan(K, K)
    hint = shape_hint(B, T, H)
    out = {}
    for fam, name in (("chunk_fwd", "fwd_config"), ("chunk_bwd", "bwd_config")):
        tuned = lookup_winner(plan, fam, hint)
        out[name] = ("tuned " if tuned else "default ") + repr(resolve(fam, plan, None, hint))
    return out


def time_chunk(fchunk, shapes, variants):
    log("\n== chunkwise forward timing (bf16, safe gate -5, h0 fp32, output_final_state) ==")
    out = []
    for (B, T, H, K) in shapes:
        x = inputs(B, T, H, K, K)
        kd = lambda cfg=None: kdagen.chunk_kda(**x, output_final_state=True, safe_gate=True,  # noqa: E731
                                               lower_bound=LOWER, config=cfg)
        o, s = kd()
        row = dict(kind="chunk_fwd", shape=f"{B},{T},{H},{K}", **used_configs(B, T, H, K))
        if fchunk is not None:
            fl = lambda: fchunk(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER)  # noqa: E731
            fo, fs = fl()
            row["diff_vs_fla_o"] = rel(o, fo)
            row["diff_vs_fla_state"] = rel(s, fs)
            row["fla_ms"] = do_bench(fl, warmup=100, rep=500, return_mode="median")
        row["kdagen_ms"] = do_bench(kd, warmup=100, rep=500, return_mode="median")
        if "fla_ms" in row:
            row["speedup"] = row["fla_ms"] / row["kdagen_ms"]
        for name, cfg in [("default", None)] + list(variants):
            try:
                launches, _ = chunk_kda_launches(**x, output_final_state=True, safe_gate=True,
                                                 lower_bound=LOWER, config=cfg)
                for ln in launches:
                    ln()
                times = [do_bench(ln, warmup=30, rep=200, return_mode="median") for ln in launches]
                row[f"v:{name}"] = "intra %.3f state %.3f" % tuple(times)
            except Exception as e:  # noqa: BLE001
                row[f"v:{name}"] = f"error {type(e).__name__}: {str(e)[:120]}"
        log(json.dumps(row))
        RESULTS["rows"].append(row)
        dump()
        out.append(row)
        del x
        torch.cuda.empty_cache()
    return out


def time_decode(frec_fwd, batches, copy_gbs):
    log("\n== decode timing (T=1, H=32, K=V=128, fp32 state pool updated in place) ==")
    H, K, V = 32, 128, 128
    out = []
    for B in batches:
        x = inputs(B, 1, H, K, V)
        pool = x.pop("initial_state").contiguous()
        idx = torch.arange(B, device="cuda", dtype=torch.int32)
        o_buf = torch.empty_like(x["v"])
        kd = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=idx, out=o_buf)  # noqa: E731
        row = dict(kind="decode", B=B)
        fns = {"kdagen": kd}
        if frec_fwd is not None:
            idx64 = idx.to(torch.int64)
            fns["fla"] = lambda: frec_fwd(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],  # noqa: E731
                                          initial_state=pool, scale=K ** -0.5, inplace_final_state=True,
                                          ssm_state_indices=idx64)
        # correctness of one step against float64 (pool copy)
        p0 = pool.clone()
        ref_o, ref_s = naive_recurrent_kda(*(x[n].cpu() for n in ("q", "k", "v", "g", "beta")),
                                           initial_state=p0.cpu(), output_final_state=True)
        kd()
        torch.cuda.synchronize()
        row["kdagen_err_o"] = rel(o_buf, ref_o)
        row["kdagen_err_state"] = rel(pool, ref_s)
        pool.copy_(p0)
        bytes_moved = 2 * B * H * K * V * 4
        for name, fn in fns.items():
            fn()
            torch.cuda.synchronize()
            # eager: host-bound per-call cost
            n = 300
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            row[f"{name}_eager_us"] = (time.perf_counter() - t0) / n * 1e6
            # graph replay
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            us = do_bench(graph.replay, warmup=50, rep=300, return_mode="median") * 1e3
            row[f"{name}_graph_us"] = us
            row[f"{name}_gbs"] = bytes_moved / (us * 1e-6) / 1e9
            row[f"{name}_pct_copy"] = 100 * row[f"{name}_gbs"] / copy_gbs
            pool.copy_(p0)
        log(json.dumps(row))
        RESULTS["rows"].append(row)
        dump()
        out.append(row)
    return out


GRAD_NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _grads(fn, x, do, dht):
    leaves = [x[n] for n in GRAD_NAMES]
    o, s = fn(x)
    return torch.autograd.grad((o, s), leaves, (do, dht))


BWD_CHECK_CASES = [(1, 512, 2, 128, 128), (2, 200, 2, 96, 192)]


def check_bwd(fchunk, cases=BWD_CHECK_CASES, seeds=(0,), configs=None):
    """Each gradient's error against float64 autograd through the reference, kdagen and FLA
    side by side (bf16 inputs, fp32 g and state); one row per case and input seed (seed 0: the
    inputs every earlier run used)."""
    log("\n== backward correctness (bf16) vs float64 autograd through the recurrence ==")
    for (B, T, H, K, V), seed in [(c, s) for c in cases for s in seeds]:
        x = inputs(B, T, H, K, V, seed=seed)
        for n in GRAD_NAMES:
            x[n] = x[n].detach().requires_grad_(True)
        gen = torch.Generator(device="cpu").manual_seed(7 + seed)
        do = torch.randn(B, T, H, V, generator=gen).to("cuda", torch.bfloat16)
        dht = torch.randn(B, H, K, V, generator=gen).cuda()
        ref_x = {n: x[n].detach().cpu().double().requires_grad_(True) for n in GRAD_NAMES}
        ref = _grads(lambda d: naive_recurrent_kda(d["q"], d["k"], d["v"], d["g"], d["beta"],
                                                   initial_state=d["initial_state"], output_final_state=True),
                     ref_x, do.cpu().double(), dht.cpu().double())
        row = dict(kind="bwd_check", case=f"B={B} T={T} H={H} K={K} V={V}", seed=seed)
        kd = _grads(lambda d: kdagen.chunk_kda(**d, output_final_state=True, safe_gate=True, lower_bound=LOWER),
                    x, do, dht)
        for n, a, r in zip(GRAD_NAMES, kd, ref):
            row[f"kdagen_d{n}"] = rel(a, r)
        for name, fwd_kw, bwd_kw in (BWD_CHECK_CONFIGS if configs is None else configs):
            from kdagen.ops.chunk import chunk_bwd_config
            try:
                with chunk_bwd_config(resolved_bwd_config(B, T, H, K).replace(**bwd_kw)):
                    kp = _grads(lambda d: kdagen.chunk_kda(**d, output_final_state=True, safe_gate=True,
                                                           lower_bound=LOWER,
                                                           config=train_config_for(B, T, H, K, **fwd_kw)),
                                x, do, dht)
                for n, a, r in zip(GRAD_NAMES, kp, ref):
                    row[f"kdagen_{name}_d{n}"] = rel(a, r)
            except Exception as e:  # noqa: BLE001
                row[f"kdagen_{name}_error"] = repr(e)[:200]
        if fchunk is not None:
            try:
                fl = _grads(lambda d: fchunk(**d, output_final_state=True, safe_gate=True, lower_bound=LOWER),
                            x, do, dht)
                for n, a, r in zip(GRAD_NAMES, fl, ref):
                    row[f"fla_d{n}"] = rel(a, r)
            except Exception as e:  # noqa: BLE001
                row["fla_error"] = repr(e)[:200]
        log(json.dumps(row))
        RESULTS["rows"].append(row)
        dump()


BWD_VARIANTS = [
    # (runs 9-80 measured the state, dqkw, re-run and intra tiles and stages, the split, C=64, the state
    # passes' prefetch and stages and the training forward's intra tiles: bench/RESULTS.md; C=64 with the new
    # paths faulted in run 73, so it is launch_fault.py's)
    ("st_bv32", dict(state_block_v=32)),
    # (run 81, H200: the state passes' loops unrolled by two lose at both shapes; run 82, H100: eight warps on
    # wider V tiles, BV=32 or 64, lose in both passes at both shapes)
    # the training forward's intra launch without its row-block loads issued ahead (the default since run 83)
    ("train_intra_no_la", dict(train=dict(intra_load_ahead=False))),
]
# whole forward+backward runs under a changed backward config, in the same process as the default's
WHOLE_VARIANTS = [
    # (run 76: run 69's fused intra launch +0.9 ms, diag_precision="ieee" +3.5 / +2.3 ms; the state passes'
    # prefetch is the default since)
    # the factorised diagonal's operands in fp32 on tf32 dots (run 76: +1.0 / +0.65 ms with both; dg's error
    # 1.35x -> 1.06x FLA's): in the training forward and the backward, or in one of them
    # (diag_tf32 in both: 10.243 / 7.545 ms in run 77; in the backward only 10.084 / 7.436; in the forward
    # only 9.429 / 7.013; not timed again)
    # (run 81, H200: diag_precision="split" +0.27 / +0.17 ms, dg 3.17e-3 -> 2.77e-3 (FLA 2.25e-3); with tf32 in
    # the training forward +0.43 / +0.27 ms)
    # the training forward's intra launch without its row-block loads issued ahead (run 83: +0.03 / +0.02 ms;
    # run 106: +0.07 ms at (1, 8192, 96))
    # (the triangular inverse on tf32 dots, backward only / both: runs 105-106, -0.14 / -0.19 ms at
    # (1, 8192, 96), the default since run 106 for half precision)
    # (the factorised diagonal's operands in fp32 on tf32 dots in both launches, issue 17's error bar: runs 77,
    # 81, 107-108; the default for bf16 with a bounded gate since session 22.  Run 108: layer call +0.56 ms)
    # the factorised diagonal's operands in bf16, the default before session 22 (run 107: 8.045 / 5.584 ms)
    ("diag_input", dict(diag_precision="input", train=dict(diag_precision="input"))),
    # qg as hi + lo in the reverse state pass (dh0's error: 1.6e-3 -> 0.02-0.16e-3, run 108; +0.45 ms in the
    # layer call at (1, 8192, 96), run 108)
    ("qg_split", dict(qg_split=True)),
    # the intra gradients (the wy launch and pass 2) on 4 warps: with the tf32 diagonal pass 2 spills on 2 warps
    # (sm_90 static report, session 22: 320 B plain / 468 B in the layer call, none on 4; 2 warps won with the
    # bf16 diagonal, run 85)
    ("intra_w4", dict(intra_num_warps=4)),
]
# the layer call under some of them (on its own plan's configs)
LAYER_VARIANTS = [v for v in WHOLE_VARIANTS if v[0] in ("diag_input", "qg_split", "intra_w4")] + [
    # the in-kernel gate in launches of its own (ChunkTrainConfig.gate_launch, session 23): g once in fp32, the
    # plain plan's chunk launches on it, then dz / dA_log / ddt_bias from dg.  Predicted from run 107's plain and
    # layer profiles: the layer's gate overhead (~0.6 ms at (2, 16384, 16), ~0.9 at (1, 8192, 96)) replaced by
    # ~0.25 / ~0.35 ms of element-wise traffic: 6.95 -> ~6.5-6.6 ms, 10.03 -> ~9.5 ms; peak memory +1 fp32 g
    ("gate_launch", dict(train=dict(gate_launch=True))),
]
# gradient errors under changed configs (bwd_check rows, keys kdagen_NAME_dX): (name, the training forward's
# config fields, the backward's) -- the factorised diagonal's operands in fp32 (split and split_fwd_tf32:
# run 81), the backward's inverse on tf32 dots
# (bwd_inv_tf32 / inv_tf32, the inverse on tf32 dots: run 106, no change; the default since)
# (the tf32 diagonal, the default since session 22; state_tf32 with it, diag_tf32_qg_split: run 108)
# the factorised diagonal in bf16 (the default before session 22); the reverse state pass's dS and dV' in fp32 on
# tf32 dots; the forward's intermediates kept; qg as hi + lo in the reverse pass (dh0: run 108)
BWD_CHECK_CONFIGS = (("diag_input", dict(diag_precision="input"), dict(diag_precision="input")),
                     ("state_tf32", {}, dict(state_precision="tf32")),
                     ("stored", {}, dict(store_intermediates=True)),
                     ("qg_split", {}, dict(qg_split=True)))


def train_config_for(B, T, H, K, **kw):
    """The training forward's heuristic config at this shape, changed by ``kw``."""
    from kdagen.cache.heuristics import default_train_config

    return default_train_config(bench_plan(K, K), shape_hint(B, T, H)).replace(**kw)


def bwd_breakdown(x, do, dht, variants=()):
    """kdagen's forward+backward launch by launch (ms): the forward (intra, state writing the
    per-chunk states), the recomputed intra, then each backward launch; and backward config
    variants, launch by launch."""
    from kdagen.cache.heuristics import default_chunk_bwd_config
    from kdagen.ops.chunk import chunk_kda_bwd_launches

    xd = {n: t.detach() for n, t in x.items()}
    kw = dict(output_final_state=True, safe_gate=True, lower_bound=LOWER, do=do, dht=dht)
    fwd, bwd, _ = chunk_kda_bwd_launches(**xd, **kw)
    for ln in list(fwd) + list(bwd):
        ln()
    times = [do_bench(ln, warmup=20, rep=100, return_mode="median") for ln in list(fwd) + list(bwd)]
    # every launch named by its kernel (before session 20 the forward's were assumed to be two -- intra
    # and state -- so with the split output launch each backward name sat one launch late: bench/RESULTS.md)
    out = {f"fwd_{i}_{ln.kernel}": t for i, (ln, t) in enumerate(zip(fwd, times))}
    for i, (ln, t) in enumerate(zip(bwd, times[len(fwd):])):
        out[f"bwd_{i}_{ln.kernel}"] = t
    K, V = x["q"].shape[-1], x["v"].shape[-1]
    plan = bench_plan(K, V, x["q"].dtype)
    hint = shape_hint(*x["v"].shape[:3])
    for name, kwcfg in variants:
        kwcfg = dict(kwcfg)
        train_kw = kwcfg.pop("train", None)
        try:
            if train_kw is None:
                cfg = default_chunk_bwd_config(plan, hint).replace(**kwcfg)
                fw, bw, _ = chunk_kda_bwd_launches(**xd, **kw, bwd_config=cfg)
                timed = bw
            else:  # a training forward config too: its launches are timed with the backward's
                tcfg = train_config_for(*x["v"].shape[:3], K, **train_kw)
                cfg = default_chunk_bwd_config(plan, hint).replace(chunk_size=tcfg.chunk_size,
                                                                  sub_chunk=tcfg.sub_chunk, **kwcfg)
                fw, bw, _ = chunk_kda_bwd_launches(**xd, **kw, config=tcfg, bwd_config=cfg)
                timed = list(fw) + list(bw)
            for ln in list(fw) + list(bw):  # the backward reads what this forward writes
                ln()
            ts = [do_bench(ln, warmup=10, rep=50, return_mode="median") for ln in timed]
            out[f"v:{name}"] = " ".join("%s %.3f" % (ln.kernel.replace("chunk_bwd_", ""), t)
                                        for ln, t in zip(timed, ts)) + " | sum %.3f" % sum(ts)
        except Exception as e:  # noqa: BLE001
            out[f"v:{name}"] = f"error {type(e).__name__}: {str(e)[:120]}"
    return out


def time_fwd_bwd(fchunk, shapes, variants=(), whole=WHOLE_VARIANTS):
    log("\n== chunkwise forward+backward timing (bf16, safe gate -5, grads of q,k,v,g,beta,h0) ==")
    for (B, T, H, K) in shapes:
        x = inputs(B, T, H, K, K)
        for n in GRAD_NAMES:
            x[n] = x[n].detach().requires_grad_(True)
        do = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16)
        dht = torch.randn(B, H, K, K, device="cuda")
        kd = lambda: _grads(lambda d: kdagen.chunk_kda(**d, output_final_state=True, safe_gate=True,  # noqa: E731
                                                       lower_bound=LOWER), x, do, dht)
        row = dict(kind="chunk_fwd_bwd", shape=f"{B},{T},{H},{K}", **used_configs(B, T, H, K))
        base = [t.clone() for t in kd()]
        if fchunk is not None:
            fl = lambda: _grads(lambda d: fchunk(**d, output_final_state=True, safe_gate=True,  # noqa: E731
                                                 lower_bound=LOWER), x, do, dht)
            a, b = kd(), fl()
            for n, ga, gb in zip(GRAD_NAMES, a, b):
                row[f"diff_vs_fla_d{n}"] = rel(ga, gb)
            row["fla_ms"] = do_bench(fl, warmup=50, rep=300, return_mode="median")
        row["kdagen_ms"] = do_bench(kd, warmup=50, rep=300, return_mode="median")
        if "fla_ms" in row:
            row["speedup"] = row["fla_ms"] / row["kdagen_ms"]
        row["kdagen_peak_gib"] = peak_gib(kd)
        if fchunk is not None:
            row["fla_peak_gib"] = peak_gib(fl)
        try:  # the same config keeping the forward's intermediates (no re-run of the intra launch)
            from kdagen.ops.chunk import chunk_bwd_config
            with chunk_bwd_config(resolved_bwd_config(B, T, H, K).replace(store_intermediates=True)):
                kd()
                row["kdagen_stored_ms"] = do_bench(kd, warmup=50, rep=300, return_mode="median")
                row["kdagen_stored_peak_gib"] = peak_gib(kd)
        except Exception as e:  # noqa: BLE001
            row["kdagen_stored_ms"] = f"error {type(e).__name__}: {str(e)[:200]}"
        for name, kwcfg in whole:
            try:
                from kdagen.ops.chunk import chunk_bwd_config
                kwcfg = dict(kwcfg)
                train = kwcfg.pop("train", None)
                kv = kd if train is None else (lambda: _grads(lambda d: kdagen.chunk_kda(  # noqa: E731
                    **d, output_final_state=True, safe_gate=True, lower_bound=LOWER,
                    config=train_config_for(B, T, H, K, **train)), x, do, dht))
                with chunk_bwd_config(resolved_bwd_config(B, T, H, K).replace(**kwcfg)):
                    a = kv()
                    # how far the variant's gradients are from the default's (0: bit-identical)
                    row[f"{name}_max_diff_vs_default"] = max(float((ga.float() - gb.float()).abs().max())
                                                             for ga, gb in zip(a, base))
                    if fchunk is not None:
                        for n, ga, gb in zip(GRAD_NAMES, a, fl()):
                            row[f"{name}_diff_vs_fla_d{n}"] = rel(ga, gb)
                    row[f"kdagen_{name}_ms"] = do_bench(kv, warmup=50, rep=300, return_mode="median")
                    row[f"kdagen_{name}_peak_gib"] = peak_gib(kv)
            except Exception as e:  # noqa: BLE001
                row[f"kdagen_{name}_ms"] = f"error {type(e).__name__}: {str(e)[:200]}"
        try:
            row["kdagen_launches"] = bwd_breakdown(x, do, dht, variants)
        except Exception as e:  # noqa: BLE001
            row["kdagen_launches"] = f"error {type(e).__name__}: {str(e)[:200]}"
        log(json.dumps(row))
        RESULTS["rows"].append(row)
        dump()
        try:
            profile_top(kd, f"kdagen fwd+bwd {row['shape']}")
            if fchunk is not None:
                profile_top(fl, f"FLA fwd+bwd {row['shape']}")
        except Exception as e:  # noqa: BLE001
            log(f"profile failed: {e!r}")
        del x
        torch.cuda.empty_cache()


LAYER_GRADS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")


def layer_inputs(B, T, H, K, seed=0):
    """The KDA layer's call (bench/forward_vs_fla.py's): raw q/k (l2-normalised in the op), the raw
    gate with A_log/dt_bias (in-kernel gate, lower bound LOWER), raw beta (sigmoid in the op)."""
    gen = torch.Generator().manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16
    x = dict(q=torch.randn(B, T, H, K, generator=gen).to(dev, bf), k=torch.randn(B, T, H, K, generator=gen).to(dev, bf),
             v=torch.randn(B, T, H, K, generator=gen).to(dev, bf), g=torch.randn(B, T, H, K, generator=gen).to(dev),
             beta=torch.randn(B, T, H, generator=gen).to(dev, bf),
             initial_state=(torch.randn(B, H, K, K, generator=gen) * 0.1).to(dev),
             A_log=torch.log(torch.rand(H, generator=gen) * 4 + 1).to(dev),
             dt_bias=(torch.randn(H * K, generator=gen) * 0.5).to(dev))
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 safe_gate=True, lower_bound=LOWER, output_final_state=True)
    return {n: t.requires_grad_(True) for n, t in x.items()}, flags


def time_layer(fchunk, shapes, variants=()):
    """The layer's call, forward+backward, both libraries in this process; gradients of every input
    (dz of the raw gate, dA_log, ddt_bias included); then kdagen under each variant of ``variants``
    ((name, backward config changes with the training forward's under "train"))."""
    log("\n== the layer call, forward+backward (raw q/k l2-normalised, in-kernel gate, beta sigmoid) ==")
    for (B, T, H, K) in shapes:
        x, flags = layer_inputs(B, T, H, K)
        leaves = [x[n] for n in LAYER_GRADS]
        do = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16)
        dht = torch.randn(B, H, K, K, device="cuda")
        row = dict(kind="layer_fwd_bwd", shape=f"{B},{T},{H},{K}")

        def step(fn):
            return lambda: torch.autograd.grad(fn(**x, **flags), leaves, (do, dht))

        libs = [("kdagen", kdagen.chunk_kda)] + ([("fla", fchunk)] if fchunk is not None else [])
        grads = {}
        for name, fn in libs:
            try:
                grads[name] = step(fn)()
                row[f"{name}_ms"] = do_bench(step(fn), warmup=30, rep=200, return_mode="median")
                row[f"{name}_peak_gib"] = peak_gib(step(fn))
            except Exception as e:  # noqa: BLE001
                row[f"{name}_ms"] = f"error {type(e).__name__}: {str(e)[:200]}"
        if len(grads) == 2:
            for n, a, b in zip(LAYER_GRADS, grads["kdagen"], grads["fla"]):
                row[f"diff_vs_fla_d{n}"] = rel(a, b)
        if isinstance(row.get("fla_ms"), float) and isinstance(row.get("kdagen_ms"), float):
            row["speedup"] = row["fla_ms"] / row["kdagen_ms"]
        for name, kwcfg in variants:
            try:
                from kdagen.cache.heuristics import default_train_config
                from kdagen.cache.lookup import resolve
                from kdagen.ops.chunk import chunk_bwd_config
                kwcfg = dict(kwcfg)
                train = kwcfg.pop("train", {})
                plan, hint = layer_plan(K), shape_hint(B, T, H)
                tcfg = default_train_config(plan, hint).replace(**train)
                fv = lambda **kw: kdagen.chunk_kda(**kw, config=tcfg)  # noqa: E731
                with chunk_bwd_config(resolve("chunk_bwd", plan, None, hint).replace(**kwcfg)):
                    step(fv)()
                    row[f"kdagen_{name}_ms"] = do_bench(step(fv), warmup=30, rep=200, return_mode="median")
                    row[f"kdagen_{name}_peak_gib"] = peak_gib(step(fv))
                    got = step(fv)()
                    if "kdagen" in grads:  # the variant's gradients against the default's (bf16 rounding apart)
                        for n, a, b in zip(LAYER_GRADS, got, grads["kdagen"]):
                            row[f"{name}_diff_vs_default_d{n}"] = rel(a, b)
                    if isinstance(row.get("fla_ms"), float):
                        row[f"{name}_speedup"] = row["fla_ms"] / row[f"kdagen_{name}_ms"]
            except Exception as e:  # noqa: BLE001
                row[f"kdagen_{name}_ms"] = f"error {type(e).__name__}: {str(e)[:200]}"
        log(json.dumps(row))
        RESULTS["rows"].append(row)
        dump()
        try:
            profile_top(step(kdagen.chunk_kda), f"kdagen layer fwd+bwd {row['shape']}")
        except Exception as e:  # noqa: BLE001
            log(f"profile failed: {e!r}")
        del x, leaves, grads
        torch.cuda.empty_cache()


def decode_variants(batches):
    log("\n== decode variants (graph replay, us) ==")
    H, K, V = 32, 128, 128
    for B in batches:
        x = inputs(B, 1, H, K, V)
        pool = x.pop("initial_state").contiguous()
        idx = torch.arange(B, device="cuda", dtype=torch.int32)
        o_buf = torch.empty_like(x["v"])
        row = dict(kind="decode_variants", B=B)
        for bv in (16, 32, 64, 128):
            for nw in (1, 2, 4, 8):
                cfg = RecurrentConfig(block_v=bv, num_warps=nw)
                fn = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=idx,  # noqa: E731
                                                        out=o_buf, config=cfg)
                try:
                    fn()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        fn()
                    row[f"bv{bv}_w{nw}"] = round(do_bench(g.replay, warmup=20, rep=100, return_mode="median") * 1e3, 2)
                except Exception as e:  # noqa: BLE001
                    row[f"bv{bv}_w{nw}"] = f"err {type(e).__name__}"
        log(json.dumps(row))
        RESULTS["rows"].append(row)
        dump()


CHUNK_VARIANTS = [
    ("c32", ChunkFwdConfig(chunk_size=32)),
    ("c64_w8", ChunkFwdConfig(intra_num_warps=8)),
    ("c64_tf32inv", ChunkFwdConfig(inverse_precision="tf32")),
    ("c64_factors_fp32", ChunkFwdConfig(factor_precision="fp32")),
    ("c64_bv16", ChunkFwdConfig(state_block_v=16)),
    ("c64_bv64", ChunkFwdConfig(state_block_v=64)),
    ("c64_no_prefetch", ChunkFwdConfig(state_prefetch=False)),
    ("c64_2stages", ChunkFwdConfig(state_num_stages=2)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--suite", default="check,fwd,decode")
    ap.add_argument("--no-fla", action="store_true", help="time kdagen alone (no FLA autotuning)")
    ap.add_argument("--shapes", default="1,8192,96,128;2,16384,16,128;4,4096,32,128;8,1024,8,64",
                    help="chunk shapes B,T,H,K separated by ';'")
    ap.add_argument("--train-shapes", default="1,8192,96,128;2,16384,16,128",
                    help="layer / fwdbwd: shapes B,T,H,K separated by ';'")
    ap.add_argument("--seeds", default="0", help="bwd_check: input seeds, separated by ','")
    ap.add_argument("--check-cases", default="1,2",
                    help="bwd_check: which of BWD_CHECK_CASES (1-based), separated by ','")
    ap.add_argument("--check-configs", default="all",
                    help="bwd_check: the changed configs also checked (BWD_CHECK_CONFIGS names, 'all' or 'none')")
    ap.add_argument("--variants", default="", help="whole / layer: only these variants, separated by ','")
    args = ap.parse_args()
    global OUT_DIR
    OUT_DIR = args.out
    suite = set(args.suite.split(","))
    wanted = set(filter(None, args.variants.split(",")))
    known = [n for n, _ in WHOLE_VARIANTS] + [n for n, _ in LAYER_VARIANTS if n not in dict(WHOLE_VARIANTS)]
    unknown = wanted - set(known)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; known: {known}")

    def picked(variants):
        return [v for v in variants if not wanted or v[0] in wanted]
    fchunk, frec, frec_fwd, fla_ver = (None, None, None, "not run") if args.no_fla else fla_ops()
    props = torch.cuda.get_device_properties(0)
    RESULTS["env"] = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), gpu=props.name,
                          sms=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__,
                          fla=fla_ver, kdagen=kdagen.__version__, python=platform.python_version(),
                          cuda=torch.version.cuda)
    log(json.dumps(RESULTS["env"]))
    copy_gbs = ceilings()
    try:
        if "check" in suite:
            check(fchunk, frec)
        if "fwd" in suite:
            time_chunk(fchunk, [tuple(int(x) for x in sh.split(",")) for sh in args.shapes.split(";")],
                       CHUNK_VARIANTS if "variants" in suite else [])
        seeds = [int(s) for s in args.seeds.split(",")]
        train_shapes = [tuple(int(x) for x in sh.split(",")) for sh in args.train_shapes.split(";")]
        cases = [BWD_CHECK_CASES[int(i) - 1] for i in args.check_cases.split(",")]
        configs = (BWD_CHECK_CONFIGS if args.check_configs == "all" else
                   tuple(c for c in BWD_CHECK_CONFIGS if c[0] in args.check_configs.split(",")))
        if "bwd_check" in suite:  # K = V = 128 first: its autotuning is shared with the timing below
            check_bwd(fchunk, [c for c in cases if c == BWD_CHECK_CASES[0]], seeds, configs)
        if "layer" in suite:
            time_layer(fchunk, train_shapes, picked(LAYER_VARIANTS) if "whole" in suite else ())
        if "fwdbwd" in suite:
            time_fwd_bwd(fchunk, train_shapes,
                         BWD_VARIANTS if "bwd_variants" in suite else (), picked(WHOLE_VARIANTS) if "whole" in suite else ())
        if "bwd_check" in suite:
            check_bwd(fchunk, [c for c in cases if c != BWD_CHECK_CASES[0]], seeds, configs)
        if "decode" in suite:
            time_decode(frec_fwd, [1, 64, 256], copy_gbs)
        if "decode_variants" in suite:
            decode_variants([1, 64, 256])
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())
    finally:
        dump()
    log("\n== summary ==")
    for r in RESULTS["rows"]:
        if r["kind"] == "chunk_fwd":
            log(f"fwd {r['shape']:>18}  kdagen {r['kdagen_ms']:.3f} ms  fla {r.get('fla_ms', float('nan')):.3f} ms  "
                f"x{r.get('speedup', float('nan')):.2f}  diff {r.get('diff_vs_fla_o', float('nan')):.1e}")
        if r["kind"] == "chunk_fwd_bwd":
            log(f"fwd+bwd {r['shape']:>14}  kdagen {r['kdagen_ms']:.3f} ms  fla {r.get('fla_ms', float('nan')):.3f} ms  "
                f"x{r.get('speedup', float('nan')):.2f}  | stored intermediates {r.get('kdagen_stored_ms')} ms; "
                f"peak GiB kdagen {r.get('kdagen_peak_gib', float('nan')):.2f} "
                f"stored {r.get('kdagen_stored_peak_gib', float('nan')):.2f} fla {r.get('fla_peak_gib', float('nan')):.2f}")
        if r["kind"] == "layer_fwd_bwd":
            log(f"layer fwd+bwd {r['shape']:>12}  kdagen {r.get('kdagen_ms')} ms  fla {r.get('fla_ms')} ms  "
                f"x{r.get('speedup', float('nan')):.2f}  peak GiB kdagen {r.get('kdagen_peak_gib')} fla {r.get('fla_peak_gib')}")
        if r["kind"] == "decode":
            log(f"decode B={r['B']:>3}  kdagen graph {r['kdagen_graph_us']:.1f} us ({r['kdagen_pct_copy']:.0f}% copy) "
                f"eager {r['kdagen_eager_us']:.1f} us | fla graph {r.get('fla_graph_us', float('nan')):.1f} us "
                f"eager {r.get('fla_eager_us', float('nan')):.1f} us")


if __name__ == "__main__":
    main()
