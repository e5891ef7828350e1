"""Every user mistake on the command line: exit code 2, one ``Error:`` line that says what was
wrong and what is accepted, no traceback -- and nothing compiled or measured first."""
import os
import subprocess
import sys

import click
import pytest
import torch
from click.testing import CliRunner

from kdagen.cli import main


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """A CLI runner on a machine without a GPU whose build and bench would fail the test if
    they started any work."""
    import kdagen.cache.gpus
    from kdagen.tuning import benchmark as BM, driver as D

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # a command that wrongly went ahead writes here, not into the checkout
    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_work(*a, **k):
        raise AssertionError("work started before every argument was checked")

    for name in ("compile_all", "tune_and_store"):
        monkeypatch.setattr(D, name, no_work)
    for name in ("run", "warm_fla"):
        monkeypatch.setattr(BM, name, no_work)
    return CliRunner()


def _one_error_line(result) -> str:
    out = result.output
    assert "Traceback" not in out, out
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, out
    errors = [ln for ln in out.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, out
    return errors[0]


BAD = [  # (arguments, what the error line must say)
    (["inspect", "--head-dim", "abc"], ["--head-dim", "'abc'", "K or K,V"]),
    (["inspect", "--head-dim", "64,"], ["--head-dim", "K or K,V"]),
    (["inspect", "--head-dim", "64,32,16"], ["K or K,V"]),
    (["inspect", "--head-dim", "128;96,192"], ["one head dim", "once per head dim"]),
    (["inspect", "--head-dim", "512"], ["K=512", "outside the supported range"]),
    (["inspect", "--lower-bound", "0"], ["--lower-bound", "negative number", "none"]),
    (["inspect", "--config", "{bad"], ["--config"]),
    (["inspect", "--kernel", "nope"], ["--kernel", "'nope'", "its kernels:"]),
    (["inspect", "--spec", "dplr", "--form", "recurrent", "--gate-in-kernel", "spec"],
     ["its gate 'direct' cannot be computed in the kernels"]),  # (every member lowers: tests/family/test_family*.py)
    (["inspect", "--gate-in-kernel", "softplus", "--lower-bound", "-3"], ["softplus gate has no lower bound"]),
    (["inspect", "--gate-in-kernel", "lower_bound", "--lower-bound", "none"], ["needs a bound"]),
    (["inspect", "--dtype", "fp8"], ["--dtype", "bf16"]),
    (["build"], ["Missing option '--gpu'"]),
    (["build", "--gpu", "h9000"], ["--gpu", "unknown GPU 'h9000'", "h800", "h200"]),
    (["build", "--gpu", "h800", "--lower-bound", "3"], ["--lower-bound", "'3'", "negative number"]),
    (["build", "--gpu", "h800", "--lower-bound", "abc"], ["--lower-bound", "negative number"]),
    (["build", "--gpu", "h800", "--decode-batches", "x"], ["--decode-batches", "positive integers"]),
    (["build", "--gpu", "h800", "--decode-batches", "0"], ["--decode-batches", "positive integers"]),
    (["build", "--gpu", "h800", "--jobs", "0"], ["--jobs", "x>=1"]),
    (["build", "--gpu", "h800", "--head-dim", "64,"], ["--head-dim", "K or K,V"]),
    (["build", "--gpu", "h800", "--head-dim", "128;8"], ["--head-dim", "K=8", "supported range"]),
    (["build", "--gpu", "h800", "--shapes", "1,2,3"], ["--shapes", "B,T,H,K"]),
    (["build", "--gpu", "h800", "--space", "/no/such/space.json"], ["--space", "does not exist"]),
    (["build", "--gpu", "h800", "--spec", "dplr", "--head-dim", "8"], ["--head-dim", "K=8", "supported range"]),
    (["build", "--gpu", "h800", "--spec", "nope"], ["--spec", "kda"]),
    (["build", "--gpu", "h800", "--family", "nope"], ["--family", "chunk_fwd", "recurrent"]),
    (["build", "--gpu", "auto"], ["--gpu auto", "no CUDA GPU", "h800"]),
    (["tune"], ["kdagen tune", "no CUDA GPU", "kdagen build --gpu NAME"]),
    (["tune", "--lower-bound", "x"], ["--lower-bound", "negative number"]),
    (["tune", "--head-dim", "0"], ["--head-dim", "positive integers"]),
    (["verify", "--spec", "nope"], ["--spec", "'nope'", "kda", "dplr"]),
    (["verify", "--gate", "nope"], ["--gate", "direct", "softplus"]),
    (["verify", "--lower-bound", "2"], ["--lower-bound", "negative number"]),
    (["verify", "--gate", "softplus", "--lower-bound", "-3"], ["softplus gate has no lower bound"]),
    (["verify", "--spec", "deltanet", "--gate", "direct"], ["deltanet has no decay"]),
    (["list", "--gpu", "nonsense"], ["--gpu", "unknown GPU 'nonsense'", "h200"]),
    (["bench"], ["CUDA GPU", "none is visible"]),
    (["bench", "--shapes", "1,2,3"], ["--shapes", "B,T,H,K or B,T,H,K,V"]),
    (["bench", "--shapes", "1,64,2,8"], ["--shapes", "K=8", "supported range"]),
    (["bench", "--passes", "fwd,sideways"], ["--passes", "fwd, fwdbwd, decode"]),
    (["bench", "--compare", "torch"], ["--compare", "fla"]),
    (["bench", "--fla-warm-jobs", "-1"], ["--fla-warm-jobs"]),
    (["bench", "--dtype", "int8"], ["--dtype"]),
    (["export", "--out", "x", "--name", "p"], ["Missing option '--gpu'"]),
    (["export", "--gpu", "h800", "--name", "p"], ["Missing option '--out'"]),
    (["export", "--gpu", "h9000", "--out", "x", "--name", "p"], ["--gpu", "unknown GPU 'h9000'", "h800"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "kda-h800"], ["--name", "'kda-h800'", "identifier"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "kdagen"], ["--name", "other than kdagen"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "json"], ["--name", "standard-library module"]),
    (["export", "--gpu", "auto", "--out", "x", "--name", "p"], ["--gpu", "no CUDA GPU is visible", "h800"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "p", "--dtype", "fp8"], ["--dtype", "bf16"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "p", "--head-dim", "512"], ["--head-dim", "K=512"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "p", "--lower-bound", "1"], ["--lower-bound", "negative"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "p", "--spec", "dplr"],
     ["--spec", "'dplr' lowers", "an exported package holds chunk_kda and fused_recurrent_kda", "not implemented yet"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "p", "--cache", "/no/such.json"], ["--cache", "does not exist"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "p", "--gates", "bounded", "--lower-bound", "none"],
     ["--gates", "'bounded' exports the gate bounded by --lower-bound, which is 'none'", "'unbounded' or 'both'"]),
    (["export", "--gpu", "h800", "--out", "x", "--name", "p", "--gates", "safe"], ["--gates", "'safe' is not one of",
                                                                                  "'both', 'bounded', 'unbounded'"]),
]


@pytest.mark.parametrize("args,says", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_is_one_error_line_and_exit_2(runner, args, says):
    line = _one_error_line(runner.invoke(main, args))
    for s in says:
        assert s in line, line


def test_every_command_with_options_is_walked():
    """The table above has bad arguments for every command that takes any."""
    walked = {args[0] for args, _ in BAD}
    assert walked >= set(main.commands)


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_option_has_a_description(runner, command):
    """`kdagen COMMAND --help` describes every option (tune's had none)."""
    cmd = main.commands[command]
    undescribed = [p.name for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert not undescribed, f"{command}: {undescribed}"
    r = runner.invoke(main, [command, "--help"])
    assert r.exit_code == 0 and "Options:" in r.output


def test_a_cache_directory_that_is_a_file_stops_build_before_it_compiles(runner, tmp_path, monkeypatch):
    f = tmp_path / "not-a-dir"
    f.write_text("")
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(f))
    line = _one_error_line(runner.invoke(main, ["build", "--gpu", "h800"]))
    assert "is a file, not a directory" in line and "KDAGEN_CACHE_DIR" in line


def test_bench_without_fla_or_matplotlib_says_what_to_install(runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla fails as if not installed
    line = _one_error_line(runner.invoke(main, ["bench", "--compare", "fla"]))
    assert "flash-linear-attention" in line and "pip install" in line
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    line = _one_error_line(runner.invoke(main, ["bench", "--plot", str(tmp_path / "x.png")]))
    assert "kdagen[plot]" in line
    assert not (tmp_path / "x.png").exists()


def test_bench_from_a_file_that_is_not_a_result(runner, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "--from" in _one_error_line(runner.invoke(main, ["bench", "--from", str(bad)]))
    bad.write_text('{"rows": 3}')
    assert "not a kdagen bench result" in _one_error_line(runner.invoke(main, ["bench", "--from", str(bad)]))
    good = tmp_path / "good.json"
    good.write_text('{"rows": [], "env": {}, "copy_gbs": 1.0}')
    line = _one_error_line(runner.invoke(main, ["bench", "--from", str(good), "--shapes", "1,64,2,64"]))
    assert "--from" in line and "shapes" in line


@pytest.mark.slow
def test_a_bad_argument_in_a_real_process_prints_no_traceback(tmp_path):
    """The installed entry point, as a user runs it (not click's test runner)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KDAGEN_CACHE_DIR"] = str(tmp_path)
    for args in (["inspect", "--head-dim", "128;96,192"], ["build", "--gpu", "h800", "--lower-bound", "3"]):
        r = subprocess.run([sys.executable, "-m", "kdagen.cli", *args], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")], r.stderr


def test_build_on_a_matching_gpu_without_optuna_stops_before_compiling(runner, monkeypatch):
    """The tuner needs optuna: on a matching GPU without it, build says so before its compile-check
    (which would otherwise run for a minute and then stop at the tuner); --compile-only is offered."""
    import importlib.util

    import kdagen.cache.gpus
    from kdagen.cache.gpus import get_profile

    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: get_profile("h200"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else real(name, *a))
    result = runner.invoke(main, ["build", "--gpu", "h200", "--head-dim", "64"])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert "optuna" in line and "--compile-only" in line
