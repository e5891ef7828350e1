"""bench/member_fwd_variants.py's smoke mode on the CPU (Triton's interpreter, no FLA): each variant
runs the member's inference launches one by one and through the op, the variants agree with the
default to fp32 rounding, and the rows reach the JSON file."""
from __future__ import annotations

import json

import pytest
from bench_script import load_bench


def _bench():
    return load_bench("member_fwd_variants")


@pytest.mark.parametrize("member", ["gdn", "gdn_layer"])
def test_variants_time_each_launch_and_agree_with_the_default(member, tmp_path):
    rows = _bench().main(["--smoke", "--member", member, "--variants", "default,c32,bv16", "--out", str(tmp_path)])
    assert [r["variant"] for r in rows] == ["default", "c32", "bv16"]
    for r in rows:
        assert "error" not in r, r
        assert set(r["launch_ms"]) == {"chunk_solve", "chunk_pass"} and r["op_ms"] > 0
        assert max(r["diff_vs_first"]) < 1e-5, r  # 32- or 64-row chunks, 16- or 32-wide tiles: the same answer
    assert rows[1]["config"]["chunk_size"] == 32 and rows[2]["config"]["state_block_v"] == 16
    saved = json.loads((tmp_path / f"{member}_fwd_variants.json").read_text())
    assert [r["variant"] for r in saved] == ["default", "c32", "bv16"]


def test_unknown_variants_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        _bench().main(["--smoke", "--variants", "default,nope", "--out", str(tmp_path)])
