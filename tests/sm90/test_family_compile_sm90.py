"""Compile-only checks for Hopper (sm_90) of every kernel variant Gated DeltaNet (scalar decay),
DeltaNet (no decay) and GLA (no rank-1 part) add: inference forward (solve, pass), training forward (intra, state),
backward (state, dqkw, intra; DeltaNet's folded split too), decode and its backward, through
``triton.compile(..., target=GPUTarget("cuda", 90, 32))``; no GPU is needed.

As tests/sm90/test_compile_sm90.py: the launches come from the ops' own launch builders
(:func:`kdagen.ops.member.chunk_member_launches`, ``prepare_recurrent``,
``prepare_recurrent_bwd``) on small CPU tensors, and the compiles run in a subprocess started
without ``TRITON_INTERPRET`` (this module must not import conftest)."""
from __future__ import annotations

import json
import sys

import pytest
from sm90_worker import reply, run_compile_worker

pytestmark = pytest.mark.slow  # a subprocess that compiles ~60 kernels

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)

# (id, member, dtype, K, V, extra)
CASES = [
    ("gdn-bf16-K128V128", "gdn", "bfloat16", 128, 128, {}),
    ("gdn-fp16-K96V192-varlen", "gdn", "float16", 96, 192, dict(varlen=True)),
    ("gdn-bf16-K128V128-gate-in-kernel", "gdn", "bfloat16", 128, 128, dict(gik=True)),
    ("gdn-bf16-K256V256", "gdn", "bfloat16", 256, 256, {}),
    ("deltanet-bf16-K128V128", "deltanet", "bfloat16", 128, 128, {}),
    ("deltanet-fp16-K48V96-varlen-v-first", "deltanet", "float16", 48, 96, dict(varlen=True, v_first=True)),
    ("deltanet-bf16-C32-no-prefetch", "deltanet", "bfloat16", 128, 128, dict(fwd=dict(chunk_size=32, state_prefetch=False))),
    ("gdn-bf16-C32-no-prefetch", "gdn", "bfloat16", 128, 128, dict(fwd=dict(chunk_size=32, state_prefetch=False))),
    ("gdn-fp16-gate-in-kernel-train-BK32-cumsum-dot", "gdn", "float16", 128, 128,
     dict(gik=True, train=dict(chunk_size=32, intra_block_k=32, cumsum="dot"))),
    # no decay, the split intra backward folded into dqkw and chunk_bwd_wy (ChunkBwdConfig.intra_fold): one K
    # tile of 128 in dqkw; then K = 96 over two masked tiles of 64 (dqkw and the wy launch's K loop), varlen
    ("deltanet-bf16-K128V128-fold", "deltanet", "bfloat16", 128, 128,
     dict(bwd=dict(intra_split=True, intra_fold=True, intra_block_k=64, intra_block_v=64, intra_num_warps=2,
                   dqkw_block_k=128, dqkw_block_v=64))),
    ("deltanet-fp16-K96V64-varlen-fold", "deltanet", "float16", 96, 64,
     dict(varlen=True, bwd=dict(intra_split=True, intra_fold=True, intra_block_k=64, dqkw_block_k=64))),
    # the split as it ran before the fold became DeltaNet's half-precision default: both intra launches
    ("deltanet-bf16-K128V128-unfolded-split", "deltanet", "bfloat16", 128, 128,
     dict(bwd=dict(intra_split=True, intra_block_v=64, intra_num_warps=2, dqkw_block_k=128, dqkw_block_v=64))),
    # Gated DeltaNet's split unfolded (as before the fold became its half-precision default,
    # docs/decisions/0020-intra-backward-folded.md), and
    # folded over two masked K tiles of 64 in dqkw (its dg shares summed by the wy launch), varlen
    ("gdn-bf16-K128V128-unfolded-split", "gdn", "bfloat16", 128, 128,
     dict(bwd=dict(intra_split=True, intra_block_v=64, intra_num_warps=2, dqkw_block_k=128, dqkw_block_v=64))),
    ("gdn-fp16-K96V64-varlen-fold", "gdn", "float16", 96, 64,
     dict(varlen=True, bwd=dict(intra_split=True, intra_fold=True, intra_block_k=64, dqkw_block_k=64))),
    # Gated DeltaNet's bf16 training on 64-row chunks (the heuristic,
    # docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md) as it runs with many state
    # programs: the reverse pass on 64-wide V tiles and 8 warps (the case above, two heads, takes 32-wide tiles on 4)
    ("gdn-bf16-K128V128-C64-reverse-pass-8-warps", "gdn", "bfloat16", 128, 128,
     dict(bwd=dict(chunk_size=64, sub_chunk=32, intra_split=True, intra_fold=True, intra_block_k=64, intra_block_v=64,
                   intra_num_warps=2, dqkw_block_k=128, dqkw_block_v=64, state_block_v=64, state_num_warps=8,
                   state_num_stages=3, state_prefetch=True, rerun_num_warps=1))),
    # GLA (no rank-1 part): with a bound (factorised diagonal tiles) and without (element-wise)
    ("gla-bf16-K128V128-bound", "gla", "bfloat16", 128, 128, dict(bound=-5.0)),
    ("gla-bf16-K128V128", "gla", "bfloat16", 128, 128, {}),
    ("gla-fp16-K96V192-varlen-v-first-C32", "gla", "float16", 96, 192,
     dict(varlen=True, v_first=True, bound=-5.0, fwd=dict(chunk_size=32))),
]
KINDS = ("chunk_solve", "chunk_pass", "chunk_intra", "chunk_state", "chunk_out", "chunk_bwd_rerun", "chunk_bwd_state",
         "chunk_bwd_dqkw", "chunk_bwd_wy", "chunk_bwd_intra", "recurrent", "recurrent_bwd")


def _worker_compile(cases):
    import torch
    from triton.backends.compiler import GPUTarget

    from kdagen import spec as S
    from kdagen.cache.lookup import resolve
    from kdagen.codegen.lower import lower
    from kdagen.config import RecurrentBwdConfig
    from plain_configs import plain_bwd, plain_fwd, plain_train
    from kdagen.kernels import CompileReport, build, compile_for_target
    from kdagen.ops.family import gdn_spec, gla_spec
    from kdagen.ops.inputs import check_inputs
    from kdagen.ops.member import chunk_member_launches
    from kdagen.ops.recurrent import prepare_recurrent
    from kdagen.ops.recurrent_bwd import RecurrentBwdMeta, prepare_recurrent_bwd

    target = GPUTarget("cuda", 90, 32)
    HV = 2

    def report(kind, launch):
        try:
            r = compile_for_target(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                                   launch.num_stages)
        except Exception as e:  # reported to the test, which fails with it
            return dict(kind=kind, error=f"{type(e).__name__}: {e}"[:4000])
        return dict(kind=kind, is_report=isinstance(r, CompileReport), target=r.target, shared_bytes=r.shared_bytes,
                    source=launch.fn.__name__,
                    flags={n: launch.constexprs[n] for n in ("QK_L2NORM", "BIAS_PER_HEAD") if n in launch.constexprs})

    results = {}
    for cid, member, dt, K, V, extra in cases:
        try:
            dtype = getattr(torch, dt)
            varlen, vf, gik = extra.get("varlen", False), extra.get("v_first", False), extra.get("gik", False)
            B, T = (1, 70) if varlen else (2, 70)
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(B, T, 1, K, generator=gen).to(dtype)
            k = torch.randn(B, T, 1, K, generator=gen).to(dtype)
            v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
            beta = torch.rand(B, T, HV, generator=gen).to(dtype) if member != "gla" else None
            g = -torch.rand(B, T, HV, generator=gen) if member == "gdn" else None
            if member == "gla":
                g = -torch.rand(B, T, HV, K, generator=gen)
            cu = torch.tensor([0, 7, 50, T], dtype=torch.int64) if varlen else None
            N = 3 if varlen else B
            h0 = torch.zeros((N, HV, V, K) if vf else (N, HV, K, V))
            spec = gdn_spec(True, True) if gik else (S.gdn() if member == "gdn" else S.deltanet())
            if member == "gla":
                spec = gla_spec(extra.get("bound"))
            gate = dict(use_gate_in_kernel=True, A_log=torch.zeros(HV), dt_bias=torch.zeros(HV)) if gik else {}
            kw = dict(initial_state=h0, cu_seqlens=cu, state_v_first=vf, **gate)
            out = []
            cfg = plain_fwd(**extra["fwd"]) if "fwd" in extra else None
            fwd, _ = chunk_member_launches(spec, q, k, v, g, beta, output_final_state=True, config=cfg, **kw)
            out += [report("chunk_solve", fwd[0]), report("chunk_pass", fwd[1])]
            tcfg = plain_train(**extra["train"]) if "train" in extra else None
            bcfg = plain_bwd(**extra["bwd"]) if "bwd" in extra else None
            tf, tb, _ = chunk_member_launches(spec, q, k, v, g, beta, training=True, output_final_state=True,
                                              config=tcfg, bwd_config=bcfg, **kw)
            out += [report(x.kernel, x) for x in list(tf) + list(tb)]  # (chunk_out: the output split)
            # decode (B sequences of one token) and the recurrent backward
            # the decode step reads the gate's dt_bias per head ([HV], as the caller gives it) and applies the
            # l2-norm itself; the autograd path reads it per channel (expanded), as the backward does
            dt_bias = torch.zeros(HV, K) if gik else None
            A_log = gate.get("A_log")
            dims, seqlens = check_inputs(q, k, v, g, beta, scale=None, initial_state=h0, cu_seqlens=cu,
                                         A_log=A_log, dt_bias=dt_bias, gate_in_kernel=gik, state_v_first=vf,
                                         decay=spec.decay, rank1=spec.has_rank1)
            plan = lower(spec, K, V, dt, "recurrent", gik)
            built = build(plan, resolve("recurrent", plan, None, {"T": dims.T, "B": dims.B, "N": dims.N}))
            gg = g if g is not None else torch.zeros(1)
            beta = beta if beta is not None else torch.zeros(1)  # no rank-1 part: not read
            launch, _ = prepare_recurrent(q, k, v, gg, beta, scale=K ** -0.5, initial_state=h0, output_final_state=True,
                                          cu_seqlens=cu, state_indices=None, dims=dims, plan=plan, built=built,
                                          A_log=A_log, dt_bias=gate.get("dt_bias"), state_v_first=vf,
                                          qk_l2norm=gik)
            out.append(report("recurrent", launch))
            meta = RecurrentBwdMeta(dims, seqlens, cu, K ** -0.5, plan, RecurrentBwdConfig(), vf)
            launch, _ = prepare_recurrent_bwd(meta, dict(q=q, k=k, v=v, g=gg, beta=beta, A_log=A_log, dt_bias=dt_bias),
                                              h0, torch.zeros_like(v), torch.zeros_like(h0), True)
            out.append(report("recurrent_bwd", launch))
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
    return run_compile_worker('test_family_compile_sm90', CASES, 'kdagen-family-sm90-', timeout=900)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_family_kernels_compile_for_sm90(case, compiled):
    cid, member = case[0], case[1]
    entries = compiled[cid]
    # the backward: the re-run from the forward's kept tiles, then three launches, or four where the
    # intra-chunk gradients split (a rank-1 part in half precision: the heuristic)
    split = member != "gla" and case[2] in ("bfloat16", "float16") and case[3] <= 128
    # no second intra launch where dqkw and the wy launch do its work: a case's own config says; the heuristic
    # folds DeltaNet's split in half precision, and Gated DeltaNet's with g given
    # (docs/decisions/0020-intra-backward-folded.md)
    bwd = case[5].get("bwd")
    fold = (bwd.get("intra_fold", False) if bwd is not None
            else split and (member == "deltanet" or (member == "gdn" and not case[5].get("gik"))))
    # the training forward splits its output out of the state pass (chunk_out) in half precision at K <= 128
    # (a case's own training config is the plain one, tests/plain_configs.py: the fused pass)
    out = case[2] in ("bfloat16", "float16") and case[3] <= 128 and "train" not in case[5]
    kinds = [k for k in KINDS if (k != "chunk_bwd_wy" or split) and (k != "chunk_out" or out)
             and (k != "chunk_bwd_intra" or not fold)]
    assert [e["kind"] for e in entries] == kinds, entries
    for e in entries:
        assert "error" not in e, f"{cid}: {e['kind']} failed to compile for sm_90:\n{e['error']}"
        assert e["is_report"] and e["target"] == "cuda:90"
        assert e["source"].startswith(member), e["source"]  # the member's own kernels (named by its spec)
        assert 0 < e["shared_bytes"] <= SMEM_LIMIT, f"{cid}: {e['kind']} needs {e['shared_bytes']} bytes"
    # the decode step of the in-kernel gate: dt_bias per head, the l2-norm in the kernel
    gik = bool(case[5].get("gik"))
    want = dict(QK_L2NORM=gik, **({"BIAS_PER_HEAD": True} if gik else {}))
    assert [e["flags"] for e in entries if e["kind"] == "recurrent"] == [want]
