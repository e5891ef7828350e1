"""The compile-check builds the binaries the device will load.

`kdagen build` compiles every candidate for the named GPU without that GPU; on the matching
GPU the tuner then builds each candidate through Triton's JIT.  Both must produce the same
kernel -- the same specialisation of every argument and the same options, hence the same
on-disk cache key -- or every kernel is compiled twice (a tuning run on an H200 spent 81 s
compile-checking and then compiled again on the device).  Checked here without a GPU:

1. :func:`kdagen.kernels.compile_for_target` and Triton's own JIT (``JITFunction.warmup``
   under a stand-in driver that reports an sm_90 device) give the same cache key;
2. the kernels a tuning candidate's build launches at its check shape (the op's code path,
   launches recorded instead of run) are those the precompile compiles for that shape (the
   compile-check compiles the family's own launches of them).

Runs in a subprocess without ``TRITON_INTERPRET`` (the conftest sets it for this process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from kdagen.cache.heuristics import default_config
from kdagen.tuning import candidates as CA, compile_pool as CP, families as F
import kdagen.kernels as KN
import kdagen.ops.chunk as OC
import kdagen.ops.recurrent as OR
from kdagen.kernels import compile_for_target, jit_source

import pytest
pytestmark = pytest.mark.slow  # subprocesses, compiles or long interpreter runs

target = GPUTarget("cuda", 90, 32)
sa = {"safe_gate": True, "lower_bound": -5.0}
out = {"jit": [], "build": {}}

# 1. compile_for_target's cache key is the JIT's
class StandInDriver:
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return target

plan = F.lower_for(F.family_spec("recurrent", sa), "recurrent", 16, 16, torch.float16)
shape = F.check_shape("recurrent", (4, 1, 2, 2))
# the decode step as on a CPU, and as on an sm_90 GPU: a programmatic dependent launch (launch_pdl, a compile
# option of its own, beside the PDL constexpr)
pairs = [CP.launches_for(plan, default_config("recurrent", plan), torch.float16, sa, shape, pdl=pdl)[0]
         for pdl in (False, True)]
reps = [compile_for_target(ln.fn, ln.args, ln.constexprs, target, ln.num_warps, ln.num_stages) for ln in pairs]
driver.set_active(StandInDriver())
kerns = [ln.fn.warmup(**ln.args, **ln.constexprs, grid=ln.grid, num_warps=ln.num_warps, num_stages=ln.num_stages,
                      **KN.compile_options(), **KN.launch_options(ln.constexprs))  # as kdagen.kernels.launch does
         for ln in pairs]
# (the stand-in stays: nothing below launches)
out["jit"] = [[r.cache_key for r in reps], [k.hash for k in kerns], [ln.constexprs["PDL"] for ln in pairs]]

# 2. what a candidate's build launches at its check shape is what compile_check compiles for it
ran = []
def record(fn, grid, args, constexprs, num_warps, num_stages):
    src, opts = jit_source(fn, args, constexprs, target, num_warps, num_stages)
    ran.append([fn.__name__, src.hash(), sorted(opts.items())])
KN.launch = OR.launch = record
OC.check_runnable = OR.check_runnable = lambda q: None
# (chunk_bwd_c32: the backward after the training forward's own heuristic, C=32, as the tuner runs it:
# the re-run from kept tiles and the split intra launches)
for key, shape in [("chunk_fwd", (2, 4096, 16, 16)), ("chunk_bwd", (1, 100, 2, 2)), ("chunk_bwd_c32", (1, 100, 2, 2)),
                   ("recurrent", (64, 1, 4, 4))]:
    fam = key.replace("_c32", "")
    plan = F.lower_for(F.family_spec(fam, sa), fam, 32, 32, torch.bfloat16)
    hint = {"N": shape[0], "HV": shape[3]}
    fwd = None
    if fam == "chunk_bwd":
        fwd = default_config("chunk_train" if key.endswith("c32") else "chunk_fwd", plan, hint)
    cfg = default_config(fam, plan, hint, fwd)
    ran.clear()
    CA.KernelCandidate(fam, None, plan, sa, torch.bfloat16, shape, device="cpu", fwd_config=fwd).build(cfg)
    compiled = []
    for ln in KN.with_repairs(CP.launches_for(plan, cfg, torch.bfloat16, sa, F.check_shape(fam, shape), fwd,
                                              with_forward=True)):
        src, opts = jit_source(ln.fn, ln.args, ln.constexprs, target, ln.num_warps, ln.num_stages)
        compiled.append([ln.fn.__name__, src.hash(), sorted(opts.items())])
    out["build"][key] = {"ran": ran[:], "compiled": compiled}

# 3. a kept build keeps what a training step without states runs (FLA's default call: no initial state, no
# final state -- other state-pass kernels than the tuner's call with both), and the compile-check alone does not
fam, shape = "chunk_bwd", (1, 100, 2, 2)
plan = F.lower_for(F.family_spec(fam, sa), fam, 32, 32, torch.bfloat16)
cfg = default_config(fam, plan, {"N": 1, "HV": 2})
fwd_cfg = default_config("chunk_train", plan, {"N": 1, "HV": 2}).replace(chunk_size=cfg.chunk_size,
                                                                        sub_chunk=cfg.sub_chunk)
def ident(launches):
    return sorted({json.dumps([ln.fn.__name__, jit_source(ln.fn, ln.args, ln.constexprs, target, ln.num_warps,
                                                          ln.num_stages)[0].hash()]) for ln in KN.with_repairs(launches)})
x = CP._dummy_inputs(plan, torch.bfloat16, F.check_shape(fam, shape))
x["initial_state"] = None
f, b, _ = OC.chunk_kda_bwd_launches(**x, output_final_state=False, config=fwd_cfg, bwd_config=cfg, with_rerun=True,
                                    **F.op_args(sa))
out["bare"] = {"step": ident(list(f) + list(b)),
               **{f"keep={k}": ident(CP.checked_launches(fam, plan, cfg, torch.bfloat16, sa, F.check_shape(fam, shape),
                                                         fwd_cfg, None, torch.float32, False, k)) for k in (True, False)}}
print(json.dumps(out))
'''


def test_compile_check_builds_what_the_device_jit_loads(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KDAGEN_CACHE_DIR"] = str(tmp_path)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    ours, jits, pdl = out["jit"]
    assert pdl == [False, True] and all(ours) and ours == jits and ours[0] != ours[1]
    for fam, d in out["build"].items():
        # every kernel the build launched (the backward's: the training forward, then its three
        # launches) is one the precompile compiles, with the same specialisation and options
        compiled = {json.dumps(c) for c in d["compiled"]}
        ran = {json.dumps(c) for c in d["ran"]}
        # chunk_bwd at the inference forward's C=64: the training forward's three launches (its heuristic
        # splits the output out of the state pass in bf16: intra, states-only pass, output), the re-run of
        # its intra launch (four sub-tiles per chunk: no re-run from kept tiles, no split), the reverse
        # state pass, the chunk-parallel products and the intra-chunk gradients
        # chunk_bwd_c32: the training forward's three, the re-run from kept tiles, state, dqkw, wy, intra; and
        # after each launch with a checked diagonal (the training forward's intra, its re-run, wy, the intra
        # gradients) its repair launch
        assert len(d["compiled"]) == {"chunk_fwd": 2, "chunk_bwd": 10, "chunk_bwd_c32": 11, "recurrent": 1}[fam]
        assert ran and ran == compiled, fam
    step, kept, checked = (set(out["bare"][k]) for k in ("step", "keep=True", "keep=False"))
    assert step <= kept  # a first training step finds every kernel kept
    # its state passes (forward USE_H0/STORE_HT off, backward USE_DHT/STORE_DH0 off) are only kept, not checked
    assert sorted(json.loads(s)[0].rsplit("_", 1)[0] for s in step - checked) == ["kda_chunk_bwd_state",
                                                                                   "kda_chunk_state"]
