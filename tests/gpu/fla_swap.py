"""pytest plugin: flash-linear-attention's public ops replaced by kdagen's, before FLA's test
modules import them (``python -m pytest -p fla_swap`` with this folder on ``PYTHONPATH``).

Each FLA op that kdagen serves under the same name is replaced in the package that exports it
and in the module that defines it, so ``from fla.ops.kda import chunk_kda`` in a test file gets
kdagen's.  FLA's references (``naive_*``), its gates and its kernels called by name stay FLA's.

Every replaced op counts its calls; for each test the plugin writes one JSON line to
``$FLA_SWAP_LOG`` (outcome, whether kdagen ran, the first line of the error), so a run can tell
the tests that exercised kdagen from those of FLA's internals alone.  A test that dies of a CUDA
fault (the context is lost) ends its process after its line is written; under pytest-xdist the
worker is replaced and the tests after it still run.
"""
from __future__ import annotations

import functools
import importlib
import json
import os

import kdagen

# FLA module -> the names in it that kdagen replaces
SWAPS = {
    "fla.ops.kda": ("chunk_kda", "fused_recurrent_kda"),
    "fla.ops.kda.chunk": ("chunk_kda",),
    "fla.ops.kda.fused_recurrent": ("fused_recurrent_kda",),
    "fla.ops.gated_delta_rule": ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    "fla.ops.gated_delta_rule.chunk": ("chunk_gated_delta_rule",),
    "fla.ops.gated_delta_rule.fused_recurrent": ("fused_recurrent_gated_delta_rule",),
    "fla.ops.delta_rule": ("chunk_delta_rule", "fused_recurrent_delta_rule"),
    "fla.ops.delta_rule.chunk": ("chunk_delta_rule",),
    "fla.ops.delta_rule.fused_recurrent": ("fused_recurrent_delta_rule",),
    "fla.ops.gla": ("chunk_gla", "fused_recurrent_gla"),
    "fla.ops.gla.chunk": ("chunk_gla",),
    "fla.ops.gla.fused_recurrent": ("fused_recurrent_gla",),
    "fla.ops.generalized_delta_rule": ("chunk_dplr_delta_rule", "fused_recurrent_dplr_delta_rule"),
    "fla.ops.generalized_delta_rule.dplr": ("chunk_dplr_delta_rule", "fused_recurrent_dplr_delta_rule"),
    "fla.ops.generalized_delta_rule.dplr.chunk": ("chunk_dplr_delta_rule",),
    "fla.ops.generalized_delta_rule.dplr.fused_recurrent": ("fused_recurrent_dplr_delta_rule",),
    "fla.ops": ("chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                "chunk_delta_rule", "fused_recurrent_delta_rule", "chunk_gla", "fused_recurrent_gla",
                "chunk_dplr_delta_rule", "fused_recurrent_dplr_delta_rule"),
}

CALLS = {"n": 0}
SWAPPED: list[str] = []


def _counted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        CALLS["n"] += 1
        return fn(*args, **kwargs)

    return wrapper


_OURS = {name: _counted(getattr(kdagen, name)) for name in SWAPS["fla.ops"]}


def swap() -> None:
    for mod_name, names in SWAPS.items():
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name in names:
            if hasattr(mod, name):
                setattr(mod, name, _OURS[name])
                SWAPPED.append(f"{mod_name}.{name}")


swap()

_FAULTS = ("misaligned address", "illegal memory access", "an illegal instruction", "unspecified launch failure",
           "CUDA error")


def pytest_report_header(config):
    return [f"fla_swap: kdagen {kdagen.__version__} in place of {len(SWAPPED)} FLA names"]


def pytest_runtest_setup(item):
    CALLS["n"] = 0


def pytest_runtest_logreport(report):
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    if getattr(report, "node", None) is not None:
        return  # pytest-xdist's controller relaying a worker's report: the worker, which ran the op, wrote its line
    err = ""
    if report.outcome == "failed":
        text = str(report.longrepr)
        lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
        err = (lines[0] if lines else text.splitlines()[-1] if text else "")[:400]
    rec = {"test": report.nodeid, "outcome": report.outcome, "kdagen_called": CALLS["n"] > 0, "error": err}
    path = os.environ.get("FLA_SWAP_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if report.outcome == "failed" and any(s in str(report.longrepr) for s in _FAULTS):
        os._exit(70)  # the CUDA context is gone: let xdist replace this worker
