"""The command line for every member of the family and for a user's spec file
(``--spec NAME`` or ``--spec path/to/file.py:NAME``): list, verify, inspect, build
(compile-only), export; the refusals name the lowering's reason; the tuner's spec is the
requested member's, so its winners are keyed by that member."""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from kdagen import spec as S
from kdagen.cli import main
from kdagen.ops.dplr import chunk_form_available
from kdagen.spec.load import load_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_member.py"
USER = f"{EXAMPLE}:SPEC"


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """A runner on a machine without a GPU whose build would fail the test if it compiled."""
    import kdagen.cache.gpus
    from kdagen.tuning import driver as D

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: None)

    def no_work(*a, **k):
        raise AssertionError("work started before every argument was checked")

    for name in ("compile_all", "tune_and_store"):
        monkeypatch.setattr(D, name, no_work)
    return CliRunner()


def _spec_file(tmp_path, body: str, name: str = "spec.py") -> pathlib.Path:
    p = tmp_path / name
    p.write_text("import sympy as sp\nfrom kdagen import spec as S\n" + textwrap.dedent(body))
    return p


def _error_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    return line


# --- list -------------------------------------------------------------------------------

def test_list_shows_every_member_with_its_structure_decay_and_kernels(runner, monkeypatch):
    r = runner.invoke(main, ["list"])
    assert r.exit_code == 0, r.output
    rows = {ln.split()[0]: ln for ln in r.output.splitlines() if ln.startswith("  ") and " hash " in ln}
    assert set(rows) == set(S.MEMBERS)
    for name, kind, decay in [("kda", "kda", "channel"), ("gdn", "kda", "scalar"), ("deltanet", "kda", "identity"),
                              ("gla", "gla", "channel"), ("dplr", "dplr", "channel")]:
        assert re.search(rf"structure {kind}\s+decay {decay}", rows[name]), rows[name]
    assert "kernels: chunk forward and backward, recurrent" in rows["kda"]
    # general DPLR: its chunk and recurrent kernels
    assert chunk_form_available()
    assert "kernels: chunk forward and backward, recurrent" in rows["dplr"], rows["dplr"]
    assert "spec only" not in r.output and "why:" not in r.output
    # a build whose chunk templates had no DPLR branch lists its recurrent kernels alone
    monkeypatch.setattr("kdagen.codegen.forms.CHUNK_STRUCTURES", frozenset({"kda", "gla"}))  # a build without it
    r = runner.invoke(main, ["list"])
    rows = {ln.split()[0]: ln for ln in r.output.splitlines() if ln.startswith("  ") and " hash " in ln}
    assert "kernels: recurrent (the chunk form is not generated in this build)" in rows["dplr"], rows["dplr"]


def test_list_decides_kernels_by_lowering_not_by_a_list(runner, monkeypatch):
    """With a lowering that refuses everything, KDA too is listed without kernels, with the
    lowering's reason; the status is not a table of names."""
    import kdagen.codegen.lower as L

    def refuse(spec, *a, **k):
        raise L.LoweringError(f"no kernels for {spec.name} today")

    monkeypatch.setattr(L, "lower", refuse)
    r = runner.invoke(main, ["list"])
    assert r.exit_code == 0, r.output
    kda_row = next(ln for ln in r.output.splitlines() if ln.startswith("  kda "))
    assert "spec only (no generated kernels)" in kda_row
    assert "chunk forward and backward" not in r.output


def test_list_a_user_spec(runner):
    r = runner.invoke(main, ["list", "--spec", USER, "--spec", "gla"])
    assert r.exit_code == 0, r.output
    user = load_spec(USER)
    assert f"kda_sigmoid3 hash {user.hash}" in r.output and f"from {EXAMPLE}:SPEC" in r.output
    assert "(gate sigmoid3, g >= -3)" in r.output
    assert "  gla " in r.output and "  kda " not in r.output  # only the specs asked for


# --- verify -----------------------------------------------------------------------------

def test_verify_a_user_spec_runs_its_own_float64_checks(runner):
    r = runner.invoke(main, ["verify", "--spec", USER])
    assert r.exit_code == 0, r.output
    assert "spec kda_sigmoid3" in r.output and "kernels    : chunk forward" in r.output
    assert len(re.findall(r"spec: chunk vs rec\..*ok", r.output)) == 4
    assert "spec: state carry" in r.output and "spec: gate range" in r.output and "0 failed" in r.output


def test_verify_fails_a_user_spec_whose_gate_leaves_its_declared_range(runner, tmp_path):
    p = _spec_file(tmp_path, """
        GATE = S.Gate("liar", -2 * S.Sigmoid(S.z), (S.z,), declared_range=(sp.Float(-1.0), sp.Integer(0)))
        SPEC = S.Recurrence("liar", "channel", GATE, a=S.beta * S.k, b=sp.exp(S.g) * S.k, write_key=S.beta * S.k)
        """)
    r = runner.invoke(main, ["verify", "--spec", f"{p}:SPEC"])
    assert r.exit_code == 1, r.output
    assert re.search(r"spec: gate range .* FAIL", r.output) and "1 failed" in r.output


@pytest.mark.parametrize("member", ["gdn", "deltanet", "gla", "dplr"])
def test_verify_every_member_checks_its_spec_against_its_reference(runner, member):
    r = runner.invoke(main, ["verify", "--spec", member] + (["--lower-bound", "none"] if member == "deltanet" else []))
    assert r.exit_code == 0, r.output
    assert f"{member}'s expressions == naive_recurrent_{member}" in r.output and "0 failed" in r.output
    assert "kernels    :" in r.output


def test_verify_a_general_dplr_user_spec(runner, tmp_path):
    """A delta rule whose write key differs from its erase key: general DPLR, no kernels, its
    recurrence still checked."""
    p = _spec_file(tmp_path, """
        SPEC = S.Recurrence("wk", "channel", S.gate_direct(-5.0), a=S.beta * S.k, b=sp.exp(S.g) * S.k, write_key=S.k)
        """)
    r = runner.invoke(main, ["verify", "--spec", f"{p}:SPEC"])
    assert r.exit_code == 0, r.output
    assert "kernels    : none: write key k differs from a" in r.output and "spec: state carry" in r.output


# --- inspect ----------------------------------------------------------------------------

def test_inspect_a_user_spec_prints_its_gate_in_the_kernels(runner):
    r = runner.invoke(main, ["inspect", "--spec", USER, "--head-dim", "64", "--gate-in-kernel", "spec",
                             "--kernel", "chunk_solve"])
    assert r.exit_code == 0, r.output
    assert "# spec  : kda_sigmoid3" in r.output and "def kda_sigmoid3_chunk_solve_" in r.output
    assert "-3.0*tl.fdiv(1.0, 1.0 + tl.exp(-(b_bias + b_z)))" in r.output  # the gate, printed from sympy
    r = runner.invoke(main, ["inspect", "--spec", USER, "--form", "recurrent", "--gate-in-kernel", "spec",
                             "--plan-only"])
    assert r.exit_code == 0, r.output
    assert '"gate_in_kernel": true' in r.output and '"gate_has_bias": true' in r.output and '"form": "recurrent"' in r.output


# --- refusals ---------------------------------------------------------------------------

BAD = [
    (["verify", "--spec", "/no/such/spec.py:SPEC"], ["--spec", "/no/such/spec.py", "does not exist"]),
    (["verify", "--spec", f"{EXAMPLE}:NOPE"], ["--spec", "no attribute 'NOPE'", "SPEC"]),
    (["verify", "--spec", USER, "--gate", "softplus"], ["--gate", "its own gate"]),
    (["list", "--spec", "nope"], ["--spec", "unknown spec 'nope'", "file.py:NAME"]),
    (["inspect", "--spec", USER, "--gate-in-kernel", "softplus"], ["--gate-in-kernel", "--gate-in-kernel spec"]),
    (["inspect", "--spec", "kda", "--gate-in-kernel", "spec"], ["its gate 'direct' cannot be computed in the kernels",
                                                              "needs a gate expression"]),
    (["build", "--gpu", "h100", "--spec", USER, "--lower-bound", "-2"], ["--lower-bound", "sets its own bound"]),
    (["build", "--gpu", "h100", "--spec", USER, "--head-dim", "8"], ["--head-dim", "K=8", "supported range"]),
    (["tune", "--spec", "dplr"], ["no CUDA GPU"]),
    (["export", "--gpu", "h100", "--out", "x", "--name", "p", "--spec", USER], ["--spec", "not implemented yet"]),
]


@pytest.mark.parametrize("args,says", BAD, ids=[" ".join(a).replace(str(ROOT), "") for a, _ in BAD])
def test_a_bad_spec_argument_is_one_error_line(runner, args, says):
    line = _error_line(runner.invoke(main, args))
    for s in says:
        assert s in line, line


def test_a_spec_the_templates_cannot_lower_is_refused_with_the_reason(runner, tmp_path):
    p = _spec_file(tmp_path, """
        SPEC = S.Recurrence("rk", "channel", S.gate_direct(), a=S.beta * S.k, b=sp.exp(S.g) * S.k,
                            write_key=S.beta * S.k, readout=S.k)
        """)
    for cmd in (["build", "--gpu", "h100"], ["inspect"], ["export", "--gpu", "h100", "--out", "x", "--name", "p"]):
        line = _error_line(runner.invoke(main, cmd + ["--spec", f"{p}:SPEC"]))
        assert "'rk' cannot be lowered" in line and "read out scale * q" in line, line


# --- the tuner's spec -------------------------------------------------------------------

def test_family_spec_builds_the_requested_member():
    from kdagen.codegen.lower import lower, tuning_spec
    from kdagen.ops.inputs import select_spec
    from kdagen.tuning.driver import family_spec

    bounded = {"safe_gate": True, "lower_bound": -5.0}
    assert family_spec("chunk_fwd", bounded) == select_spec(False, True, -5.0, False, False)  # KDA as before
    gdn = family_spec("chunk_fwd", {**bounded, "spec": "gdn"})
    assert gdn == S.get_spec("gdn", lower_bound=-5.0)
    assert family_spec("recurrent", {**bounded, "spec": "gdn"}) == S.get_spec("gdn")  # the recurrent op: unbounded
    assert family_spec("chunk_fwd", {**bounded, "spec": "deltanet"}) == S.deltanet()
    user = load_spec(USER)
    args = {"safe_gate": True, "lower_bound": user.gate.lower_bound, "spec": USER}
    for fam, form in (("chunk_fwd", "chunk"), ("chunk_bwd", "chunk"), ("recurrent", "recurrent")):
        tuned = family_spec(fam, args)
        assert tuned.name == "kda_sigmoid3" and tuned.gate.name == "direct"
        # the key the user's kernels look their winners up by is the one build stores them under
        assert tuned.hash == lower(user, 64, 64, "bfloat16", form, True).tuning_spec_hash
        assert tuned.hash == tuning_spec(user, form).hash
    assert family_spec("chunk_fwd", args).hash != select_spec(False, True, -3.0, False, False).hash


def test_winners_are_keyed_by_the_member():
    from kdagen.cache.gpus import get_profile
    from kdagen.cache.keys import cache_key
    from kdagen.tuning.families import family_spec, lower_for

    shape = {"T": 4096, "B": 1, "N": 1}
    keys = {}
    for ref in ("kda", USER):
        args = {"safe_gate": True, "lower_bound": -3.0, **({"spec": ref} if ref != "kda" else {})}
        plan = lower_for(family_spec("chunk_fwd", args), "chunk_fwd", 64, 64, torch.bfloat16)
        keys[ref] = cache_key(plan, "chunk_fwd", shape, get_profile("h100"))
    assert keys["kda"] != keys[USER]
    assert keys[USER].spec_hash == load_spec(USER).with_gate(S.gate_direct(-3.0)).hash


def test_the_tuner_runs_a_kda_structured_spec_through_kdas_kernels(monkeypatch):
    """A KDA-structured spec's kernels (which the tuner times through the member entries) are KDA's:
    the generated sources are the same but for the header and the function's name; a spec
    that does not lower is refused with the reason."""
    from kdagen.cache.heuristics import default_config
    from kdagen.codegen.render import family_kernels, render
    from kdagen.ops.inputs import select_spec
    from kdagen.tuning.families import check_tunable, family_spec, lower_for

    user_args = {"safe_gate": True, "lower_bound": -3.0, "spec": USER}
    check_tunable(user_args)
    for fam in ("chunk_fwd", "chunk_bwd", "recurrent"):
        mine = lower_for(family_spec(fam, user_args), fam, 64, 64, torch.bfloat16)
        kdas = lower_for(select_spec(False, fam != "recurrent", -3.0, False, False), fam, 64, 64, torch.bfloat16)
        cfg = default_config(fam, mine)
        for kind in family_kernels(fam, mine, cfg):
            a, b = render(kind, mine, cfg).text, render(kind, kdas, cfg).text
            assert a != b  # the header names the spec
            body = lambda t: re.sub(r"\w+_" + kind + r"_[0-9a-f]+", "NAME", t[t.index("@triton.jit"):])  # noqa: E731
            assert body(a) == body(b), f"{fam}/{kind}: the kernel bodies differ"
    check_tunable({"safe_gate": True, "lower_bound": -5.0, "spec": "gdn"})  # its own op: test_tune_family.py
    check_tunable({"safe_gate": True, "lower_bound": -5.0, "spec": "gla"})
    dplr = {"safe_gate": True, "lower_bound": -5.0, "spec": "dplr"}
    check_tunable(dplr, ("recurrent",))  # general DPLR's recurrent family: tests/family/test_dplr_decode.py
    check_tunable(dplr)  # and its chunk forward (the chunk_train family): tests/family/test_dplr_chunk.py
    monkeypatch.setattr("kdagen.codegen.forms.CHUNK_STRUCTURES", frozenset({"kda", "gla"}))  # a build without it
    with pytest.raises(ValueError, match="'dplr' cannot be tuned: .*not generated yet"):
        check_tunable(dplr)


def test_dplr_inspect_and_build_take_its_recurrent_form_and_name_a_missing_chunk_form(runner, monkeypatch):
    """General DPLR: `inspect --form recurrent` prints its own decode kernel; without the chunk form
    in this build, `inspect` (the chunk form) and `build --family chunk_fwd` say so on --spec."""
    r = runner.invoke(main, ["inspect", "--spec", "dplr", "--form", "recurrent", "--head-dim", "64"])
    assert r.exit_code == 0, r.output
    assert "def dplr_recurrent_" in r.output and "q, k, v, g, a, b," in r.output
    assert '"structure": "dplr"' in r.output
    r = runner.invoke(main, ["inspect", "--spec", "dplr", "--head-dim", "64", "--plan-only"])
    assert r.exit_code == 0 and '"form": "chunk"' in r.output, r.output
    r = runner.invoke(main, ["inspect", "--spec", "dplr", "--head-dim", "64"])
    assert r.exit_code == 0 and "def dplr_chunk_intra_" in r.output and "def dplr_chunk_state_" in r.output, r.output
    monkeypatch.setattr("kdagen.codegen.forms.CHUNK_STRUCTURES", frozenset({"kda", "gla"}))  # a build without it
    for args in (["inspect", "--spec", "dplr"], ["build", "--gpu", "h100", "--spec", "dplr", "--family", "chunk_fwd"]):
        line = _error_line(runner.invoke(main, args))
        for says in ("--spec", "'dplr'", "general DPLR structure", "do not lower yet in this build", "--form recurrent",
                     "kdagen verify --spec dplr"):
            assert says in line, line


@pytest.mark.slow
def test_build_a_user_spec_compile_only(tmp_path):
    """`kdagen build --spec FILE.py:SPEC --compile-only` in a fresh process (compiling for a GPU
    target cannot happen where the test session put Triton in interpreter mode)."""
    space = tmp_path / "rec.json"
    space.write_text('{"kernel": "recurrent", "params": {"block_v": [16, 32], "num_warps": [4]}}')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KDAGEN_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "kdagen.cli", "build", "--gpu", "h100", "--spec", USER, "--head-dim",
                        "32", "--space", str(space), "--jobs", "1", "--compile-only"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    user = load_spec(USER)
    assert f"spec kda_sigmoid3 hash {user.with_gate(S.gate_direct(-3.0)).hash} (gate direct, g >= -3)" in r.stdout
    assert f"kda_sigmoid3 hash {user.hash}: its gate, gate sigmoid3, g >= -3, is computed inside" in r.stdout
    assert "recurrent K=32 V=32: 2/2 candidate configs compiled for h100" in r.stdout
    nxt = r.stdout.split("next:")[1]
    assert f"--spec {USER}" in nxt and "--lower-bound" not in nxt and "kdagen export" not in nxt


def test_build_on_the_gpu_stores_a_user_specs_winners_under_its_own_keys(tmp_path, monkeypatch):
    """`kdagen build --spec FILE.py:SPEC` on a (faked) H200: the winners land under the spec's own
    keys, the spec's kernels (its gate in-kernel) find them, and KDA's do not."""
    import kdagen.cache.gpus
    import kdagen.cache.lookup as TU
    from kdagen.cache.gpus import get_profile
    from kdagen.cache.heuristics import default_config
    from kdagen.cache.store import TuningCache
    from kdagen.codegen.lower import lower
    from kdagen.ops.inputs import select_spec
    from kdagen.tuning import compile_pool as CP, driver as D

    h200 = get_profile("h200")
    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: h200)
    monkeypatch.setattr(TU, "_current_gpu", lambda: h200)
    monkeypatch.setattr(TU, "_MEMO", {})
    TU._cache_for.cache_clear()
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(D, "compile_check",
                        lambda fam, plan, *a, **k: [CP.CompileSurvey(fam, None, 1, [default_config(fam, plan)])])
    seen = []

    def fake_tune_family(fam, plan, spec, spec_args, gpu, dt, shape, fwd_config=None, **kw):
        seen.append((fam, spec.name, spec_args.get("spec")))
        d = default_config(fam, plan, {"N": shape[0], "HV": shape[3]}, fwd_config)
        return d.replace(num_warps=2) if fam == "recurrent" else d.replace(chunk_size=32, sub_chunk=16), \
            1.0, 2.0, 1e-3, {}

    monkeypatch.setattr(D, "tune_family", fake_tune_family)
    r = CliRunner().invoke(main, ["build", "--gpu", "h200", "--spec", USER, "--head-dim", "32", "--dtype", "fp32",
                             "--shapes", "1,64,2,32", "--decode-batches", "2", "--decode-heads", "2",
                             "--family", "chunk_fwd", "--family", "recurrent"])
    assert r.exit_code == 0, r.output
    assert {s[1] for s in seen} == {"kda_sigmoid3"} and {s[2] for s in seen} == {USER}
    user = load_spec(USER)
    entries = TuningCache("h200").entries()
    from kdagen.cache.keys import cache_key

    def key(spec, fam, form, hint):
        return cache_key(lower(spec, 32, 32, "float32", form), fam, hint, h200, "float32").key_string()

    # (a bucket names its value heads: the chunk shape's, and decode's --decode-heads)
    chunk_hint, dec_hint = dict(T=64, B=1, N=1, HV=2), dict(T=1, B=2, N=2, HV=2)
    # the spec's own tuning specs: g given, bounded by its gate for the chunk form, unbounded for decode
    assert set(entries) == {key(user.with_gate(S.gate_direct(-3.0)), "chunk_fwd", "chunk", chunk_hint),
                            key(user.with_gate(S.gate_direct(None)), "recurrent", "recurrent", dec_hint)}
    assert key(select_spec(False, True, -3.0, False, False), "chunk_fwd", "chunk", chunk_hint) not in entries
    shape = {"T": 64, "B": 1, "N": 1, "HV": 2}
    TU._MEMO.clear()
    mine = lower(user, 32, 32, "float32", "chunk", True)  # the spec's kernels, its gate in-kernel
    assert TU.resolve("chunk_fwd", mine, None, shape).chunk_size == 32
    assert TU.resolve("recurrent", lower(user, 32, 32, "float32", "recurrent", True), None,
                      {**shape, "N": 2, "B": 2, "T": 1}).num_warps == 2
    kdas = lower(select_spec(False, True, -3.0, False, False), 32, 32, "float32", "chunk")
    assert TU.resolve("chunk_fwd", kdas, None, shape) == default_config("chunk_fwd", kdas, shape)
