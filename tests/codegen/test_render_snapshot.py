"""tests/render_snapshot.py, the before/after check of what the ops launch: it records every launch of a case
(kernel, generated module, constexprs, warps, stages, grid) without running any, restores the launcher after,
and its diff finds a changed source line or launch parameter and nothing else."""
import copy

import render_snapshot as RS

from kdagen import kernels

CASES = ("kda decode 1", "gdn decode", "gla decode")


def test_a_snapshot_records_each_launch_with_its_source_and_leaves_the_launcher_as_it_was():
    launch = kernels.launch
    snap = RS.record(CASES)
    assert kernels.launch is launch
    assert set(snap) == set(CASES)
    for case, launches in snap.items():
        assert len(launches) == 1 and "error" not in launches[0], (case, launches)
        ln = launches[0]
        assert ln["kernel"].startswith(case.split()[0] + "_recurrent_"), ln["kernel"]
        assert "@triton.jit" in ln["source"] and f"def {ln['kernel']}(" in ln["source"]
        assert ln["num_warps"] >= 1 and ln["grid"] and isinstance(ln["constexprs"], dict)


def test_the_diff_reports_a_changed_line_or_parameter_and_nothing_else(capsys):
    snap = RS.record(CASES[:2])
    assert RS.diff(snap, copy.deepcopy(snap), show=5) == 0
    other = copy.deepcopy(snap)
    src = other["gdn decode"][0]["source"]
    other["gdn decode"][0]["source"] = src.replace("@triton.jit", "@triton.jit  # changed", 1)
    other["kda decode 1"][0]["num_warps"] += 1
    capsys.readouterr()
    assert RS.diff(snap, other, show=5) == 2
    out = capsys.readouterr().out
    assert "+@triton.jit  # changed" in out and "num_warps" in out
    # a module's name carries its source's hash: names alone differing is no difference
    renamed = copy.deepcopy(snap)
    ln = renamed["kda decode 1"][0]
    old = ln["kernel"]
    ln["kernel"] = old[:-12] + "0" * 12
    ln["source"] = ln["source"].replace(old, ln["kernel"])
    assert RS.diff(snap, renamed, show=5) == 0
