"""bench/family_vs_fla.py's smoke mode on the CPU (Triton's interpreter, FLA absent): it runs
kdagen's side of every section at tiny shapes, its error section agrees with float64, and the
table and family.json hold what ran; a spent budget still writes both."""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from bench_script import load_bench


def _bench(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # FLA absent: `import fla...` raises ImportError
    return load_bench("family_vs_fla")


@pytest.mark.slow
def test_smoke_runs_kdagen_side_of_every_section(monkeypatch, tmp_path, capsys):
    res = _bench(monkeypatch).main(["--smoke", "--out", str(tmp_path)])
    rows = {(r["member"], r["pass_"]): r for r in res["rows"]}
    members = ("gdn", "deltanet", "gla", "gla5", "dplr", "dplr5")
    assert set(rows) == {(m, p) for m in members for p in ("fwd", "fwdbwd", "decode")}
    for r in rows.values():
        key = "kdagen_graph_us" if r["pass_"] == "decode" else "kdagen_ms"
        assert math.isfinite(r[key]) and r[key] > 0 and "fla_ms" not in r and "kdagen_error" not in r, r
    assert "kdagen_pool_graph_us" in rows[("gdn", "decode")]
    assert [(e["member"], e["kind"]) for e in res["errors"]] == [
        (m, "forward") for m in members] + [(m, "gradients") for m in members]
    for e in res["errors"]:
        assert set(e) == {"member", "kind", "shape", "kdagen", "t_s"}
        want = {"o", "final_state", "recurrent_o"} if e["kind"] == "forward" else (
            {"dq", "dk", "dv", "dinitial_state"} | ({"dbeta"} if e["member"] in ("gdn", "deltanet") else set())
            | ({"dg"} if e["member"] in ("gdn", "gla", "gla5") else set())
            | ({"da", "db", "dgk"} if e["member"] in ("dplr", "dplr5") else set()))
        assert set(e["kdagen"]) == want, e
        assert all(v < 1e-5 for v in e["kdagen"].values()), e  # fp32 in the interpreter: float64-exact
    saved = json.loads((tmp_path / "family.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(res["rows"]))
    out = capsys.readouterr().out
    assert "| gdn | fwd | 1, 40, 2, 32 |" in out and "| deltanet | gradients | 1, 37, 1, 32 | kdagen | dq " in out
    # the forward rows of every member come before any gradient row
    assert [r["pass_"] for r in res["rows"]] == ["fwd", "decode"] * 6 + ["fwdbwd"] * 6


def test_the_layer_call_members_error_section_agrees_with_float64(monkeypatch, tmp_path):
    """gdn_gate (FLA's in-kernel gate) and gdn_layer (the gate and the l2-norm on raw q and k): the
    bench's float64 reference applies the gate and normalises q and k as the ops do, so kdagen's fp32
    forward, decode and every gradient (dz, dA_log, ddt_bias included) agree with it."""
    res = _bench(monkeypatch).main(["--smoke", "--out", str(tmp_path), "--only", "gdn_gate,gdn_layer,errors"])
    assert [(e["member"], e["kind"]) for e in res["errors"]] == [
        ("gdn_gate", "forward"), ("gdn_layer", "forward"), ("gdn_gate", "gradients"), ("gdn_layer", "gradients")]
    for e in res["errors"]:
        want = {"o", "final_state", "recurrent_o"} if e["kind"] == "forward" else {
            "dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log", "ddt_bias"}
        assert set(e["kdagen"]) == want, e
        assert all(v < 1e-5 for v in e["kdagen"].values()), e
    # the layer member's inputs are raw: its k is not of unit length (the kernels normalise it)
    x = _bench(monkeypatch).inputs("gdn_layer", 1, 8, 1, 16, 16, "cpu")
    assert (x["k"].norm(dim=-1) - 1).abs().max() > 0.5


def test_a_spent_budget_still_writes_the_table(monkeypatch, tmp_path, capsys):
    res = _bench(monkeypatch).main(["--smoke", "--out", str(tmp_path), "--budget", "0", "--only", "gdn,fwd"])
    assert res["rows"] == [] and res["skipped"] == ["fwd gdn (1, 40, 2, 32)"]
    assert json.loads((tmp_path / "family.json").read_text())["skipped"] == res["skipped"]
    out = capsys.readouterr().out
    assert "| member | pass |" in out and "skipped for the budget" in out


def test_only_refuses_unknown_names(monkeypatch, tmp_path):
    with pytest.raises(SystemExit):
        _bench(monkeypatch).main(["--smoke", "--out", str(tmp_path), "--only", "nope"])


@pytest.mark.slow
def test_a_backward_that_raised_is_not_asked_again(monkeypatch, tmp_path):
    """A library whose backward raises (FLA's GDN on Triton < 3.7.1 with Hopper) is asked once per
    member: its later gradient rows carry the first refusal, and the forward rows are unaffected."""
    bench = _bench(monkeypatch)
    import kdagen

    calls = []

    def refusing_chunk(q, k, v, g, beta, **kw):
        o, s = kdagen.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
        if torch.is_grad_enabled() and q.requires_grad:
            calls.append(1)
            return RefuseBackward.apply(o), s
        return o, s

    class RefuseBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("no backward on this machine")

    real_ops = bench.ops
    monkeypatch.setattr(bench, "ops", lambda member, lib: (
        (refusing_chunk, real_ops(member, "kdagen")[1]) if lib == "fla" else real_ops(member, lib)))
    res = bench.main(["--smoke", "--out", str(tmp_path), "--only", "gdn,errors,fwd,fwdbwd"])
    grad_rows = [e for e in res["errors"] if e["kind"] == "gradients"]
    assert grad_rows and all("no backward on this machine" in e["fla"]["error"] for e in grad_rows)
    fwdbwd = [r for r in res["rows"] if r["pass_"] == "fwdbwd"]
    assert fwdbwd and all("no backward on this machine" in r["fla_error"] for r in fwdbwd)
    assert len(calls) == 1  # asked once, in the first gradient row
    fwd = [r for r in res["rows"] if r["pass_"] == "fwd"]
    assert fwd and all("fla_ms" in r and "ratio" in r for r in fwd)
