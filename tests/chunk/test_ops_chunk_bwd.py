"""Gradients of chunk_kda (the generated backward kernels, run in the CPU interpreter) against
torch autograd through the float64 token-by-token reference ``naive_recurrent_kda``.

Every case checks the gradient of every differentiable input (q, k, v, g, beta, the initial
state, and A_log / dt_bias with the in-kernel gate) for a random upstream gradient on o and,
where the final state is returned, another one on the final state.  The cases are a cover,
not a product: T not a multiple of C, T = 1, varlen with a length-1 sequence, K/V not powers
of two, GVA, gates exactly at the lower bound (bounded plan) and the unbounded plan, beta
near 0 and near 1, chunk sizes 16/32/64, fp16 inputs, stored vs recomputed intermediates.
Plus: a NaN-poisoned run of the backward launches (nothing left unwritten), the no-grad
forward left as it was, the inference-only refusal, and an sm_90 compile of both templates.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
import torch

from cases import in_kernel_gate, make_inputs, reference
from conftest import F64, assert_close, params, poison, rel_err
from plain_configs import plain_bwd, plain_train

import kdagen
from kdagen.kernels import Launch
from kdagen.ops.chunk import chunk_bwd_config, chunk_kda_bwd_launches
from kdagen.spec.reference import kda_gate, naive_recurrent_kda

F32, F16 = torch.float32, torch.float16
# relative Frobenius error of every gradient against the float64 reference
TOL = {F32: 1e-5, F16: 5e-3}
VARLEN = [0, 1, 20, 53]  # a length-1 sequence, lengths straddling chunks of 32


@dataclass
class Case:
    id: str
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    dtype: torch.dtype = F32
    gate: str = "safe"  # safe (bounded plan) | free (unbounded plan) | gik_lb | gik_sp
    g_mode: str = "random"  # random: ~10% of g exactly at g_lo | lb: g == -5 everywhere
    g_lo: float = -5.0
    beta: str = "random"  # random (with exact 0s and 1s) | small (1e-3) | large (0.999)
    h0: bool = True
    final_state: bool = True
    cu: Optional[list] = None
    C: Optional[int] = None  # forward chunk size (None: the default config)
    BC: int = 16  # forward sub-chunk (with C)
    lb: float = -5.0  # lower bound promised with gate="safe"
    bwd: dict = field(default_factory=dict)  # ChunkBwdConfig overrides
    train: dict = field(default_factory=dict)  # ChunkTrainConfig overrides
    seed: int = 0

    @property
    def Ttot(self):
        return self.cu[-1] if self.cu else self.T


CASES = [
    Case("T45-C32-safe", 1, 45, 1, 1, 32, 32),
    Case("T1-B2-free", 2, 1, 1, 1, 32, 16, gate="free"),
    Case("varlen-len1-safe", 1, 53, 1, 1, 32, 32, cu=VARLEN),
    Case("varlen-len1-free-gva-noh0", 1, 53, 1, 2, 16, 32, gate="free", cu=VARLEN, h0=False),
    Case("K24V40-safe-gva1x2", 1, 45, 1, 2, 24, 40),
    Case("K48V80-free-gva2x4-B2-stored", 2, 37, 2, 4, 48, 80, gate="free", bwd=dict(store_intermediates=True)),
    Case("g-at-lb-everywhere-safe", 1, 45, 1, 1, 32, 32, g_mode="lb"),
    Case("free-strong-gates", 1, 45, 1, 1, 32, 32, gate="free", g_lo=-20.0),
    Case("beta-near-0", 1, 45, 1, 1, 32, 32, beta="small", g_lo=-1.0),
    Case("beta-near-1-free", 1, 45, 1, 2, 32, 32, gate="free", beta="large"),
    Case("no-final-state", 1, 45, 1, 1, 32, 32, final_state=False),
    Case("C16-safe", 1, 45, 1, 1, 32, 32, C=16),
    Case("C64-free-K40V24-tiles16", 1, 70, 1, 1, 40, 24, gate="free", C=64,
         bwd=dict(state_block_v=16, dqkw_block_v=16, intra_block_k=16, intra_block_v=16)),
    Case("K24V40-dqkw-tiles16-state-fp32", 1, 53, 1, 2, 24, 40, cu=VARLEN,
         bwd=dict(dqkw_block_k=16, dqkw_block_v=16, state_block_v=16, dqkw_num_warps=2, state_dtype="fp32")),
    Case("C64-BC32-safe-lb2", 1, 100, 1, 1, 32, 48, C=64, BC=32, lb=-2.0, g_lo=-2.0),
    Case("gik-lowerbound-gva", 1, 45, 1, 2, 32, 32, gate="gik_lb"),
    Case("gik-softplus-varlen", 1, 53, 1, 2, 24, 32, gate="gik_sp", cu=VARLEN),
    # the in-kernel gate in launches of its own (ChunkTrainConfig.gate_launch): g, then dz, dA_log, ddt_bias
    Case("gik-lowerbound-gva-gate-launch", 1, 45, 1, 2, 32, 32, gate="gik_lb", train=dict(gate_launch=True)),
    Case("gik-softplus-varlen-K24-gate-launch", 1, 53, 1, 2, 24, 32, gate="gik_sp", cu=VARLEN,
         train=dict(gate_launch=True)),
    # fp16 inputs (g and the state stay float32)
    Case("fp16-free-varlen-gva", 1, 53, 1, 2, 32, 40, dtype=F16, gate="free", cu=VARLEN),
    Case("fp16-safe-g-at-lb", 1, 45, 1, 1, 32, 32, dtype=F16),
    Case("fp16-gik-lowerbound-C64", 1, 70, 1, 2, 32, 32, dtype=F16, gate="gik_lb", C=64),
    Case("fp16-gik-softplus", 1, 45, 1, 2, 32, 32, dtype=F16, gate="gik_sp"),
    Case("fp16-gik-lowerbound-K40-gate-launch", 1, 45, 1, 2, 40, 32, dtype=F16, gate="gik_lb",
         train=dict(gate_launch=True)),
    Case("fp16-states-in-fp16", 1, 70, 1, 2, 32, 40, dtype=F16, bwd=dict(state_dtype="input")),
    # the factorised diagonal's operands in fp32 (training forward and backward; the split intra launches)
    Case("fp16-safe-diag-ieee-varlen", 1, 53, 1, 2, 32, 32, dtype=F16, cu=VARLEN,
         bwd=dict(diag_precision="ieee", intra_split=True), train=dict(diag_precision="ieee")),
    # longer sequences: several chunks per sequence in the reverse state pass
    Case("T130-K64V64-safe-B2-gva2x4", 2, 130, 2, 4, 64, 64, bwd=dict(dqkw_block_k=32)),
    Case("fp16-T130-free-K96V16", 1, 130, 1, 1, 96, 16, dtype=F16, gate="free"),
]


def _leaves(case: Case):
    """(the case's inputs by name, chunk_kda's keywords for its gate, cu_seqlens)."""
    x = make_inputs(case.B, case.Ttot, case.H, case.HV, case.K, case.V, dtype=case.dtype, seed=case.seed,
                    h0=case.h0, gate="raw" if case.gate.startswith("gik") else case.g_mode, beta=case.beta,
                    cu_seqlens=case.cu, g_lo=case.g_lo)
    leaves = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta)
    if x.h0 is not None:
        leaves["initial_state"] = x.h0
    kw = {}
    if case.gate == "safe":
        kw = dict(safe_gate=True, lower_bound=case.lb)
    elif case.gate.startswith("gik"):
        leaves["A_log"], leaves["dt_bias"] = in_kernel_gate(case.seed, case.HV, case.K)
        kw = dict(use_gate_in_kernel=True)
        if case.gate == "gik_lb":
            kw["lower_bound"] = -5.0
    return leaves, kw, x.cu_seqlens


def _upstream(case: Case, o_shape, ht_shape):
    gen = torch.Generator().manual_seed(case.seed + 99)
    do = torch.randn(o_shape, generator=gen)
    dht = torch.randn(ht_shape, generator=gen) if case.final_state else None
    return do, dht


def _reference_grads(case: Case, leaves, kw, cu, do, dht):
    ref = {n: t.detach().to(F64).requires_grad_(True) for n, t in leaves.items()}
    if case.gate.startswith("gik"):
        g64 = kda_gate(ref["g"], ref["A_log"], ref["dt_bias"], lower_bound=kw.get("lower_bound"))
    else:
        g64 = ref["g"]
    o, ht = reference("kda", ref, g=g64, h0=ref.get("initial_state"), output_final_state=case.final_state,
                      cu_seqlens=cu)
    loss = (o * do.to(F64)).sum()
    if dht is not None:
        loss = loss + (ht * dht.to(F64)).sum()
    loss.backward()
    return {n: t.grad for n, t in ref.items()}


def _config(case: Case):
    if case.C is None and not case.train:
        return None
    chunking = {} if case.C is None else dict(chunk_size=case.C, sub_chunk=case.BC)
    return plain_train(**chunking, **case.train)


# the cases the interpreter takes well over half a second for (the quick subset leaves them out)
SLOW = {
    'C64-BC32-safe-lb2', 'C64-free-K40V24-tiles16', 'K24V40-dqkw-tiles16-state-fp32', 'K24V40-safe-gva1x2',
    'K48V80-free-gva2x4-B2-stored', 'T1-B2-free', 'T130-K64V64-safe-B2-gva2x4', 'beta-near-1-free',
    'fp16-T130-free-K96V16', 'fp16-free-varlen-gva', 'fp16-gik-lowerbound-C64', 'fp16-gik-softplus',
    'fp16-safe-diag-ieee-varlen', 'fp16-safe-g-at-lb', 'fp16-states-in-fp16', 'free-strong-gates',
    'gik-lowerbound-gva', 'gik-softplus-varlen', 'gik-lowerbound-gva-gate-launch', 'gik-softplus-varlen-K24-gate-launch',
    'fp16-gik-lowerbound-K40-gate-launch',
    'varlen-len1-free-gva-noh0', 'varlen-len1-safe'
}


@pytest.mark.parametrize("case", params(CASES, [c.id for c in CASES], SLOW))
def test_chunk_kda_gradients_match_reference(case: Case):
    leaves, kw, cu = _leaves(case)
    x = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    bwd_cfg = plain_bwd(**case.bwd)
    with chunk_bwd_config(bwd_cfg):
        o, ht = kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x.get("initial_state"),
                                 output_final_state=case.final_state, cu_seqlens=cu, A_log=x.get("A_log"),
                                 dt_bias=x.get("dt_bias"), config=_config(case), **kw)
    assert o.requires_grad and o.dtype == case.dtype
    assert (ht is not None) == case.final_state
    do, dht = _upstream(case, o.shape, None if ht is None else ht.shape)
    loss = (o.float() * do).sum()
    if ht is not None:
        assert ht.requires_grad
        loss = loss + (ht * dht).sum()
    loss.backward()
    ref = _reference_grads(case, leaves, kw, cu, do, dht)
    tol = TOL[case.dtype]
    for name, leaf in x.items():
        assert leaf.grad is not None, f"no gradient for {name}"
        assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape, name
        assert_close(leaf.grad, ref[name], tol, f"d{name}")


@pytest.mark.slow
def test_gradients_only_for_inputs_that_require_them():
    """Only v (and then only the initial state) asks for a gradient; upstream only on the
    final state (o unused: autograd hands the backward a zero dO)."""
    case = Case("partial", 1, 45, 1, 2, 32, 32, gate="free")
    leaves, kw, cu = _leaves(case)
    for wanted in ("v", "initial_state"):
        x = dict(leaves)
        x[wanted] = leaves[wanted].clone().requires_grad_(True)
        o, ht = kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                 output_final_state=True, **kw)
        _, dht = _upstream(case, o.shape, ht.shape)
        (ht * dht).sum().backward()
        ref = _reference_grads(case, leaves, kw, cu, torch.zeros(o.shape), dht)
        assert_close(x[wanted].grad, ref[wanted], TOL[F32], f"d{wanted}")
        for n, t in x.items():
            if n != wanted:
                assert t.grad is None


@pytest.mark.slow
def test_host_preprocessing_is_differentiated():
    """use_qk_l2norm_in_kernel / use_beta_sigmoid_in_kernel (with allow_neg_eigval) and an
    explicit scale: the l2-norm's launches and the beta sigmoid's torch op before the Function,
    with their gradients, against float64 autograd through the same maps."""
    gen = torch.Generator().manual_seed(5)
    B, T, H, HV, K, V = 1, 40, 1, 2, 32, 24
    leaves = dict(q=3 * torch.randn(B, T, H, K, generator=gen), k=2 * torch.randn(B, T, H, K, generator=gen),
                  v=torch.randn(B, T, HV, V, generator=gen), g=-5.0 * torch.rand(B, T, HV, K, generator=gen),
                  beta=2 * torch.randn(B, T, HV, generator=gen), initial_state=torch.randn(B, HV, K, V, generator=gen))
    x = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    o, ht = kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.3, initial_state=x["initial_state"],
                             output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                             allow_neg_eigval=True, safe_gate=True, lower_bound=-5.0)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    ((o * do).sum() + (ht * dht).sum()).backward()
    r = {n: t.detach().to(F64).requires_grad_(True) for n, t in leaves.items()}
    qn = torch.nn.functional.normalize(r["q"], dim=-1)
    kn = torch.nn.functional.normalize(r["k"], dim=-1)
    ro, rh = naive_recurrent_kda(qn, kn, r["v"], r["g"], 2 * torch.sigmoid(r["beta"]), scale=0.3,
                                 initial_state=r["initial_state"], output_final_state=True)
    ((ro * do.to(F64)).sum() + (rh * dht.to(F64)).sum()).backward()
    for n in leaves:
        assert_close(x[n].grad, r[n].grad, TOL[F32], f"d{n}")


# ------------------------------------------------------------------ every element written


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["safe", "gik_lb"])
def test_backward_writes_every_element(gate):
    """Every buffer the backward launches write -- gradients, the per-chunk state gradients
    and the products between the launches -- is filled with NaN first: nothing may stay
    unwritten, and no masked-off element may be read.  Varlen with a length-1 sequence, K/V not powers of two, two V
    tiles, GVA; the outputs are reduced by hand and checked against the reference."""
    case = Case("poison", 1, 53, 1, 2, 24, 40, gate=gate, cu=VARLEN)
    leaves, kw, cu = _leaves(case)
    N = len(VARLEN) - 1
    do, dht = _upstream(case, (1, 53, 2, 40), (N, 2, 24, 40))
    fwd, bwd, out = chunk_kda_bwd_launches(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], initial_state=leaves["initial_state"],
        output_final_state=True, cu_seqlens=cu, A_log=leaves.get("A_log"), dt_bias=leaves.get("dt_bias"),
        do=do, dht=dht, bwd_config=plain_bwd(state_block_v=32, dqkw_block_k=16, rerun_block_k=16,
                                             intra_block_k=16, intra_split=gate == "gik_lb"), **kw)
    poison(fwd[1].args["vn"])  # V', written by the forward's state pass for the backward
    for launch in fwd:
        launch()
    # the re-run from the kept A_qk and T, state, dqkw, then the intra gradients (gik_lb: split in two)
    kind = {ln.kernel: ln for ln in bwd}
    rerun, state, dqkw, intra = (kind[n] for n in ("chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw",
                                                     "chunk_bwd_intra"))
    assert len(bwd) == (5 if gate == "gik_lb" else 4) and rerun.grid[2] == 2, "two K tiles of the re-run expected"
    assert state.grid[0] == 2, "two V tiles expected"
    assert dqkw.constexprs["BV"] == 32 and dqkw.constexprs["V"] == 40, "two V tiles in the dqkw loop expected"
    assert dqkw.grid[2] == 2, "two K tiles of the dqkw launch expected (K=24, BK=16)"
    for name in ("qg", "kg", "w", "gn"):
        poison(rerun.args[name])
    for name in ("du", "dhs", "dh0"):
        poison(state.args[name])
    for name in ("dqg", "dkg", "dw", "daqk", "dgn"):
        poison(dqkw.args[name])
    for ln in (kind.get("chunk_bwd_wy"), intra):
        for name in ("dq", "dk", "dv", "dg", "dbeta", "dA_part", "dbias_part", "de"):
            if ln is not None and name in ln.args:
                poison(ln.args[name])
    for launch in bwd:
        launch()
    ref = _reference_grads(case, leaves, kw, cu, do, dht)
    got = dict(q=out["dq"].sum(2, keepdim=True), k=out["dk"].sum(2, keepdim=True), v=out["dv"], g=out["dg"],
               beta=out["dbeta"], initial_state=out["dh0"])
    if gate == "gik_lb":
        got["A_log"] = out["dA_part"].sum((0, 2))
        got["dt_bias"] = out["dbias_part"].sum(0).reshape(-1)
    assert set(got) == set(ref)
    for n, t in got.items():
        assert_close(t, ref[n], TOL[F32], f"d{n}")


@pytest.mark.parametrize("dtype,state_dtype,expect", [(F32, "input", F32), (F16, "input", F16),
                                                      (F16, "fp32", F32), (F16, None, F32)])
def test_state_storage_dtype(dtype, state_dtype, expect):
    """The per-chunk states the training forward keeps, and their gradients, are stored in
    ChunkBwdConfig.state_dtype (default: the input dtype, but float32 for fp16 inputs)."""
    leaves, kw, cu = _leaves(Case("sdt", 1, 40, 1, 1, 32, 32, dtype=dtype))
    cfg = None if state_dtype is None else plain_bwd(state_dtype=state_dtype)
    fwd, bwd, _ = chunk_kda_bwd_launches(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                         initial_state=leaves["initial_state"], bwd_config=cfg, **kw)
    assert fwd[1].args["hs"].dtype == expect
    kind = {ln.kernel: ln for ln in bwd}
    assert kind["chunk_bwd_state"].args["dhs"].dtype == expect and kind["chunk_bwd_dqkw"].args["hs"] is fwd[1].args["hs"]


@pytest.mark.parametrize("HV", [1, 2])
def test_gradients_are_written_in_the_inputs_dtypes(HV):
    """dq, dk and dbeta leave the kernel in the inputs' dtypes (no conversion pass after it);
    with GVA, dq and dk stay float32 until the sum over each q/k head's value heads."""
    leaves, kw, cu = _leaves(Case("odt", 1, 40, 1, HV, 32, 32, dtype=F16))
    fwd, bwd, outs = chunk_kda_bwd_launches(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                            initial_state=leaves["initial_state"], **kw)
    expect = F16 if HV == 1 else F32
    assert outs["dq"].dtype == outs["dk"].dtype == expect
    assert outs["dbeta"].dtype == F16 and outs["dv"].dtype == F16 and outs["dg"].dtype == F32
    # fp16: the split intra launches (chunk_bwd_wy writes dbeta, the second dq)
    kind = {ln.kernel: ln for ln in bwd}
    assert kind["chunk_bwd_intra"].args["dq"] is outs["dq"] and kind["chunk_bwd_wy"].args["dbeta"] is outs["dbeta"]


# ------------------------------------------------------------------ the forward without grad


def test_forward_without_grad_runs_the_inference_kernels(monkeypatch):
    """No input requires grad: the inference forward runs (the solve and the state pass) and
    writes no per-chunk states; with grad the training forward runs and writes them
    (STORE_HS).  The two compute the same o and final state, to float32 rounding."""
    seen = []
    real_call = Launch.__call__

    def spy(self):
        seen.append(dict(self.constexprs))
        return real_call(self)

    monkeypatch.setattr(Launch, "__call__", spy)
    leaves, kw, cu = _leaves(Case("nograd", 1, 45, 1, 2, 32, 32))
    o0, h0 = kdagen.chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                              initial_state=leaves["initial_state"], output_final_state=True, **kw)
    assert len(seen) == 2 and seen[1]["STORE_HS"] is False and not o0.requires_grad
    assert "BH" in seen[0] and "STORE_VN" not in seen[1]  # the solve and the inference state pass
    seen.clear()
    v = leaves["v"].clone().requires_grad_(True)
    o1, h1 = kdagen.chunk_kda(leaves["q"], leaves["k"], v, leaves["g"], leaves["beta"],
                              initial_state=leaves["initial_state"], output_final_state=True, **kw)
    # the training forward: the intra launch, its repair launch (the promised bound checked), the state pass
    assert len(seen) == 3 and seen[0]["REPAIR"] is False and seen[1]["REPAIR"] is True
    assert seen[2]["STORE_HS"] is True and seen[2]["STORE_VN"] is True and o1.requires_grad
    assert rel_err(o0, o1.detach()) < 1e-6 and rel_err(h0, h1.detach()) < 1e-6


def test_backward_launch_sequence(monkeypatch):
    """Forward (intra writing U and T, state writing the per-chunk states and V'), then the
    backward: the re-run of qg, kg, W and G_n from the kept A_qk and T, the reverse state pass,
    the chunk-parallel products, the intra-chunk gradients (fp32: one launch) -- six launches, and
    after each intra launch its repair launch (the promised bound checked; REPAIR), nothing else."""
    seen = []
    real_call = Launch.__call__

    def spy(self):
        seen.append((self.fn.__name__.split("_", 1)[1].rsplit("_", 1)[0], dict(self.constexprs)))
        return real_call(self)

    monkeypatch.setattr(Launch, "__call__", spy)
    leaves, kw, cu = _leaves(Case("seq", 1, 45, 1, 1, 32, 32))
    leaves = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    o, ht = kdagen.chunk_kda(**leaves, output_final_state=True, **kw)
    (o.sum() + ht.sum()).backward()
    assert [k for k, _ in seen] == ["chunk_intra", "chunk_intra", "chunk_state", "chunk_bwd_rerun", "chunk_bwd_state",
                                    "chunk_bwd_dqkw", "chunk_bwd_intra", "chunk_bwd_intra"]
    assert [c.get("REPAIR") for _, c in seen] == [False, True, None, None, None, None, False, True]
    assert seen[0][1]["STORE_U"] is True and seen[0][1]["STORE_T"] is True
    assert seen[2][1]["STORE_HS"] is True and seen[2][1]["STORE_VN"] is True


def test_intermediate_states_with_grad_is_refused(no_launch):
    leaves, kw, cu = _leaves(Case("refuse", 1, 20, 1, 1, 32, 32))
    q = leaves["q"].clone().requires_grad_(True)
    with pytest.raises(ValueError, match="inference-only"):
        kdagen.chunk_kda(q, leaves["k"], leaves["v"], leaves["g"], leaves["beta"], return_intermediate_states=True,
                         **kw)
    assert not no_launch


# ------------------------------------------------------------------ sm_90 compile

SMEM_LIMIT = 232448  # H100/H200: largest dynamic shared memory per block
REPO = Path(__file__).resolve().parents[2]
COMPILE_CASES = [
    # id, dtype, K, V, gate, forward config overrides, backward config (None: the heuristic's)
    ("bf16-K128V128-safe", "bfloat16", 128, 128, "safe", None, None),
    ("bf16-K96V192-free", "bfloat16", 96, 192, "free", None, None),
    ("bf16-K128V128-gik-lb-varlen-C64", "bfloat16", 128, 128, "gik_lb", dict(chunk_size=64), None),
    ("bf16-K128V128-safe-fused-intra", "bfloat16", 128, 128, "safe", None, dict(intra_split=False)),
    # the reverse state pass loading G_n one chunk ahead (ChunkBwdConfig.state_prefetch), K masked
    ("bf16-K96V192-free-prefetch", "bfloat16", 96, 192, "free", None, dict(state_prefetch=True, intra_split=True)),
    # the upstream diagonal tiles as hi + lo in the dq/dk/dg launch (diag_precision="split")
    ("bf16-K128V128-safe-diag-split", "bfloat16", 128, 128, "safe", None,
     dict(diag_precision="split", intra_split=True, state_prefetch=True)),
]
# Runs in a clean interpreter (Triton cannot compile while TRITON_INTERPRET=1, which the
# conftest sets for this process): the ops' own launch builders, compiled for sm_90.
_WORKER = r'''
import json, sys, torch
from triton.backends.compiler import GPUTarget
from kdagen.kernels import compile_for_target
from plain_configs import plain_bwd, plain_train
from kdagen.ops.chunk import chunk_kda_bwd_launches
out = {}
for cid, dtype, K, V, gate, cfg, bcfg in json.loads(sys.stdin.read()):
    dt, HV, varlen = getattr(torch, dtype), 2, "varlen" in cid
    B, T = (1, 70) if varlen else (2, 70)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, 1, K, generator=gen).to(dt)
    k = torch.randn(B, T, 1, K, generator=gen).to(dt)
    v = torch.randn(B, T, HV, V, generator=gen).to(dt)
    g = -torch.rand(B, T, HV, K, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen).to(dt)
    cu = torch.tensor([0, 7, 50, T]) if varlen else None
    N = 3 if varlen else B
    kw = dict(safe_gate=True, lower_bound=-5.0) if gate == "safe" else {}
    if gate.startswith("gik"):
        kw = dict(use_gate_in_kernel=True, A_log=torch.zeros(HV), dt_bias=torch.zeros(HV * K), lower_bound=-5.0)
    try:
        _, bwd, _ = chunk_kda_bwd_launches(q, k, v, g, beta, initial_state=torch.zeros(N, HV, K, V),
                                           output_final_state=True, cu_seqlens=cu,
                                           config=None if cfg is None else plain_train(**cfg),
                                           bwd_config=None if bcfg is None else plain_bwd(**bcfg),
                                           **kw)
        res = []
        for l in [x for ln in bwd for x in (ln, ln.then) if x is not None]:  # each launch, then its repair launch
            r = compile_for_target(l.fn, l.args, l.constexprs, GPUTarget("cuda", 90, 32), l.num_warps, l.num_stages)
            res.append(dict(name=r.name, fn=l.fn.__name__, target=r.target, shared=r.shared_bytes,
                            BT=l.constexprs.get("BT"), K=l.constexprs["K"], V=l.constexprs.get("V"),
                            prefetch="b_gn_next" in open(l.fn.fn.__code__.co_filename).read(),
                            split="b_dQl" in open(l.fn.fn.__code__.co_filename).read(),
                            tf32='input_precision="tf32"' in open(l.fn.fn.__code__.co_filename).read(),
                            repair=l.constexprs.get("REPAIR")))
        out[cid] = res
    except Exception as e:
        out[cid] = dict(error=f"{type(e).__name__}: {e}"[:4000])
sys.stdout.write("\n@@RESULTS@@" + json.dumps(out) + "\n")
'''


@pytest.fixture(scope="module")
def compiled_bwd():
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONWARNINGS"] = "ignore"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="kdagen-bwd-sm90-") as tmp:  # private caches, removed afterwards
        env["KDAGEN_CACHE_DIR"] = os.path.join(tmp, "kdagen")
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")  # really compile
        proc = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps(COMPILE_CASES), capture_output=True,
                              text=True, env=env, cwd=str(REPO), timeout=540)
    marker = proc.stdout.rfind("@@RESULTS@@")
    assert proc.returncode == 0 and marker >= 0, f"compile worker failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout[marker + len("@@RESULTS@@"):])


@pytest.mark.slow
@pytest.mark.parametrize("case", COMPILE_CASES, ids=[c[0] for c in COMPILE_CASES])
def test_backward_kernels_compile_for_sm90(case, compiled_bwd):
    cid, dtype, K, V, gate, cfg, bcfg = case
    res = compiled_bwd[cid]
    assert not isinstance(res, dict), f"build/compile failed:\n{res.get('error')}"
    # the re-run from the forward's kept tiles, then state, dqkw and the intra gradients (bf16: two launches)
    kinds = ["chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_wy", "chunk_bwd_intra"]
    if "fused" in cid:
        kinds.remove("chunk_bwd_wy")
    if "C64" in cid:  # four sub-tiles per chunk: neither the re-run from kept tiles nor the split
        kinds = ["chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"]
    # a promised bound (g given) or none: the intra launches' diagonals are checked in repair launches
    # (REPAIR=True, after each), compiled too; an in-kernel gate's formula bound is not checked
    repairs = [r for r in res if r["repair"]]
    assert [r["repair"] for r in res if r["repair"] is not None] == [False, True] * len(repairs)
    assert len(repairs) == (0 if gate.startswith("gik") else 1 if "fused" in cid else 2)
    for r in repairs:
        assert r["target"] == "cuda:90" and 0 < r["shared"] <= SMEM_LIMIT, r
    res = [r for r in res if not r["repair"]]
    assert len(res) == len(kinds)
    for r, kind in zip(res, kinds):
        assert kind in r["name"] and r["name"] == r["fn"] and r["target"] == "cuda:90"
        assert 0 < r["shared"] <= SMEM_LIMIT, f"{kind}: {r['shared']} bytes of shared memory (limit {SMEM_LIMIT})"
        assert r["K"] == K and r["V"] in ((None,) if kind == "chunk_bwd_rerun" else (V,))
        assert r["BT"] == (cfg or {}).get("chunk_size", 32)
        # G_n a chunk ahead: the half-precision heuristic's reverse pass (K <= 128) and the configs that ask
        assert r["prefetch"] == (kind == "chunk_bwd_state" and (bcfg or {"state_prefetch": True}).get("state_prefetch", False))
        assert r["split"] == (kind == "chunk_bwd_intra" and "split" in cid)
        if kind == "chunk_bwd_state":  # dS and dV' on the input dtype's dots (no tf32 in the reverse pass)
            assert not r["tf32"]
