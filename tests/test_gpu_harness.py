"""The GPU harness (``tests/gpu/``) stays runnable: its sweep computes a case on the CPU as it would
on a GPU, and the FLA swap names only ops kdagen has."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

import fla_swap  # noqa: E402
import sweep  # noqa: E402

import kdagen  # noqa: E402


def test_fla_swap_replaces_only_ops_kdagen_has():
    names = {n for ns in fla_swap.SWAPS.values() for n in ns}
    assert names == set(fla_swap.SWAPS["fla.ops"])
    for n in names:
        assert callable(getattr(kdagen, n)), n
        assert fla_swap._OURS[n].__wrapped__ is getattr(kdagen, n)


@pytest.mark.parametrize("member,form", [("dplr", "chunk_bwd"), ("gla", "decode")])
def test_sweep_case_matches_float64_on_the_cpu(monkeypatch, member, form):
    monkeypatch.setenv("KDAGEN_SWEEP_DEVICE", "cpu")
    res = sweep.run_case(member, 24, "float32", "varlen", form)
    assert res["ok"], res
    expected = {"o", "ht"} | ({"dq", "dk", "dv", "da", "db", "dg", "dh0"} if form.endswith("bwd") else set())
    assert set(res["errors"]) == expected
    assert res["worst"] < 1e-5
