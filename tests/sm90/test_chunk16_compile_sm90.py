"""Compile-only checks for Hopper (sm_90) of the launches a ``chunk_size=16`` call makes, with the configs
the ops choose (heuristics: no config given): each member's inference call (the training forward's intra
and state launches: the solve takes 32 or 64) and its training step (the training forward, the
backward's re-run of the intra launch, the backward), and general DPLR's (chunk_dplr_delta_rule: FLA's
default length), through ``triton.compile(..., target=GPUTarget("cuda", 90, 32))``; no GPU is needed.
Every launch that has chunks walks 16-row ones, compiles and fits the H100/H200's shared memory per block.

As tests/sm90/test_family_compile_sm90.py: the launches come from the ops' own launch builders
(:func:`kdagen.ops.member.chunk_member_launches` with ``chunk_size``; general DPLR's with the configs
:func:`kdagen.ops.dplr._configs` gives at 16 rows) on small CPU tensors, and the compiles run in a
subprocess started without ``TRITON_INTERPRET`` (this module must not import conftest)."""
from __future__ import annotations

import json
import sys

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles ~80 kernels

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)

# (id, member, dtype, K, V, extra)
CASES = [
    ("gdn-bf16-K128V128", "gdn", "bfloat16", 128, 128, {}),  # its heuristic trains on 64 / 32: pinned to 16 / 16
    ("gdn-bf16-K128V128-gate-in-kernel", "gdn", "bfloat16", 128, 128, dict(gik=True)),
    ("gdn-fp16-K96V192-varlen", "gdn", "float16", 96, 192, dict(varlen=True)),
    ("deltanet-bf16-K128V128", "deltanet", "bfloat16", 128, 128, {}),
    ("deltanet-fp16-K48V96-varlen-v-first", "deltanet", "float16", 48, 96, dict(varlen=True, v_first=True)),
    ("gla-bf16-K128V128-bound", "gla", "bfloat16", 128, 128, dict(bound=-5.0)),
    ("gla-bf16-K128V128", "gla", "bfloat16", 128, 128, {}),
    ("gdn-bf16-K256V256", "gdn", "bfloat16", 256, 256, {}),
    # general DPLR: FLA's test shapes (D = 64 and 16, fp16, safe_gate), bf16 unbounded, the stored intermediates
    ("dplr-fp16-K64V64-bound", "dplr", "float16", 64, 64, dict(bound=-5.0)),
    ("dplr-fp16-K16V16-bound", "dplr", "float16", 16, 16, dict(bound=-5.0)),
    ("dplr-bf16-K128V128", "dplr", "bfloat16", 128, 128, {}),
    ("dplr-bf16-K64V64-bound-stored-varlen", "dplr", "bfloat16", 64, 64, dict(bound=-5.0, store=True, varlen=True)),
]


def _worker_compile(cases):
    import torch
    from triton.backends.compiler import GPUTarget

    from kdagen import spec as S
    from kdagen.kernels import CompileReport, compile_for_target
    from kdagen.ops import dplr as D
    from kdagen.ops.family import gdn_spec, gla_spec
    from kdagen.ops.member import chunk_member_launches

    target = GPUTarget("cuda", 90, 32)
    HV = 2

    def report(stage, launch):
        kind = launch.kernel
        try:
            r = compile_for_target(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                                   launch.num_stages)
        except Exception as e:  # reported to the test, which fails with it
            return dict(stage=stage, kind=kind, error=f"{type(e).__name__}: {e}"[:4000])
        return dict(stage=stage, kind=kind, is_report=isinstance(r, CompileReport), target=r.target,
                    shared_bytes=r.shared_bytes, source=launch.fn.__name__, BT=launch.constexprs.get("BT"))

    results = {}
    for cid, member, dt, K, V, extra in cases:
        try:
            dtype = getattr(torch, dt)
            varlen, vf, gik = extra.get("varlen", False), extra.get("v_first", False), extra.get("gik", False)
            B, T = (1, 70) if varlen else (2, 70)
            gen = torch.Generator().manual_seed(0)
            H = 1
            q = torch.randn(B, T, H, K, generator=gen).to(dtype)
            k = torch.randn(B, T, H, K, generator=gen).to(dtype)
            v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
            cu = torch.tensor([0, 7, 50, T], dtype=torch.int64) if varlen else None
            N = 3 if varlen else B
            h0 = torch.zeros((N, HV, V, K) if vf else (N, HV, K, V))
            bound = extra.get("bound")
            out = []
            if member == "dplr":
                a = torch.randn(B, T, HV, K, generator=gen).to(dtype)
                b = torch.randn(B, T, HV, K, generator=gen).to(dtype)
                gk = -torch.rand(B, T, HV, K, generator=gen)
                kw = dict(initial_state=h0, cu_seqlens=cu, safe_gate=bound is not None, lower_bound=bound)
                call, _, _ = D._prepare("chunk_dplr_delta_rule", q, k, v, a, b, gk, training=False, **kw)
                cfg, _ = D._configs("chunk_dplr_delta_rule", call, None, False, 16)
                fwd, _ = D.chunk_dplr_launches(q, k, v, a, b, gk, config=cfg, output_final_state=True, **kw)
                out += [report("inference", x) for x in fwd]
                call, _, _ = D._prepare("chunk_dplr_delta_rule", q, k, v, a, b, gk, training=True, **kw)
                tcfg, bcfg = D._configs("chunk_dplr_delta_rule", call, None, True, 16, extra.get("store", False))
                tf, tb, _ = D.chunk_dplr_bwd_launches(q, k, v, a, b, gk, config=tcfg, bwd_config=bcfg,
                                                      output_final_state=True, with_rerun=True, **kw)
            else:
                beta = torch.rand(B, T, HV, generator=gen).to(dtype) if member != "gla" else None
                g = -torch.rand(B, T, HV, generator=gen) if member == "gdn" else None
                if member == "gla":
                    g = -torch.rand(B, T, HV, K, generator=gen)
                    spec = gla_spec(bound)
                else:
                    spec = gdn_spec(True, True) if gik else (S.gdn() if member == "gdn" else S.deltanet())
                gate = dict(use_gate_in_kernel=True, A_log=torch.zeros(HV), dt_bias=torch.zeros(HV)) if gik else {}
                kw = dict(initial_state=h0, cu_seqlens=cu, state_v_first=vf, chunk_size=16, **gate)
                fwd, _ = chunk_member_launches(spec, q, k, v, g, beta, output_final_state=True, **kw)
                out += [report("inference", x) for x in fwd]
                tf, tb, _ = chunk_member_launches(spec, q, k, v, g, beta, training=True, output_final_state=True,
                                                  with_rerun=True, **kw)
            out += [report("training forward", x) for x in tf] + [report("backward", x) for x in tb]
            results[cid] = out
        except Exception as e:
            results[cid] = [dict(stage="build", kind="build", error=f"{type(e).__name__}: {e}"[:4000])]
    return results


def _worker_main():
    cases = json.loads(sys.stdin.read())
    res = _worker_compile([tuple(c) for c in cases])
    reply(res)


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker('test_chunk16_compile_sm90', CASES, 'kdagen-chunk16-sm90-', timeout=1800)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chunk16_kernels_compile_for_sm90(case, compiled):
    cid, member = case[0], case[1]
    entries = compiled[cid]
    for e in entries:
        assert "error" not in e, f"{cid}: {e['stage']} {e['kind']} failed to compile for sm_90:\n{e['error']}"
        assert e["is_report"] and e["target"] == "cuda:90"
        assert e["source"].startswith(member), e["source"]  # the member's own kernels (named by its spec)
        assert 0 < e["shared_bytes"] <= SMEM_LIMIT, f"{cid}: {e['kind']} needs {e['shared_bytes']} bytes"
        assert e["BT"] in (None, 16), (cid, e["stage"], e["kind"], e["BT"])
    # an inference call at 16 rows runs the training forward's launches, never the solve and pass
    assert [e["kind"] for e in entries if e["stage"] == "inference"] == ["chunk_intra", "chunk_state"], entries
    # the training forward (its output split out of the state pass in half precision at K <= 128, general
    # DPLR's never) with the backward's re-run of its intra launch (chunks of one sub-tile re-run it, not
    # chunk_bwd_rerun: ChunkBwdConfig.reruns_from_saved; kept intermediates, none), then the backward's three
    # launches (the intra gradients not split: one sub-tile)
    out = member != "dplr" and case[2] in ("bfloat16", "float16") and case[3] <= 128
    train = [e["kind"] for e in entries if e["stage"] == "training forward"]
    assert train == (["chunk_intra", "chunk_state"] + ["chunk_out"] * out
                     + ["chunk_intra"] * (not case[5].get("store"))), train
    back = [e["kind"] for e in entries if e["stage"] == "backward"]
    assert back == ["chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"], back
