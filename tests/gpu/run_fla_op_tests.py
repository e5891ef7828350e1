"""Run flash-linear-attention's own op tests with kdagen's ops in FLA's place (:mod:`fla_swap`).

Needs a CUDA machine with FLA (``fla-core``) and ``einops`` installed, pytest and pytest-xdist,
and a copy of FLA's ``tests/`` folder (its ``conftest.py`` and ``ops/test_*.py``) from FLA's
repository::

    FLA_DISABLE_BACKEND_DISPATCH=1 python tests/gpu/run_fla_op_tests.py --fla-tests PATH/tests \\
        --out DIR [--files kda,gdn,delta,gla,dplr_delta] [-n 8] [--timeout 300] [--parallel]

For each file it prints passed / failed / skipped, split into the tests that called a kdagen op
and those that ran FLA's internals only (kernels called by name, its gates, vendor backends),
and the failures with their first error line; ``DIR/fla_tests.json`` holds every test's record, and
``DIR/fla_<file>.jsonl`` each test's line as it ends (a run cut short keeps what it ran).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_file(tests: Path, name: str, raw: Path, workers: int, timeout: int) -> tuple[list[dict], str]:
    log = raw / f"fla_{name}.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, "FLA_SWAP_LOG": str(log), "FLA_DISABLE_BACKEND_DISPATCH": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "fla_swap", f"ops/test_{name}.py",
           "-p", "no:cacheprovider", "--max-worker-restart", "1000"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    try:
        p = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=timeout)
        tail = (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        tail = f"TIMEOUT after {timeout}s\n" + ((e.stdout or b"")[-2000:].decode(errors="replace")
                                              if isinstance(e.stdout, bytes) else str(e.stdout or "")[-2000:])
    recs: dict[str, dict] = {}
    for ln in (log.read_text().splitlines() if log.exists() else []):
        r = json.loads(ln)
        first = recs.setdefault(r["test"], {**r, "file": name})  # one record a test: its first report,
        first["kdagen_called"] = first["kdagen_called"] or r["kdagen_called"]  # kdagen's if any line says so
    return list(recs.values()), tail


def _count(rs: list[dict]) -> str:
    c: dict[str, int] = {}
    for r in rs:
        c[r["outcome"]] = c.get(r["outcome"], 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "none"


def report(name: str, recs: list[dict]) -> None:
    ours = [r for r in recs if r["kdagen_called"]]
    theirs = [r for r in recs if not r["kdagen_called"]]
    print(f"test_{name}.py: kdagen ops: {_count(ours)} | FLA internals only: {_count(theirs)}", flush=True)
    for r in recs:
        if r["outcome"] == "failed":
            print(f"   FAIL {'kdagen' if r['kdagen_called'] else 'fla   '} {r['test']}: {r['error'][:230]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fla-tests", required=True, type=Path, help="FLA's tests/ folder")
    ap.add_argument("--out", default="fla-tests-out", type=Path)
    ap.add_argument("--files", default="kda,gdn,delta,gla,dplr_delta")
    ap.add_argument("-n", "--workers", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per file")
    ap.add_argument("--parallel", action="store_true", help="run the files at the same time")
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = a.files.split(",")
    lock = threading.Lock()
    done: dict[str, tuple[list[dict], str]] = {}

    def one(name: str) -> None:
        # each test's line lands in out/fla_<name>.jsonl as it ends: a run cut short keeps what it ran
        recs, tail = run_file(a.fla_tests.resolve(), name, out, a.workers, a.timeout)
        with lock:
            done[name] = (recs, tail)
            report(name, recs)
            (out / "fla_tests.json").write_text(json.dumps([r for n in names if n in done for r in done[n][0]], indent=1))
            (out / "fla_tests_tails.txt").write_text(
                "\n".join(f"===== test_{n}.py\n{done[n][1]}" for n in names if n in done))

    with ThreadPoolExecutor(len(names) if a.parallel else 1) as ex:  # files side by side on one GPU: --parallel
        list(ex.map(one, names))


if __name__ == "__main__":
    main()
