"""Compile-only check for Hopper (sm_90) of general DPLR's recurrent (decode) kernel and its
backward, through
``triton.compile(..., target=GPUTarget("cuda", 90, 32))``; no GPU is needed.

As tests/sm90/test_family_compile_sm90.py: the launch comes from the op's own launch builder
(``prepare_recurrent`` / ``prepare_recurrent_bwd``, with the dplr plan and a, b in place of
beta) on small CPU tensors, and
the compiles run in a subprocess started without ``TRITON_INTERPRET`` (this module must not
import conftest).  Variants: bf16 and fp16 inputs, K = V = 128 / 256 / 48 x 96, varlen with a
state pool in [V, K] layout, reverse, and a bf16 pool."""
from __future__ import annotations

import json
import sys

import pytest
from sm90_worker import reply, run_compile_worker

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)

# (id, dtype, K, V, extra)
CASES = [
    ("dplr-bf16-K128V128", "bfloat16", 128, 128, {}),
    ("dplr-fp16-K48V96-varlen-pool-v-first-reverse", "float16", 48, 96, dict(varlen=True, v_first=True,
                                                                              reverse=True)),
    ("dplr-bf16-K256V256-bf16-pool", "bfloat16", 256, 256, dict(varlen=True, pool_dtype="bfloat16")),
]


def _worker_compile(cases):
    import torch
    from triton.backends.compiler import GPUTarget

    from kdagen.cache.lookup import resolve
    from kdagen.codegen.lower import lower
    from kdagen.kernels import CompileReport, build, compile_for_target
    from kdagen.ops.dplr import dplr_spec
    from kdagen.ops.inputs import check_inputs
    from kdagen.config import RecurrentBwdConfig
    from kdagen.ops.recurrent import prepare_recurrent
    from kdagen.ops.recurrent_bwd import RecurrentBwdMeta, prepare_recurrent_bwd

    target = GPUTarget("cuda", 90, 32)
    H, HV = 1, 2
    results = {}
    for cid, dt, K, V, extra in cases:
        try:
            dtype = getattr(torch, dt)
            varlen, vf = extra.get("varlen", False), extra.get("v_first", False)
            B, T = (1, 5) if varlen else (3, 1)  # decode: one token per sequence
            q = torch.zeros(B, T, H, K, dtype=dtype)
            v = torch.zeros(B, T, HV, V, dtype=dtype)
            a, b = torch.zeros(B, T, HV, K, dtype=dtype), torch.zeros(B, T, HV, K, dtype=dtype)
            gk = torch.zeros(B, T, HV, K)
            cu = torch.tensor([0, 1, 2, 4, 5], dtype=torch.int64) if varlen else None
            N = 4 if varlen else B
            pool_dtype = getattr(torch, extra.get("pool_dtype", "float32"))
            h0 = torch.zeros((N + 2, HV, V, K) if vf else (N + 2, HV, K, V), dtype=pool_dtype)
            idx = torch.tensor([3, 0, -1, 1], dtype=torch.int32)[:N] if varlen else None
            if idx is None:
                h0 = h0[:N].contiguous()
            spec = dplr_spec()
            dims, _ = check_inputs(q, q, v, gk, None, scale=None, initial_state=h0, cu_seqlens=cu, state_indices=idx,
                                   sync_seqlens=False, state_v_first=vf, rank1=False)
            plan = lower(spec, K, V, dt, "recurrent")
            built = build(plan, resolve("recurrent", plan, None, {"T": dims.T, "B": dims.B, "N": dims.N},
                                        extra.get("pool_dtype", "float32")))
            launch, _ = prepare_recurrent(q, q, v, gk, torch.zeros(1), scale=K ** -0.5, initial_state=h0,
                                          output_final_state=False, cu_seqlens=cu, state_indices=idx, dims=dims,
                                          plan=plan, built=built, state_v_first=vf, ab=(a, b),
                                          reverse=extra.get("reverse", False))
            r = compile_for_target(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                                   launch.num_stages)
            res = dict(is_report=isinstance(r, CompileReport), target=r.target, shared_bytes=r.shared_bytes,
                       source=launch.fn.__name__, args=sorted(launch.args), reverse=launch.constexprs.get("REVERSE"))
            # the backward (training: states [N, HV, ..], no pool), its gradients of a and b
            h0 = torch.zeros((N, HV, V, K) if vf else (N, HV, K, V))
            seqlens = cu.tolist() if cu is not None else None
            meta = RecurrentBwdMeta(dims, seqlens, cu, K ** -0.5, plan, RecurrentBwdConfig(), vf)
            bwd, _ = prepare_recurrent_bwd(meta, dict(q=q, k=q, v=v, g=gk, a=a, b=b), h0, torch.zeros_like(v),
                                           torch.zeros_like(h0), True)
            rb = compile_for_target(bwd.fn, bwd.args, bwd.constexprs, target, bwd.num_warps, bwd.num_stages)
            res.update(bwd_target=rb.target, bwd_shared_bytes=rb.shared_bytes, bwd_source=bwd.fn.__name__,
                       bwd_args=sorted(bwd.args))
            results[cid] = res
        except Exception as e:  # reported to the test, which fails with it
            results[cid] = dict(error=f"{type(e).__name__}: {e}"[:4000])
    return results


def _worker_main():
    cases = json.loads(sys.stdin.read())
    res = _worker_compile([tuple(c) for c in cases])
    reply(res)


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker('test_dplr_decode_compile_sm90', CASES, 'kdagen-dplr-sm90-', timeout=600)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dplr_recurrent_kernel_compiles_for_sm90(case, compiled):
    cid, extra = case[0], case[4]
    e = compiled[cid]
    assert "error" not in e, f"{cid}: the DPLR recurrent kernel failed to compile for sm_90:\n{e['error']}"
    assert e["is_report"] and e["target"] == "cuda:90"
    assert e["source"].startswith("dplr_recurrent"), e["source"]  # the dplr spec's own kernel
    assert "a" in e["args"] and "b" in e["args"] and "beta" not in e["args"]
    assert e["reverse"] is extra.get("reverse", False)
    assert 0 < e["shared_bytes"] <= SMEM_LIMIT, f"{cid}: needs {e['shared_bytes']} bytes"
    assert e["bwd_target"] == "cuda:90" and e["bwd_source"].startswith("dplr_recurrent_bwd"), e["bwd_source"]
    assert {"a", "b", "da", "db"} <= set(e["bwd_args"]) and "dbeta" not in e["bwd_args"]
    assert 0 < e["bwd_shared_bytes"] <= SMEM_LIMIT, f"{cid}: the backward needs {e['bwd_shared_bytes']} bytes"
