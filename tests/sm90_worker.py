"""The subprocess harness of the compile-only sm_90 tests: each test file compiles its kernels in
a fresh interpreter (no TRITON_INTERPRET, private kdagen and Triton caches) through its own
``_worker_main``, which reads the cases as JSON on stdin and prints the results after a marker."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MARKER = "@@RESULTS@@"


def run_compile_worker(module: str, cases, prefix: str, timeout: float = 900):
    """Run ``module._worker_main()`` (a test file's, by module name) on ``cases``; its results."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONWARNINGS"] = "ignore"
    where = next(HERE.rglob(f"{module}.py")).parent  # the test file's folder (tests/sm90)
    code = (f"import sys; sys.path[:0] = [{str(where)!r}, {str(HERE)!r}, {str(REPO)!r}]; import {module} as m; "
            "m._worker_main()")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:  # private caches, removed afterwards
        env["KDAGEN_CACHE_DIR"] = os.path.join(tmp, "kdagen")
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(cases), capture_output=True, text=True,
                              env=env, cwd=str(REPO), timeout=timeout)
    marker = proc.stdout.rfind(MARKER)
    if proc.returncode != 0 or marker < 0:
        raise RuntimeError(f"compile worker failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout[marker + len(MARKER):])


def reply(results) -> None:
    """A worker's answer: ``results`` after the marker on stdout."""
    sys.stdout.write("\n" + MARKER + json.dumps(results) + "\n")
