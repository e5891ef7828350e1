"""GDN, DeltaNet and GLA's (with and without a gate bound) chunk form with bf16 tensor-core operands, emulated in the interpreter
(tests/bf16_family_interpreter.py, in a subprocess): every output and gradient within a few
units of bf16's rounding (2^-9) of the float64 recurrence, as tests/chunk/test_bf16_emulated.py asks
of KDA, and dg (GDN's and GLA's: a reverse cumsum of terms that cancel in pairs; GDN's summed over the
channels too) no worse than the other gradients."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess

SCRIPT = Path(__file__).resolve().parents[1] / "bf16_family_interpreter.py"
CASES = {
    "gdn-gva": "gdn:1,96,1,2,32,48",  # 3 chunks of 32, a strong decay, GVA, V not a power of two
    "gdn-B2-T70": "gdn:2,70,1,2,48,32",  # T not a multiple of the chunk, K not a power of two
    "deltanet": "deltanet:1,70,1,1,48,32",
    # the split intra backward folded (ChunkBwdConfig.intra_fold), K over two masked tiles in dqkw, GVA
    "deltanet-fold": "deltanet_fold:1,70,1,2,48,32",
    "gla": "gla:1,70,1,2,48,32",  # element-wise diagonal tiles, a strong decay, GVA
    "gla5": "gla5:1,96,1,1,32,48",  # factorised diagonal tiles (g >= -5 promised)
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
    want = ({"o", "final_state", "o_inference", "final_state_inference", "dq", "dk", "dv", "dinitial_state"}
            | ({"dbeta"} if "gla" not in case else set()) | ({"dg"} if "gdn" in case or "gla" in case else set()))
    assert set(err) == want
    bad = {n: e for n, e in err.items() if not e <= TOL}
    assert not bad, f"{case}: errors above {TOL}: {bad}"
    assert min(err.values()) > 1e-4, f"{case}: no bf16 rounding seen -- is the emulation installed? {err}"


@pytest.mark.parametrize("case", ["gdn-gva", "gdn-B2-T70", "gla", "gla5"])
def test_dg_no_worse_than_the_other_gradients(errors, case):
    err = errors[case]
    assert err["dg"] <= 1.5 * max(err["dq"], err["dk"], err["dv"]), err
