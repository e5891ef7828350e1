"""What `kdagen build` shows: progress (a bar on a terminal, one line per stage elsewhere,
nothing with --quiet), padded head dims, the gate a spec hash belongs to, and the closing
summary of what compiled, what was dropped and why, what was tuned, and where it all is."""
import io
import re

import pytest
import torch
from click.testing import CliRunner

from kdagen.cache.heuristics import default_config
from kdagen.cli import main
from kdagen.tuning.report import BuildSummary, Progress, drop_reasons, padding_note, table


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    return CliRunner()


# --- progress ------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_progress_off_a_terminal_prints_a_line_per_stage_and_an_eta_for_long_stages():
    out, clock = io.StringIO(), Clock()
    p = Progress(stream=out, bar=False, every_s=30, clock=clock)
    p.compile_step("chunk_fwd/intra", 0, 10, 0)  # the stage starts
    for i in range(1, 11):  # 10 candidates, 10 s each: a line after 30 s with the time left
        clock.t += 10
        p.compile_step("chunk_fwd/intra", i, 10, i - 1)
    p.compile_step("recurrent", 1, 1, 1)
    lines = out.getvalue().splitlines()
    assert lines == ["  [chunk_fwd/intra 3/10] 2 ok, 1 dropped (30s, ETA 70s)",
                     "  [chunk_fwd/intra 6/10] 5 ok, 1 dropped (60s, ETA 40s)",
                     "  [chunk_fwd/intra 9/10] 8 ok, 1 dropped (90s, ETA 10s)",
                     "  [chunk_fwd/intra 10/10] 9 ok, 1 dropped (100s)",
                     "  [recurrent 1/1] 1 ok, 0 dropped (0s)"]


def test_progress_on_a_terminal_draws_a_bar_with_eta_and_echo_does_not_break_it(capsys):
    out = io.StringIO()
    p = Progress(stream=out, bar=True)
    p.compile_step("chunk_bwd/dqkw", 0, 4, 0)
    p.compile_step("chunk_bwd/dqkw", 1, 4, 1)
    p.echo("a line while the bar is drawn")
    for i in range(2, 5):
        p.compile_step("chunk_bwd/dqkw", i, 4, i - 1)
    drawn = out.getvalue()
    assert "chunk_bwd/dqkw" in drawn and re.search(r"\d+/4 \[\d\d:\d\d<", drawn)  # count, elapsed < remaining
    assert "[chunk_bwd/dqkw" not in drawn  # no line per stage: the bar instead
    assert capsys.readouterr().out == "a line while the bar is drawn\n"
    step = p.tuning([("tune chunk_fwd K=128 V=128", 2), ("tune recurrent K=128 V=128", 1)])
    for _ in range(3):
        step()
    assert "tune chunk_fwd" in out.getvalue() and "tune recurrent" in out.getvalue()


def test_quiet_progress_prints_nothing():
    out = io.StringIO()
    p = Progress(enabled=False, stream=out, bar=True)
    p.compile_step("x", 1, 1, 1)
    p.tuning([("t", 1)])()
    assert out.getvalue() == ""


# --- notes and summary ---------------------------------------------------------------------

def _plan(K, V):
    from kdagen.ops.inputs import select_spec
    from kdagen.tuning.families import lower_for

    return lower_for(select_spec(False, True, -5.0, False, False), "chunk_fwd", K, V, torch.bfloat16)


@pytest.mark.parametrize("K,V,padded,ratio", [(80, 80, "K=80 to 128 and V=80 to 128", 2.56),
                                              (160, 160, "K=160 to 256 and V=160 to 256", 2.56),
                                              (17, 17, "K=17 to 32 and V=17 to 32", 3.54),
                                              (128, 96, "V=96 to 128", 1.33)])
def test_padding_is_noted_with_the_padded_size_and_the_extra_work(K, V, padded, ratio):
    plan = _plan(K, V)
    note = padding_note(plan)
    assert padded in note and f"{ratio:.2f}x" in note
    assert abs(plan.BK * plan.BV / (K * V) - ratio) < 5e-3  # what the plan's tiles imply


def test_no_padding_note_for_powers_of_two():
    assert padding_note(_plan(128, 128)) is None and padding_note(_plan(64, 256)) is None


def test_drop_reasons_are_counted_by_kind():
    fails = [(None, "needs 300000 B of shared memory, h800 has 232448")] * 3 + \
            [(None, "CompilationError: at 1:2"), (None, "OutOfResources: registers")]
    assert drop_reasons(fails) == "3 over shared memory, 1 CompilationError, 1 OutOfResources"


def test_table_aligns_columns():
    lines = table(["a", "num"], [("xx", "1.5"), ("y", "10.25")], align="lr")
    assert lines == ["  a     num", "  --  -----", "  xx    1.5", "  y   10.25"]  # headers aligned alike


def test_summary_lists_compiled_dropped_and_tuned():
    from kdagen.config import RecurrentConfig
    from kdagen.tuning.compile_pool import CompileSurvey
    from kdagen.tuning.driver import duration, error_text

    s = BuildSummary("h200")
    ok = RecurrentConfig()
    s.add_surveys({(128, 128, "recurrent"): (None, None, [
        CompileSurvey("recurrent", None, 5, [ok, ok], [(ok, "needs 1 B of shared memory, h200 has 0")] * 2 +
                      [(ok, "CompilationError: x")])])})
    s.add_tuned("recurrent", 128, 128, (64, 1, 32, 32), ok, 0.004, 0.005, 2e-6)
    s.add_tuned("recurrent", 128, 128, (256, 1, 32, 32), None, None, 0.01, None)
    text = "\n".join(s.lines(duration, error_text))
    assert re.search(r"recurrent\s+-\s+128x128\s+2/5\s+3\s+2 over shared memory, 1 CompilationError", text)
    assert re.search(r"recurrent\s+128x128\s+B=64 H=32\s+4.00 us\s+5.00 us\s+x1.25\s+2.0e-06\s+" +
                     re.escape(ok.short()), text)
    assert re.search(r"B=256 H=32\s+none passed", text)


# --- the command --------------------------------------------------------------------------

@pytest.fixture
def fake_compile(monkeypatch):
    """compile_check faked: every family's default compiles, one candidate is dropped for
    shared memory; the progress callback is called as the real one calls it."""
    from kdagen.cache.heuristics import default_config
    from kdagen.tuning import compile_pool as CP, driver as D

    def fake(fam, plan, *a, on_progress=None, **k):
        d = default_config(fam, plan)
        if on_progress:
            on_progress(fam, 0, 2, 0)
            on_progress(fam, 1, 2, 1)
            on_progress(fam, 2, 2, 1)
        return [CP.CompileSurvey(fam, None, 2, [d], [(d, "needs 300000 B of shared memory, h800 has 232448")])]

    monkeypatch.setattr(D, "compile_check", fake)
    kept = []  # the configs kept for the GPU (compiles faked: none fails)
    monkeypatch.setattr(D, "_keep", lambda targets, *a, **k: kept.extend(targets) or [None] * len(targets))
    return kept


def test_build_shows_gate_padding_progress_and_a_summary(runner, fake_compile):
    r = runner.invoke(main, ["build", "--gpu", "h800", "--head-dim", "80", "--family", "recurrent",
                             "--decode-batches", "2", "--check-all"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "(gate direct, g >= -5)" in out
    assert "pad K=80 to 128 and V=80 to 128" in out and "2.56x" in out
    assert "[recurrent 2/2] 1 ok, 1 dropped" in r.stderr  # not a terminal: one line per stage
    assert re.search(r"recurrent\s+-\s+80x80\s+1/2\s+1\s+1 over shared memory", out)
    assert "generated sources: " in out and "kept binaries: " in out
    # what the ops will run at each decode batch is kept: the heuristic's config (nothing tuned here)
    assert "kept the binaries of 1 config(s)" in out
    (fam, plan, _, shape, config, fwd), = fake_compile
    assert (fam, plan.K, shape, fwd) == ("recurrent", 80, (2, 1, 32, 32), None)
    assert config == default_config("recurrent", plan, dict(T=1, B=2, N=2, HV=32, state_v_first=False))
    assert "next: on a machine with this GPU (h800), `kdagen tune --head-dim 80`" in out
    r = runner.invoke(main, ["build", "--gpu", "h800", "--head-dim", "64", "--family", "recurrent", "--quiet"])
    assert r.exit_code == 0 and "[recurrent" not in r.stderr and "summary:" in r.output


def test_a_build_that_does_not_tune_compiles_what_the_ops_run(runner, fake_compile, monkeypatch):
    """Without the GPU here (and without --check-all or a space of one's own) the candidates are not
    compiled -- the tuner on that GPU compiles them -- but the configs the ops run there at every tuning
    shape are, and are kept; the summary lists them, and one that does not compile fails the build."""
    from kdagen.cache.heuristics import default_config
    from kdagen.tuning import driver as D

    def no_survey(*a, **k):
        raise AssertionError("compile_check called by a build that does not tune")

    monkeypatch.setattr(D, "compile_check", no_survey)
    r = runner.invoke(main, ["build", "--gpu", "h800", "--head-dim", "64", "--family", "recurrent",
                             "--family", "chunk_fwd", "--decode-batches", "2,64", "--shapes", "1,1024,4,64;2,64,8,64"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "compile-check only: the configs the ops run there (--check-all: every candidate config)" in out
    assert "summary: candidate configs compiled" not in out and "compile-check done" not in out
    assert "compiling what the ops run on a h800 (sm_90) at each tuning shape, to keep it" in out
    assert [(f, p.K, s) for f, p, _, s, _, _ in fake_compile] == [
        ("chunk_fwd", 64, (1, 1024, 4, 4)), ("chunk_fwd", 64, (2, 64, 8, 8)),
        ("recurrent", 64, (2, 1, 32, 32)), ("recurrent", 64, (64, 1, 32, 32))]
    for fam, plan, _, shape, config, _ in fake_compile:  # the heuristic at the op's call shape (value heads too)
        B, T, _, HV = shape
        assert config == default_config(fam, plan, dict(T=T, B=B, N=B, HV=HV) if fam == "chunk_fwd" else
                                        dict(T=1, B=B, N=B, HV=32, state_v_first=False))
    assert "kept the binaries of 4 config(s)" in out
    assert "summary: what the ops run on a h800 at each tuning shape, compiled for it and kept" in out
    assert re.search(r"chunk_fwd\s+64x64\s+B=1 T=1024 H=4\s+heuristic\s+kept", out)
    assert re.search(r"recurrent\s+64x64\s+B=64 H=32\s+heuristic\s+kept", out)
    assert "every candidate compiled is in" not in out  # nothing but the kept configs was compiled
    # one of them does not compile for the GPU: said, and the build fails
    monkeypatch.setattr(D, "_keep", lambda targets, *a, **k: [None] * (len(targets) - 1) + ["needs 300000 B of "
                                                                                           "shared memory"])
    r = runner.invoke(main, ["build", "--gpu", "h800", "--head-dim", "64", "--family", "recurrent", "--quiet"])
    assert r.exit_code == 1, r.output
    assert "error: does not compile: recurrent K=64 V=64" in r.output and "needs 300000 B" in r.output
    assert re.search(r"B=256 H=32\s+heuristic\s+failed: needs 300000 B of shared memory", r.output)
    assert "error: some configs the ops run on a h800 do not compile for it" in r.output
    # with --check-all the same build compile-checks every candidate first
    monkeypatch.setattr(D, "compile_check", lambda fam, plan, *a, **k: [])
    r = runner.invoke(main, ["build", "--gpu", "h800", "--head-dim", "64", "--family", "recurrent", "--check-all",
                             "--quiet"])
    assert r.exit_code == 0, r.output  # (there a config left unkept is a warning: the candidates were checked)
    assert "compile-check done" in r.output and "every candidate compiled is in" in r.output
    assert "warning: not kept: recurrent K=64 V=64" in r.output


def test_build_on_the_matching_gpu_summarises_the_winners(runner, fake_compile, monkeypatch, tmp_path):
    import kdagen.cache.gpus
    from kdagen.cache.gpus import get_profile
    from kdagen.cache.heuristics import default_config
    from kdagen.tuning import driver as D

    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: get_profile("h200"))

    def fake_tune_family(fam, plan, spec, spec_args, gpu, dt, shape, **kw):
        d = default_config(fam, plan)
        return d.replace(num_warps=2), 0.002 * shape[0], 0.003 * shape[0], 1e-6, {}

    monkeypatch.setattr(D, "tune_family", fake_tune_family)
    r = runner.invoke(main, ["build", "--gpu", "h200", "--head-dim", "64", "--family", "recurrent", "--dtype",
                             "fp32", "--decode-batches", "1,4"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert re.search(r"recurrent\s+64x64\s+B=1 H=32\s+2.00 us\s+3.00 us\s+x1.50", out)
    assert re.search(r"recurrent\s+64x64\s+B=4 H=32\s+8.00 us\s+12.00 us\s+x1.50", out)
    assert f"tuning cache:      {tmp_path / 'cache' / 'h200.json'}" in out
    assert "next: `kdagen list --gpu h200`" in out and "kdagen bench --compare fla" in out


def test_verify_and_build_print_the_same_hash_by_default(runner, fake_compile):
    """Both assume the gate bound -5 unless told otherwise, and say so."""
    v = runner.invoke(main, ["verify", "--spec", "kda"])
    b = runner.invoke(main, ["build", "--gpu", "h800", "--head-dim", "64", "--family", "recurrent", "--quiet"])
    i = runner.invoke(main, ["inspect", "--plan-only"])
    (vh,) = re.findall(r"spec kda \(hash (\w+)\)", v.output)
    (bh,) = re.findall(r"spec kda hash (\w+) \(gate direct, g >= -5\)", b.output)
    (ih,) = re.findall(r"# spec  : kda hash (\w+) \(gate direct, g >= -5\)", i.output)
    assert vh == bh == ih
    assert "range [-5.0" in v.output
    # without the bound, a different spec, and each command says which
    v = runner.invoke(main, ["verify", "--spec", "kda", "--lower-bound", "none"])
    b = runner.invoke(main, ["build", "--gpu", "h800", "--head-dim", "64", "--family", "chunk_fwd", "--quiet",
                             "--lower-bound", "none"])
    (vh2,) = re.findall(r"spec kda \(hash (\w+)\)", v.output)
    assert vh2 != vh and f"hash {vh2} (gate direct, g unbounded below)" in b.output


def test_verify_softplus_gate_takes_no_default_bound(runner):
    r = runner.invoke(main, ["verify", "--spec", "gdn", "--gate", "softplus"])
    assert r.exit_code == 0, r.output


def test_inspect_notes_padding(runner):
    r = runner.invoke(main, ["inspect", "--head-dim", "160", "--plan-only"])
    assert r.exit_code == 0 and "# note: the kernels pad K=160 to 256 and V=160 to 256" in r.output


def test_list_says_which_specs_have_kernels(runner):
    r = runner.invoke(main, ["list"])
    assert r.exit_code == 0
    rows = {ln.split()[0]: ln for ln in r.output.splitlines() if ln.startswith("  ") and " hash " in ln}
    assert set(rows) == {"kda", "gdn", "deltanet", "gla", "dplr"}
    assert "kernels: chunk forward and backward, recurrent" in rows["kda"]
    for name in ("gdn", "deltanet", "gla"):
        assert "kernels: chunk forward and backward, recurrent" in rows[name], rows[name]
    assert "kernels: " in rows["dplr"] and "recurrent" in rows["dplr"], rows["dplr"]  # its decode kernels at least
    assert "spec only" not in r.output
    assert "(gate direct, g >= -5)" in rows["kda"] and "(no gate)" in rows["deltanet"]
