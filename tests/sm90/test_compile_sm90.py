"""Compile-only checks for Hopper (sm_90): every generated template -- chunk intra, chunk
state, recurrent and its backward -- over several shapes, dtypes, gates and configs, through
``triton.compile(..., target=GPUTarget("cuda", 90, 32))``; no GPU is needed.

The launches come from the ops' own launch builders (``chunk_kda_launches`` and
``prepare_recurrent``) on small CPU tensors, so what is compiled is exactly what the ops
would launch.  Triton cannot compile while ``TRITON_INTERPRET=1`` is in effect (the
interpreter patches ``triton.language`` for the whole process, and ``@triton.jit`` returns
an interpreter object), which the conftest sets for the interpreter tests; the compiles
therefore run in two worker subprocesses started without it, in parallel, once per module.
This module must not import conftest (that would set the interpreter flag in the workers).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses, compiles or long interpreter runs

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block (227 KiB)
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# ----------------------------------------------------------------------------- the cases
# chunk: (id, dtype, K, V, gate, config overrides or None for the default config, extra)
CHUNK_CASES = [
    ("bf16-K128V128-bounded-default", "bfloat16", 128, 128, "safe", None, {}),
    ("fp16-K128V128-bounded-default", "float16", 128, 128, "safe", None, {}),
    ("bf16-K96V192-bounded-default", "bfloat16", 96, 192, "safe", None, {}),
    ("bf16-K256V256-bounded-default", "bfloat16", 256, 256, "safe", None, {}),
    ("fp16-K256V256-unbounded-default", "float16", 256, 256, "free", None, {}),
    ("bf16-K128V128-unbounded-default", "bfloat16", 128, 128, "free", None, {}),
    ("bf16-K96V192-unbounded-C32", "bfloat16", 96, 192, "free", dict(chunk_size=32, state_block_v=32), {}),
    ("bf16-K128V128-gate-in-kernel-lowerbound", "bfloat16", 128, 128, "gik_lb", None, {}),
    ("fp16-K128V128-gate-in-kernel-softplus", "float16", 128, 128, "gik_sp", None, {}),
    ("bf16-C64-BV16", "bfloat16", 128, 128, "safe", dict(chunk_size=64, state_block_v=16), {}),
    ("bf16-C64-BV64", "bfloat16", 128, 128, "safe", dict(chunk_size=64, state_block_v=64), {}),
    ("fp16-C32-BV32", "float16", 128, 128, "safe", dict(chunk_size=32, state_block_v=32, inverse_precision="tf32"), {}),
    ("bf16-C32-BV64-no-prefetch", "bfloat16", 128, 128, "safe",
     dict(chunk_size=32, state_block_v=64, state_prefetch=False, state_num_stages=2), {}),
    ("bf16-C64-w8-tf32-factors-fp32", "bfloat16", 128, 128, "safe",
     dict(chunk_size=64, intra_num_warps=8, inverse_precision="tf32", factor_precision="fp32",
          state_num_warps=8, state_block_v=64), {}),
    # the three-stage pipeline of 64-row chunks at K=256 needs over 300 KiB of shared memory:
    # the compile-check must drop it
    ("bf16-K256V256-C64-3stages", "bfloat16", 256, 256, "safe", dict(chunk_size=64, state_num_stages=3),
     dict(over_smem="chunk_pass")),
    # the solve over K tiles (solve_k_tile): 2-warp programs, one and two halves, masked channels, an in-kernel gate
    ("bf16-K128-k-tiles-16-w2", "bfloat16", 128, 128, "safe",
     dict(chunk_size=64, solve_k_tile=16, intra_num_warps=2, solve_load_ahead=0), {}),
    ("fp16-K96V96-k-tiles-16-C32-w4-gik", "float16", 96, 96, "gik_sp",
     dict(chunk_size=32, solve_k_tile=16, intra_num_warps=4, inverse_precision="tf32"), {}),
    ("bf16-varlen-intermediate-states", "bfloat16", 128, 128, "safe", None, dict(varlen=True, states=True)),
    ("bf16-varlen-states-v-first", "bfloat16", 128, 128, "safe", None, dict(varlen=True, states=True, v_first=True)),
]

# the sequence-parallel state pass (state_segment_chunks > 0): its three launches after the solve
SEG_CASES = [
    ("bf16-K128V128-seg16", "bfloat16", 128, 128, "safe", dict(state_segment_chunks=16), {}),
    ("fp16-K96V192-C32-seg8-varlen-states-v-first", "float16", 96, 192, "free",
     dict(chunk_size=32, state_segment_chunks=8, inverse_precision="tf32"), dict(varlen=True, states=True, v_first=True)),
]
SEG_KINDS = ("chunk_solve", "chunk_seg_state", "chunk_seg_combine", "chunk_seg_pass")
# context parallelism's two-phase rank: pass A over the segments of whole sequences
# (kdagen.ops.chunk_segments.sequence_transition_launch) -- the first of a packed call's sequences whole, every row
# of a fixed-length call in the sequence-parallel pass's segments
CP_CASES = [
    ("bf16-K128V128-varlen-first-sequence", "bfloat16", 128, 128, "safe", None, dict(varlen=True)),
    ("fp16-K96V192-rows-C32-seg8", "float16", 96, 192, "free",
     dict(chunk_size=32, inverse_precision="tf32", state_segment_chunks=8), {}),
]

# the training forward (ChunkTrainConfig): the same cover as before the inference forward existed
TRAIN_CASES = [
    ("bf16-K128V128-bounded-default", "bfloat16", 128, 128, "safe", None, {}),
    ("fp16-K128V128-bounded-default", "float16", 128, 128, "safe", None, {}),
    ("bf16-K96V192-bounded-default", "bfloat16", 96, 192, "safe", None, {}),
    ("bf16-K256V256-bounded-default", "bfloat16", 256, 256, "safe", None, {}),
    ("fp16-K256V256-elementwise-default", "float16", 256, 256, "free", None, {}),
    ("bf16-K128V128-elementwise-default", "bfloat16", 128, 128, "free", None, {}),
    ("bf16-K96V192-elementwise-C64", "bfloat16", 96, 192, "free",
     dict(chunk_size=64, intra_block_k=32, state_block_v=32), {}),
    ("bf16-K128V128-gate-in-kernel-lowerbound", "bfloat16", 128, 128, "gik_lb", None, {}),
    ("fp16-K128V128-gate-in-kernel-softplus", "float16", 128, 128, "gik_sp", None, {}),
    ("bf16-C64-BV16", "bfloat16", 128, 128, "safe", dict(chunk_size=64, intra_block_k=64, state_block_v=16), {}),
    ("bf16-C64-BV64", "bfloat16", 128, 128, "safe", dict(chunk_size=64, intra_block_k=128, state_block_v=64), {}),
    ("fp16-C32-BV32", "float16", 128, 128, "safe", dict(chunk_size=32, intra_block_k=64, state_block_v=32,
                                                        state_num_warps=4), {}),
    ("bf16-C32-BV64", "bfloat16", 128, 128, "safe", dict(chunk_size=32, intra_block_k=128, state_block_v=64), {}),
    ("bf16-K256V256-C64-BV64", "bfloat16", 256, 256, "safe",
     dict(chunk_size=64, intra_block_k=128, state_block_v=64, state_num_warps=8, state_num_stages=1), {}),
    # compiled as the JIT specialises it (16-byte aligned pointers, sizes divisible by 16),
    # the two-stage pipeline of this state tile needs 248 KiB: over the limit, so the
    # compile-check must drop it (the unspecialised compile reported less, and passed it)
    ("bf16-K256V256-C64-BV64-2stages", "bfloat16", 256, 256, "safe",
     dict(chunk_size=64, intra_block_k=128, state_block_v=64, state_num_warps=8, state_num_stages=2),
     dict(over_smem="chunk_state")),
    ("bf16-varlen-intermediate-states", "bfloat16", 128, 128, "safe", None, dict(varlen=True, states=True)),
    ("bf16-C32-cumsum-dot", "bfloat16", 128, 128, "safe", dict(chunk_size=32, intra_block_k=128, state_block_v=32, cumsum="dot"), {}),
    ("fp16-K96V192-cumsum-dot-elementwise", "float16", 96, 192, "free",
     dict(chunk_size=32, intra_block_k=32, state_block_v=32, cumsum="dot"), {}),
    # the state pass loading U and G_n one chunk ahead (state_prefetch), K masked and not
    ("bf16-C32-BV16-prefetch", "bfloat16", 128, 128, "safe",
     dict(chunk_size=32, intra_block_k=128, state_block_v=16, state_num_warps=4, state_prefetch=True), {}),
    ("fp16-K96V192-C32-prefetch-varlen", "float16", 96, 192, "safe",
     dict(chunk_size=32, intra_block_k=64, state_block_v=32, state_prefetch=True), dict(varlen=True)),
    # no gate bound in bf16: the checked diagonal (factorised where a sub-tile's span allows, element-wise else)
    ("bf16-K128-free-checked-diagonal", "bfloat16", 128, 128, "free",
     dict(chunk_size=32, intra_block_k=32, state_block_v=32), {}),
    # the intra launch's row-block loads issued ahead (intra_load_ahead), one K tile and two
    ("bf16-C32-intra-load-ahead", "bfloat16", 128, 128, "safe",
     dict(chunk_size=32, intra_block_k=128, state_block_v=16, state_num_stages=3, intra_load_ahead=True), {}),
    ("fp16-K96V192-C32-intra-load-ahead-2k", "float16", 96, 192, "safe",
     dict(chunk_size=32, intra_block_k=64, state_block_v=32, intra_load_ahead=True), dict(varlen=True)),
    # the output out of the state pass (split_output): the states-only pass and the output launch
    ("bf16-C32-split-output", "bfloat16", 128, 128, "safe",
     dict(chunk_size=32, intra_block_k=128, state_block_v=16, state_num_stages=3, split_output=True), {}),
    ("fp16-K96V192-split-output-varlen", "float16", 96, 192, "safe",
     dict(chunk_size=32, intra_block_k=64, state_block_v=32, split_output=True, out_block_v=128, out_block_k=32,
          out_num_warps=8), dict(varlen=True)),
]

# a training call's l2-norm of q and k and its backward (templates/qk_l2norm.py.j2): (id, dtype, K)
L2NORM_CASES = [
    ("bf16-K128", "bfloat16", 128),
    ("fp16-K96", "float16", 96),
]

# a layer call's in-kernel gate in launches of its own (ChunkTrainConfig.gate_launch): (id, dtype, K, gate)
GATE_CASES = [
    ("bf16-K128-lowerbound", "bfloat16", 128, "gik_lb"),
    ("fp16-K96-softplus", "float16", 96, "gik_sp"),
    # Gated DeltaNet's gate (FLA's use_gate_in_kernel): one per token and value head, the launches on one channel
    ("bf16-gdn-one-channel", "bfloat16", 1, "gdn"),
]

# recurrent: (id, dtype, K, V, gate, block_v or None for the default config, extra)
REC_CASES = [
    ("bf16-K128V128-BV16", "bfloat16", 128, 128, "direct", 16, {}),
    ("bf16-K128V128-BV64-pool", "bfloat16", 128, 128, "direct", 64, dict(pool="float32")),
    ("fp16-K128V128-BV64-bf16-pool", "float16", 128, 128, "direct", 64, dict(pool="bfloat16")),
    ("bf16-K256V256-default", "bfloat16", 256, 256, "direct", None, {}),
    ("bf16-K96V192-varlen-BV16", "bfloat16", 96, 192, "direct", 16, dict(varlen=True)),
    ("bf16-gate-in-kernel-lowerbound-BV64", "bfloat16", 128, 128, "gik_lb", 64, {}),
    ("fp16-gate-in-kernel-softplus-BV16", "float16", 128, 128, "gik_sp", 16, {}),
    ("bf16-K128V128-BV64-pool-v-first", "bfloat16", 128, 128, "direct", 64, dict(pool="float32", v_first=True)),
    # persistent programs whose item loop Triton pipelines (num_stages > 1)
    ("bf16-K128V128-BV64-bf16-pool-pipelined", "bfloat16", 128, 128, "direct", 64,
     dict(pool="bfloat16", rc=dict(num_warps=4, readout="loaded", programs_per_sm=2, num_stages=3))),
    ("bf16-K96V192-varlen-gate-in-kernel-pipelined", "bfloat16", 96, 192, "gik_lb", 32,
     dict(varlen=True, rc=dict(programs_per_sm=2, num_stages=2))),
    # FLA's in-kernel flags applied by the decode kernel to what it loads (the l2-norm of q and k, the beta
    # sigmoid, twice it with allow_neg_eigval): one item per program, and persistent programs (two configs)
    ("bf16-K128V128-BV32-pool-l2norm-beta-sigmoid", "bfloat16", 128, 128, "gik_sp", 32,
     dict(pool="float32", flags=dict(qk_l2norm=True, beta_sigmoid=True, neg_eigval=True))),
    ("bf16-K96V192-varlen-l2norm-persistent", "bfloat16", 96, 192, "gik_lb", 16,
     dict(varlen=True, rc=dict(programs_per_sm=4, num_stages=2), flags=dict(qk_l2norm=True))),
    ("bf16-K128V128-BV64-bf16-pool-pipelined-l2norm-beta-sigmoid", "bfloat16", 128, 128, "direct", 64,
     dict(pool="bfloat16", rc=dict(num_warps=4, readout="loaded", programs_per_sm=2, num_stages=3),
          flags=dict(qk_l2norm=True, beta_sigmoid=True))),
    # speculative decoding (token_slots): a slot per token ([N, T_max] indices), with and without
    # num_accepted_tokens; a config asking for persistent programs runs the one-item body (token_slot_config)
    ("bf16-K128V128-BV32-pool-token-slots-accepted", "bfloat16", 128, 128, "direct", 32,
     dict(pool="float32", varlen=True, slots=True, accepted=True)),
    ("bf16-K128V128-BV16-bf16-pool-v-first-token-slots-flags", "bfloat16", 128, 128, "gik_sp", 16,
     dict(pool="bfloat16", v_first=True, varlen=True, slots=True, rc=dict(programs_per_sm=2, num_stages=2),
          flags=dict(qk_l2norm=True, beta_sigmoid=True))),
]

# the recurrent backward: (id, dtype, K, V, gate, RecurrentBwdConfig fields or None, extra)
# the schedule of a packed call whose offsets are on the device only: chunks (L 1) or segments
SCHEDULE_CASES = [
    ("int64-C64-chunks", "bfloat16", 128, 128, "safe", dict(chunk_size=64), dict(cu_dtype="int64", L=1)),
    ("int32-C32-segments", "bfloat16", 128, 128, "safe", dict(chunk_size=32), dict(cu_dtype="int32", L=32)),
]
REC_BWD_CASES = [
    ("bf16-K128V128-default", "bfloat16", 128, 128, "direct", None, {}),
    ("bf16-K96V192-varlen-BV64-v-first", "bfloat16", 96, 192, "direct", dict(block_v=64), dict(varlen=True, v_first=True)),
    ("fp16-gate-in-kernel-lowerbound-BV16-seg32", "float16", 128, 128, "gik_lb", dict(block_v=16, segment=32), {}),
    ("bf16-K256V256-gate-in-kernel-softplus", "bfloat16", 256, 256, "gik_sp", None, {}),
]


# ----------------------------------------------------------------------------- the worker
def _worker_compile(jobs):
    """Runs in a clean subprocess: build each case's launches and compile them for sm_90."""
    import torch
    from plain_configs import plain_bwd, plain_decode, plain_fwd, plain_train
    from triton.backends.compiler import GPUTarget

    from kdagen.config import RecurrentBwdConfig
    from kdagen.kernels import CompileReport, compile_for_target
    from kdagen.ops.chunk import chunk_kda_bwd_launches, chunk_kda_launches
    from kdagen.cache.lookup import resolve
    from kdagen.codegen.lower import lower
    from kdagen.dtypes import dtype as as_dtype
    from kdagen.kernels import build
    from kdagen.ops.inputs import check_inputs, select_spec
    from kdagen.ops.recurrent import prepare_recurrent, token_slot_config
    from kdagen.ops.recurrent_bwd import RecurrentBwdMeta, prepare_recurrent_bwd

    target = GPUTarget("cuda", 90, 32)
    HV = 2

    def tensors(dtype, K, V, B, T, varlen):
        dt = getattr(torch, dtype)
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(B, T, 1, K, generator=gen).to(dt)
        k = torch.randn(B, T, 1, K, generator=gen).to(dt)
        v = torch.randn(B, T, HV, V, generator=gen).to(dt)
        g = -torch.rand(B, T, HV, K, generator=gen)
        beta = torch.rand(B, T, HV, generator=gen).to(dt)
        cu = torch.tensor([0, 7, 50, T], dtype=torch.int64) if varlen else None
        return q, k, v, g, beta, cu

    def gate_kwargs(gate, K):
        if gate == "safe":
            return dict(safe_gate=True, lower_bound=-5.0)
        if gate in ("free", "direct"):
            return {}
        kw = dict(use_gate_in_kernel=True, A_log=torch.zeros(HV), dt_bias=torch.zeros(HV * K))
        if gate == "gik_lb":
            kw["lower_bound"] = -5.0
        return kw

    def report(kind, launch):
        try:
            r = compile_for_target(launch.fn, launch.args, launch.constexprs, target,
                                   launch.num_warps, launch.num_stages)
        except Exception as e:  # reported to the test, which fails with it
            return dict(kind=kind, error=f"{type(e).__name__}: {e}"[:4000])
        return dict(kind=kind, is_report=isinstance(r, CompileReport), name=r.name, fn_name=launch.fn.__name__,
                    target=r.target, shared_bytes=r.shared_bytes, num_warps=r.num_warps,
                    launch_num_warps=launch.num_warps,
                    constexprs={k: v for k, v in launch.constexprs.items() if isinstance(v, (int, bool))})

    results = {}
    for family, case in jobs:
        if family == "l2norm":
            cid, dtype, K = case
            V, gate, cfg, extra = K, None, None, {}
        elif family == "gate":
            cid, dtype, K, gate = case
            V, cfg, extra = K, None, {}
        else:
            cid, dtype, K, V, gate, cfg, extra = case
        try:
            if family in ("chunk", "seg"):
                varlen = extra.get("varlen", False)
                q, k, v, g, beta, cu = tensors(dtype, K, V, 1 if varlen else 2, 70, varlen)
                N = 3 if varlen else 2
                vf = extra.get("v_first", False)
                launches, _ = chunk_kda_launches(
                    q, k, v, g, beta, initial_state=torch.zeros((N, HV, V, K) if vf else (N, HV, K, V)),
                    output_final_state=True, return_intermediate_states=extra.get("states", False), cu_seqlens=cu,
                    config=None if cfg is None else plain_fwd(**cfg), state_v_first=vf, **gate_kwargs(gate, K))
                results[f"{family}:{cid}"] = [report(ln.kernel, ln) for ln in launches]
            elif family == "cp":  # the forward's config, then pass A over whole sequences
                from kdagen.ops.chunk import prepare_kda
                from kdagen.ops.chunk_call import chunk_configs, forward_launches
                from kdagen.ops.chunk_segments import sequence_transition_launch

                varlen = extra.get("varlen", False)
                q, k, v, g, beta, cu = tensors(dtype, K, V, 1 if varlen else 2, 70, varlen)
                call, x = prepare_kda(q, k, v, g, beta, initial_state=torch.zeros(3 if varlen else 2, HV, K, V),
                                      cu_seqlens=cu, **gate_kwargs(gate, K))
                config, _ = chunk_configs(call, None if cfg is None else plain_fwd(**cfg), None, False)
                launches, _ = forward_launches(call, x, config, True)
                launch, *_ = sequence_transition_launch(build(call.plan, config), launches[-1],
                                                        (0,) if varlen else None, plan=call.plan, config=config,
                                                        dev=q.device, seqlens=call.seqlens)
                results[f"{family}:{cid}"] = [report(launch.kernel, launch)]
            elif family == "schedule":  # a packed call's schedule from device-only offsets
                from kdagen.ops.chunk_fwd import SCHEDULE
                from kdagen.ops.schedule import schedule_launch

                plan = lower(select_spec(False, True, -5.0, False, False), K, V, dtype, "chunk")
                fn = build(plan, plain_fwd(**cfg)).fns[SCHEDULE]
                cu = torch.tensor([0, 7, 7, 50, 70], dtype=getattr(torch, extra["cu_dtype"]))
                launch, _ = schedule_launch(cu, 70, cfg["chunk_size"], extra["L"], fn)
                results[f"{family}:{cid}"] = [report("chunk_schedule", launch)]
            elif family == "train":
                varlen = extra.get("varlen", False)
                q, k, v, g, beta, cu = tensors(dtype, K, V, 1 if varlen else 2, 70, varlen)
                N = 3 if varlen else 2
                kw = gate_kwargs(gate, K)
                launches, _, _ = chunk_kda_bwd_launches(
                    q, k, v, g, beta, initial_state=torch.zeros(N, HV, K, V), output_final_state=True, cu_seqlens=cu,
                    config=None if cfg is None else plain_train(**cfg), **kw)
                results[f"{family}:{cid}"] = [report("chunk_intra", launches[0]), report("chunk_state", launches[1])]
                if len(launches) > 2:  # split_output's chunk-parallel output launch
                    results[f"{family}:{cid}"].append(report(launches[2].kernel, launches[2]))
                if launches[0].then is not None:  # the checked diagonal's repair launch (REPAIR=True)
                    results[f"{family}:{cid}"].append(report("chunk_intra_repair", launches[0].then))
            elif family == "l2norm":
                from kdagen.ops.l2norm import l2norm_bwd_launch, l2norm_launch

                plan = lower(select_spec(False, True, -5.0, False, False), K, K, dtype, "chunk")
                x = [torch.zeros(2, 70, 1, K, dtype=getattr(torch, dtype)) for _ in range(6)]
                r = [torch.zeros(140) for _ in range(2)]
                fwd = l2norm_launch(build(plan, plain_train()).fn("qk_l2norm"), *x[:4], *r)
                bwd = l2norm_bwd_launch(build(plan, plain_bwd()).fn("qk_l2norm_bwd"), *x[:2], *r, *x[2:])
                results[f"{family}:{cid}"] = [report("qk_l2norm", fwd), report("qk_l2norm_bwd", bwd)]
            elif family == "gate":
                from kdagen.ops.gate import gate_bwd_launch, gate_launch

                if gate == "gdn":  # (the plan's head dims; the gate's launches take its one channel)
                    from kdagen.ops.family import gdn_spec
                    plan = lower(gdn_spec(True, True), 128, 128, dtype, "chunk", True)
                else:
                    plan = lower(select_spec(True, False, -5.0 if gate == "gik_lb" else None, True, True), K, K,
                                 dtype, "chunk", True)
                built = build(plan, plain_train(gate_launch=True))
                z = torch.zeros(2, 70, HV, K, dtype=getattr(torch, dtype))
                A_log, dt_bias = torch.zeros(HV), torch.zeros(HV * K)
                g = torch.zeros(2, 70, HV, K)
                parts = torch.zeros(9, HV), torch.zeros(9, HV, K)
                fwd = gate_launch(built.fn("gate"), z, A_log, dt_bias, g, HV, K)
                bwd = gate_bwd_launch(built.fn("gate_bwd"), z, A_log, dt_bias, g, z, *parts, HV, K)
                results[f"{family}:{cid}"] = [report("gate", fwd), report("gate_bwd", bwd)]
            elif family == "recurrent_bwd":
                varlen, vf = extra.get("varlen", False), extra.get("v_first", False)
                q, k, v, g, beta, cu = tensors(dtype, K, V, 1 if varlen else 2, 70, varlen)
                N = 3 if varlen else 2
                kw = gate_kwargs(gate, K)
                gik = kw.get("use_gate_in_kernel", False)
                A_log, dt_bias = kw.get("A_log"), kw.get("dt_bias")
                h0 = torch.zeros((N, HV, V, K) if vf else (N, HV, K, V))
                dims, seqlens = check_inputs(q, k, v, g, beta, scale=None, initial_state=h0, cu_seqlens=cu, A_log=A_log,
                                             dt_bias=dt_bias, gate_in_kernel=gik, state_v_first=vf)
                spec = select_spec(gik, False, kw.get("lower_bound"), A_log is not None, dt_bias is not None)
                plan = lower(spec, K, V, as_dtype(q.dtype).name, "recurrent", gik)
                meta = RecurrentBwdMeta(dims, seqlens, cu, K ** -0.5, plan, RecurrentBwdConfig(**(cfg or {})), vf)
                launch, _ = prepare_recurrent_bwd(meta, dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log,
                                                             dt_bias=dt_bias), h0, torch.zeros_like(v),
                                                  torch.zeros_like(h0), True)
                results[f"{family}:{cid}"] = [report("recurrent_bwd", launch)]
            else:
                varlen = extra.get("varlen", False)
                q, k, v, g, beta, cu = tensors(dtype, K, V, 1 if varlen else 3, 70 if varlen else 1, varlen)
                N = 3
                kw = gate_kwargs(gate, K)
                gik = kw.get("use_gate_in_kernel", False)
                A_log, dt_bias = kw.get("A_log"), kw.get("dt_bias")
                pool = extra.get("pool")
                vf = extra.get("v_first", False)
                if pool is not None:
                    h0 = torch.zeros((5, HV, V, K) if vf else (5, HV, K, V), dtype=getattr(torch, pool))
                    idx = torch.tensor([4, -1, 1], dtype=torch.int32)
                else:
                    h0, idx = torch.zeros(N, HV, K, V), None
                accepted = None
                if extra.get("slots"):  # a slot per token: [N, T_max], T_max the whole call's tokens
                    idx = torch.full((N, q.shape[1]), -1, dtype=torch.int32)
                    idx[0, :2], idx[2, :2] = torch.tensor([4, 0]), torch.tensor([1, 2])
                    if extra.get("accepted"):
                        accepted = torch.tensor([2, 1, 1], dtype=torch.int32)
                dims, _ = check_inputs(q, k, v, g, beta, scale=None, initial_state=h0, cu_seqlens=cu,
                                       state_indices=idx, A_log=A_log, dt_bias=dt_bias, gate_in_kernel=gik,
                                       state_v_first=vf, accepted=accepted)
                spec = select_spec(gik, False, kw.get("lower_bound"), A_log is not None, dt_bias is not None)
                plan = lower(spec, K, V, as_dtype(q.dtype).name, "recurrent", gik)
                built = build(plan, token_slot_config(resolve("recurrent", plan, None if cfg is None else
                                                              plain_decode(block_v=cfg, **extra.get("rc", {})),
                                                              {"T": dims.T, "B": dims.B, "N": dims.N}), idx))
                launch, _ = prepare_recurrent(q, k, v, g, beta, scale=K ** -0.5, initial_state=h0,
                                              output_final_state=True, cu_seqlens=cu, state_indices=idx,
                                              dims=dims, plan=plan, built=built, A_log=A_log, dt_bias=dt_bias,
                                              state_v_first=vf, accepted=accepted, **extra.get("flags", {}))
                results[f"{family}:{cid}"] = [report("recurrent", launch)]
        except Exception as e:
            results[f"{family}:{cid}"] = [dict(kind="build", error=f"{type(e).__name__}: {e}"[:4000])]
    return results


def _worker_main():
    jobs = json.loads(sys.stdin.read())
    res = _worker_compile([(fam, tuple(c)) for fam, c in jobs])
    sys.stdout.write("\n@@RESULTS@@" + json.dumps(res) + "\n")


# ----------------------------------------------------------------------------- the fixture
def _run_worker(jobs, env):
    code = ("import sys; sys.path[:0] = [%r, %r, %r]; import test_compile_sm90 as m; m._worker_main()"
            % (str(HERE), str(HERE.parent), str(REPO)))
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(jobs), capture_output=True,
                          text=True, env=env, cwd=str(REPO), timeout=540)
    marker = proc.stdout.rfind("@@RESULTS@@")
    if proc.returncode != 0 or marker < 0:
        raise RuntimeError(f"compile worker failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout[marker + len("@@RESULTS@@"):])


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONWARNINGS"] = "ignore"
    jobs = ([("chunk", c) for c in CHUNK_CASES] + [("seg", c) for c in SEG_CASES] + [("cp", c) for c in CP_CASES]
            + [("train", c) for c in TRAIN_CASES]
            + [("schedule", c) for c in SCHEDULE_CASES] + [("l2norm", c) for c in L2NORM_CASES]
            + [("gate", c) for c in GATE_CASES]
            + [("recurrent", c) for c in REC_CASES] + [("recurrent_bwd", c) for c in REC_BWD_CASES])
    # two workers of similar cost: alternate the (expensive) chunk cases between them
    halves = [jobs[0::2], jobs[1::2]]
    with tempfile.TemporaryDirectory(prefix="kdagen-sm90-") as tmp, ThreadPoolExecutor(2) as ex:
        env["KDAGEN_CACHE_DIR"] = os.path.join(tmp, "kdagen")  # generated sources, no tuned winners
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")  # really compile, no stale cache hits
        parts = list(ex.map(lambda j: _run_worker(j, env), halves))
    out = {}
    for p in parts:
        out.update(p)
    return out


def _check_ok(entry):
    assert "error" not in entry, f"{entry['kind']} failed to compile for sm_90:\n{entry['error']}"
    assert entry["is_report"], "compile_for_target did not return a CompileReport"
    assert entry["target"] == "cuda:90"
    assert entry["name"] == entry["fn_name"]
    assert entry["num_warps"] == entry["launch_num_warps"]


def _compiled_pair(entries, kinds, extra):
    """The launches of a chunk forward, compiled, within shared memory: (entries, constexprs)."""
    assert [e["kind"] for e in entries] == list(kinds), entries
    _check_smem(entries, extra)
    return entries, [e["constexprs"] for e in entries]


def _check_smem(entries, extra):
    for e in entries:
        _check_ok(e)
        if extra.get("over_smem") == e["kind"]:
            assert e["shared_bytes"] > SMEM_LIMIT, e["shared_bytes"]
            continue
        assert 0 < e["shared_bytes"] <= SMEM_LIMIT, (
            f"{e['kind']}: {e['shared_bytes']} bytes of shared memory (limit {SMEM_LIMIT})")


@pytest.mark.parametrize("case", CHUNK_CASES, ids=[c[0] for c in CHUNK_CASES])
def test_chunk_kernels_compile_for_sm90(case, compiled):
    """The inference forward: the solve and the state pass."""
    cid, dtype, K, V, gate, cfg, extra = case
    entries, (solve, state) = _compiled_pair(compiled["chunk:" + cid], ("chunk_solve", "chunk_pass"), extra)
    assert solve["K"] == K and state["K"] == K and state["V"] == V
    assert solve["BT"] == state["BT"] and solve["BK"] == state["BK"] == 1 << (K - 1).bit_length()
    if cfg is not None:  # the config really reached the kernels
        assert solve["BT"] == cfg["chunk_size"] and solve["BH"] == min(32, cfg["chunk_size"])
        assert state["BV"] == min(cfg.get("state_block_v", 32), 1 << (V - 1).bit_length())
        assert state["LOOP_STAGES"] == cfg.get("state_num_stages", 3)
        if "state_num_warps" in cfg:
            assert entries[1]["num_warps"] == cfg["state_num_warps"]
        if "intra_num_warps" in cfg:
            assert entries[0]["num_warps"] == cfg["intra_num_warps"]
    if extra.get("varlen"):
        assert solve["IS_VARLEN"] and state["IS_VARLEN"]
    if extra.get("states"):
        assert state["STORE_HS"]
    assert state["STATE_V_FIRST"] == bool(extra.get("v_first"))


@pytest.mark.parametrize("case", SEG_CASES, ids=[c[0] for c in SEG_CASES])
def test_sequence_parallel_state_pass_compiles_for_sm90(case, compiled):
    """The inference forward with state_segment_chunks: the solve, then passes A, B and C."""
    cid, dtype, K, V, gate, cfg, extra = case
    entries, (solve, a, b, c) = _compiled_pair(compiled["seg:" + cid], SEG_KINDS, extra)
    BK = 1 << (K - 1).bit_length()
    bv = min(cfg.get("state_block_v", 32), 1 << (V - 1).bit_length())
    assert a["SEG_CHUNKS"] == b["SEG_CHUNKS"] == c["SEG_CHUNKS"] == cfg["state_segment_chunks"]
    assert a["BK"] == b["BK"] == c["BK"] == BK and a["BV"] == b["BV"] == c["BV"] == bv
    assert solve["BT"] == a["BT"] == b["BT"] == c["BT"] == cfg.get("chunk_size", 64)
    assert a["IS_VARLEN"] == b["IS_VARLEN"] == c["IS_VARLEN"] == bool(extra.get("varlen"))
    assert b["USE_H0"] and b["STORE_HT"] and c["STORE_HS"] == bool(extra.get("states"))
    assert b["STATE_V_FIRST"] == c["STATE_V_FIRST"] == bool(extra.get("v_first"))
    # the chain holds a K x K fp32 transition: at least its dot operand in shared memory
    assert entries[2]["shared_bytes"] >= 4 * K * K // 2


@pytest.mark.parametrize("case", CP_CASES, ids=[c[0] for c in CP_CASES])
def test_context_parallel_pieces_compile_for_sm90(case, compiled):
    """Context parallelism's inference rank: pass A over whole sequences (its end state and transition), with
    the forward's tiles, in shared memory."""
    from kdagen.ops.chunk_segments import WHOLE_SEQUENCE
    cid, dtype, K, V, gate, cfg, extra = case
    (entry,) = compiled["cp:" + cid]
    _check_smem([entry], extra)
    a = entry["constexprs"]
    assert entry["kind"] == "chunk_seg_state"
    assert a["SEG_CHUNKS"] == ((cfg or {}).get("state_segment_chunks") or WHOLE_SEQUENCE)
    assert a["IS_VARLEN"] == bool(extra.get("varlen")) and a["K"] == K and a["V"] == V
    assert a["BT"] == (cfg or {}).get("chunk_size", 64)


@pytest.mark.parametrize("case", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_training_forward_kernels_compile_for_sm90(case, compiled):
    cid, dtype, K, V, gate, cfg, extra = case
    entries = compiled["train:" + cid]
    # the checked diagonal's repair launch follows where a gate bound is promised or absent (bf16/fp32 factors)
    repair = [e for e in entries if e["kind"] == "chunk_intra_repair"]
    assert bool(repair) == (gate in ("safe", "free") and dtype != "float16")  # (fp16: element-wise, no check)
    if repair:
        _check_smem(repair, extra)
        assert repair[0]["constexprs"]["REPAIR"] and not entries[0]["constexprs"]["REPAIR"]
    entries = [e for e in entries if e["kind"] != "chunk_intra_repair"]
    split = entries[-1]["kind"] == "chunk_out"
    # the output split out of the state pass where the config asks, and by the heuristic in half precision at
    # K <= 128 (default_train_config)
    assert split == (cfg.get("split_output", False) if cfg is not None else K <= 128), [e["kind"] for e in entries]
    if split:  # the states-only pass (no output products) and the output launch on its own tiles
        out = entries.pop()
        _check_smem([out], extra)
        c = out["constexprs"]
        assert c["IS_VARLEN"] == extra.get("varlen", False) and c["BT"] == entries[0]["constexprs"]["BT"]
        if cfg is not None:
            assert c["BV"] == min(cfg.get("out_block_v", 64), V) and c["BK"] == min(cfg.get("out_block_k", 64), K)
            assert out["num_warps"] == cfg.get("out_num_warps", 4)
    entries, (intra, state) = _compiled_pair(entries, ("chunk_intra", "chunk_state"), extra)
    assert state["WRITE_O"] is not split
    assert intra["K"] == K and intra["V"] == V and state["K"] == K and state["V"] == V
    assert intra["BT"] == state["BT"] and state["STORE_HS"] and state["STORE_VN"]
    if cfg is not None:  # the config really reached the kernels
        assert intra["BT"] == cfg["chunk_size"]
        assert state["BV"] == min(cfg["state_block_v"], 1 << (V - 1).bit_length())
        assert intra["BK"] == min(cfg["intra_block_k"], 1 << (K - 1).bit_length())
        if "state_num_warps" in cfg:
            assert entries[1]["num_warps"] == cfg["state_num_warps"]


def _elementwise_pair(compiled, key, kinds, K):
    """The constexprs of an element-wise forward/backward pair of launches that compiled within shared
    memory, each on a whole K row (BK the next power of two)."""
    entries = compiled[key]
    assert [e["kind"] for e in entries] == list(kinds), entries
    for e in entries:
        _check_ok(e)
        assert e["shared_bytes"] <= SMEM_LIMIT
        assert e["constexprs"]["K"] == K and e["constexprs"]["BK"] == 1 << (K - 1).bit_length()
    return [e["constexprs"] for e in entries]


@pytest.mark.parametrize("case", L2NORM_CASES, ids=[c[0] for c in L2NORM_CASES])
def test_the_l2norm_kernels_compile_for_sm90(case, compiled):
    cid, dtype, K = case
    for c in _elementwise_pair(compiled, "l2norm:" + cid, ("qk_l2norm", "qk_l2norm_bwd"), K):
        assert c["BR"] * c["BK"] == 2048


@pytest.mark.parametrize("case", GATE_CASES, ids=[c[0] for c in GATE_CASES])
def test_the_gate_launches_compile_for_sm90(case, compiled):
    cid, dtype, K, gate = case
    for c in _elementwise_pair(compiled, "gate:" + cid, ("gate", "gate_bwd"), K):
        assert c["HV"] == 2 and c["BT"] == 16  # (the worker's HV)


@pytest.mark.parametrize("case", REC_CASES, ids=[c[0] for c in REC_CASES])
def test_recurrent_kernel_compiles_for_sm90(case, compiled):
    cid, dtype, K, V, gate, bv, extra = case
    entries = compiled["recurrent:" + cid]
    assert [e["kind"] for e in entries] == ["recurrent"], entries
    e = entries[0]
    _check_ok(e)
    assert 0 <= e["shared_bytes"] <= SMEM_LIMIT
    c = e["constexprs"]
    assert c["K"] == K and c["V"] == V
    if bv is not None:
        assert c["BV"] == bv
    assert c["USE_INDICES"] == ("pool" in extra)
    assert c["IS_VARLEN"] == bool(extra.get("varlen"))
    assert c["STATE_V_FIRST"] == bool(extra.get("v_first"))
    flags = extra.get("flags", {})
    assert c["QK_L2NORM"] == flags.get("qk_l2norm", False)
    assert c["BETA_SIGMOID"] == flags.get("beta_sigmoid", False)
    assert c["NEG_EIGVAL"] == flags.get("neg_eigval", False)
    # speculative decoding's kernel takes num_accepted_tokens' switch; the plain kernel has no such constexpr
    assert c.get("ACCEPTED") == (bool(extra.get("accepted")) if extra.get("slots") else None)
    assert not (extra.get("slots") and c["SLOT_GRID"])
    rc = extra.get("rc", {})
    if rc.get("programs_per_sm") and not extra.get("slots"):  # (token slots run one-item programs whatever asked)
        # the pipelined item loop: the state tile goes through shared memory, one buffer per stage ahead
        tile = c["BK"] * c["BV"] * (2 if extra.get("pool") in ("bfloat16", "float16") else 4)
        assert e["shared_bytes"] >= (rc["num_stages"] - 1) * tile, (e["shared_bytes"], tile)


@pytest.mark.parametrize("case", REC_BWD_CASES, ids=[c[0] for c in REC_BWD_CASES])
def test_recurrent_backward_compiles_for_sm90(case, compiled):
    cid, dtype, K, V, gate, cfg, extra = case
    entries = compiled["recurrent_bwd:" + cid]
    assert [e["kind"] for e in entries] == ["recurrent_bwd"], entries
    e = entries[0]
    _check_ok(e)
    assert 0 <= e["shared_bytes"] <= SMEM_LIMIT
    c = e["constexprs"]
    assert c["K"] == K and c["V"] == V and c["STATE_V_FIRST"] == bool(extra.get("v_first"))
    assert c["BV"] == min((cfg or {}).get("block_v", 32), V)
    assert c["IS_VARLEN"] == bool(extra.get("varlen"))


@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=[c[0] for c in SCHEDULE_CASES])
def test_the_packed_schedule_kernel_compiles_for_sm90(case, compiled):
    """The one-program kernel that builds a packed call's chunk or segment schedule on the device."""
    cid, dtype, K, V, gate, cfg, extra = case
    (entry,) = compiled["schedule:" + cid]
    _check_ok(entry)
    assert entry["kind"] == "chunk_schedule" and entry["constexprs"]["C"] == cfg["chunk_size"]
    assert entry["constexprs"]["L"] == extra["L"] and entry["shared_bytes"] <= SMEM_LIMIT
