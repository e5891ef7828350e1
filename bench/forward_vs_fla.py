"""The forward against flash-linear-attention (FLA), in one process, on the same inputs.

    PYTHONPATH=/tmp/site:. python3 bench/forward_vs_fla.py --out "$OUT" [--warm-workers 12]

1. FLA's autotuning candidates are compiled first in parallel worker processes (each compiles
   a share of every autotuner's configs at every shape; the timings there are thrown away),
   so the measuring process's own autotuning only benchmarks;
2. bf16 errors of both libraries against the float64 recurrence at small shapes;
3. median times (triton.testing.do_bench) of both at each shape, kdagen's per launch, and the
   ratio FLA / kdagen.  Shapes: the plain call (g given, safe_gate, lower bound -5) at four
   shapes; the KDA layer's call (raw q/k with l2-norm, raw gate with A_log/dt_bias, raw beta)
   at two; 64 packed sequences (~32K tokens, H=32); one long sequence with few heads.
Writes forward.json and forward.log under --out and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LOWER = -5.0
T0 = time.time()
LOG: list[str] = []
RES: dict = {"rows": [], "checks": []}

PLAIN = [(1, 8192, 96, 128), (2, 16384, 16, 128), (4, 4096, 32, 128), (8, 1024, 8, 64)]
LAYER = [(1, 8192, 96, 128), (2, 16384, 16, 128)]
LONG = (1, 65536, 8, 128)
PACKED = (64, 32768, 32, 128)  # (sequences, total tokens, H, K=V)


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def dump(out):
    with open(os.path.join(out, "forward.json"), "w") as f:
        json.dump(RES, f, indent=1)
    with open(os.path.join(out, "forward.log"), "w") as f:
        f.write("\n".join(LOG))


def packed_lengths(n, total, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(n, generator=gen) + 0.05
    lens = (w / w.sum() * total).long().clamp_min(1)
    lens[-1] += total - int(lens.sum())
    cu = torch.zeros(n + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(lens, 0)
    return cu


def inputs(B, T, H, K, V, layer=False, cu=None, seed=0, dev="cuda"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    N = B if cu is None else len(cu) - 1
    x = dict(v=v.to(dev, torch.bfloat16),
             initial_state=(torch.randn(N, H, K, V, generator=gen) * 0.1).to(dev))
    if layer:
        x.update(q=q.to(dev, torch.bfloat16), k=k.to(dev, torch.bfloat16),
                 g=torch.randn(B, T, H, K, generator=gen).to(dev),
                 beta=torch.randn(B, T, H, generator=gen).to(dev, torch.bfloat16),
                 A_log=torch.log(torch.rand(H, generator=gen) * 4 + 1).to(dev),
                 dt_bias=(torch.randn(H * K, generator=gen) * 0.5).to(dev))
        flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                     safe_gate=True, lower_bound=LOWER)
    else:
        k = torch.nn.functional.normalize(k, dim=-1)
        x.update(q=q.to(dev, torch.bfloat16), k=k.to(dev, torch.bfloat16),
                 g=(LOWER * torch.sigmoid(torch.randn(B, T, H, K, generator=gen) + 2.0)).to(dev),
                 beta=torch.sigmoid(torch.randn(B, T, H, generator=gen)).to(dev, torch.bfloat16))
        flags = dict(safe_gate=True, lower_bound=LOWER)
    if cu is not None:
        x["cu_seqlens"] = cu.to(dev)
    return x, flags


def cases():
    out = [("plain", s, False, None) for s in PLAIN]
    out += [("layer", s, True, None) for s in LAYER]
    out.append(("packed64", (1, PACKED[1], PACKED[2], PACKED[3]), False, packed_lengths(PACKED[0], PACKED[1])))
    # the same call given the offsets on the host too (FLA's cu_seqlens_cpu, both libraries): what a
    # serving engine that has them passes; neither reads cu_seqlens back from the device
    out.append(("packed64h", (1, PACKED[1], PACKED[2], PACKED[3]), False, packed_lengths(PACKED[0], PACKED[1])))
    out.append(("long", LONG, False, None))
    return out


def _fla():
    from fla.ops.kda import chunk_kda as fla_chunk_kda
    return fla_chunk_kda


def _call(fn, x, flags):
    return fn(**x, **flags, output_final_state=True)


def _warm_worker(index, count, queue, with_fla, only=()):
    """Compile a share of FLA's autotuning candidates at every case (of ``only``, when given), and
    kdagen's kernels of every count-th case, into the shared Triton cache."""
    import kdagen

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fla_warm import keep_share_of_configs

    keep_share_of_configs(index, count)
    fla = _fla() if with_fla else None
    done = 0
    for i, (name, (B, T, H, D), layer, cu) in enumerate(c for c in cases() if not only or c[0] in only):
        try:
            x, flags = inputs(B, T, H, D, D, layer, cu)
            with torch.no_grad():
                if fla is not None:
                    _call(fla, x, flags)
                if i % count == index:
                    _call(kdagen.chunk_kda, x, flags)
            torch.cuda.synchronize()
            done += 1
        except Exception as e:  # noqa: BLE001
            queue.put((index, f"{name}: {type(e).__name__}: {str(e)[:160]}"))
        torch.cuda.empty_cache()
    queue.put((index, f"done {done}"))


def warm(workers, with_fla, budget_s, only=()):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_warm_worker, args=(i, workers, queue, with_fla, tuple(only))) for i in range(workers)]
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
    log(f"warm-up: {workers} workers in {time.time() - T0:.0f}s; "
        f"{sum(1 for _, m in msgs if m.startswith('done'))} finished; "
        + "; ".join(m for _, m in msgs if not m.startswith("done"))[:400])


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def checks(fla):
    import kdagen
    from kdagen.spec.reference import naive_recurrent_kda
    for (B, T, H, D, layer) in [(1, 1024, 4, 128, False), (2, 333, 2, 128, False), (1, 1000, 4, 128, True)]:
        x, flags = inputs(B, T, H, D, D, layer)
        # the reference sees what the kernels see: l2-normalised q/k, the gate and beta applied
        r = dict(x)
        if layer:
            r["q"] = torch.nn.functional.normalize(x["q"].double(), dim=-1)
            r["k"] = torch.nn.functional.normalize(x["k"].double(), dim=-1)
            A, bias = x["A_log"].double(), x["dt_bias"].double().view(H, D)
            r["g"] = LOWER * torch.sigmoid(torch.exp(A)[:, None] * (x["g"].double() + bias))
            r["beta"] = torch.sigmoid(x["beta"].double())
        ro, rs = naive_recurrent_kda(r["q"], r["k"], r["v"], r["g"], r["beta"],
                                     initial_state=x["initial_state"], output_final_state=True)
        row = dict(case=[B, T, H, D, "layer" if layer else "plain"])
        for lib, fn in (("kdagen", kdagen.chunk_kda), ("fla", fla)):
            if fn is None:
                continue
            with torch.no_grad():
                o, s = _call(fn, x, flags)
            row[lib] = (rel(o, ro), rel(s, rs))
        RES["checks"].append(row)
        log(f"  check {row}")


def bench_ms(fn):
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--warm-workers", type=int, default=12)
    ap.add_argument("--warm-budget", type=float, default=240.0, help="seconds the warm-up may take")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-checks", action="store_true",
                    help="skip the bf16 error checks (with FLA they autotune its kernels at their shapes first)")
    ap.add_argument("--only", default="", help="comma-separated case names (plain, layer, packed64, packed64h, long)")
    args = ap.parse_args()
    import triton

    import kdagen
    from kdagen.ops.chunk import chunk_kda_launches

    log(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"kdagen {kdagen.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    fla = None
    if not args.no_fla:
        try:
            fla = _fla()
            import fla as fla_pkg
            log(f"FLA {getattr(fla_pkg, '__version__', '?')}")
        except Exception as e:  # noqa: BLE001
            log("FLA not importable:", repr(e))
    xs = torch.empty(256 * 2 ** 20, device="cuda")
    ys = torch.empty_like(xs)
    ceil = 2 * xs.numel() * 4 / bench_ms(lambda: ys.copy_(xs)) / 1e6
    del xs, ys
    RES["copy_GBps"] = ceil
    log(f"copy ceiling {ceil:.0f} GB/s")
    only = set(filter(None, args.only.split(",")))
    if args.warm_workers > 0:
        warm(args.warm_workers, fla is not None, args.warm_budget, only)
    if not args.no_checks:
        log(f"\n== bf16 errors against float64 [t={time.time() - T0:.0f}s]")
        checks(fla)
    dump(args.out)
    for name, (B, T, H, D), layer, cu in cases():
        if only and name not in only:
            continue
        x, flags = inputs(B, T, H, D, D, layer, cu)
        if name == "packed64h":
            flags = dict(flags, cu_seqlens_cpu=cu)
        th = B * T * H
        floor_bytes = th * (2 * D * 2 + D * 4 + D * 2 + 2 + D * 2)  # q, k, v, g (fp32), beta read; o written
        row = dict(case=name, shape=[B, T, H, D], tokens_heads=th, floor_ms=floor_bytes / ceil / 1e6)
        try:
            with torch.no_grad():
                fk = lambda: _call(kdagen.chunk_kda, x, flags)  # noqa: E731
                fk()
                row["kdagen_ms"] = bench_ms(fk)
                launches, _ = chunk_kda_launches(**x, **{f: v for f, v in flags.items() if f != "cu_seqlens_cpu"},
                                                 output_final_state=True)
                for ln in launches:
                    ln()
                row["kdagen_launch_ms"] = {ln.kernel: bench_ms(ln) for ln in launches}
                row["launches"] = {ln.kernel: dict(grid=list(ln.grid), warps=ln.num_warps,
                                                   constexprs={k: v for k, v in ln.constexprs.items()
                                                               if isinstance(v, (int, bool))}) for ln in launches}
                if fla is not None:
                    ff = lambda: _call(fla, x, flags)  # noqa: E731
                    ff()
                    row["fla_ms"] = bench_ms(ff)
                    row["ratio"] = row["fla_ms"] / row["kdagen_ms"]
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        RES["rows"].append(row)
        log(f"  {name:9s} {B},{T},{H},{D}: {row}")
        dump(args.out)
        del x
        torch.cuda.empty_cache()
    log(f"\n| case | B, T, H, K=V | kdagen ms | FLA ms | FLA/kdagen | launches (ms) | floor ms |")
    log("|---|---|---|---|---|---|---|")
    for r in RES["rows"]:
        if "error" in r:
            log(f"| {r['case']} | {r['shape']} | error: {r['error'][:80]} | | | | |")
            continue
        lt = ", ".join(f"{k} {v:.3f}" for k, v in r.get("kdagen_launch_ms", {}).items())
        log(f"| {r['case']} | {', '.join(map(str, r['shape']))} | {r['kdagen_ms']:.3f} | {r.get('fla_ms', float('nan')):.3f} | "
            f"{r.get('ratio', float('nan')):.2f}x | {lt} | {r['floor_ms']:.3f} |")
    log(f"done in {time.time() - T0:.0f}s")
    dump(args.out)


if __name__ == "__main__":
    main()
