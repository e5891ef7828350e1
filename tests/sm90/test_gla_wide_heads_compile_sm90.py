"""Compile-only checks for Hopper (sm_90) of GLA's launches at head dims past 256 (K=V=320 and 512, as
flash-linear-attention's test_chunk runs chunk_gla): inference forward (solve, pass), training forward
(intra, state), backward (re-run, state, dqkw, intra), decode and its backward, with the heuristic
configs, through ``triton.compile(..., target=GPUTarget("cuda", 90, 32))``; no GPU is needed.  Every
launch must fit the 232,448 bytes of shared memory; ptxas's register and spill report (the Triton
wheel's ptxas) bounds the spills: none in the state passes and the recurrent kernels, whose [512, BV]
float32 state the heuristics put on 16-wide V tiles over 8 warps.

As tests/sm90/test_family_compile_sm90.py, the compiles run in a subprocess started without
``TRITON_INTERPRET`` (this module must not import conftest)."""
from __future__ import annotations

import json
import sys

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles ~40 kernels

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)

# (id, dtype, K, V, lower bound)
CASES = [
    ("fp16-K320V320", "float16", 320, 320, None),
    ("bf16-K320V320-bound", "bfloat16", 320, 320, -5.0),
    ("bf16-K512V512", "bfloat16", 512, 512, None),
    ("fp16-K512V512-bound", "float16", 512, 512, -5.0),
]
KINDS = ("chunk_solve", "chunk_pass", "chunk_intra", "chunk_state", "chunk_bwd_rerun", "chunk_bwd_state",
         "chunk_bwd_dqkw", "chunk_bwd_intra", "recurrent", "recurrent_bwd")
# the launches that hold the state (or its gradient) [BK, BV] in registers: no spill at all
STATE_KINDS = ("chunk_pass", "chunk_state", "chunk_bwd_state", "recurrent", "recurrent_bwd")
# the others: the solve holds its 32 rows whole ([32, 512] tiles; 216-308 B a thread at 512); the intra
# gradients spill 64 B in fp16 at any K (their K tile is 32 wide)
MAX_SPILL = 512


def _ptxas(ptx: str):
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path  # the ptxas Triton assembles sm_90 code with (Triton 3.9: its newer one)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        r = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    regs = max((int(m) for m in re.findall(r"Used (\d+) registers", r.stderr)), default=None)
    spill = max((int(m) for m in re.findall(r"(\d+) bytes spill stores", r.stderr)), default=None)
    return regs, spill


def _worker_compile(cases):
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from kdagen.cache.lookup import resolve
    from kdagen.codegen.lower import lower, spec_max_head_dim
    from kdagen.kernels import jit_source
    from kdagen.ops.family import gla_spec
    from kdagen.ops.inputs import check_inputs
    from kdagen.ops.member import chunk_member_launches
    from kdagen.ops.recurrent import prepare_recurrent
    from kdagen.ops.recurrent_bwd import RecurrentBwdMeta, current_config, prepare_recurrent_bwd
    from kdagen.kernels import build

    target = GPUTarget("cuda", 90, 32)
    HV = 2

    def report(kind, launch):
        try:
            src, options = jit_source(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                                      launch.num_stages)
            out = triton.compile(src, target=target, options=options)
            regs, spill = _ptxas(out.asm["ptx"])
        except Exception as e:  # reported to the test, which fails with it
            return dict(kind=kind, error=f"{type(e).__name__}: {e}"[:4000])
        c = launch.constexprs
        return dict(kind=kind, shared_bytes=int(out.metadata.shared), regs=regs, spills=spill,
                    num_warps=launch.num_warps, source=launch.fn.__name__, BK=c.get("BK"), BV=c.get("BV"))

    results = {}
    for cid, dt, K, V, bound in cases:
        try:
            dtype = getattr(torch, dt)
            B, T = 2, 70
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(B, T, 1, K, generator=gen).to(dtype)
            k = torch.randn(B, T, 1, K, generator=gen).to(dtype)
            v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
            g = -torch.rand(B, T, HV, K, generator=gen)
            h0 = torch.zeros(B, HV, K, V)
            spec = gla_spec(bound)
            out = []
            fwd, _ = chunk_member_launches(spec, q, k, v, g, None, output_final_state=True, initial_state=h0)
            out += [report("chunk_solve", fwd[0]), report("chunk_pass", fwd[1])]
            tf, tb, _ = chunk_member_launches(spec, q, k, v, g, None, training=True, output_final_state=True,
                                              initial_state=h0)
            out += [report(x.kernel, x) for x in list(tf) + list(tb)]
            dims, seqlens = check_inputs(q, k, v, g, None, scale=None, initial_state=h0, cu_seqlens=None,
                                         decay=spec.decay, rank1=False, max_head_dim=spec_max_head_dim(spec))
            plan = lower(spec, K, V, dt, "recurrent")
            built = build(plan, resolve("recurrent", plan, None, {"T": dims.T, "B": dims.B, "N": dims.N}))
            gb = torch.zeros(1)  # no beta: not read
            launch, _ = prepare_recurrent(q, k, v, g, gb, scale=K ** -0.5, initial_state=h0, output_final_state=True,
                                          cu_seqlens=None, state_indices=None, dims=dims, plan=plan, built=built,
                                          A_log=None, dt_bias=None, state_v_first=False)
            out.append(report("recurrent", launch))
            meta = RecurrentBwdMeta(dims, seqlens, None, K ** -0.5, plan, current_config(plan), False)
            launch, _ = prepare_recurrent_bwd(meta, dict(q=q, k=k, v=v, g=g, beta=gb, A_log=None, dt_bias=None),
                                              h0, torch.zeros_like(v), torch.zeros_like(h0), True)
            out.append(report("recurrent_bwd", launch))
            results[cid] = out
        except Exception as e:
            results[cid] = [dict(kind="build", error=f"{type(e).__name__}: {e}"[:4000])]
    return results


def _worker_main():
    cases = json.loads(sys.stdin.read())
    reply(_worker_compile([tuple(c) for c in cases]))


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker("test_gla_wide_heads_compile_sm90", CASES, "kdagen-gla-wide-sm90-", timeout=1500)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gla_wide_heads_compile_for_sm90(case, compiled):
    cid = case[0]
    entries = compiled[cid]
    assert [e["kind"] for e in entries] == list(KINDS), entries
    for e in entries:
        assert "error" not in e, f"{cid}: {e['kind']} failed to compile for sm_90:\n{e['error']}"
        assert e["source"].startswith("gla"), e["source"]
        assert 0 < e["shared_bytes"] <= SMEM_LIMIT, f"{cid}: {e['kind']} needs {e['shared_bytes']} bytes"
        assert e["regs"] is not None and e["spills"] is not None, e
        limit = 0 if e["kind"] in STATE_KINDS else MAX_SPILL
        assert e["spills"] <= limit, f"{cid}: {e['kind']} spills {e['spills']} B a thread ({e})"
        if e["kind"] in STATE_KINDS[:3] + ("recurrent_bwd",):  # the state row whole, on narrow V tiles
            assert e["BK"] == 512 and e["BV"] == 16 and e["num_warps"] == 8, e
