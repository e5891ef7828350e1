"""Kept binaries (kdagen/cache/binaries.py): a kernel compiled for sm_90 on this CPU machine and kept is
found by the lookup Triton's JIT uses (the compile for the same kernel, arguments and target, in a fresh
process with an empty Triton cache, is a cache hit served from the kept folder); another source, target,
specialisation or Triton build is never served it; and a user's own Triton cache manager is left alone.

The compiles run in subprocesses without TRITON_INTERPRET (which the conftest sets for this process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# One decode kernel (K = V = 16) compiled for a target as the build's compile workers do; prints what
# Triton's compiler reported: the cache key and whether it was a cache hit.
_WORKER = r'''
import json, sys
args = json.loads(sys.argv[1])
import triton
from triton import knobs
if args.get("other_triton"):  # another Triton build: its own key
    import triton.runtime.cache as rc, triton.compiler.compiler as cc
    key = rc.triton_key() + "-another-build"
    rc.triton_key = cc.triton_key = lambda: key
hits = []
knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))
import importlib
import torch
from triton.backends.compiler import GPUTarget
root = args.get("root", "kdagen")  # kdagen, or an exported package's runtime (PKG._runtime)
mod = lambda name: importlib.import_module(f"{root}.{name}")
kn, binaries = mod("kernels"), mod("cache.binaries")
default_config, lower, build = mod("cache.heuristics").default_config, mod("codegen.lower").lower, kn.build
Dims, select_spec, prepare_recurrent = mod("ops.inputs").Dims, mod("ops.inputs").select_spec, mod("ops.recurrent").prepare_recurrent
plan = lower(select_spec(False, False, None, False, False), 16, 16, "float32", "recurrent", False)
cfg = default_config("recurrent", plan).replace(num_warps=args.get("num_warps", 1))
B, T = 1, args.get("T", 4)
x = dict(q=torch.zeros(B, T, 1, 16), k=torch.zeros(B, T, 1, 16), v=torch.zeros(B, T, 1, 16),
         g=torch.zeros(B, T, 1, 16), beta=torch.zeros(B, T, 1))
launch, _ = prepare_recurrent(**x, scale=0.25, initial_state=None, output_final_state=True, cu_seqlens=None,
                              state_indices=None, dims=Dims(B=B, T=T, H=1, HV=1, K=16, V=16, N=B), plan=plan,
                              built=build(plan, cfg), by_slot=False, pdl=False)
rep = kn.compile_for_target(launch.fn, launch.args, launch.constexprs, GPUTarget("cuda", args.get("arch", 90), 32),
                            launch.num_warps, launch.num_stages,
                            keep=dict(gpu="h800", family="recurrent") if args.get("keep") else None)
print("@@" + json.dumps(dict(key=rep.cache_key, hits=hits, installed=knobs.cache.manager_class is binaries.manager_class(),
                             manager=str(knobs.cache.manager_class))))
'''


def _compile(tmp: Path, triton_cache: str, **args) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_MANAGER")}
    env.update(KDAGEN_CACHE_DIR=str(tmp / "kdagen"), TRITON_CACHE_DIR=str(tmp / triton_cache),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), PYTHONWARNINGS="ignore")
    env.update(args.pop("env", {}))
    p = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(args)], capture_output=True, text=True, env=env,
                       cwd=str(tmp), timeout=300)
    assert p.returncode == 0 and "@@" in p.stdout, p.stderr[-4000:]
    return json.loads(p.stdout.rsplit("@@", 1)[1])


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kept")
    first = _compile(tmp, "triton-build", keep=True)
    return tmp, first


def test_a_kept_binary_is_what_the_first_compile_elsewhere_loads(kept):
    tmp, first = kept
    assert first["installed"] and first["hits"] == [False]  # compiled at the build, then kept
    (path,) = (tmp / "kdagen" / "binaries").glob("*/info.json")
    info, folder = json.loads(path.read_text()), path.parent
    assert info["key"] == first["key"] and info["target"] == "cuda:90" and info["gpu"] == "h800"
    import triton
    assert info["triton"] == triton.__version__ and "recurrent" in info["kernel"]
    assert any(f.suffix == ".cubin" for f in folder.iterdir())
    # a fresh process, an empty Triton cache: the same compile is a hit, served from the kept folder
    again = _compile(tmp, "triton-fresh")
    assert again["key"] == first["key"] and again["hits"] == [True]
    restored = tmp / "triton-fresh" / folder.name
    group = json.loads(next(restored.glob("__grp__*")).read_text())["child_paths"]
    assert all(Path(p).parent == restored and Path(p).exists() for p in group.values())


@pytest.mark.parametrize("change", [dict(arch=80), dict(num_warps=2), dict(T=16), dict(other_triton=True)],
                         ids=["other-target", "other-config", "other-specialisation", "other-triton-build"])
def test_nothing_else_is_served_a_kept_binary(kept, change):
    """Another target, config (num_warps), argument specialisation (T = 16 is specialised as a multiple of
    16, T = 4 is not) or Triton build has another key, and compiles anew."""
    tmp, first = kept
    other = _compile(tmp, f"triton-{sorted(change)[0]}", **change)
    assert other["key"] != first["key"] and other["hits"] == [False]


def test_the_same_specialisation_shares_the_binary(kept):
    """T = 3 and T = 4 specialise alike (neither is 1 or a multiple of 16): the kept binary serves both."""
    tmp, first = kept
    other = _compile(tmp, "triton-T3", T=3)
    assert other["key"] == first["key"] and other["hits"] == [True]


def test_a_users_own_cache_manager_is_left_alone(kept):
    tmp, _ = kept
    r = _compile(tmp, "triton-own", env={"TRITON_CACHE_MANAGER": "triton.runtime.cache:FileCacheManager"})
    assert not r["installed"] and "FileCacheManager" in r["manager"] and r["hits"] == [False]


def test_an_exported_package_ships_and_serves_the_kept_binaries(kept, tmp_path):
    """`kdagen export --aot` copies the kept binaries of the package's kernels for its GPUs into the package
    (listed in its manifest); the package's own runtime, in a fresh process with an empty Triton cache and no
    kdagen cache, loads its kernel from there (the same key: the same source and specialisation)."""
    from click.testing import CliRunner

    from kdagen.cli import main

    tmp, first = kept
    env = {"KDAGEN_CACHE_DIR": str(tmp / "kdagen")}
    r = CliRunner(env=env).invoke(main, ["export", "--gpu", "h800", "--head-dim", "16", "--dtype", "fp32", "--aot",
                                         "--out", str(tmp_path), "--name", "kda_aot", "--date", "2026-12-06"])
    assert r.exit_code == 0, r.output
    assert "binaries compiled ahead of time: 1" in r.output
    pkg = tmp_path / "kda_aot" / "kda_aot"
    manifest = json.loads((pkg / "manifest.json").read_text())
    (entry,) = manifest["binaries"]
    assert entry["key"] == first["key"] and entry["target"] == "cuda:90" and entry["kernel"] in manifest["sources"]
    assert [p.parent.name for p in (pkg / "binaries").glob("*/info.json")] != []
    served = _compile(tmp_path, "triton-package", root="kda_aot._runtime",
                      env={"PYTHONPATH": str(tmp_path / "kda_aot"), "KDAGEN_CACHE_DIR": str(tmp_path / "none")})
    assert served["installed"] and served["key"] == first["key"] and served["hits"] == [True]
    # without --aot the package ships none (and says nothing of them)
    r = CliRunner(env=env).invoke(main, ["export", "--gpu", "h800", "--head-dim", "16", "--dtype", "fp32",
                                         "--out", str(tmp_path / "plain"), "--name", "kda_aot"])
    assert r.exit_code == 0 and "ahead of time" not in r.output
    plain = tmp_path / "plain" / "kda_aot" / "kda_aot"
    assert json.loads((plain / "manifest.json").read_text())["binaries"] == [] and not (plain / "binaries").exists()
