"""Compile-only checks for Hopper (sm_90) of bench/decode_stream_probe.py's decode kernels, at the
shapes runs 191-192 timed (B=256, H=32, K=V=128): what bench/RESULTS.md (session 38) says the
compiler made of them.

- ``decode_tma``: Triton's pipeliner turns the state tile's descriptor load into a TMA copy into
  shared memory behind an mbarrier, issued ahead of the loop (one per stage but the last), and the
  new tile leaves as an asynchronous TMA store; no spill.
- ``decode_ksplit``: the group's count is a release atomic, the wait an acquire load, and the
  partials are read past L1 (``ld.global.cg``); no spill.

As tests/test_compile_sm90.py: the compiles run in a subprocess started without ``TRITON_INTERPRET``
(this module must not import conftest).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles four kernels

CASES = [("tma", 3, 4, 64), ("tma", 2, 4, 128), ("ksplit", 4, 4, 0), ("ksplit", 8, 2, 0)]


def _worker_compile(cases):
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from bench_script import load_bench
    from kdagen.kernels import jit_source

    probe = load_bench("decode_stream_probe")
    target = GPUTarget("cuda", 90, 32)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    B, H, K, V, P = 256, 32, 128, 128, 260
    bf = torch.bfloat16
    x = dict(q=torch.empty(1, B, H, K, dtype=bf), k=torch.empty(1, B, H, K, dtype=bf), v=torch.empty(1, B, H, V, dtype=bf),
             g=torch.empty(1, B, H, K), beta=torch.empty(1, B, H, dtype=bf), o=torch.empty(1, B, H, V, dtype=bf))
    common = dict(slots=torch.empty(B, dtype=torch.int32), cu=torch.empty(B + 1, dtype=torch.int64))
    results = {}
    for kind, a, warps, bv in cases:
        cid = f"{kind}-{a}-{warps}-{bv}"
        try:
            pool = torch.empty(P, H, K, V)
            if kind == "tma":
                args = dict(**x, desc=probe.pool_desc(pool, bv), **common, n_items=B * H * (V // bv), P=P, scale=0.088)
                fn, consts, stages = probe.decode_tma, dict(H=H, K=K, V=V, BV=bv, S=a), a
            else:
                part, flags = probe.ksplit_scratch(2, 2, V, a, "cpu")
                args = dict(**x, pool=pool, **common, part=part, flags=flags, P=P, scale=0.088)
                fn, consts, stages = probe.decode_ksplit, dict(H=H, K=K, V=V, KS=a), 1
            src, options = jit_source(fn, args, consts, target, warps, stages)
            out = triton.compile(src, target=target, options=options)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "k.ptx")
                with open(path, "w") as f:
                    f.write(out.asm["ptx"])
                rep = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.o")],
                                     capture_output=True, text=True).stderr
            ttgir, ptx = out.asm["ttgir"], out.asm["ptx"]
            r = dict(spill=sum(int(n) for n in re.findall(r"(\d+) bytes spill", rep)),
                     regs=int(re.search(r"Used (\d+) registers", rep).group(1)),
                     release=len(re.findall(r"atom\.global\.gpu\.release\.add", ptx)),
                     acquire=len(re.findall(r"ld\.global\.gpu\.acquire|atom\.global\.gpu\.acquire", ptx)),
                     cg_loads=len(re.findall(r"ld\.global\.cg", ptx)))
            if kind == "tma":  # the item loop: what is requested before it, and in it
                head, loop = ttgir.split(" scf.for ", 1)
                r.update(tma_loads_before_loop=head.count("ttng.async_tma_copy_global_to_local"),
                         tma_loads_in_loop=loop.count("ttng.async_tma_copy_global_to_local"),
                         tma_stores=ttgir.count("ttng.async_tma_copy_local_to_global"))
            results[cid] = r
        except Exception as e:  # reported to the test, which fails with it
            results[cid] = dict(error=f"{type(e).__name__}: {e}"[:4000])
    return results


def _worker_main():
    reply(_worker_compile([tuple(c) for c in json.loads(sys.stdin.read())]))


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker("test_decode_stream_probe_sm90", CASES, "kdagen-stream-probe-sm90-", timeout=600)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_probe_kernels_compile_as_described(case, compiled):
    kind, a, _, _ = case
    r = compiled[f"{case[0]}-{case[1]}-{case[2]}-{case[3]}"]
    assert "error" not in r, r.get("error")
    assert r["spill"] == 0 and r["regs"] <= 255
    if kind == "tma":
        # S - 1 tiles requested before the loop, one more per iteration, the new tile stored through the TMA
        assert r["tma_loads_before_loop"] == a - 1 and r["tma_loads_in_loop"] == 1 and r["tma_stores"] == 1
    else:
        assert r["release"] == 1 and r["acquire"] >= 1 and r["cg_loads"] >= 3
