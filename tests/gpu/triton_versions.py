"""Compare two Tritons on a GPU: the installed one and a wheel's (CI never runs this: no GPU there).

For each Triton, in subprocesses of its own: a reduced GPU sweep against float64 (``tests/gpu/sweep.py``:
every form of each member, fixed length and varlen) and ``kdagen bench --suite readme --compare fla``
(the README's forward, forward+backward and decode cases, kdagen and FLA in the same process, each
checked against float64).  The wheel's Triton is installed into a folder of its own (``pip install
--no-deps --target``) that is put first on PYTHONPATH, so the rest of the environment -- torch, FLA,
kdagen -- is the same for both.  Each Triton gets fresh Triton and kdagen caches: both run kdagen's
heuristic configs (tuned winners are keyed by the Triton version anyway).

    python tests/gpu/triton_versions.py (--wheels DIR | --overlay DIR) [--out triton-versions] [--budget 900]
        [--members kda,gdn,gla,dplr] [--dims 64,100,128] [--dtypes float32,bfloat16] [--no-bench]
        [--no-installed]

--wheels DIR: a folder holding a triton-*.whl (e.g. ``pip download --no-deps triton==3.9.0 -d DIR``).
--overlay DIR: a folder that already holds the other Triton's ``triton/`` package (a wheel unpacked,
e.g. one slimmed to travel where a whole wheel cannot).  --no-installed measures the other Triton only
(the installed one's figures from an earlier run).  Prints one table:
per Triton the sweep's pass/fail counts and worst error per form, then per bench case each Triton's
kdagen and FLA times and kdagen's error.  Writes OUT/<version>/{sweep/sweep.json,bench.json}.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "tests" / "gpu" / "sweep.py"
FORMS = ("chunk_fwd", "chunk_bwd", "decode", "decode_bwd")


def _version(env: dict) -> str:
    r = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"], env=env,
                       capture_output=True, text=True, check=True)
    return r.stdout.strip()


def _env(overlay: Path | None, caches: Path) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(overlay), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TRITON_CACHE_DIR"] = str(caches / "triton")
    env["KDAGEN_CACHE_DIR"] = str(caches / "kdagen")
    return env


def _run(cmd: list[str], env: dict, log: Path) -> int:
    print("$", " ".join(cmd), f"> {log}", flush=True)
    with open(log, "w") as fh:
        return subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO).returncode


def measure(label: str, overlay: Path | None, out: Path, a) -> dict:
    caches = Path(tempfile.mkdtemp(prefix="kdagen-tv-" + "".join(c if c.isalnum() else "_" for c in label) + "-"))
    env = _env(overlay, caches)
    version = _version(env)
    d = out / version
    d.mkdir(parents=True, exist_ok=True)
    print(f"\n== {label}: Triton {version}", flush=True)
    res = {"version": version}
    _run([sys.executable, str(SWEEP), "--out", str(d / "sweep"), "--members", a.members, "--dims", a.dims,
          "--dtypes", a.dtypes, "--budget", str(a.budget), "--workers", str(a.workers)], env, d / "sweep.log")
    sweep = d / "sweep" / "sweep.json"
    res["sweep"] = json.loads(sweep.read_text()) if sweep.exists() else []
    if a.bench:
        _run([sys.executable, "-c", "from kdagen.cli import main; main()", "bench", "--suite", "readme",
              "--compare", "fla", "--out", str(d / "bench")], env, d / "bench.log")
        bench = d / "bench.json"
        res["bench"] = json.loads(bench.read_text())["rows"] if bench.exists() else []
    return res


def _sweep_lines(results: list[dict]) -> list[str]:
    lines = ["sweep against float64 (reduced): passed/run and the worst relative error per form"]
    lines.append(f"{'triton':14s}" + "".join(f"{f:>24s}" for f in FORMS) + "   failures")
    for r in results:
        cells, bad = [], []
        for f in FORMS:
            rows = [c for c in r["sweep"] if c["form"] == f]
            ok = sum(c["status"] == "pass" for c in rows)
            worst = max((c.get("worst", float("inf")) for c in rows), default=float("nan"))
            cells.append(f"{ok}/{len(rows)} {worst:9.1e}")
            bad += [f"{c['member']}/{f}/K{c['K']}/{c['dtype']}/{c['layout']}:{c['status']}"
                    for c in rows if c["status"] != "pass"]
        lines.append(f"{r['version']:14s}" + "".join(f"{c:>24s}" for c in cells)
                     + "   " + (", ".join(bad[:8]) + (f" (+{len(bad) - 8})" if len(bad) > 8 else "") if bad else "none"))
    return lines


def _bench_lines(results: list[dict]) -> list[str]:
    if not all("bench" in r for r in results):
        return []
    keys = list(dict.fromkeys((b.get("member", "kda"), b["pass"], b["shape"]) for r in results for b in r["bench"]))
    head = f"{'member':7s} {'pass':7s} {'shape':20s}" + "".join(
        f"{'kdagen ' + r['version']:>20s}{'fla ' + r['version']:>18s}{'err':>9s}" for r in results)
    lines = ["", "kdagen bench --suite readme --compare fla: median times; err is kdagen's against float64", head]

    def cell(r, key, lib):
        b = next((b for b in r["bench"] if (b.get("member", "kda"), b["pass"], b["shape"]) == key
                  and b["library"] == lib), None)
        return b

    for key in keys:
        line = f"{key[0]:7s} {key[1]:7s} {key[2]:20s}"
        for r in results:
            k, f = cell(r, key, "kdagen"), cell(r, key, "fla")
            fmt = lambda b: "-" if b is None else ("failed" if b["failed"] else f"{b['ms']:.4f} ms")
            err = "-" if k is None or k["failed"] or k["error"] is None else f"{k['error']:.1e}"
            line += f"{fmt(k):>20s}{fmt(f):>18s}{err:>9s}"
        lines.append(line)
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheels", help="a folder holding the other Triton's wheel (triton-*.whl)")
    src.add_argument("--overlay", help="a folder holding the other Triton's unpacked triton/ package")
    ap.add_argument("--out", default="triton-versions")
    ap.add_argument("--members", default="kda,gdn,gla,dplr")
    ap.add_argument("--dims", default="64,100,128")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--budget", type=float, default=900.0, help="seconds of each sweep (sweep.py --budget)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--no-bench", dest="bench", action="store_false", help="the sweep only")
    ap.add_argument("--no-installed", dest="installed", action="store_false",
                    help="measure the other Triton only")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if a.overlay:
        overlay = Path(a.overlay).resolve()
        if not (overlay / "triton" / "__init__.py").exists():
            sys.exit(f"{a.overlay}: no triton/ package in it")
        label = f"overlay {overlay}"
    else:
        wheels = sorted(Path(a.wheels).glob("triton-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"{a.wheels}: expected one triton-*.whl, found {[w.name for w in wheels]}")
        overlay = out / "overlay"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target",
                        str(overlay), str(wheels[0])], check=True)
        label = wheels[0].name
    results = ([measure("installed", None, out, a)] if a.installed else []) + [measure(label, overlay, out, a)]
    lines = _sweep_lines(results) + _bench_lines(results)
    print("\n" + "\n".join(lines))
    (out / "table.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
