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
result = dict(key=rep.cache_key, hits=list(hits), installed=knobs.cache.manager_class is binaries.manager_class(),
              manager=str(knobs.cache.manager_class))
if args.get("modules"):  # the C sources Triton's driver builds at this kernel's first launch, captured
    from unittest import mock
    from triton.backends.nvidia import driver as nv
    src, options = kn.jit_source(launch.fn, launch.args, launch.constexprs, GPUTarget("cuda", 90, 32),
                                 launch.num_warps, launch.num_stages)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    seen = {}
    def capture(src, name, **kw):
        seen[name] = src
        return mock.MagicMock()
    if binaries.builds_launchers():
        with mock.patch.object(nv, "compile_module_from_src", capture), mock.patch.object(nv, "library_dirs", list):
            nv.CudaUtils.__init__(object.__new__(nv.CudaUtils))
            nv.CudaLauncher(src, compiled.metadata)
    ours = binaries.launch_module_sources(src, compiled.metadata)
    json.dump(dict(triton=seen, ours=ours), open(args["modules"], "w"))
print("@@" + json.dumps(result))
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
    first = _compile(tmp, "triton-build", keep=True, modules=str(tmp / "modules.json"))
    return tmp, first


def test_a_kept_binary_is_what_the_first_compile_elsewhere_loads(kept):
    tmp, first = kept
    assert first["installed"] and first["hits"] == [False]  # compiled at the build, then kept
    (path,) = [p for p in (tmp / "kdagen" / "binaries").glob("*/info.json") if "kernel" in json.loads(p.read_text())]
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


# A fresh process with an empty Triton cache and no C compiler (Triton's build raises): each C source is looked
# up as Triton's driver looks it up at a first launch; prints where each module came from.  A stand-in for the
# driver's library (the kept modules name libcuda.so.1) is loaded first, so that they load on this CPU machine.
_MODULE_WORKER = r'''
import ctypes, json, sys
args = json.loads(sys.argv[1])
ctypes.CDLL(args["driver"], mode=ctypes.RTLD_GLOBAL)
import triton.runtime.build as tb
built = []
def no_compiler(name, *a, **kw):
    built.append(name)
    raise RuntimeError("no C compiler here")
tb._build = no_compiler
import kdagen.kernels  # installs the kept-binary cache manager (as the ops do on import)
served = {}
for name, src in args["sources"].items():
    try:
        served[name] = tb.compile_module_from_src(src=src, name=name).__file__
    except RuntimeError:
        served[name] = None
print("@@" + json.dumps(dict(served=served, built=built)))
'''


def test_the_launch_modules_a_first_launch_builds_are_kept_and_served(kept, tmp_path):
    """Beside the kernel, the build keeps the C modules Triton's driver builds at its first launch -- its
    launcher and the driver utilities -- from exactly the sources Triton's own ``CudaLauncher`` and
    ``CudaUtils`` build (captured), under Triton's key for them, linked to name ``libcuda.so.1``.  A fresh
    process with an empty Triton cache loads them from the kept folder without building; another source (another
    signature's launcher) is not served and is built."""
    import re
    import sysconfig

    from kdagen.cache import binaries

    tmp, _ = kept
    sources = json.loads((tmp / "modules.json").read_text())
    assert sources["ours"] == sources["triton"]
    infos = {json.loads(p.read_text())["module"]: (json.loads(p.read_text()), p.parent)
             for p in (tmp / "kdagen" / "binaries").glob("*/info.json") if "module" in json.loads(p.read_text())}
    if not binaries.builds_launchers():  # Triton >= 3.7: one generic launcher, nothing built per kernel
        assert sources["ours"] == {} and infos == {}
        return
    assert set(sources["ours"]) == {"cuda_utils", "__triton_launcher"}
    assert set(infos) == {"cuda_utils", "__triton_launcher"}
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name, (info, folder) in infos.items():
        assert info["key"] == binaries.module_key(sources["ours"][name]) and info["folder"] == folder.name
        so = folder / f"{name}{suffix}"
        needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
        assert re.search(r"NEEDED.*\[libcuda\.so\.1\]", needed), needed
    # the stand-in driver library: every cu* function the modules name, empty
    names = sorted(set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\b", "".join(sources["ours"].values()))))
    (tmp_path / "drv.c").write_text("".join(f"void {n}(void) {{}}\n" for n in names))
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "libcuda.so.1"),
                    str(tmp_path / "drv.c")], check=True)
    other = sources["ours"]["__triton_launcher"].replace("int gridX", "int  gridX", 1)
    assert other != sources["ours"]["__triton_launcher"]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_MANAGER")}
    env.update(KDAGEN_CACHE_DIR=str(tmp / "kdagen"), TRITON_CACHE_DIR=str(tmp_path / "triton-fresh"),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), PYTHONWARNINGS="ignore")
    args = dict(driver=str(tmp_path / "libcuda.so.1"), sources={**sources["ours"], "other": other})
    p = subprocess.run([sys.executable, "-c", _MODULE_WORKER, json.dumps(args)], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path), timeout=300)
    assert p.returncode == 0 and "@@" in p.stdout, p.stderr[-4000:]
    r = json.loads(p.stdout.rsplit("@@", 1)[1])
    assert r["built"] == ["other"] and r["served"]["other"] is None
    for name, (info, folder) in infos.items():
        path = Path(r["served"][name])
        assert path.parent == tmp_path / "triton-fresh" / info["folder"]
        assert path.read_bytes() == (folder / f"{name}{suffix}").read_bytes()


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
    from kdagen.cache.binaries import builds_launchers
    modules = ["__triton_launcher", "cuda_utils"] if builds_launchers() else []
    assert sorted(m["module"] for m in manifest["launch_modules"]) == modules
    assert sorted(p.name.split(".")[0] for p in (pkg / "binaries").glob("*/*.so")) == modules
    served = _compile(tmp_path, "triton-package", root="kda_aot._runtime",
                      env={"PYTHONPATH": str(tmp_path / "kda_aot"), "KDAGEN_CACHE_DIR": str(tmp_path / "none")})
    assert served["installed"] and served["key"] == first["key"] and served["hits"] == [True]
    # without --aot the package ships none (and says nothing of them)
    r = CliRunner(env=env).invoke(main, ["export", "--gpu", "h800", "--head-dim", "16", "--dtype", "fp32",
                                         "--out", str(tmp_path / "plain"), "--name", "kda_aot"])
    assert r.exit_code == 0 and "ahead of time" not in r.output
    plain = tmp_path / "plain" / "kda_aot" / "kda_aot"
    assert json.loads((plain / "manifest.json").read_text())["binaries"] == [] and not (plain / "binaries").exists()
