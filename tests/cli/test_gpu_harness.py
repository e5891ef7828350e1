"""The GPU harness (``tests/gpu/``) stays runnable: its sweep computes a case on the CPU as it would
on a GPU, the FLA swap names only ops kdagen has, and the speculative-decoding bench parses its arguments
and runs its exactness check in a dry run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import fla_swap  # noqa: E402
import run_fla_op_tests  # noqa: E402
import spec_decode_bench  # noqa: E402
import sweep  # noqa: E402
import triton_versions  # noqa: E402

import kdagen  # noqa: E402


def test_fla_swap_replaces_only_ops_kdagen_has():
    names = {n for ns in fla_swap.SWAPS.values() for n in ns}
    assert names == set(fla_swap.SWAPS["fla.ops"])
    for n in names:
        assert callable(getattr(kdagen, n)), n
        assert fla_swap._OURS[n].__wrapped__ is getattr(kdagen, n)


_FAKE_FLA_TEST = """
import pytest
from fla.ops.kda import chunk_kda


def test_calls_the_op():
    with pytest.raises(Exception):
        chunk_kda(None, None, None, None, None)  # swapped: kdagen's op refuses it


def test_calls_nothing():
    assert True


def test_fails_without_the_op():
    assert False
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_fla_test_runner_says_which_tests_ran_kdagen(tmp_path, monkeypatch, workers):
    """The runner's record of each test of FLA's files: one a test, and ``kdagen_called`` only where the test
    called a swapped op -- under pytest-xdist too, whose controller relays each worker's report (it ran no
    op: its line said False, and which line came first was a race).  A stand-in ``fla`` package on the CPU."""
    pkg = tmp_path / "site" / "fla" / "ops" / "kda"
    pkg.mkdir(parents=True)
    for d in (pkg.parents[1], pkg.parent):
        (d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("def chunk_kda(*args, **kwargs):\n    raise AssertionError('FLA ran')\n")
    (tmp_path / "tests" / "ops").mkdir(parents=True)
    (tmp_path / "tests" / "ops" / "test_fake.py").write_text(_FAKE_FLA_TEST)
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{repo}")
    recs, tail = run_fla_op_tests.run_file(tmp_path / "tests", "fake", tmp_path, workers, timeout=300)
    got = {r["test"].split("::")[1]: (r["outcome"], r["kdagen_called"]) for r in recs}
    assert got == {"test_calls_the_op": ("passed", True), "test_calls_nothing": ("passed", False),
                   "test_fails_without_the_op": ("failed", False)}, tail
    lines = (tmp_path / "fla_fake.jsonl").read_text().splitlines()
    assert len(lines) == 3, lines  # the worker's lines alone


@pytest.mark.parametrize("member,form", [("dplr", "chunk_bwd"), ("gla", "decode")])
def test_sweep_case_matches_float64_on_the_cpu(monkeypatch, member, form):
    monkeypatch.setenv("KDAGEN_SWEEP_DEVICE", "cpu")
    res = sweep.run_case(member, 24, "float32", "varlen", form)
    assert res["ok"], res
    expected = {"o", "ht"} | ({"dq", "dk", "dv", "da", "db", "dg", "dh0"} if form.endswith("bwd") else set())
    assert set(res["errors"]) == expected
    assert res["worst"] < 1e-5


def test_spec_decode_bench_parses_and_dry_runs(tmp_path, capsys):
    """The bench's arguments (the GPU defaults, and bad values refused), and a dry run in the interpreter:
    no timing, kdagen's verify step against float64 for every token's o and slot, a table and the JSON."""
    a = spec_decode_bench.parse_args(["--out", str(tmp_path)])
    assert (a.batches, a.tokens, a.pools) == ([1, 16, 256], [2, 4], ["float32", "bfloat16"])
    for bad in (["--pools", "float16"], ["--tokens", "0"]):
        with pytest.raises(SystemExit):
            spec_decode_bench.parse_args(bad)
    assert not spec_decode_bench.GPU  # (the interpreter: tests/conftest.py)
    rc = spec_decode_bench.main(["--out", str(tmp_path), "--batches", "2", "--tokens", "3", "--pools", "float32"])
    out = capsys.readouterr().out
    assert rc == 0 and "| 2 | 3 | float32 |" in out and "PASS" in out
    res = json.loads((tmp_path / "spec_decode_bench.json").read_text())
    (row,) = res["rows"]
    assert row["exact"] and row["rel_err_kdagen"] < 1e-5 and row["state_bytes"] == 2 * 2 * 16 * 16 * 4 * 4


def test_triton_versions_tabulates_what_sweep_and_bench_write():
    """The two-Triton comparison reads the records sweep.py and ``kdagen bench`` write: the sweep's counts
    and worst error per form, its failures by name, and each bench case's times under both Tritons."""
    case = dict(member="kda", K=64, dtype="float32", layout="fixed")
    old = {"version": "3.6.0", "sweep": [dict(case, form=f, status="pass", worst=1e-6) for f in sweep.FORMS],
           "bench": [dict(member="kda", shape="1,8192,96,128", library=lib, failed=None, ms=ms, error=err,
                          **{"pass": "fwd"}) for lib, ms, err in (("kdagen", 1.5, 2e-3), ("fla", 2.0, 3e-3))]}
    new = {"version": "3.9.0", "sweep": [dict(case, form=f, status="pass" if f != "decode" else "wrong", worst=0.5)
                                         for f in sweep.FORMS],
           "bench": [dict(old["bench"][0], ms=1.25), dict(old["bench"][1], failed="boom")]}
    sw = triton_versions._sweep_lines([old, new])
    assert "1/1" in sw[2] and sw[2].endswith("none")
    assert "0/1" in sw[3] and sw[3].endswith("kda/decode/K64/float32/fixed:wrong")
    (row,) = [ln for ln in triton_versions._bench_lines([old, new]) if ln.startswith("kda ")]
    assert row.split()[3:] == ["1.5000", "ms", "2.0000", "ms", "2.0e-03", "1.2500", "ms", "failed", "2.0e-03"]


def test_triton_versions_takes_an_unpacked_triton_and_can_leave_the_installed_one_out(tmp_path, monkeypatch):
    """``--overlay`` (a Triton already unpacked, e.g. slimmed to travel where its wheel cannot) is measured as
    the other Triton, ``--no-installed`` measures it alone, and a folder without a triton package is refused."""
    measured = []
    monkeypatch.setattr(triton_versions, "measure",
                        lambda label, overlay, out, a: measured.append((label, overlay)) or
                        {"version": label, "sweep": []})
    (tmp_path / "t39" / "triton").mkdir(parents=True)
    (tmp_path / "t39" / "triton" / "__init__.py").write_text("__version__ = '3.9.0'\n")
    for extra, expect in (([], ["installed", "overlay"]), (["--no-installed"], ["overlay"])):
        measured.clear()
        monkeypatch.setattr(sys, "argv", ["triton_versions.py", "--overlay", str(tmp_path / "t39"), "--no-bench",
                                          "--out", str(tmp_path / "out")] + extra)
        triton_versions.main()
        assert [m[0].split()[0] for m in measured] == expect
        assert measured[-1][1] == (tmp_path / "t39").resolve()
        assert (tmp_path / "out" / "table.txt").exists()
    monkeypatch.setattr(sys, "argv", ["triton_versions.py", "--overlay", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="no triton/ package"):
        triton_versions.main()
