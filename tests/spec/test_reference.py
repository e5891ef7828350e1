"""Tests of kdagen.reference: the float64 recurrent / chunkwise references and the KDA gate."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kdagen.spec.reference import (
    dplr_recurrence,
    kda_gate,
    naive_chunk_deltanet,
    naive_chunk_gdn,
    naive_chunk_gla,
    naive_chunk_kda,
    naive_recurrent_deltanet,
    naive_recurrent_dplr,
    naive_recurrent_gdn,
    naive_recurrent_gla,
    naive_recurrent_kda,
)

F64 = torch.float64
TOL = 1e-10


def rel(out, ref):
    """||out - ref|| / ||ref||, guarding against a trivially zero reference."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == F64 and ref.dtype == F64
    nrm = ref.norm().item()
    assert nrm > 1e-8, "reference is (near) zero: the comparison would be vacuous"
    return (out - ref).norm().item() / nrm


def make_inputs(B, T, H, HV, K, V, seed, n_states=None, with_h0=True, scalar_gate=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=F64)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=F64)
    gshape = (B, T, HV) if scalar_gate else (B, T, HV, K)
    g = -5.0 * (1.0 - torch.rand(gshape, generator=gen, dtype=F64))  # in [-5, 0)
    g = torch.where(torch.rand(gshape, generator=gen, dtype=F64) < 0.15, torch.full_like(g, -5.0), g)
    beta = torch.rand(B, T, HV, generator=gen, dtype=F64)
    N = B if n_states is None else n_states
    h0 = torch.randn(N, HV, K, V, generator=gen, dtype=F64) if with_h0 else None
    return q, k, v, g, beta, h0


def dense_dplr(q, k, v, ld, a, b, w, scale, h0):
    """Independent, obviously-correct DPLR recurrence with explicit K x K transition matrices.

    a, b, w are per value head [B, T, HV, K]; q/k heads are looked up as hv // (HV // H).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    o = torch.zeros(B, T, HV, V, dtype=F64)
    S_out = torch.zeros(B, HV, K, V, dtype=F64)
    for bb in range(B):
        for hv in range(HV):
            h = hv // group
            S = h0[bb, hv].clone() if h0 is not None else torch.zeros(K, V, dtype=F64)
            for t in range(T):
                M = torch.diag(torch.exp(ld[bb, t, hv]))
                if a is not None:
                    M = M - torch.outer(a[bb, t, hv], b[bb, t, hv])
                khat = w[bb, t, hv] if w is not None else k[bb, t, h]
                S = M @ S + torch.outer(khat, v[bb, t, hv])
                o[bb, t, hv] = S.T @ (scale * q[bb, t, h])
            S_out[bb, hv] = S
    return o, S_out


def kda_dense_args(k, g, beta, HV):
    """a = beta k, b = exp(g) k, khat = beta k, with the GVA head map written out by hand."""
    B, T, H, K = k.shape
    group = HV // H
    kk = torch.stack([k[:, :, hv // group] for hv in range(HV)], dim=2)
    bk = beta[..., None] * kk
    return bk, torch.exp(g) * kk, bk


# --------------------------------------------------------------------------------------------
# recurrence against an independent dense implementation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("B,T,H,HV,K,V,with_h0", [(2, 9, 2, 4, 5, 3, True), (1, 7, 1, 3, 4, 6, False)])
def test_kda_recurrence_matches_dense(B, T, H, HV, K, V, with_h0):
    q, k, v, g, beta, h0 = make_inputs(B, T, H, HV, K, V, seed=1, with_h0=with_h0)
    scale = 0.37
    o, S = naive_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True)
    a, b, w = kda_dense_args(k, g, beta, HV)
    o_ref, S_ref = dense_dplr(q, k, v, g, a, b, w, scale, h0)
    assert rel(o, o_ref) < TOL and rel(S, S_ref) < TOL


def test_general_dplr_recurrence_matches_dense():
    B, T, H, HV, K, V = 2, 8, 1, 2, 4, 3
    q, k, v, g, beta, h0 = make_inputs(B, T, H, HV, K, V, seed=2)
    gen = torch.Generator().manual_seed(22)
    a = 0.5 * torch.randn(B, T, HV, K, generator=gen, dtype=F64)
    b = 0.5 * torch.randn(B, T, HV, K, generator=gen, dtype=F64)
    o, S = naive_recurrent_dplr(q, k, v, a, b, g, initial_state=h0, output_final_state=True)
    o_ref, S_ref = dense_dplr(q, k, v, g, a, b, None, K ** -0.5, h0)
    assert rel(o, o_ref) < TOL and rel(S, S_ref) < TOL


def test_default_scale_and_output_types():
    q, k, v, g, beta, h0 = make_inputs(1, 5, 1, 1, 9, 2, seed=3)
    o1, S1 = naive_recurrent_kda(q.float(), k.float(), v.float(), g.float(), beta.float())
    assert o1.dtype == F64 and S1 is None and o1.shape == (1, 5, 1, 2)
    o2, _ = naive_recurrent_kda(q.float(), k.float(), v.float(), g.float(), beta.float(), scale=9 ** -0.5)
    o3, _ = naive_recurrent_kda(q.float(), k.float(), v.float(), g.float(), beta.float(), scale=1.0)
    assert torch.equal(o1, o2)
    assert rel(o3 * 9 ** -0.5, o1) < 1e-14
    o4, S4 = naive_chunk_kda(q.float(), k.float(), v.float(), g.float(), beta.float(), output_final_state=True)
    assert o4.dtype == F64 and S4.dtype == F64 and rel(o4, o1) < TOL


# --------------------------------------------------------------------------------------------
# chunkwise == recurrence
# --------------------------------------------------------------------------------------------

CHUNK_CASES = [
    # B, T, H, HV, K, V, C, with_h0
    (2, 37, 2, 4, 24, 40, 16, True),  # GVA, K/V not powers of two, T % C != 0
    (1, 1, 1, 1, 16, 16, 64, True),  # T = 1
    (2, 10, 1, 1, 8, 12, 64, False),  # T < C, no initial state
    (1, 64, 1, 2, 32, 16, 64, True),  # T == C
    (1, 130, 2, 2, 24, 40, 64, True),  # several chunks, short last chunk
    (2, 23, 1, 3, 5, 7, 4, False),  # HV = 3 * H, tiny chunks
    (1, 17, 2, 4, 24, 40, 4, True),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,C,with_h0", CHUNK_CASES)
def test_chunk_kda_equals_recurrence(B, T, H, HV, K, V, C, with_h0):
    q, k, v, g, beta, h0 = make_inputs(B, T, H, HV, K, V, seed=T * 7 + C, with_h0=with_h0)
    o_ref, S_ref = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, S = naive_chunk_kda(q, k, v, g, beta, chunk_size=C, initial_state=h0, output_final_state=True)
    assert rel(o, o_ref) < TOL
    assert rel(S, S_ref) < TOL


@pytest.mark.parametrize("B,T,H,HV,K,V,C,with_h0", CHUNK_CASES)
def test_chunk_gla_equals_recurrence(B, T, H, HV, K, V, C, with_h0):
    q, k, v, g, _, h0 = make_inputs(B, T, H, HV, K, V, seed=T * 11 + C, with_h0=with_h0)
    o_ref, S_ref = naive_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    o, S = naive_chunk_gla(q, k, v, g, chunk_size=C, initial_state=h0, output_final_state=True)
    assert rel(o, o_ref) < TOL
    assert rel(S, S_ref) < TOL


@pytest.mark.parametrize("C", [4, 16, 64])
def test_chunk_gdn_and_deltanet_equal_recurrence(C):
    B, T, H, HV, K, V = 2, 41, 1, 2, 24, 40
    q, k, v, g, beta, h0 = make_inputs(B, T, H, HV, K, V, seed=C, scalar_gate=True)
    o_ref, S_ref = naive_recurrent_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, S = naive_chunk_gdn(q, k, v, g, beta, chunk_size=C, initial_state=h0, output_final_state=True)
    assert rel(o, o_ref) < TOL and rel(S, S_ref) < TOL
    o_ref, S_ref = naive_recurrent_deltanet(q, k, v, beta, initial_state=h0, output_final_state=True)
    o, S = naive_chunk_deltanet(q, k, v, beta, chunk_size=C, initial_state=h0, output_final_state=True)
    assert rel(o, o_ref) < TOL and rel(S, S_ref) < TOL


VARLEN_CASES = [
    # lengths, C, with_h0
    ([1, 17, 1, 33, 18], 16, True),  # lengths 1 and lengths straddling chunk boundaries
    ([5, 1, 70], 64, False),
    ([3, 9, 4], 4, True),
]


@pytest.mark.parametrize("lengths,C,with_h0", VARLEN_CASES)
def test_chunk_equals_recurrence_varlen(lengths, C, with_h0):
    T = sum(lengths)
    N = len(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int64)
    q, k, v, g, beta, h0 = make_inputs(1, T, 2, 4, 24, 40, seed=T + C, n_states=N, with_h0=with_h0)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
    o_ref, S_ref = naive_recurrent_kda(q, k, v, g, beta, **kw)
    o, S = naive_chunk_kda(q, k, v, g, beta, chunk_size=C, **kw)
    assert S.shape == (N, 4, 24, 40)
    assert rel(o, o_ref) < TOL and rel(S, S_ref) < TOL
    o_ref, S_ref = naive_recurrent_gla(q, k, v, g, **kw)
    o, S = naive_chunk_gla(q, k, v, g, chunk_size=C, **kw)
    assert rel(o, o_ref) < TOL and rel(S, S_ref) < TOL


# --------------------------------------------------------------------------------------------
# varlen == separate runs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_h0", [True, False])
def test_varlen_equals_separate_runs(with_h0):
    lengths = [4, 1, 13, 6]
    T, N = sum(lengths), len(lengths)
    cu = torch.tensor([0, 4, 5, 18, 24], dtype=torch.int64)
    q, k, v, g, beta, h0 = make_inputs(1, T, 1, 2, 6, 5, seed=5, n_states=N, with_h0=with_h0)
    runs = {
        "rec_kda": lambda sl, **kw: naive_recurrent_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], **kw),
        "chunk_kda": lambda sl, **kw: naive_chunk_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], chunk_size=4, **kw),
        "rec_gla": lambda sl, **kw: naive_recurrent_gla(q[:, sl], k[:, sl], v[:, sl], g[:, sl], **kw),
        "chunk_gla": lambda sl, **kw: naive_chunk_gla(q[:, sl], k[:, sl], v[:, sl], g[:, sl], chunk_size=4, **kw),
    }
    for name, run in runs.items():
        o_pk, S_pk = run(slice(None), initial_state=h0, output_final_state=True, cu_seqlens=cu)
        outs, states = [], []
        for i in range(N):
            sl = slice(int(cu[i]), int(cu[i + 1]))
            h0_i = h0[i : i + 1] if h0 is not None else None
            o_i, S_i = run(sl, initial_state=h0_i, output_final_state=True)
            outs.append(o_i)
            states.append(S_i)
        assert rel(o_pk, torch.cat(outs, 1)) < 1e-13, name
        assert rel(S_pk, torch.cat(states, 0)) < 1e-13, name
    # and the packed run really differs from treating the whole pack as one sequence
    o_one, _ = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0[:1] if h0 is not None else None)
    o_pk, _ = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    assert rel(o_one, o_pk) > 1e-3


def test_varlen_zero_length_sequence_keeps_initial_state():
    cu = torch.tensor([0, 3, 3, 5], dtype=torch.int64)
    q, k, v, g, beta, h0 = make_inputs(1, 5, 1, 1, 3, 2, seed=6, n_states=3)
    for fn in (naive_recurrent_kda, lambda *a, **kw: naive_chunk_kda(*a, chunk_size=2, **kw)):
        o, S = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        assert o.shape == (1, 5, 1, 2)
        assert torch.equal(S[1], h0[1])
        assert not torch.allclose(S[0], h0[0])


# --------------------------------------------------------------------------------------------
# degenerate members
# --------------------------------------------------------------------------------------------


def test_kda_with_zero_gate_is_deltanet():
    q, k, v, g, beta, h0 = make_inputs(2, 19, 2, 4, 7, 5, seed=7)
    z = torch.zeros_like(g)
    o1, S1 = naive_recurrent_kda(q, k, v, z, beta, initial_state=h0, output_final_state=True)
    o2, S2 = naive_recurrent_deltanet(q, k, v, beta, initial_state=h0, output_final_state=True)
    assert rel(o1, o2) < 1e-14 and rel(S1, S2) < 1e-14
    # ... and a non-zero gate really changes the answer
    o3, _ = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0)
    assert rel(o3, o2) > 1e-3


def test_kda_with_equal_channels_is_gdn():
    q, k, v, gs, beta, h0 = make_inputs(2, 19, 2, 4, 7, 5, seed=8, scalar_gate=True)
    gk = gs[..., None].expand(*gs.shape, 7).contiguous()
    o1, S1 = naive_recurrent_kda(q, k, v, gk, beta, initial_state=h0, output_final_state=True)
    o2, S2 = naive_recurrent_gdn(q, k, v, gs, beta, initial_state=h0, output_final_state=True)
    assert rel(o1, o2) < 1e-14 and rel(S1, S2) < 1e-14


def test_zero_beta_is_pure_decay():
    B, T, H, HV, K, V = 2, 13, 1, 2, 6, 4
    q, k, v, g, _, h0 = make_inputs(B, T, H, HV, K, V, seed=9)
    g = g * 0.2  # keep the state visible over the whole sequence
    beta = torch.zeros(B, T, HV, dtype=F64)
    Gc = g.cumsum(1)  # [B, T, HV, K]
    qe = q.repeat_interleave(HV // H, dim=2)
    o_exp = torch.einsum("bthk,bhkv->bthv", K ** -0.5 * qe * torch.exp(Gc), h0)
    S_exp = torch.exp(Gc[:, -1])[..., None] * h0
    for o, S in (
        naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True),
        naive_chunk_kda(q, k, v, g, beta, chunk_size=4, initial_state=h0, output_final_state=True),
    ):
        assert rel(o, o_exp) < TOL and rel(S, S_exp) < TOL


def test_dplr_with_kda_factors_is_kda():
    B, T, H, HV, K, V = 2, 15, 2, 4, 6, 5
    q, k, v, g, beta, h0 = make_inputs(B, T, H, HV, K, V, seed=10)
    a, b, w = kda_dense_args(k, g, beta, HV)  # per value head
    o1, S1 = dplr_recurrence(q, k, v, g, a, b, w, initial_state=h0, output_final_state=True)
    o2, S2 = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel(o1, o2) < 1e-13 and rel(S1, S2) < 1e-13
    # without write_key (khat = k instead of beta k) the result must differ
    o3, _ = dplr_recurrence(q, k, v, g, a, b, initial_state=h0)
    assert rel(o3, o2) > 1e-3


def test_gla_is_dplr_without_rank_one():
    B, T, H, HV, K, V = 1, 12, 1, 2, 5, 3
    q, k, v, g, _, h0 = make_inputs(B, T, H, HV, K, V, seed=11)
    o1, S1 = naive_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    o2, S2 = dplr_recurrence(q, k, v, g, initial_state=h0, output_final_state=True)
    assert rel(o1, o2) < 1e-14 and rel(S1, S2) < 1e-14
    o3, S3 = dense_dplr(q, k, v, g, None, None, None, K ** -0.5, h0)
    assert rel(o1, o3) < TOL and rel(S1, S3) < TOL


# --------------------------------------------------------------------------------------------
# hand-computed 2-token example (plain Python floats)
# --------------------------------------------------------------------------------------------


def test_two_token_scalar_example_by_hand():
    qs, ks, vs = [0.9, -1.3], [0.6, -0.8], [2.0, -0.5]
    gs, bs, S0, sc = [-0.3, -1.7], [0.4, 0.9], 1.5, 0.7
    # KDA, K = V = 1: S_t = (1 - b k^2) e^g S + b k v
    S, o_kda = S0, []
    for t in range(2):
        S = (1.0 - bs[t] * ks[t] ** 2) * math.exp(gs[t]) * S + bs[t] * ks[t] * vs[t]
        o_kda.append(sc * qs[t] * S)
    S_kda = S
    # GLA: S_t = e^g S + k v
    S, o_gla = S0, []
    for t in range(2):
        S = math.exp(gs[t]) * S + ks[t] * vs[t]
        o_gla.append(sc * qs[t] * S)
    S_gla = S

    def t4(x):
        return torch.tensor(x, dtype=F64).reshape(1, 2, 1, 1)

    q, k, v, g = t4(qs), t4(ks), t4(vs), t4(gs)
    beta = torch.tensor(bs, dtype=F64).reshape(1, 2, 1)
    h0 = torch.tensor(S0, dtype=F64).reshape(1, 1, 1, 1)
    exp_o = torch.tensor(o_kda, dtype=F64).reshape(1, 2, 1, 1)
    kw = dict(scale=sc, initial_state=h0, output_final_state=True)
    results = [naive_recurrent_kda(q, k, v, g, beta, **kw)]
    results += [naive_chunk_kda(q, k, v, g, beta, chunk_size=C, **kw) for C in (1, 2, 64)]
    for o, Sf in results:
        assert torch.allclose(o, exp_o, rtol=1e-14, atol=0)
        assert math.isclose(Sf.item(), S_kda, rel_tol=1e-14)
    exp_o = torch.tensor(o_gla, dtype=F64).reshape(1, 2, 1, 1)
    results = [naive_recurrent_gla(q, k, v, g, **kw)]
    results += [naive_chunk_gla(q, k, v, g, chunk_size=C, **kw) for C in (1, 2, 64)]
    for o, Sf in results:
        assert torch.allclose(o, exp_o, rtol=1e-14, atol=0)
        assert math.isclose(Sf.item(), S_gla, rel_tol=1e-14)


# --------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------


def _bad_cases():
    q, k, v, g, beta, h0 = make_inputs(1, 6, 2, 4, 3, 2, seed=12)
    q2, k2, v2, g2, beta2, h02 = make_inputs(2, 6, 2, 4, 3, 2, seed=12)
    cu = torch.tensor([0, 2, 6], dtype=torch.int64)
    h0n = torch.randn(2, 4, 3, 2, dtype=F64)
    v3 = torch.randn(1, 6, 3, 2, dtype=F64)
    g3 = torch.randn(1, 6, 3, 3, dtype=F64)
    b3 = torch.rand(1, 6, 3, dtype=F64)
    return [
        ("HV=3 not a multiple of H=2", lambda: naive_recurrent_kda(q, k, v3, g3, b3), "multiple"),
        ("HV=3 not a multiple of H=2 (chunk)", lambda: naive_chunk_gla(q, k, v3, g3), "multiple"),
        ("q/k shape mismatch", lambda: naive_recurrent_kda(q, k[..., :2], v, g, beta), "same shape"),
        ("v has other T", lambda: naive_chunk_kda(q, k, v[:, :5], g, beta), "v must be"),
        ("q is 3-D", lambda: naive_recurrent_gla(q[0], k[0], v[0], g[0]), "dimensions"),
        ("q not a tensor", lambda: naive_recurrent_gla(q.tolist(), k, v, g), "torch.Tensor"),
        ("kda gate per head only", lambda: naive_recurrent_kda(q, k, v, g[..., 0], beta), "g must have shape"),
        ("gdn gate per channel", lambda: naive_recurrent_gdn(q, k, v, g, beta), "g must have shape"),
        ("beta with K", lambda: naive_chunk_kda(q, k, v, g, g), "beta must have"),
        ("beta wrong T", lambda: naive_recurrent_deltanet(q, k, v, beta[:, :3]), "beta must have"),
        ("cu_seqlens with B=2", lambda: naive_recurrent_kda(q2, k2, v2, g2, beta2, cu_seqlens=cu), "B == 1"),
        ("cu_seqlens with B=2 (chunk)", lambda: naive_chunk_kda(q2, k2, v2, g2, beta2, cu_seqlens=cu), "B == 1"),
        ("cu_seqlens end != T", lambda: naive_recurrent_gla(q, k, v, g, cu_seqlens=torch.tensor([0, 2, 5])), "end"),
        ("cu_seqlens start != 0", lambda: naive_chunk_gla(q, k, v, g, cu_seqlens=torch.tensor([1, 2, 6])), "start"),
        ("cu_seqlens decreasing", lambda: naive_chunk_kda(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 4, 2, 6])), "non-decreasing"),
        ("cu_seqlens float", lambda: naive_recurrent_kda(q, k, v, g, beta, cu_seqlens=torch.tensor([0.0, 6.0])), "integer"),
        ("initial_state N != #seqs", lambda: naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu), "initial_state"),
        ("initial_state wrong K", lambda: naive_chunk_kda(q2, k2, v2, g2, beta2, initial_state=h0n[..., :2, :]), "initial_state"),
        ("chunk_size 0", lambda: naive_chunk_kda(q, k, v, g, beta, chunk_size=0), "chunk_size"),
        ("chunk_size float", lambda: naive_chunk_gla(q, k, v, g, chunk_size=16.0), "chunk_size"),
        ("a without b", lambda: dplr_recurrence(q, k, v, g, a=g), "together"),
        ("a wrong K", lambda: naive_recurrent_dplr(q, k, v, g[..., :2], g, g), "a must have"),
        ("write_key wrong heads", lambda: dplr_recurrence(q, k, v, g, write_key=g[:, :, :3]), "write_key"),
        ("log_decay wrong shape", lambda: dplr_recurrence(q, k, v, g[..., :1]), "log_decay"),
        ("scale not a number", lambda: naive_recurrent_kda(q, k, v, g, beta, scale="x"), "scale"),
        ("gate: A_log wrong", lambda: kda_gate(g, torch.zeros(3)), "A_log"),
        ("gate: dt_bias wrong", lambda: kda_gate(g, torch.zeros(4), dt_bias=torch.zeros(11)), "dt_bias"),
        ("gate: positive bound", lambda: kda_gate(g, torch.zeros(4), lower_bound=2.0), "lower_bound"),
        ("gate: g_raw 3-D", lambda: kda_gate(g[0], torch.zeros(4)), "g_raw"),
    ]


@pytest.mark.parametrize("idx", range(len(_bad_cases())), ids=[c[0] for c in _bad_cases()])
def test_bad_inputs_raise_value_error(idx):
    _, call, match = _bad_cases()[idx]
    with pytest.raises(ValueError, match=match):
        call()


def test_good_inputs_pass_checks():
    # the same tensors as in the bad cases, used correctly, are accepted (the checks are not over-eager)
    q, k, v, g, beta, h0 = make_inputs(1, 6, 2, 4, 3, 2, seed=12)
    cu = torch.tensor([0, 2, 6], dtype=torch.int64)
    h0n = torch.randn(2, 4, 3, 2, dtype=F64)
    naive_recurrent_kda(q, k, v, g, beta, initial_state=h0n, cu_seqlens=cu)
    naive_chunk_kda(q, k, v, g, beta, chunk_size=3, initial_state=h0n, cu_seqlens=cu.to(torch.int32))
    dplr_recurrence(q, k, v, g, a=g, b=g, write_key=k)  # H-headed write_key is GVA-mapped
    kda_gate(g, torch.zeros(4), dt_bias=torch.zeros(12), lower_bound=-5)


# --------------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------------


def _grad_inputs(seed):
    q, k, v, g, beta, h0 = make_inputs(1, 5, 1, 2, 2, 3, seed=seed)
    beta = beta * 0.8 + 0.1
    return [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]


def test_gradcheck_recurrent_kda():
    inputs = _grad_inputs(13)

    def f(q, k, v, g, beta, h0):
        return naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("C", [2, 64])
def test_gradcheck_chunk_kda(C):
    inputs = _grad_inputs(14)

    def f(q, k, v, g, beta, h0):
        return naive_chunk_kda(q, k, v, g, beta, chunk_size=C, initial_state=h0, output_final_state=True)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


def test_gradcheck_chunk_kda_varlen():
    q, k, v, g, beta, _ = make_inputs(1, 5, 1, 1, 2, 2, seed=15)
    h0 = torch.randn(2, 1, 2, 2, dtype=F64)
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
    cu = torch.tensor([0, 3, 5], dtype=torch.int64)

    def f(q, k, v, g, beta, h0):
        return naive_chunk_kda(q, k, v, g, beta, chunk_size=2, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


def test_chunk_and_recurrent_gradients_agree():
    q, k, v, g, beta, h0 = make_inputs(1, 11, 2, 2, 6, 4, seed=16)
    gen = torch.Generator().manual_seed(160)
    do = torch.randn(1, 11, 2, 4, generator=gen, dtype=F64)
    dS = torch.randn(1, 2, 6, 4, generator=gen, dtype=F64)
    grads = []
    for fn in (naive_recurrent_kda, lambda *a, **kw: naive_chunk_kda(*a, chunk_size=4, **kw)):
        ins = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
        o, S = fn(*ins[:5], initial_state=ins[5], output_final_state=True)
        ((o * do).sum() + (S * dS).sum()).backward()
        grads.append([t.grad for t in ins])
    for g_rec, g_chk in zip(*grads):
        assert rel(g_chk, g_rec) < 1e-9


# --------------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------------


def _gate_inputs(seed, B=2, T=3, HV=3, K=4):
    gen = torch.Generator().manual_seed(seed)
    g_raw = 3.0 * torch.randn(B, T, HV, K, generator=gen)
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(HV * K, generator=gen)
    return g_raw, A_log, dt_bias


@pytest.mark.parametrize("with_bias", [True, False])
def test_kda_gate_lower_bound(with_bias):
    g_raw, A_log, dt_bias = _gate_inputs(17)
    dt_bias = dt_bias if with_bias else None
    lb = -5.0
    g = kda_gate(g_raw, A_log, dt_bias, lower_bound=lb)
    assert g.dtype == F64 and g.shape == g_raw.shape
    assert (g >= lb).all() and (g < 0).all()
    B, T, HV, K = g_raw.shape
    for bb in range(B):
        for t in range(T):
            for h in range(HV):
                for d in range(K):
                    x = float(g_raw[bb, t, h, d]) + (float(dt_bias[h * K + d]) if with_bias else 0.0)
                    ref = lb / (1.0 + math.exp(-math.exp(float(A_log[h])) * x))
                    assert math.isclose(float(g[bb, t, h, d]), ref, rel_tol=1e-13, abs_tol=1e-300)


@pytest.mark.parametrize("with_bias", [True, False])
def test_kda_gate_softplus(with_bias):
    g_raw, A_log, dt_bias = _gate_inputs(18)
    dt_bias = dt_bias if with_bias else None
    g = kda_gate(g_raw, A_log, dt_bias)
    assert g.dtype == F64 and g.shape == g_raw.shape
    assert (g <= 0).all()
    B, T, HV, K = g_raw.shape
    for bb in range(B):
        for t in range(T):
            for h in range(HV):
                for d in range(K):
                    x = float(g_raw[bb, t, h, d]) + (float(dt_bias[h * K + d]) if with_bias else 0.0)
                    sp = max(x, 0.0) + math.log1p(math.exp(-abs(x)))
                    ref = -math.exp(float(A_log[h])) * sp
                    assert math.isclose(float(g[bb, t, h, d]), ref, rel_tol=1e-13, abs_tol=1e-300)


def test_kda_gate_large_inputs_and_2d_bias():
    # softplus is evaluated exactly (no linear cut-off at 20), and dt_bias may be [HV, K]
    g_raw = torch.full((1, 1, 2, 3), 30.0, dtype=F64)
    A_log = torch.tensor([0.0, math.log(2.0)], dtype=F64)
    g = kda_gate(g_raw, A_log)
    sp30 = 30.0 + math.log1p(math.exp(-30.0))
    assert math.isclose(float(g[0, 0, 0, 0]), -sp30, rel_tol=1e-15)
    assert math.isclose(float(g[0, 0, 1, 0]), -2.0 * sp30, rel_tol=1e-15)
    bias = torch.arange(6, dtype=F64)
    assert torch.equal(kda_gate(g_raw, A_log, bias), kda_gate(g_raw, A_log, bias.reshape(2, 3)))
    assert not torch.equal(kda_gate(g_raw, A_log, bias), g)
