"""The Triton versions kdagen is tested on: a Triton outside them gets one warning when kdagen is
imported (not an error), and every kernel is compiled with FP fusion asked for explicitly, so that
Triton 3.10's new default (fusion off) does not change the code kdagen builds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from kdagen.kernels import TESTED_TRITON, UntestedTritonWarning, triton_is_tested, warn_if_untested

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["3.6.0", "3.7.1", "3.8.0", "3.9.0", "3.9.0+git1a2b3c4", "3.9.1"])
def test_a_tested_triton_gets_no_warning(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_untested(version) is False
    assert triton_is_tested(version)


@pytest.mark.parametrize("version", ["3.5.1", "3.2.0", "3.10.0", "3.10.0+git1a2b3c4", "4.0.0", "not-a-version"])
def test_an_untested_triton_gets_one_warning_that_names_it(version):
    with pytest.warns(UntestedTritonWarning) as rec:
        assert warn_if_untested(version) is True
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert version in msg and "3.6" in msg and "3.9" in msg


def test_the_tested_range_is_pyprojects():
    """pyproject.toml's triton requirement and TESTED_TRITON say the same range."""
    text = (REPO / "pyproject.toml").read_text()
    (a, b), (c, d) = TESTED_TRITON
    assert f'"triton>={a}.{b},<{c}.{d + 1}"' in text


def test_the_installed_triton_is_a_tested_one():
    """The suite runs on a tested Triton (CI's two jobs): a new one is added to the range when it passes."""
    import triton
    assert triton_is_tested(triton.__version__), triton.__version__


_IMPORT = r'''
import json, sys, warnings
import triton
triton.__version__ = sys.argv[1]
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    import kdagen
    import kdagen.ops.chunk, kdagen.kernels
    import importlib; importlib.import_module("kdagen")
print(json.dumps([[w.category.__name__, str(w.message)] for w in rec]))
'''


@pytest.mark.slow  # subprocesses that import torch and kdagen
@pytest.mark.parametrize("version,expect", [("3.10.0", 1), ("3.6.0", 0)])
def test_importing_kdagen_warns_once_for_an_untested_triton(version, expect):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _IMPORT, version], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [w for w in json.loads(r.stdout.strip().splitlines()[-1]) if w[0] == "UntestedTritonWarning"]
    assert len(got) == expect, got
    if expect:
        assert version in got[0][1]


_FUSION = r'''
import json, os
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from kdagen.kernels import jit_source

@triton.jit
def axpy(x, y, a, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    tl.store(y + o, a * tl.load(x + o, mask=m) + tl.load(y + o, mask=m), mask=m)

import torch
target = GPUTarget("cuda", 90, 32)
args = {"x": torch.empty(64), "y": torch.empty(64), "a": 2.0, "N": 64}
_, ours = jit_source(axpy, args, {"BLOCK": 64}, target, 4, 2)
# Triton's own default for a launch that does not say (what kdagen's launches got before they said)
default = make_backend(target).parse_options({"num_warps": 4, "num_stages": 2})
print(json.dumps({"ours": ours["enable_fp_fusion"], "default": default.enable_fp_fusion}))
'''


@pytest.mark.slow  # a subprocess without the interpreter (Triton's JIT binder for an sm_90 target)
def test_kernels_ask_for_fp_fusion_whatever_tritons_default(tmp_path):
    """With Triton's default set to 3.10's (TRITON_DEFAULT_FP_FUSION=0), a launch that does not ask is
    compiled without fusion; kdagen's compile options ask for it, so its kernels keep it."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_FORCE_DISABLE_FP_FUSION")}
    env["TRITON_DEFAULT_FP_FUSION"] = "0"
    script = tmp_path / "fusion.py"  # a file: @triton.jit reads its function's source
    script.write_text(_FUSION)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"ours": True, "default": False}
