"""Compile-only checks for Hopper (sm_90) of general DPLR's chunk forward kernels (the DPLR
branches of chunk_intra and chunk_state), as their inference and training launches make them,
through ``triton.compile(..., target=GPUTarget("cuda", 90, 32))``; no GPU is needed.

As tests/sm90/test_family_compile_sm90.py: the launches come from the op's own launch builder
(:func:`kdagen.ops.dplr.chunk_dplr_launches`) on small CPU tensors, and the compiles run in a
subprocess started without ``TRITON_INTERPRET`` (this module must not import conftest)."""
from __future__ import annotations

import json
import sys

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles ~30 kernels

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)

# (id, dtype, K, V, extra): bound None -> element-wise diagonal tiles, else factorised
CASES = [
    ("dplr-bf16-K128V128", "bfloat16", 128, 128, {}),
    ("dplr-bf16-K128V128-bound", "bfloat16", 128, 128, dict(bound=-5.0)),
    ("dplr-bf16-K128V128-bound-C64", "bfloat16", 128, 128, dict(bound=-5.0, train=dict(chunk_size=64))),
    ("dplr-fp16-K96V192-varlen", "float16", 96, 192, dict(varlen=True)),
    ("dplr-fp16-K64V64-bound-C16-cumsum-dot", "float16", 64, 64,
     dict(bound=-0.5, train=dict(chunk_size=16, cumsum="dot"))),
    ("dplr-bf16-K256V256-bound", "bfloat16", 256, 256, dict(bound=-5.0)),
    ("dplr-bf16-K256V256", "bfloat16", 256, 256, {}),
    ("dplr-fp32-K64V64-bound", "float32", 64, 64, dict(bound=-5.0)),
]
KINDS = ("chunk_intra", "chunk_state", "chunk_intra:train", "chunk_state:train")


def _worker_compile(cases):
    import torch
    from triton.backends.compiler import GPUTarget

    from plain_configs import plain_train
    from kdagen.kernels import CompileReport, compile_for_target
    from kdagen.ops.dplr import chunk_dplr_launches

    target = GPUTarget("cuda", 90, 32)
    HV = 2

    def report(kind, launch):
        try:
            r = compile_for_target(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                                   launch.num_stages)
        except Exception as e:  # reported to the test, which fails with it
            return dict(kind=kind, error=f"{type(e).__name__}: {e}"[:4000])
        return dict(kind=kind, is_report=isinstance(r, CompileReport), target=r.target, shared_bytes=r.shared_bytes,
                    source=launch.fn.__name__, spills=r.n_spills)

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
            bound = extra.get("bound")
            kw = dict(initial_state=torch.zeros(N, HV, K, V), cu_seqlens=cu, output_final_state=True,
                      safe_gate=bound is not None, lower_bound=bound)
            cfg = plain_train(**extra["train"]) if "train" in extra else None
            out = []
            fwd, _ = chunk_dplr_launches(q, k, v, a, b, gk, config=cfg, **kw)
            out += [report("chunk_intra", fwd[0]), report("chunk_state", fwd[1])]
            tf, _ = chunk_dplr_launches(q, k, v, a, b, gk, training=True, config=cfg, **kw)
            out += [report("chunk_intra:train", tf[0]), report("chunk_state:train", tf[1])]
            results[cid] = out
        except Exception as e:
            results[cid] = [dict(kind="build", error=f"{type(e).__name__}: {e}"[:4000])]
    return results


# the tuner's compile-check (what `kdagen build --gpu h800 --spec dplr --compile-only` runs), on a
# small space: both stages of the chunk_train family, element-wise and factorised
TUNER_SPACE = {"kernel": "chunk_train",
               "params": {"chunk_size": [32, 64], "sub_chunk": [16], "intra_block_k": [32, 64],
                          "intra_num_warps": [4], "state_block_v": [32], "state_num_warps": [4]},
               "stages": {"intra": {"launch": "chunk_intra", "fields": ["chunk_size", "sub_chunk", "intra_block_k",
                                                                      "intra_num_warps"]},
                          "state": {"launch": "chunk_state", "fields": ["chunk_size", "state_block_v",
                                                                      "state_num_warps"]}},
               "constraints": ["smem_estimate <= smem_limit"]}


def _worker_tuner():
    import torch

    from kdagen.cache.gpus import get_profile
    from kdagen.tuning.compile_pool import compile_check
    from kdagen.tuning.families import families_for, family_spec, lower_for
    from kdagen.tuning.space import SearchSpace

    out = {}
    for bound in (None, -5.0):
        sa = {"spec": "dplr", "safe_gate": bound is not None, "lower_bound": bound}
        (fam,) = families_for(sa, ["chunk_fwd"])
        spec = family_spec(fam, sa)
        plan = lower_for(spec, fam, 64, 64, torch.bfloat16)
        surveys = compile_check(fam, plan, spec, sa, get_profile("h800"), torch.bfloat16,
                                space=SearchSpace.from_dict(TUNER_SPACE), progress=False, jobs=1,
                                shape=(1, 256, 2, 2))
        out[str(bound)] = dict(family=fam, diag=plan.diag_mode,
                               surveys=[(s.stage, s.total, len(s.survivors), [w for _, w in s.failures])
                                        for s in surveys])
    return out


def _worker_main():
    cases = json.loads(sys.stdin.read())
    res = _worker_compile([tuple(c) for c in cases])
    res["@tuner"] = _worker_tuner()
    reply(res)


@pytest.fixture(scope="module")
def compiled():
    return run_compile_worker('test_dplr_compile_sm90', CASES, 'kdagen-dplr-sm90-', timeout=900)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dplr_kernels_compile_for_sm90(case, compiled):
    cid = case[0]
    entries = compiled[cid]
    assert [e["kind"] for e in entries] == list(KINDS), entries
    for e in entries:
        assert "error" not in e, f"{cid}: {e['kind']} failed to compile for sm_90:\n{e['error']}"
        assert e["is_report"] and e["target"] == "cuda:90"
        assert e["source"].startswith("dplr_chunk_"), e["source"]  # DPLR's own kernels (named by its spec)
        assert 0 < e["shared_bytes"] <= SMEM_LIMIT, f"{cid}: {e['kind']} needs {e['shared_bytes']} bytes"


def test_tuner_compile_check_keeps_every_candidate(compiled):
    """The tuner's compile-check of DPLR's chunk forward (family chunk_train) for the H800 keeps
    every candidate of both stages, element-wise and factorised."""
    tuner = compiled["@tuner"]
    assert set(tuner) == {"None", "-5.0"}
    assert (tuner["None"]["diag"], tuner["-5.0"]["diag"]) == ("elementwise", "factorised")
    for bound, r in tuner.items():
        assert r["family"] == "chunk_train"
        assert [s[0] for s in r["surveys"]] == ["intra", "state"]
        for stage, total, ok, failures in r["surveys"]:
            assert total > 1 and ok == total, (bound, stage, failures)
