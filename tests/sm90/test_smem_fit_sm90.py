"""Compile-only sm_90 checks of the shared-memory fit (kdagen.cache.smem): general DPLR's chunk launches at
K = V = 100, fp16 and bf16, as an H100 call with ``chunk_size=64`` and with the default chunks resolves them
(FLA's tests/ops/test_dplr_delta.py shape: the heuristic's three-stage state passes needed 264,192 bytes),
fit in 232,448 bytes; and :func:`kdagen.cache.smem.estimate` is at least what every estimated launch
compiles to, the unfitted configs' too (which exceed the limit: the estimate must say so).

As tests/sm90/test_dplr_compile_sm90.py: the launches come from the op's launch builders on small CPU tensors,
and the compiles run in a subprocess started without ``TRITON_INTERPRET``."""
from __future__ import annotations

import json
import sys

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles ~25 kernels

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)

# (id, dtype, K, chunk_size, fitted to the H100)
CASES = [
    ("dplr-fp16-K100-C64", "float16", 100, 64, True),
    ("dplr-bf16-K100-C64", "bfloat16", 100, 64, True),
    ("dplr-bf16-K100-default", "bfloat16", 100, None, True),
    ("dplr-fp16-K100-C64-unfitted", "float16", 100, 64, False),
]


def _worker_compile(cases):
    import contextlib

    import torch
    from triton.backends.compiler import GPUTarget

    from kdagen.cache import smem
    from kdagen.cache.gpus import get_profile
    from kdagen.kernels import compile_for_target, with_repairs
    from kdagen.ops.dplr import _configs, _prepare, chunk_dplr_bwd_launches

    target = GPUTarget("cuda", 90, 32)
    results = {}
    for cid, dt, K, cs, fitted in cases:
        try:
            dtype = getattr(torch, dt)
            gen = torch.Generator().manual_seed(0)
            B, T, H = 2, 64, 2
            q, k, v, a, b = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(5))
            gk = -torch.rand(B, T, H, K, generator=gen)
            call, _, _ = _prepare("t", q, k, v, a, b, gk, training=True)
            with smem.target(get_profile("h100")) if fitted else contextlib.nullcontext():
                cfg, bcfg = _configs("t", call, None, True, cs)
            est = {**smem.estimate("chunk_train", call.plan, cfg), **smem.estimate("chunk_bwd", call.plan, bcfg)}
            fwd, bwd, _ = chunk_dplr_bwd_launches(q, k, v, a, b, gk, config=cfg, bwd_config=bcfg)
            out = []
            for ln in with_repairs(list(fwd) + list(bwd)):
                r = compile_for_target(ln.fn, ln.args, ln.constexprs, target, ln.num_warps, ln.num_stages)
                out.append(dict(kind=ln.kernel, shared=r.shared_bytes, estimate=est.get(ln.kernel)))
            results[cid] = out
        except Exception as e:
            results[cid] = [dict(kind="build", error=f"{type(e).__name__}: {e}"[:4000])]
    return results


def _worker_main():
    cases = json.loads(sys.stdin.read())
    reply(_worker_compile([tuple(c) for c in cases]))


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker("test_smem_fit_sm90", CASES, "kdagen-smem-sm90-", timeout=1200)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fitted_configs_fit_and_the_estimate_bounds_the_compiles(case, compiled):
    cid, fitted = case[0], case[4]
    entries = compiled[cid]
    assert entries and all("error" not in e for e in entries), entries
    assert {"chunk_state", "chunk_bwd_state", "chunk_bwd_dqkw"} <= {e["kind"] for e in entries}
    for e in entries:
        if fitted:
            assert 0 < e["shared"] <= SMEM_LIMIT, f"{cid}: {e['kind']} needs {e['shared']} bytes"
        if e["estimate"] is not None:  # never under the compile: a launch over the limit is estimated over it
            assert e["estimate"] >= e["shared"], f"{cid}: {e['kind']} estimated {e['estimate']}, needs {e['shared']}"
    if not fitted:  # the configs: over the limit, and estimated so
        over = [e for e in entries if e["shared"] > SMEM_LIMIT]
        assert over and all(e["estimate"] is not None and e["estimate"] > SMEM_LIMIT for e in over), entries
