"""Gradients of fused_recurrent_kda (the generated backward, run in the CPU interpreter) against
torch autograd through the float64 token-by-token reference ``naive_recurrent_kda``.

Every case checks the gradient of every differentiable input (q, k, v, g, beta, the initial
state, and A_log / dt_bias with the in-kernel gate) for random upstream gradients on o and on
the final state.  The cover: odd T over several checkpoint segments, two V tiles (partial sums
over V), K/V not powers of two, GVA, varlen with length-0 and length-1 sequences, no initial
state, the in-kernel gates (lower bound, softplus) with the l2-norm and beta sigmoid flags,
gates far below any bound and -inf (no decay is ever inverted), fp16 inputs, the V-first state
layout; plus every gradient buffer written (NaN-poisoned), only the gradients asked for, and the
refusals (a state pool, ``out=``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from cases import in_kernel_gate, make_inputs
from conftest import F64, assert_close, poison

import kdagen
from kdagen.config import RecurrentBwdConfig
from kdagen.ops.recurrent_bwd import RecurrentBwdMeta, prepare_recurrent_bwd, recurrent_bwd_config
from kdagen.spec.reference import kda_gate, naive_recurrent_kda

F32, F16 = torch.float32, torch.float16
TOL = {F32: 1e-5, F16: 5e-3}  # relative Frobenius error of every gradient


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
    gate: str = "random"  # make_inputs' gate, or gik_lb / gik_sp (in-kernel gate from a raw input)
    h0: bool = True
    final_state: bool = True
    cu: Optional[list] = None
    flags: bool = False  # l2-norm, beta sigmoid with allow_neg_eigval, an explicit scale
    v_first: bool = False
    bwd: tuple = (16, 4)  # RecurrentBwdConfig (block_v, segment)
    seed: int = 0

    @property
    def Ttot(self):
        return self.cu[-1] if self.cu else self.T


CASES = [
    Case("T13-B2-gva-2Vtiles-K16V24", 2, 13, 1, 2, 16, 24),
    Case("varlen-len0-len1-gva", 1, 0, 1, 2, 16, 16, cu=[0, 0, 1, 9, 20, 20]),
    Case("gik-lowerbound-flags", 1, 11, 1, 2, 16, 16, gate="gik_lb", flags=True),
    Case("gik-softplus-varlen-noh0", 1, 0, 1, 1, 24, 16, gate="gik_sp", cu=[0, 5, 14], h0=False),
    Case("gates-below-bound-and-inf", 1, 12, 1, 1, 16, 16, gate="inf", bwd=(16, 8)),
    Case("fp16-gva-B2", 2, 9, 1, 2, 16, 32, dtype=F16, bwd=(32, 16)),
    Case("v-first-varlen-no-final-state", 1, 0, 1, 2, 16, 24, cu=[0, 7, 10], final_state=False, v_first=True),
]


def _leaves(case: Case):
    raw = case.gate.startswith("gik")
    x = make_inputs(case.B, case.Ttot, case.H, case.HV, case.K, case.V, dtype=case.dtype, seed=case.seed,
                    h0=case.h0, gate="raw" if raw else case.gate, cu_seqlens=case.cu)
    leaves = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta)
    kw = {}
    if case.flags:
        gen = torch.Generator().manual_seed(case.seed + 3)
        leaves["q"] = (3 * torch.randn(x.q.shape, generator=gen)).to(case.dtype)
        leaves["k"] = (2 * torch.randn(x.k.shape, generator=gen)).to(case.dtype)
        leaves["beta"] = (2 * torch.randn(x.beta.shape, generator=gen)).to(case.dtype)
        kw.update(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, scale=0.3)
    if x.h0 is not None:
        leaves["initial_state"] = x.h0.transpose(-1, -2).contiguous() if case.v_first else x.h0
    if raw:
        leaves["A_log"], leaves["dt_bias"] = in_kernel_gate(case.seed, case.HV, case.K)
        kw["use_gate_in_kernel"] = True
        if case.gate == "gik_lb":
            kw["lower_bound"] = -5.0
    return leaves, kw, x.cu_seqlens


def _reference_grads(case: Case, leaves, kw, cu, do, dht):
    """Autograd through the float64 recurrence (states [K, V]; the V-first ones transposed)."""
    r = {n: t.detach().to(F64).requires_grad_(True) for n, t in leaves.items()}
    q, k, beta, g = r["q"], r["k"], r["beta"], r["g"]
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    if kw.get("use_beta_sigmoid_in_kernel"):
        beta = 2 * torch.sigmoid(beta)
    if kw.get("use_gate_in_kernel"):
        g = kda_gate(g, r["A_log"], r["dt_bias"], lower_bound=kw.get("lower_bound"))
    h0 = r.get("initial_state")
    if h0 is not None and case.v_first:
        h0 = h0.transpose(-1, -2)
    o, ht = naive_recurrent_kda(q, k, r["v"], g, beta, scale=kw.get("scale"), initial_state=h0,
                                output_final_state=True, cu_seqlens=cu)
    loss = (o * do.to(F64)).sum()
    if dht is not None:
        loss = loss + (ht * (dht.transpose(-1, -2) if case.v_first else dht).to(F64)).sum()
    loss.backward()
    return {n: t.grad for n, t in r.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recurrent_gradients_match_reference(case: Case):
    leaves, kw, cu = _leaves(case)
    x = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    block_v, segment = case.bwd
    with recurrent_bwd_config(RecurrentBwdConfig(block_v=block_v, segment=segment)):
        o, ht = kdagen.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x.get("A_log"),
                                           dt_bias=x.get("dt_bias"), initial_state=x.get("initial_state"),
                                           output_final_state=case.final_state, cu_seqlens=cu,
                                           state_v_first=case.v_first, **kw)
    assert o.requires_grad and o.dtype == case.dtype
    assert (ht is not None) == case.final_state
    gen = torch.Generator().manual_seed(case.seed + 99)
    do = torch.randn(o.shape, generator=gen)
    loss = (o.float() * do).sum()
    dht = None
    if ht is not None:
        N = len(case.cu) - 1 if case.cu else case.B
        assert tuple(ht.shape) == ((N, case.HV, case.V, case.K) if case.v_first else (N, case.HV, case.K, case.V))
        dht = torch.randn(ht.shape, generator=gen)
        loss = loss + (ht * dht).sum()
    loss.backward()
    ref = _reference_grads(case, leaves, kw, cu, do, dht)
    for name, leaf in x.items():
        assert leaf.grad is not None, f"no gradient for {name}"
        assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape, name
        assert_close(leaf.grad, ref[name], TOL[case.dtype], f"d{name}")


def test_only_the_gradients_asked_for():
    """Only v asks for a gradient, upstream only on the final state (o unused: a zero dO)."""
    case = Case("partial", 1, 10, 1, 2, 16, 16)
    leaves, kw, cu = _leaves(case)
    x = dict(leaves, v=leaves["v"].clone().requires_grad_(True))
    o, ht = kdagen.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                       output_final_state=True)
    dht = torch.randn(ht.shape, generator=torch.Generator().manual_seed(1))
    (ht * dht).sum().backward()
    ref = _reference_grads(case, leaves, kw, cu, torch.zeros(o.shape), dht)
    assert_close(x["v"].grad, ref["v"], TOL[F32], "dv")
    assert all(t.grad is None for n, t in x.items() if n != "v")


def test_backward_writes_every_gradient_element():
    """Every buffer of the backward launch -- the per-V-tile partials, dv, dh0, the gate-parameter
    partials -- is NaN first: each is written in full (varlen with a length-0 and a length-1
    sequence, K and V not powers of two, three V tiles)."""
    from kdagen.codegen.lower import lower
    from kdagen.ops.inputs import check_inputs, select_spec

    case = Case("poison", 1, 0, 1, 2, 24, 40, gate="gik_lb", cu=[0, 0, 1, 12])
    leaves, kw, cu = _leaves(case)
    dims, seqlens = check_inputs(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], scale=None,
                                 initial_state=leaves["initial_state"], cu_seqlens=cu, A_log=leaves["A_log"],
                                 dt_bias=leaves["dt_bias"], gate_in_kernel=True)
    plan = lower(select_spec(True, False, -5.0, True, True), 24, 40, "float32", "recurrent", True)
    meta = RecurrentBwdMeta(dims, seqlens, cu, 24 ** -0.5, plan, RecurrentBwdConfig(block_v=16, segment=4), False)
    gen = torch.Generator().manual_seed(2)
    do, dht = torch.randn(1, 12, 2, 40, generator=gen), torch.randn(3, 2, 24, 40, generator=gen)
    launch, out = prepare_recurrent_bwd(meta, leaves, leaves["initial_state"], do, dht, True)
    assert launch.grid == (3, 6)
    for t in out.values():
        poison(t)
    launch()
    for name, t in out.items():
        assert torch.isfinite(t).all(), f"{name} has unwritten elements"
    # a length-0 sequence passes dht through to dh0 unchanged
    assert torch.equal(out["dh0"][0], dht[0])


def test_refusals_with_gradients(no_launch):
    x = make_inputs(2, 3, 1, 1, 16, 16, seed=1)
    q = x.q.clone().requires_grad_(True)
    with pytest.raises(ValueError, match="ssm_state_indices"):
        kdagen.fused_recurrent_kda(q, x.k, x.v, x.g, x.beta, initial_state=x.h0,
                                   ssm_state_indices=torch.tensor([1, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="out="):
        kdagen.fused_recurrent_kda(q, x.k, x.v, x.g, x.beta, out=torch.empty_like(x.v))
    assert not no_launch
