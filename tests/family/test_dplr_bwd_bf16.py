"""General DPLR's chunk forward and backward with bf16 tensor-core operands, emulated in the
interpreter (tests/bf16_dplr_interpreter.py, in a subprocess): o, the final state and every
gradient (q, k, v, a, b, gk, initial state) within a few units of bf16's rounding (2^-9) of the
float64 recurrence, the bar tests/family/test_family_bf16.py sets for the other members, and dgk (a
reverse cumsum of terms that cancel in pairs) no worse than dq, dk and dv."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess

SCRIPT = Path(__file__).resolve().parents[1] / "bf16_dplr_interpreter.py"
CASES = {
    "dplr": "free:1,70,1,2,48,32",  # element-wise diagonal tiles, a strong decay, GVA, K not a power of two
    "dplr5": "bound5:1,96,1,1,32,48",  # factorised diagonal tiles (gk >= -5 promised), 3 chunks
}
TOL = 7e-3  # tests/chunk/test_bf16_emulated.py's bar: 3.6 units of bf16 rounding


@pytest.fixture(scope="module")
def errors():
    out = subprocess.run([sys.executable, str(SCRIPT)] + [f"{n}:{c}" for n, c in CASES.items()],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_every_output_within_bf16_rounding(errors, case):
    err = errors[case]
    assert set(err) == {"o", "final_state", "dq", "dk", "dv", "da", "db", "dgk", "dinitial_state"}
    bad = {n: e for n, e in err.items() if not e <= TOL}
    assert not bad, f"{case}: errors above {TOL}: {bad}"
    assert min(err.values()) > 1e-4, f"{case}: no bf16 rounding seen -- is the emulation installed? {err}"


@pytest.mark.parametrize("case", list(CASES))
def test_dgk_no_worse_than_the_other_gradients(errors, case):
    err = errors[case]
    assert err["dgk"] <= 1.5 * max(err["dq"], err["dk"], err["dv"]), err
