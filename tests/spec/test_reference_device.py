"""kdagen.reference computes on the device of its inputs (q, or g_raw for kda_gate).

There is no GPU in CI, so device-genericity is checked on the ``meta`` device: every op runs its
shape / dtype / device checks without computing values, so a tensor accidentally created on (or
moved to) the CPU makes the call fail.  A CPU test pins that CPU results are unchanged.
"""
from __future__ import annotations

import pytest
import torch

from kdagen.spec import reference as R

F64 = torch.float64
META = torch.device("meta")
B, T, K, V, C = 1, 5, 4, 3, 2


def meta_inputs(H, HV, dtype=torch.float32, requires_grad=False):
    def t(*shape):
        return torch.empty(*shape, device=META, dtype=dtype, requires_grad=requires_grad)

    return dict(
        q=t(B, T, H, K),
        k=t(B, T, H, K),
        v=t(B, T, HV, V),
        g=t(B, T, HV, K),
        gs=t(B, T, HV),
        beta=t(B, T, HV),
        a=t(B, T, HV, K),
        b=t(B, T, HV, K),
        h0=t(B, HV, K, V),
    )


def check(out, HV, final=True):
    o, S = out
    assert o.device == META and o.dtype == F64 and o.shape == (B, T, HV, V)
    if final:
        assert S is not None and S.device == META and S.dtype == F64 and S.shape == (B, HV, K, V)
    else:
        assert S is None


@pytest.mark.parametrize("H,HV", [(2, 2), (1, 2)])
@pytest.mark.parametrize("with_h0", [False, True])
def test_meta_all_functions(H, HV, with_h0):
    x = meta_inputs(H, HV)
    q, k, v, g, gs, beta, a, b = (x[n] for n in ("q", "k", "v", "g", "gs", "beta", "a", "b"))
    kw = dict(initial_state=x["h0"] if with_h0 else None, output_final_state=True)

    check(R.naive_recurrent_kda(q, k, v, g, beta, **kw), HV)
    check(R.naive_recurrent_gdn(q, k, v, gs, beta, **kw), HV)
    check(R.naive_recurrent_deltanet(q, k, v, beta, **kw), HV)
    check(R.naive_recurrent_gla(q, k, v, g, **kw), HV)
    check(R.naive_recurrent_dplr(q, k, v, a, b, g, **kw), HV)
    check(R.dplr_recurrence(q, k, v, g, a, b, write_key=a, **kw), HV)
    check(R.naive_chunk_kda(q, k, v, g, beta, chunk_size=C, **kw), HV)
    check(R.naive_chunk_gdn(q, k, v, gs, beta, chunk_size=C, **kw), HV)
    check(R.naive_chunk_deltanet(q, k, v, beta, chunk_size=C, **kw), HV)
    check(R.naive_chunk_gla(q, k, v, g, chunk_size=C, **kw), HV)
    # without a final state
    check(R.naive_recurrent_kda(q, k, v, g, beta), HV, final=False)
    check(R.naive_chunk_kda(q, k, v, g, beta, chunk_size=C), HV, final=False)


def test_meta_cu_seqlens_on_cpu():
    """Packed sequences: q on meta, cu_seqlens on the CPU (its values are read with .tolist())."""
    H, HV = 2, 2
    x = meta_inputs(H, HV)
    cu = torch.tensor([0, 2, 5], dtype=torch.int64)
    h0 = torch.empty(2, HV, K, V, device=META)
    for fn, args in [
        (R.naive_recurrent_kda, (x["q"], x["k"], x["v"], x["g"], x["beta"])),
        (R.naive_chunk_kda, (x["q"], x["k"], x["v"], x["g"], x["beta"], C)),
        (R.naive_chunk_gla, (x["q"], x["k"], x["v"], x["g"], C)),
    ]:
        o, S = fn(*args, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        assert o.device == META and o.dtype == F64 and o.shape == (B, T, HV, V)
        assert S.device == META and S.dtype == F64 and S.shape == (2, HV, K, V)


def test_meta_kda_gate():
    HV = 2
    g_raw = torch.empty(B, T, HV, K, device=META)
    A_log = torch.empty(HV, device=META)
    dt_bias = torch.empty(HV * K, device=META)
    for lb in (None, -5.0):
        g = R.kda_gate(g_raw, A_log, dt_bias, lower_bound=lb)
        assert g.device == META and g.dtype == F64 and g.shape == (B, T, HV, K)


@pytest.mark.parametrize("H,HV", [(2, 2), (1, 2)])
def test_meta_autograd_chunk_kda(H, HV):
    """Backward through the chunkwise form (incl. solve_triangular) stays on the inputs' device."""
    x = meta_inputs(H, HV, requires_grad=True)
    leaves = [x[n] for n in ("q", "k", "v", "g", "beta", "h0")]
    o, S = R.naive_chunk_kda(*leaves[:5], chunk_size=C, initial_state=leaves[5], output_final_state=True)
    grads = torch.autograd.grad(o.sum() + S.sum(), leaves)
    for leaf, gr in zip(leaves, grads):
        assert gr.device == META and gr.dtype == leaf.dtype and gr.shape == leaf.shape


def test_meta_autograd_recurrent_kda():
    x = meta_inputs(1, 2, requires_grad=True)
    leaves = [x[n] for n in ("q", "k", "v", "g", "beta", "h0")]
    o, S = R.naive_recurrent_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True)
    grads = torch.autograd.grad(o.sum() + S.sum(), leaves)
    for leaf, gr in zip(leaves, grads):
        assert gr.device == META and gr.shape == leaf.shape


def test_cpu_unchanged():
    """On the CPU, float32 inputs give exactly the result of the same inputs pre-cast to float64."""
    gen = torch.Generator().manual_seed(0)
    H, HV = 1, 2
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -torch.rand(B, T, HV, K, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen)
    f32 = (q, k, v, g, beta)
    f64 = tuple(t.to(F64) for t in f32)

    for fn, extra in [(R.naive_chunk_kda, dict(chunk_size=C)), (R.naive_recurrent_kda, {})]:
        o32, S32 = fn(*f32, initial_state=h0, output_final_state=True, **extra)
        o64, S64 = fn(*f64, initial_state=h0.to(F64), output_final_state=True, **extra)
        for t in (o32, S32, o64, S64):
            assert t.device.type == "cpu" and t.dtype == F64
        assert torch.equal(o32, o64) and torch.equal(S32, S64)
    # and the chunkwise form agrees with the recurrence (a value check, not just a device check)
    o_c, S_c = R.naive_chunk_kda(*f64, chunk_size=C, initial_state=h0, output_final_state=True)
    o_r, S_r = R.naive_recurrent_kda(*f64, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o_c, o_r, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S_c, S_r, rtol=1e-10, atol=1e-10)

    g_raw = torch.randn(B, T, HV, K, generator=gen)
    A_log = torch.randn(HV, generator=gen)
    gate = R.kda_gate(g_raw, A_log)
    assert gate.device.type == "cpu" and gate.dtype == F64
    assert torch.equal(gate, R.kda_gate(g_raw.to(F64), A_log.to(F64)))
