"""Compile-only checks for Hopper (sm_90) of general DPLR's backward: the re-run of the forward's
intra launch (the default recompute mode) and the three backward kernels (state, dqkw, intra),
through ``triton.compile(..., target=GPUTarget("cuda", 90, 32))``; no GPU is needed.
Each must compile and fit the H100/H200's shared memory per block.  (The training forward's own
kernels are tests/sm90/test_dplr_compile_sm90.py's.)

As tests/sm90/test_family_compile_sm90.py: the launches come from the op's own launch builder
(:func:`kdagen.ops.dplr.chunk_dplr_bwd_launches`) on small CPU tensors, and the compiles run
in a subprocess started without ``TRITON_INTERPRET`` (this module must not import conftest)."""
from __future__ import annotations

import json
import sys

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles 15 kernels

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)

# (id, dtype, K, V, extra): bound -> safe_gate with that lower bound (factorised diagonal tiles)
CASES = [
    ("dplr-bf16-K128V128", "bfloat16", 128, 128, {}),
    ("dplr-bf16-K64V64-C64-bound", "bfloat16", 64, 64, dict(bound=-5.0, chunk_size=64)),
    ("dplr-fp16-K96V192-varlen-C32", "float16", 96, 192, dict(varlen=True, chunk_size=32)),
    ("dplr-bf16-K128V128-stored", "bfloat16", 128, 128, dict(bound=-5.0, store=True)),
]
KINDS = ("chunk_intra_rerun", "chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra")


def _worker_compile(cases):
    import torch
    from triton.backends.compiler import GPUTarget

    from plain_configs import plain_bwd, plain_train
    from kdagen.kernels import CompileReport, compile_for_target
    from kdagen.ops.dplr import chunk_dplr_bwd_launches

    target = GPUTarget("cuda", 90, 32)
    HV = 2

    def report(kind, launch):
        try:
            r = compile_for_target(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                                   launch.num_stages)
        except Exception as e:  # reported to the test, which fails with it
            return dict(kind=kind, error=f"{type(e).__name__}: {e}"[:4000])
        return dict(kind=kind, is_report=isinstance(r, CompileReport), target=r.target, shared_bytes=r.shared_bytes,
                    source=launch.fn.__name__)

    results = {}
    for cid, dt, K, V, extra in cases:
        try:
            dtype = getattr(torch, dt)
            varlen = extra.get("varlen", False)
            B, T = (1, 70) if varlen else (2, 70)
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(B, T, 1, K, generator=gen).to(dtype)
            k = torch.randn(B, T, 1, K, generator=gen).to(dtype)
            v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
            a = torch.randn(B, T, HV, K, generator=gen).to(dtype)
            b = torch.randn(B, T, HV, K, generator=gen).to(dtype)
            gk = -torch.rand(B, T, HV, K, generator=gen)
            cu = torch.tensor([0, 7, 50, T], dtype=torch.int64) if varlen else None
            N = 3 if varlen else B
            h0 = torch.zeros(N, HV, K, V)
            C = extra.get("chunk_size", 32)
            bound = extra.get("bound")
            cfg = plain_train(chunk_size=C)
            bcfg = plain_bwd(chunk_size=C, sub_chunk=cfg.sub_chunk, store_intermediates=extra.get("store", False))
            fwd, bwd, _ = chunk_dplr_bwd_launches(q, k, v, a, b, gk, config=cfg, bwd_config=bcfg,
                                                  output_final_state=True, initial_state=h0, cu_seqlens=cu,
                                                  safe_gate=bound is not None, lower_bound=bound, with_rerun=True)
            out = [report("chunk_intra_rerun", fwd[2])] if len(fwd) == 3 else []
            out += [report(n, x) for n, x in zip(("chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"), bwd)]
            results[cid] = out
        except Exception as e:
            results[cid] = [dict(kind="build", error=f"{type(e).__name__}: {e}"[:4000])]
    return results


def _worker_main():
    cases = json.loads(sys.stdin.read())
    res = _worker_compile([tuple(c) for c in cases])
    reply(res)


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker('test_dplr_bwd_compile_sm90', CASES, 'kdagen-dplr-bwd-sm90-', timeout=900)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dplr_training_kernels_compile_for_sm90(case, compiled):
    cid, extra = case[0], case[4]
    entries = compiled[cid]
    kinds = [k for k in KINDS if not (extra.get("store") and k == "chunk_intra_rerun")]  # stored: no re-run
    assert [e["kind"] for e in entries] == kinds, entries
    for e in entries:
        assert "error" not in e, f"{cid}: {e['kind']} failed to compile for sm_90:\n{e['error']}"
        assert e["is_report"] and e["target"] == "cuda:90"
        assert e["source"].startswith("dplr_"), e["source"]  # DPLR's own kernels (named by its spec)
        assert 0 < e["shared_bytes"] <= SMEM_LIMIT, f"{cid}: {e['kind']} needs {e['shared_bytes']} bytes"
