"""The kdagen command line, end to end (CPU only: compile-only builds)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from plain_configs import plain_bwd, plain_fwd

from kdagen.cli import main


def _kdagen(args, tmp_path):
    """Run the CLI in a fresh process: compiling for a GPU target cannot happen in a process
    where the test session put Triton in interpreter mode (TRITON_INTERPRET=1)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KDAGEN_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, "-m", "kdagen.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    return CliRunner()


def test_help_lists_every_command(runner):
    r = runner.invoke(main, ["--help"])
    assert r.exit_code == 0
    for cmd in ("build", "tune", "export", "bench", "list", "inspect", "verify"):
        assert cmd in r.output


def test_verify_prints_a_table_and_passes(runner):
    r = runner.invoke(main, ["verify", "--spec", "kda"])
    assert r.exit_code == 0, r.output
    assert "chunk vs recurrence" in r.output and "symbolic" in r.output and "FAIL" not in r.output
    assert "0 failed" in r.output


def test_verify_reports_failure_with_nonzero_exit(runner, monkeypatch):
    import kdagen.spec.verify as V

    monkeypatch.setattr(V, "TOL", -1.0)  # nothing can pass a negative tolerance
    r = runner.invoke(main, ["verify", "--spec", "gla"])
    assert r.exit_code == 1 and "FAIL" in r.output


def test_bench_needs_a_gpu(runner, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on any machine
    r = runner.invoke(main, ["bench"])
    assert r.exit_code == 2 and "measures on a CUDA GPU and none is visible here" in r.output


def test_build_refuses_unknown_gpu_with_the_list(runner):
    r = runner.invoke(main, ["build", "--gpu", "h9000"])
    assert r.exit_code != 0 and "h800" in r.output and "h200" in r.output


def test_build_auto_without_gpu_is_a_usage_error(runner, monkeypatch):
    import kdagen.cache.gpus

    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: None)  # the same on any machine
    r = runner.invoke(main, ["build", "--gpu", "auto"])
    assert r.exit_code == 2 and "no CUDA GPU" in r.output


@pytest.mark.slow
def test_build_h800_compile_only_end_to_end(runner, tmp_path):
    space = tmp_path / "tiny.json"
    space.write_text(json.dumps({
        "kernel": "chunk_fwd", "version": 1,
        "params": {"chunk_size": [64], "intra_num_warps": [4],
                   "state_block_v": [32, 64], "state_num_warps": [4]},
        "stages": {"intra": {"launch": "chunk_solve", "fields": ["chunk_size", "intra_num_warps"]},
                   "state": {"launch": "chunk_pass", "fields": ["chunk_size", "state_block_v", "state_num_warps"]}},
        "constraints": ["smem_estimate <= smem_limit"]}))
    r = _kdagen(["build", "--gpu", "h800", "--head-dim", "64", "--space", str(space), "--quiet"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "compile-check only" in r.stdout
    assert "chunk_fwd/intra K=64 V=64: 1/1 candidate configs compiled for h800" in r.stdout
    assert "chunk_fwd/state K=64 V=64: 2/2 candidate configs compiled for h800" in r.stdout


@pytest.mark.slow
def test_build_backward_compile_only(runner, tmp_path):
    """The backward family: each of its three launches surveyed for the GPU's architecture;
    a V tile larger than V is cut by the space's constraint before compiling."""
    space = tmp_path / "bwd.json"
    space.write_text(json.dumps({
        "kernel": "chunk_bwd", "version": 1,
        "params": {"state_block_v": [16, 128], "dqkw_block_k": [32], "dqkw_block_v": [32],
                   "intra_block_k": [32], "intra_num_warps": [8]},
        "stages": {"state": {"launch": "chunk_bwd_state", "fields": ["state_block_v"]},
                   "dqkw": {"launch": "chunk_bwd_dqkw", "fields": ["dqkw_block_k", "dqkw_block_v"]},
                   "intra": {"launch": "chunk_bwd_intra", "fields": ["intra_block_k", "intra_num_warps"]}},
        "constraints": ["state_block_v <= max(16, V)", "smem_estimate <= smem_limit"]}))
    r = _kdagen(["build", "--gpu", "h100", "--head-dim", "64", "--space", str(space), "--quiet"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for stage in ("state", "dqkw", "intra"):
        assert f"chunk_bwd/{stage} K=64 V=64: 1/1 candidate configs compiled for h100" in r.stdout


@pytest.mark.slow
def test_build_recurrent_compile_only(runner, tmp_path):
    space = tmp_path / "rec.json"
    space.write_text(json.dumps({"kernel": "recurrent", "params": {"block_v": [16, 32, 64], "num_warps": [4]}}))
    # three candidates on two worker processes
    r = _kdagen(["build", "--gpu", "h20", "--head-dim", "96,48", "--space", str(space), "--jobs", "2"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recurrent K=96 V=48: 3/3 candidate configs compiled for h20" in r.stdout
    assert "[recurrent 3/3] 3 ok, 0 dropped" in r.stderr
    # the kept decode kernels, and (Triton 3.6) their launchers and the driver utilities their first launches build
    from kdagen.cache.binaries import builds_launchers
    m = re.search(r"kept binaries: +(\S+) \((\d+) kernels and (\d+) C modules", r.stdout)
    infos = [json.loads(p.read_text()) for p in Path(m[1]).glob("*/info.json")]
    assert int(m[2]) == sum("kernel" in i for i in infos) >= 3 and int(m[3]) == len(infos) - int(m[2])
    assert sorted({i["module"] for i in infos if "module" in i}) == (["__triton_launcher", "cuda_utils"]
                                                                      if builds_launchers() else [])


@pytest.mark.slow
def test_compile_check_drops_configs_over_shared_memory(tmp_path):
    code = """
import torch
from kdagen.tuning.compile_pool import compile_check
from kdagen.tuning.families import lower_for
from kdagen.cache.gpus import get_profile
from kdagen.ops.inputs import select_spec
from kdagen.tuning.space import SearchSpace
spec = select_spec(False, True, -5.0, False, False)
plan = lower_for(spec, "chunk_fwd", 64, 64, torch.bfloat16)
space = SearchSpace.from_dict({"kernel": "chunk_fwd", "params": {"chunk_size": [32]},
                               "stages": {"state": {"launch": "chunk_pass",
                                                    "fields": ["chunk_size", "state_block_v"]}}})
tiny = get_profile("h100").__class__(**{**get_profile("h100").__dict__, "name": "tiny", "smem_per_block_bytes": 4096})
(survey,) = compile_check("chunk_fwd", plan, spec, {"safe_gate": True, "lower_bound": -5.0}, tiny,
                          torch.bfloat16, space=space, progress=False)
print(survey.total, len(survey.survivors), survey.failures[0][1] if survey.failures else "")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KDAGEN_CACHE_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    total, survivors, why = r.stdout.strip().split(" ", 2)
    assert (total, survivors) == ("1", "0") and "shared memory" in why


def test_inspect_prints_generated_source(runner):
    r = runner.invoke(main, ["inspect", "--head-dim", "96,192", "--lower-bound", "-5", "--kernel", "chunk_pass"])
    assert r.exit_code == 0, r.output
    assert "# plan  :" in r.output and "@triton.jit" in r.output and "kda_chunk_pass_" in r.output
    r = runner.invoke(main, ["inspect", "--form", "recurrent", "--gate-in-kernel", "softplus"])
    assert r.exit_code == 0 and "tl.log(1.0 + tl.exp" in r.output
    r = runner.invoke(main, ["inspect", "--head-dim", "512"])
    assert r.exit_code == 2 and "outside the supported range" in r.output


@pytest.mark.slow
def test_inspect_backward_kernels(runner):
    """The backward's three kernels, with the in-kernel gate's sympy derivative printed in."""
    r = runner.invoke(main, ["inspect", "--form", "chunk_bwd", "--head-dim", "64", "--gate-in-kernel", "lower_bound"])
    assert r.exit_code == 0, r.output
    for kind in ("chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"):
        assert f"kda_{kind}_" in r.output
    assert '"dqkw_block_k"' in r.output and "b_dAacc" in r.output
    r = runner.invoke(main, ["inspect", "--form", "chunk_bwd", "--kernel", "chunk_intra"])
    assert r.exit_code == 2 and "chunk_bwd_dqkw" in r.output


def test_list_shows_specs_and_cache(runner):
    r = runner.invoke(main, ["list"])
    assert r.exit_code == 0
    assert "kda" in r.output and "gdn" in r.output and "tuning cache" in r.output and "empty" in r.output


def test_tune_and_store_orders_families_and_warns_without_default(tmp_path, monkeypatch, capsys):
    """The tuning half of `kdagen build` (GPU work faked): the backward is tuned at the
    forward winner's chunk length, winners land in the cache, and a default config that could
    not be measured is reported rather than silently compared with nothing."""
    import torch

    from kdagen.cache.gpus import get_profile
    from kdagen.cache.heuristics import default_config
    from kdagen.cache.store import TuningCache
    from kdagen.tuning import compile_pool as CP, driver as D
    from kdagen.tuning.families import lower_for
    from kdagen.ops.inputs import select_spec

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    spec = select_spec(False, True, -5.0, False, False)
    calls = []
    fwd_win = plain_fwd(chunk_size=64)

    def fake_tune_family(fam, plan, spec_, spec_args, gpu, dt, shape, space=None, seed=0, progress=True,
                         candidates_by_stage=None, jobs=1, fwd_config=None, isolate=False, worker=None, pool=None,
                         state_dtype=None):
        calls.append((fam, shape, fwd_config, candidates_by_stage,
                      isolate and worker is not None and pool is compile_pool and jobs == 3
                      and state_dtype is torch.float32))
        if fam == "chunk_fwd":
            return fwd_win, 2.0, 2.5, 1e-3, {}
        return plain_bwd(), 5.0, None, 2e-3, {}

    monkeypatch.setattr(D, "tune_family", fake_tune_family)
    compile_pool = CP.CompilePool(3)  # passed through, never started by the fake
    surveys = {}
    for fam in ("chunk_fwd", "chunk_bwd"):
        plan = lower_for(spec, fam, 64, 64, torch.bfloat16)
        stages = ("intra", "state") if fam == "chunk_fwd" else ("state", "dqkw", "intra")
        default = default_config(fam, plan)
        surveys[(64, 64, fam)] = (plan, spec, [CP.CompileSurvey(fam, st, 1, [default]) for st in stages])
    D.tune_and_store(get_profile("h200"), {"safe_gate": True, "lower_bound": -5.0}, torch.bfloat16,
                     surveys, [(1, 512, 4, 64)], [1], None, 0, True, pool=compile_pool)
    (f_fam, f_shape, f_fwd, _, f_iso), (b_fam, b_shape, b_fwd, b_cands, b_iso) = calls
    assert (f_fam, b_fam) == ("chunk_fwd", "chunk_bwd") and f_shape == b_shape == (1, 512, 4, 4)
    # the backward runs with the training forward (ChunkTrainConfig) at its own chunk length: the
    # inference forward's winner (C=64 here) does not reach it
    assert f_fwd is None and b_fwd is None and f_iso and b_iso
    bwd_c = default_config("chunk_bwd", lower_for(spec, "chunk_bwd", 64, 64, torch.bfloat16)).chunk_size
    assert bwd_c != fwd_win.chunk_size and all(c.chunk_size == bwd_c for cs in b_cands.values() for c in cs)
    err = capsys.readouterr().err
    assert "warning: chunk_bwd" in err and "default config failed" in err and "chunk_fwd K=64" not in err
    entries = TuningCache("h200", cache_dir=tmp_path).entries()
    assert sorted(k.split("-")[0] for k in entries) == ["chunk_bwd", "chunk_fwd"]
    # the error the tuner measured for each winner is stored with it
    assert {e["kernel"]: e["error"] for e in entries.values()} == {"chunk_fwd": 1e-3, "chunk_bwd": 2e-3}


TUNED = {"chunk_fwd": dict(state_num_warps=8), "chunk_bwd": dict(intra_num_warps=8), "recurrent": dict(num_warps=2)}
FAMILY_OF = {"ChunkFwdConfig": "chunk_fwd", "ChunkBwdConfig": "chunk_bwd", "RecurrentConfig": "recurrent"}


@pytest.fixture
def build_on_h200(runner, monkeypatch):
    """``build(*args)`` runs `kdagen build` on a faked H200 (compile-check and tuning faked: each
    family's winner differs from its default in the one field of TUNED); ``used`` then records
    the config of every kernel build the ops make."""
    import kdagen.cache.gpus
    import kdagen.cache.lookup as TU
    from kdagen import kernels
    from kdagen.cache.gpus import get_profile
    from kdagen.cache.heuristics import default_config
    from kdagen.ops import chunk_call as chunk_op, chunk_bwd as chunk_bwd_op, recurrent as recurrent_op
    from kdagen.tuning import compile_pool as CP, driver as D

    h200 = get_profile("h200")
    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: h200)
    monkeypatch.setattr(TU, "_current_gpu", lambda: h200)
    monkeypatch.setattr(TU, "_MEMO", {})
    TU._cache_for.cache_clear()
    monkeypatch.setattr(D, "compile_check",
                        lambda fam, plan, *a, **k: [CP.CompileSurvey(fam, None, 1, [default_config(fam, plan)])])

    def fake_tune_family(fam, plan, spec, spec_args, gpu, dt, shape, fwd_config=None, **kw):
        d = default_config(fam, plan, {"N": shape[0], "HV": shape[3]}, fwd_config)
        if fam == "recurrent":  # a decode step: listed in microseconds
            return d.replace(**TUNED[fam]), 0.00265, 0.0031, 4e-6, {}
        return d.replace(**TUNED[fam]), 1.0, 2.0, 3e-3, {}

    monkeypatch.setattr(D, "tune_family", fake_tune_family)
    used = []
    real_build = kernels.build

    def spy(plan, config):
        used.append(config)
        return real_build(plan, config)

    for mod in (chunk_op, chunk_bwd_op, recurrent_op):
        monkeypatch.setattr(mod, "build", spy)

    def build(*args):
        res = runner.invoke(main, ["build", "--gpu", "h200", "--head-dim", "16", "--dtype", "fp32",
                                   "--shapes", "1,64,2,16", "--decode-batches", "2", "--decode-heads", "2", *args])
        assert res.exit_code == 0, res.output
        TU._MEMO.clear()
        return res.output

    return build, used


def _kda_inputs():
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(*s, generator=g) for n, s in
         dict(q=(1, 64, 2, 16), k=(1, 64, 2, 16), v=(1, 64, 2, 16), g=(1, 64, 2, 16), beta=(1, 64, 2)).items()}
    x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    x["g"] = -torch.rand(1, 64, 2, 16, generator=g)
    x["beta"] = torch.sigmoid(x["beta"])
    return x


def _tuned(config) -> bool:
    field, value = next(iter(TUNED[FAMILY_OF[type(config).__name__]].items()))
    return getattr(config, field) == value


@pytest.mark.slow
def test_the_ops_look_up_what_build_stores(runner, build_on_h200):
    """`kdagen build` on the matching GPU stores winners under the keys the ops look up:
    chunk_kda with the bound the build assumed, its backward, and fused_recurrent_kda -- whose
    kernel has no gate bound (it takes no safe_gate), so its winner must not be keyed by the
    bounded spec."""
    import kdagen

    build, used = build_on_h200
    out = build()
    assert out.count("tuned ") == 3 and "2.65 us (x1.17 vs default 3.10 us)" in out
    listed = runner.invoke(main, ["list"]).output
    assert "h200: 3 winner(s)" in listed and "2.65 us  x1.17 vs default" in listed and "1.000 ms  x2.00" in listed
    assert "error 4.0e-06" in listed and "error 3.0e-03" in listed
    x = _kda_inputs()
    leaves = {n: t.requires_grad_(True) for n, t in x.items()}
    o, _ = kdagen.chunk_kda(**leaves, safe_gate=True, lower_bound=-5.0)
    o.sum().backward()
    with torch.no_grad():
        kdagen.chunk_kda(**x, safe_gate=True, lower_bound=-5.0)
        step = {n: t.detach()[:1, :1].expand(2, 1, *t.shape[2:]).contiguous() for n, t in x.items()}
        kdagen.fused_recurrent_kda(**step)
        kdagen.fused_recurrent_kda(**step, lower_bound=-5.0)
    kinds = [type(c).__name__ for c in used]
    assert kinds.count("RecurrentConfig") == 2 and {"ChunkFwdConfig", "ChunkBwdConfig", "ChunkTrainConfig"} <= set(kinds)
    # the training forward is not tuned (it runs at the backward's chunk length); the rest are
    assert all(_tuned(c) for c in used if type(c).__name__ != "ChunkTrainConfig"), used


@pytest.mark.slow
def test_in_kernel_gate_calls_use_the_winners_build_stores(build_on_h200):
    """use_gate_in_kernel=True: the kernels differ from the direct gate's only by the gate's
    prologue, so the call runs the winners `kdagen build` tuned for the direct gate with the same
    bound -- forward, backward and decode, with or without A_log / dt_bias.  The softplus gate has
    no bound: its calls keep the heuristic (nothing tuned the unbounded direct gate here)."""
    import kdagen

    build, used = build_on_h200
    build()
    x = _kda_inputs()
    z = torch.randn(1, 64, 2, 16)
    params = dict(A_log=torch.zeros(2), dt_bias=torch.zeros(2 * 16))
    for kw in (params, {}):
        used.clear()
        leaves = {n: t.detach().requires_grad_(True) for n, t in {**x, "g": z}.items()}
        o, _ = kdagen.chunk_kda(**leaves, use_gate_in_kernel=True, lower_bound=-5.0, **kw)
        o.sum().backward()
        with torch.no_grad():
            kdagen.chunk_kda(**{**x, "g": z}, use_gate_in_kernel=True, lower_bound=-5.0, **kw)
            step = {n: t.detach()[:1, :1].expand(2, 1, *t.shape[2:]).contiguous() for n, t in {**x, "g": z}.items()}
            kdagen.fused_recurrent_kda(**step, use_gate_in_kernel=True, lower_bound=-5.0, **kw)
        assert sorted(type(c).__name__ for c in used) == ["ChunkBwdConfig", "ChunkFwdConfig", "ChunkTrainConfig",
                                                          "RecurrentConfig"]
        assert all(_tuned(c) for c in used if type(c).__name__ != "ChunkTrainConfig"), (kw.keys(), used)
    used.clear()
    with torch.no_grad():
        kdagen.chunk_kda(**{**x, "g": z}, use_gate_in_kernel=True, **params)
    assert [type(c).__name__ for c in used] == ["ChunkFwdConfig"] and not _tuned(used[0])


def test_winners_are_keyed_by_the_state_dtype(build_on_h200, monkeypatch):
    """A decode call with a bf16 state pool does not run winners measured with float32 states;
    `kdagen build --state-dtype bf16` tunes for it, and then it does.  (The call takes the GPU's path:
    under the interpreter the ops otherwise run a bf16 pool on a float32 copy, kdagen.ops.inputs.fla_dtypes;
    only the config a call resolves is looked at here, not its values.)"""
    import kdagen
    from kdagen.ops import inputs as inputs_mod
    from kdagen.ops import recurrent as recurrent_op

    monkeypatch.setattr(inputs_mod, "interpreting", lambda: False)

    build, used = build_on_h200
    build()
    x = _kda_inputs()
    step = {n: t[:1, :1].expand(2, 1, *t.shape[2:]).contiguous() for n, t in x.items()}
    pool = torch.zeros(3, 2, 16, 16, dtype=torch.bfloat16)
    idx = torch.tensor([2, 0], dtype=torch.int32)

    def decode_config(state):
        used.clear()
        recurrent_op._FAST.clear()  # a decode loop's fast path keeps the launch it first built
        kdagen.fused_recurrent_kda(**step, initial_state=state, ssm_state_indices=idx)
        (c,) = used
        return c

    assert _tuned(decode_config(pool.float())) and not _tuned(decode_config(pool))
    build("--family", "recurrent", "--state-dtype", "bf16")
    assert _tuned(decode_config(pool)) and _tuned(decode_config(pool.float()))


@pytest.mark.parametrize("how", ["keyboard", "lock"])
def test_build_interrupted_while_tuning_says_how_to_resume(runner, monkeypatch, how):
    """Ctrl-C (or a timeout's SIGINT) during tuning: exit 130 with where the work is kept, not
    a traceback.  Inside concurrent.futures' wait the interrupt can surface as a RuntimeError
    raised while handling it ("release unlocked lock", seen on the H200); an unrelated
    RuntimeError still propagates."""
    import kdagen.cache.gpus
    from kdagen.cache.gpus import get_profile
    from kdagen.cache.heuristics import default_config
    from kdagen.tuning import compile_pool as CP, driver as D

    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: get_profile("h200"))
    monkeypatch.setattr(D, "compile_check",
                        lambda fam, plan, *a, **k: [CP.CompileSurvey(fam, None, 1, [default_config(fam, plan)])])

    def interrupted(*a, **k):
        if how == "keyboard":
            raise KeyboardInterrupt
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("release unlocked lock")

    monkeypatch.setattr(D, "tune_and_store", interrupted)
    res = runner.invoke(main, ["build", "--gpu", "h200", "--head-dim", "64", "--family", "recurrent"])
    assert res.exit_code == 130, res.output
    assert "interrupted after" in res.output and "the same command resumes" in res.output
    assert "Traceback" not in res.output

    def broken(*a, **k):
        raise RuntimeError("something else")

    monkeypatch.setattr(D, "tune_and_store", broken)
    res = runner.invoke(main, ["build", "--gpu", "h200", "--head-dim", "64", "--family", "recurrent"])
    assert res.exit_code != 130 and isinstance(res.exception, RuntimeError) and "something else" in str(res.exception)
