"""The examples a user copies from must run (on CPU through the Triton interpreter)."""
import os
import pathlib
import subprocess
import sys

import pytest
pytestmark = pytest.mark.slow  # subprocesses, compiles or long interpreter runs

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_prefill_and_decode_example_runs(tmp_path):
    path = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = dict(os.environ, TRITON_INTERPRET="1", KDAGEN_CACHE_DIR=str(tmp_path), PYTHONPATH=path)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "prefill_and_decode.py")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rel. error vs float64" in r.stdout


def test_train_step_example_runs(tmp_path):
    """A KDA layer with the in-kernel gate, l2-norm and beta sigmoid: its parameter gradients
    match the float64 layer, and a few optimiser steps lower the loss."""
    path = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = dict(os.environ, TRITON_INTERPRET="1", KDAGEN_CACHE_DIR=str(tmp_path), PYTHONPATH=path)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_step.py")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "worst rel. error vs float64" in r.stdout and "loss per step:" in r.stdout
