"""Compile-only checks for Hopper (sm_90): the training state passes load every tile of a chunk
ahead of its use.

The forward state pass (``chunk_state``) and the reverse state pass (``chunk_bwd_state``) walk the
chunks of a sequence one after another, so a global load that the loop waits for lies on every
chunk's path.  Triton's software pipeliner turns a loop's tile loads into asynchronous copies
issued ``num_stages - 1`` iterations ahead -- but only loads it can copy in 4-byte or wider pieces
(a mask that varies along the contiguous axis leaves 2-byte ones) -- and the templates load the
small 1-D tiles (G_n) one iteration ahead by hand.  This test compiles the heuristic training
launches of KDA, Gated DeltaNet, DeltaNet and general DPLR for sm_90 (no GPU) and reads the loop
body of the Triton GPU IR: every 2-D load there must be an asynchronous copy, and every
synchronous load must be a 1-D tile whose value is carried to the next iteration (a prefetch).  The
inference forward's state pass (``chunk_pass``, KDA's default configs) is held to the same rule.
Before this was checked, the reverse pass read A_qk causally masked and transposed in registers
(a synchronous [32, 32] load per chunk), and the forward pass read G_n in the chunk that used it.

As tests/sm90/test_compile_sm90.py: the compiles run in a subprocess started without
``TRITON_INTERPRET`` (this module must not import conftest).
"""
from __future__ import annotations

import json
import re
import sys

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles a dozen kernels

# (id, member, (N, HV) of the heuristic's shape hint)
CASES = [
    ("kda-few-heads", "kda", (2, 16)),
    ("kda-many-heads", "kda", (1, 96)),
    ("gdn", "gdn", (2, 16)),
    ("deltanet", "deltanet", (2, 16)),
    ("dplr", "dplr", (2, 16)),
]
PASSES = ("chunk_state", "chunk_bwd_state")
INFERENCE = ("chunk_pass",)  # the inference forward's state pass (KDA's cases)


def loop_loads(ttgir: str) -> dict:
    """The loads inside the outermost ``scf.for`` of a kernel's TTGIR: the synchronous ones as
    (SSA name, tile shape, carried to the next iteration), and the count of asynchronous copies."""
    lines = ttgir.splitlines()
    start = next(i for i, ln in enumerate(lines) if " scf.for " in ln)
    depth, body = 0, []
    for ln in lines[start:]:
        depth += ln.count("{") - ln.count("}")
        body.append(ln)
        if depth <= 0 and len(body) > 1:
            break
    yields = " ".join(ln for ln in body if "scf.yield" in ln)
    sync = []
    for ln in body:
        m = re.match(r"\s*(%[\w#]+) = tt\.load .*?: tensor<([0-9x]+)x", ln)
        if m:
            name, shape = m.group(1), m.group(2)
            # carried: the loaded value, or a cast of it (a prefetch converted on arrival), is yielded
            names = {name}
            for other in body:
                c = re.match(r"\s*(%[\w#]+) = (arith\.extf|arith\.truncf|ttg\.convert_layout) (%[\w#]+)", other)
                if c and c.group(3) in names:
                    names.add(c.group(1))
            carried = any(re.search(re.escape(n) + r"\b", yields) for n in names)
            sync.append((name, shape, carried))
    return dict(sync=sync, async_copies=sum("async_copy_global_to_local" in ln for ln in body))


def _worker_compile(cases):
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from kdagen import spec as S
    from kdagen.kernels import jit_source
    from kdagen.ops.chunk import chunk_kda_bwd_launches, chunk_kda_launches
    from kdagen.ops.dplr import chunk_dplr_bwd_launches
    from kdagen.ops.member import chunk_member_launches

    target = GPUTarget("cuda", 90, 32)
    K = V = 128
    bf = torch.bfloat16
    results = {}
    for cid, member, (B, H) in cases:
        # B sequences of H heads: the heuristic picks the tiles of that shape (its program count)
        T = 64
        x = [torch.zeros(B, T, H, d, dtype=bf) for d in (K, K, V)]
        h0 = torch.zeros(B, H, K, V)
        try:
            if member == "kda":
                gate = dict(safe_gate=True, lower_bound=-5.0)
                fwd, bwd, _ = chunk_kda_bwd_launches(*x, torch.zeros(B, T, H, K), torch.zeros(B, T, H, dtype=bf),
                                                     initial_state=h0, output_final_state=True, **gate)
                inf, _ = chunk_kda_launches(*x, torch.zeros(B, T, H, K), torch.zeros(B, T, H, dtype=bf),
                                            initial_state=h0, output_final_state=True, **gate)
                bwd = list(bwd) + list(inf)
            elif member == "dplr":
                fwd, bwd, _ = chunk_dplr_bwd_launches(*x, torch.zeros(B, T, H, K, dtype=bf),
                                                      torch.zeros(B, T, H, K, dtype=bf), torch.zeros(B, T, H, K),
                                                      initial_state=h0, output_final_state=True)
            else:
                g = -torch.rand(B, T, H) if member == "gdn" else None
                spec = S.gdn() if member == "gdn" else S.deltanet()
                fwd, bwd, _ = chunk_member_launches(spec, *x, g, torch.zeros(B, T, H, dtype=bf), training=True,
                                                    initial_state=h0, output_final_state=True)
            out = {}
            for ln in list(fwd) + list(bwd):
                if ln.kernel in PASSES + INFERENCE:
                    src, options = jit_source(ln.fn, ln.args, ln.constexprs, target, ln.num_warps, ln.num_stages)
                    ttgir = triton.compile(src, target=target, options=options).asm["ttgir"]
                    out[ln.kernel] = dict(loop_loads(ttgir), num_stages=ln.num_stages)
            results[cid] = out
        except Exception as e:  # reported to the test, which fails with it
            results[cid] = dict(error=f"{type(e).__name__}: {e}"[:4000])
    return results


def _worker_main():
    reply(_worker_compile([tuple(c) for c in json.loads(sys.stdin.read())]))


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker("test_pipelined_loads_sm90", CASES, "kdagen-pipelined-sm90-", timeout=900)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_state_passes_issue_their_loads_ahead(case, compiled):
    res = compiled[case[0]]
    assert "error" not in res, res.get("error")
    assert sorted(res) == sorted(PASSES + (INFERENCE if case[1] == "kda" else ())), res
    for kernel, r in res.items():
        # the pipelined loop the check is about (the inference pass pipelines its loop by tl.range)
        assert r["num_stages"] > 1 or kernel in INFERENCE, (kernel, r)
        # the 2-D tiles (W, kg, qg, dO, A_qk, U...) are asynchronous copies
        assert r["async_copies"] >= 3, (kernel, r)
        for name, shape, carried in r["sync"]:
            assert "x" not in shape, f"{case[0]}: {kernel} waits for a [{shape}] tile load in its chunk loop"
            assert carried, f"{case[0]}: {kernel} loads a [{shape}] tile ({name}) in the chunk that uses it"


def test_loop_loads_parser_finds_a_synchronous_tile_load():
    """The IR reader on a loop with one asynchronous copy, one carried 1-D load and one 2-D load
    used in place (the shapes of the reverse pass before its A_qk load was issued ahead)."""
    ir = "\n".join([
        "module {",
        "  tt.func @k() {",
        "    %r:2 = scf.for %i = %a to %b step %c iter_args(%x = %x0, %g = %g0) {",
        "      %t = tt.load %p, %m, %o : tensor<32x32x!tt.ptr<bf16>, #blocked3>",
        "      %gn = tt.load %q, %m2, %o2 : tensor<128x!tt.ptr<f32>, #blocked4>",
        "      %bt = tt.load %q2, %m3, %o3 : tensor<64x!tt.ptr<bf16>, #blocked5>",
        "      %bt2 = arith.extf %bt : tensor<64xbf16, #blocked5> to tensor<64xf32, #blocked5>",
        "      %w = ttg.async_copy_global_to_local %pw, %sw mask %mw : tensor<32x128x!tt.ptr<bf16>, #b>",
        "      scf.yield %x1, %gn, %bt2 : tensor<128x16xf32, #mma1>, tensor<128xf32, #blocked4>, tensor<64xf32>",
        "    }",
        "    tt.return",
        "  }",
        "}",
    ])
    r = loop_loads(ir)
    assert r["async_copies"] == 1
    assert r["sync"] == [("%t", "32x32", False), ("%gn", "128", True), ("%bt", "64", True)]
