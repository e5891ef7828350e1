"""The first call in a fresh process, with and without kept binaries (kdagen/cache/binaries.py), on a GPU.

    PYTHONPATH=. python tests/gpu/first_call.py --out DIR [--shape 1,8192,16,128] [--batch 16] [--no-fla] [--profile]

1. ``kdagen build --gpu auto --compile-only`` at the shape and decode batch keeps the binaries of what the ops
   will run there (its compile-check of every candidate is timed too: the cost of keeping);
2. each case then runs in a fresh process with an empty Triton cache -- ``cold``: an empty kdagen cache
   (everything compiles); ``kept``: kdagen's cache with the kept binaries (loaded); and in each process
   the same call again (``warm``): chunk_kda's forward and backward in bf16 at --shape, and
   fused_recurrent_kda's decode step of --batch sequences on 32 heads (fp32 states); FLA's first call beside (its own cold start, FLA_DISABLE_BACKEND_DISPATCH=1).

Prints a table and writes ``first_call.json``.  The goal (issue 63): the first call with kept binaries within
2x of a warm call.  CI never runs this (no GPU there).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CASE = r'''
import json, sys, time
t_import = time.perf_counter()
lib, op, B, T, H, K, N = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
PROFILE = len(sys.argv) > 8 and sys.argv[8] == "profile"
import torch
import triton.runtime.build as _tb
from triton import knobs
_built, _hits = [], []
_orig_build = _tb._build
def _timed_build(name, *a, **kw):  # the C modules a first launch builds (launchers, the driver's utilities)
    t = time.perf_counter(); so = _orig_build(name, *a, **kw); _built.append(time.perf_counter() - t); return so
_tb._build = _timed_build
_compiled = []
def _listen(**kw):  # every kernel's first launch: loaded (a hit) or compiled (named, so a miss is diagnosable)
    _hits.append(bool(kw["cache_hit"]))
    if not kw["cache_hit"]:
        _compiled.append(getattr(kw["src"], "name", None) or kw["metadata"].get("name", "?"))
knobs.compilation.listener = _listen
if lib == "fla":
    from fla.ops.kda import chunk_kda, fused_recurrent_kda
else:
    from kdagen import chunk_kda, fused_recurrent_kda
t_import = time.perf_counter() - t_import
dev, bf = "cuda", torch.bfloat16
torch.manual_seed(0)
if op == "chunk":
    q = torch.randn(B, T, H, K, device=dev, dtype=bf, requires_grad=True)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(bf).requires_grad_(True)
    v = torch.randn(B, T, H, K, device=dev, dtype=bf, requires_grad=True)
    g = (-5 * torch.sigmoid(torch.randn(B, T, H, K, device=dev) + 2)).requires_grad_(True)
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev)).to(bf).requires_grad_(True)
    def call():
        o, _ = chunk_kda(q, k, v, g, beta, safe_gate=True, lower_bound=-5.0)
        o.float().square().mean().backward()
else:  # a decode step of N sequences on 32 heads, as `kdagen build` keeps it (its decode tuning shape)
    q = torch.randn(N, 1, 32, K, device=dev, dtype=bf)
    k = torch.nn.functional.normalize(torch.randn(N, 1, 32, K, device=dev), dim=-1).to(bf)
    v = torch.randn(N, 1, 32, K, device=dev, dtype=bf)
    g = -torch.rand(N, 1, 32, K, device=dev)
    beta = torch.rand(N, 1, 32, device=dev).to(bf)
    h0 = torch.zeros(N, 32, K, K, device=dev)
    def call():
        fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
times, profile = [], None
for i in range(3):
    if i == 0 and PROFILE:  # where the first call's time goes (the profiler's own cost included)
        import cProfile, io, pstats
        pr = cProfile.Profile(); pr.enable()
    torch.cuda.synchronize(); t0 = time.perf_counter(); call(); torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    if i == 0 and PROFILE:
        pr.disable(); buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(40)
        profile = buf.getvalue()
print("@@" + json.dumps(dict(import_s=t_import, first_s=times[0], warm_s=min(times[1:]), c_builds=len(_built),
                             c_build_s=sum(_built), compiles=_hits.count(False), cache_hits=_hits.count(True),
                             compiled=_compiled, profile=profile)))
'''


def run_case(lib: str, op: str, shape, batch: int, triton_cache: Path, kdagen_cache: Path,
             profile: bool = False) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(triton_cache), "KDAGEN_CACHE_DIR": str(kdagen_cache),
           "FLA_DISABLE_BACKEND_DISPATCH": "1"}
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run([sys.executable, "-c", _CASE, lib, op, *map(str, shape), str(batch)]
                       + (["profile"] if profile else []), capture_output=True,
                       text=True, env=env, timeout=900)
    if p.returncode != 0 or "@@" not in p.stdout:
        return dict(error=(p.stderr or p.stdout)[-1500:])
    return json.loads(p.stdout.rsplit("@@", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shape", default="1,8192,16,128", help="B,T,H,K of chunk_kda (K = V)")
    ap.add_argument("--batch", type=int, default=16, help="sequences of the decode step (H and K of --shape)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="then the kept first call once more under cProfile: its top entries to DIR/profile_<op>.txt")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    B, T, H, K = map(int, a.shape.split(","))
    work = Path(tempfile.mkdtemp(prefix="first-call-"))
    kept = work / "kdagen-kept"
    env = {**os.environ, "KDAGEN_CACHE_DIR": str(kept), "TRITON_CACHE_DIR": str(work / "triton-build")}
    t0 = time.time()
    build = subprocess.run([sys.executable, "-m", "kdagen.cli", "build", "--gpu", "auto", "--compile-only",
                            "--head-dim", str(K), "--shapes", a.shape, "--decode-batches", str(a.batch),
                            "--family", "chunk_fwd", "--family", "chunk_bwd", "--family", "recurrent",
                            "--jobs", str(a.jobs), "--quiet"], capture_output=True, text=True, env=env, cwd=REPO)
    build_s = time.time() - t0
    (a.out / "build.log").write_text(build.stdout + build.stderr)
    infos = [json.loads(p.read_text()) for p in (kept / "binaries").glob("*/info.json")]
    n_kept = sum("kernel" in i for i in infos)
    n_modules = len(infos) - n_kept
    print(f"build (compile-only, keep): {build_s:.0f} s, rc {build.returncode}, {n_kept} kept binaries, "
          f"{n_modules} kept launch modules", flush=True)
    rows = []
    for op in ("chunk", "decode"):
        for lib, label, kcache in [("kdagen", "cold", work / f"kdagen-empty-{op}"), ("kdagen", "kept", kept)] + \
                ([] if a.no_fla else [("fla", "fla cold", work / "unused")]):
            r = run_case(lib, op, (B, T, H, K), a.batch, work / f"triton-{label.replace(' ', '-')}-{op}", kcache)
            rows.append(dict(op=op, case=label, **r))
            if "error" in r:
                print(f"{op:6s} {label:9s} ERROR {r['error'][-300:]}", flush=True)
            else:
                print(f"{op:6s} {label:9s} first {r['first_s'] * 1e3:10.1f} ms  warm {r['warm_s'] * 1e3:8.2f} ms  "
                      f"first/warm {r['first_s'] / r['warm_s']:8.1f}x  (import {r['import_s']:.1f} s; "
                      f"{r['compiles']} compiled, {r['cache_hits']} loaded, {r['c_builds']} C modules built in "
                      f"{r['c_build_s']:.1f} s)", flush=True)
                if label == "kept" and r.get("compiled"):
                    print(f"{'':17s}compiled, not kept: {', '.join(r['compiled'])}", flush=True)
        if a.profile:  # the kept case again, in a fresh process with an empty Triton cache
            r = run_case("kdagen", op, (B, T, H, K), a.batch, work / f"triton-kept-profile-{op}", kept, profile=True)
            (a.out / f"profile_{op}.txt").write_text(r.get("profile") or r.get("error", ""))
            print(f"{op:6s} profiled: {a.out / f'profile_{op}.txt'}", flush=True)
    (a.out / "first_call.json").write_text(json.dumps(dict(shape=[B, T, H, K], batch=a.batch, build_s=build_s,
                                                           kept=n_kept, rows=rows), indent=1))


if __name__ == "__main__":
    main()
