"""bench/compose64_check.py's algebra (the state passes on 64-row steps composed from two 32-row
chunks) holds against what today's kernels write, in the interpreter at fp32: the design a future
pair-composition launch builds on (bench/RESULTS.md, session 19)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import compose64_check  # noqa: E402


def test_two_chunk_steps_compose_into_one():
    res = compose64_check.check(T=128, K=32, V=24, HV=2)
    assert set(res) == {"fwd_vn", "fwd_s_end", "fwd_s_mid", "rev_du", "rev_ds_out", "rev_ds_mid"}
    for name, err in res.items():
        assert err < 1e-5, f"{name}: {err:.2e}"
