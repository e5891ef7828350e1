"""An exported package against kdagen, in one process on one GPU (issue 14's GPU check).

    python bench/export_gpu.py                 # on the GPU machine, after `kdagen build --gpu auto`

1. exports this GPU's winners (kdagen's tuning cache, or --cache FILE) for K=V=128, bf16, g >= -5
   into a temporary directory and imports the package;
2. checks that the package and kdagen give the same bits at every shape, and prints the config
   each ran (and whether it is a tuned winner: the proof the package runs the exported ones);
3. times forward, forward+backward and decode (do_bench medians) of both and prints the ratio
   (goal: within 3%);
4. times torch.compile (default backend) of a module calling the package's ops against eager.

It needs a CUDA GPU and finishes in under two minutes on an H200 once Triton's cache holds the
kernels (after ``kdagen build --gpu auto`` or one earlier run; the first compiles dominate otherwise).
Decode is timed as eager calls (the Python work included), as an application calls it.  For a smoke run on a CPU:
``TRITON_INTERPRET=1 python bench/export_gpu.py --shapes 1,64,2,32 --decode 1 --no-compile``.
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import kdagen
from kdagen.cache.gpus import detect_current
from kdagen.cache.lookup import lookup_winner, resolve

T0 = time.time()
BUDGET_S = 100.0


def timer(fn) -> float:
    """Median ms of fn (Triton's do_bench on a GPU, a wall-clock median on a CPU)."""
    if torch.cuda.is_available():
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[1]


def pair(fk, fp) -> tuple[float, float]:
    """kdagen's and the package's times, interleaved twice (the lower median of each): drift in
    the GPU's clocks reaches both alike."""
    k1, p1, k2, p2 = timer(fk), timer(fp), timer(fk), timer(fp)
    return min(k1, k2), min(p1, p2)


def inputs(B, T, H, K, dev, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen).to(dev, dtype)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(dev, dtype)
    v = torch.randn(B, T, H, K, generator=gen).to(dev, dtype)
    g = (-5 * torch.rand(B, T, H, K, generator=gen)).to(dev)
    beta = torch.rand(B, T, H, generator=gen).to(dev, dtype)
    h0 = torch.randn(B, H, K, K, generator=gen).to(dev)
    return q, k, v, g, beta, h0


def export(gpu: str, K: str, dtype: str, cache: str | None, out: str) -> str:
    cmd = [sys.executable, "-m", "kdagen.cli", "export", "--gpu", gpu, "--head-dim", str(K), "--dtype", dtype,
           "--lower-bound", "-5", "--out", out, "--name", "kda_bench"]
    if cache:
        cmd += ["--cache", cache]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout.strip(), r.stderr.strip(), sep="\n")
    if r.returncode:
        raise SystemExit(f"export failed ({r.returncode})")
    sys.path.insert(0, f"{out}/kda_bench")
    return "kda_bench"


def configs(pkg_name, family, form, K, dtype, shape, state="float32"):
    """(kdagen's config, is it a winner; the package's config, is it a winner) for a call shape."""
    from kdagen.codegen.lower import lower
    from kdagen.ops.inputs import select_spec

    safe = form == "chunk"
    plan = lower(select_spec(False, safe, -5.0 if safe else None, False, False), K, K, dtype, form)
    ex = importlib.import_module(f"{pkg_name}._runtime.exported")
    lk = importlib.import_module(f"{pkg_name}._runtime.cache.lookup")
    pplan = ex.lower(ex.select_spec(False, safe, -5.0 if safe else None, False, False), K, K, dtype, form)
    mine = resolve(family, plan, None, shape, state)
    theirs = lk.resolve(family, pplan, None, shape, state)
    return (mine, lookup_winner(plan, family, shape, state) is not None,
            theirs, ex.lookup_winner(pplan, family, shape, state) is not None)


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b) if x is not None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1,8192,96,128;2,16384,16,128", help="B,T,H,K;... of the chunk passes")
    ap.add_argument("--decode", default="1,256", help="decode batch sizes (32 heads, one token)")
    ap.add_argument("--cache", default=None, help="a tuning cache file (default: kdagen's for this GPU)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile timing")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = detect_current()
    gpu_name = gpu.name if gpu is not None else "h200"
    dtype = "bf16" if dev == "cuda" else "fp32"
    tdtype = torch.bfloat16 if dev == "cuda" else torch.float32
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    Ks = sorted({s[3] for s in shapes} | {128 if dev == "cuda" else shapes[0][3]})
    print(f"kdagen {kdagen.__version__}, torch {torch.__version__}, GPU {gpu_name}, dtype {dtype}")
    out = tempfile.mkdtemp(prefix="kdagen-export-bench-")
    name = export(gpu_name, ";".join(map(str, Ks)), dtype, args.cache, out)
    pkg = importlib.import_module(name)
    canon = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    rows = []  # (case, pass, kdagen ms, package ms, kdagen config, package config)

    def config_text(cfg, won):
        return ("winner " if won else "heur. ") + cfg.short()

    for B, T, H, K in shapes:
        q, k, v, g, beta, h0 = inputs(B, T, H, K, dev, tdtype)
        kw = dict(initial_state=h0, output_final_state=True, safe_gate=True, lower_bound=-5.0)
        shape = {"T": T, "B": B, "N": B, "HV": H}
        with torch.no_grad():
            a = kdagen.chunk_kda(q, k, v, g, beta, **kw)
            b = pkg.chunk_kda(q, k, v, g, beta, **kw)
            assert same(a, b), f"forward bits differ at {(B, T, H, K)}"
            tk, tp = pair(lambda: kdagen.chunk_kda(q, k, v, g, beta, **kw), lambda: pkg.chunk_kda(q, k, v, g, beta, **kw))
        m, mw, p, pw = configs(name, "chunk_fwd", "chunk", K, canon, shape)
        rows.append((f"{B},{T},{H},{K}", "fwd", tk, tp, config_text(m, mw), config_text(p, pw)))
        leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
        do, dht = torch.randn_like(a[0]), torch.randn_like(a[1])

        def step(op):
            o, ht = op(*leaves[:5], initial_state=leaves[5], output_final_state=True, safe_gate=True,
                       lower_bound=-5.0)
            return torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)

        assert same(step(kdagen.chunk_kda), step(pkg.chunk_kda)), f"gradient bits differ at {(B, T, H, K)}"
        tk, tp = pair(lambda: step(kdagen.chunk_kda), lambda: step(pkg.chunk_kda))
        m, mw, p, pw = configs(name, "chunk_bwd", "chunk", K, canon, shape)
        rows.append((f"{B},{T},{H},{K}", "fwd+bwd", tk, tp, config_text(m, mw), config_text(p, pw)))
        del leaves, a, b
    K = Ks[-1]
    for Bd in [int(x) for x in args.decode.split(",")]:
        q, k, v, g, beta, h0 = inputs(Bd, 1, 32 if dev == "cuda" else 2, K, dev, tdtype, seed=1)
        with torch.no_grad():
            a = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
            b = pkg.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
            assert same(a, b), f"decode bits differ at B={Bd}"
            tk, tp = pair(lambda: kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True),
                          lambda: pkg.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True))
        m, mw, p, pw = configs(name, "recurrent", "recurrent", K, canon, {"T": 1, "B": Bd, "N": Bd})
        rows.append((f"decode B={Bd}", "eager", tk, tp, config_text(m, mw), config_text(p, pw)))

    print(f"\n{'case':<20} {'pass':<8} {'kdagen ms':>10} {'export ms':>10} {'ratio':>6}  config (kdagen | export)")
    for case, what, tk, tp, cm, cp in rows:
        print(f"{case:<20} {what:<8} {tk:>10.3f} {tp:>10.3f} {tp / tk:>6.3f}  {cm} | "
              f"{'same' if cm == cp else cp}")

    if args.no_compile:
        return
    print(f"\ntorch.compile (default backend) of a module calling {name}'s ops, against eager:")
    B, T, H, K = shapes[-1]
    q, k, v, g, beta, h0 = inputs(B, T, H, K, dev, tdtype)

    def prefill(q, k, v, g, beta, h0):
        return pkg.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, safe_gate=True,
                             lower_bound=-5.0)

    def train(q, k, v, g, beta, h0):
        o, ht = prefill(q, k, v, g, beta, h0)
        return o.float().square().mean() + ht.mean()

    Bd = int(args.decode.split(",")[-1])
    dq, dk, dv, dg, db, dh = inputs(Bd, 1, 32 if dev == "cuda" else 2, K, dev, tdtype, seed=2)

    def decode(q, k, v, g, beta, h0):
        return pkg.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)

    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    cases = [("prefill fwd", prefill, (q, k, v, g, beta, h0), False),
             ("fwd+bwd", train, leaves, True),
             (f"decode B={Bd}", decode, (dq, dk, dv, dg, db, dh), False)]
    for label, fn, xs, grad in cases:
        if time.time() - T0 > BUDGET_S:
            print(f"  {label:<14} skipped (time budget)")
            continue
        compiled = torch.compile(fn, fullgraph=True)
        if grad:
            run_e = lambda: torch.autograd.grad(fn(*xs), xs)  # noqa: E731
            run_c = lambda: torch.autograd.grad(compiled(*xs), xs)  # noqa: E731
        else:
            run_e = lambda: fn(*xs)  # noqa: E731
            run_c = lambda: compiled(*xs)  # noqa: E731
        t = time.time()
        with (torch.enable_grad() if grad else torch.no_grad()):
            a, b = run_e(), run_c()
            # the ops' outputs are the very kernels' (bit-identical); a loss Inductor fuses may round differently
            ok = all(torch.allclose(x.float(), y.float(), rtol=2e-2, atol=1e-3) for x, y in zip(a, b)) if grad \
                else same(a, b)
            assert ok, f"compiled {label} differs from eager"
            ct = time.time() - t
            te, tc = pair(run_e, run_c)  # interleaved twice, the lower median of each
        print(f"  {label:<14} eager {te:8.3f} ms  compiled {tc:8.3f} ms  ratio {tc / te:6.3f}  (compile {ct:.0f}s)")
    print(f"\ndone in {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
