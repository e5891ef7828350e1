"""bench/family_vs_fla.py's smoke mode on the CPU (Triton's interpreter, FLA absent): it runs
kdagen's side of every section at tiny shapes, its error section agrees with float64, and the
table and family.json hold what ran; a spent budget still writes both."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "family_vs_fla.py"


def _bench(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # FLA absent: `import fla...` raises ImportError
    spec = importlib.util.spec_from_file_location("family_vs_fla", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_smoke_runs_kdagen_side_of_every_section(monkeypatch, tmp_path, capsys):
    res = _bench(monkeypatch).main(["--smoke", "--out", str(tmp_path)])
    rows = {(r["member"], r["pass_"]): r for r in res["rows"]}
    assert set(rows) == {(m, p) for m in ("gdn", "deltanet") for p in ("fwd", "fwdbwd", "decode")}
    for r in rows.values():
        key = "kdagen_graph_us" if r["pass_"] == "decode" else "kdagen_ms"
        assert math.isfinite(r[key]) and r[key] > 0 and "fla_ms" not in r and "kdagen_error" not in r, r
    assert "kdagen_pool_graph_us" in rows[("gdn", "decode")]
    assert len(res["errors"]) == 2
    for e in res["errors"]:
        assert set(e) == {"member", "shape", "kdagen"}
        assert all(v < 1e-5 for v in e["kdagen"].values()), e  # fp32 in the interpreter: float64-exact
    saved = json.loads((tmp_path / "family.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(res["rows"]))
    assert "| gdn | fwd | 1, 40, 2, 32 |" in capsys.readouterr().out


def test_a_spent_budget_still_writes_the_table(monkeypatch, tmp_path, capsys):
    res = _bench(monkeypatch).main(["--smoke", "--out", str(tmp_path), "--budget", "0", "--only", "gdn,fwd"])
    assert res["rows"] == [] and res["skipped"] == ["fwd gdn (1, 40, 2, 32)"]
    assert json.loads((tmp_path / "family.json").read_text())["skipped"] == res["skipped"]
    out = capsys.readouterr().out
    assert "| member | pass |" in out and "skipped for the budget" in out


def test_only_refuses_unknown_names(monkeypatch, tmp_path):
    with pytest.raises(SystemExit):
        _bench(monkeypatch).main(["--smoke", "--out", str(tmp_path), "--only", "gla"])
