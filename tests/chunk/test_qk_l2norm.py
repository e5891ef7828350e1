"""A training call's l2-norm of q and k (templates/qk_l2norm.py.j2, kdagen/ops/l2norm.py), in
the CPU interpreter: the forward against ``normalize`` in float64, the backward against float64
autograd through ``normalize``, at K not a power of two, a row count that is not a multiple of
the rows per program, and a zero row (the 1e-12 clamp, where only the first term of the
gradient is left).  The whole training call with ``use_qk_l2norm_in_kernel=True`` against the
float64 recurrence is tests/chunk/test_ops_chunk_bwd.py's ``test_host_preprocessing_is_differentiated``;
here, that its gradients equal the torch ops' it replaced to rounding, KDA and Gated DeltaNet.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from plain_configs import plain_bwd, plain_train

import kdagen
import kdagen.spec as S
from kdagen.codegen.lower import lower
from kdagen.kernels import build
from kdagen.ops.l2norm import ELEMENTS_PER_PROGRAM, qk_l2norm

F32, F16, F64 = torch.float32, torch.float16, torch.float64
TOL = {F32: 2e-6, F16: 2e-3}  # relative to the largest magnitude of the reference


def _fns(K, dtype):
    plan = lower(S.kda(), K, K, "float32" if dtype == F32 else "float16", "chunk")
    return build(plan, plain_train()).fn("qk_l2norm"), build(plan, plain_bwd()).fn("qk_l2norm_bwd")


def _close(a, ref, tol, what):
    err = (a.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= tol * max(scale, 1e-30), f"{what}: max error {err:.3e} against scale {scale:.3e}"


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("K", [40, 128])
def test_forward_and_gradients_against_float64(dtype, K):
    gen = torch.Generator().manual_seed(K)
    rows = ELEMENTS_PER_PROGRAM // triton_pow2(K) * 3 + 5  # three full programs and a partial one
    shape = (1, rows, 1, K)
    q0 = (torch.randn(shape, generator=gen) * 4).to(dtype)
    k0 = (torch.randn(shape, generator=gen) * 0.05).to(dtype)
    k0[0, 7] = 0  # a zero row: the clamp
    dqn, dkn = torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)
    q, k = q0.clone().requires_grad_(True), k0.clone().requires_grad_(True)
    qn, kn = qk_l2norm(q, k, *_fns(K, dtype))
    torch.autograd.backward((qn, kn), (dqn, dkn))
    rq, rk = q0.to(F64).requires_grad_(True), k0.to(F64).requires_grad_(True)
    rqn, rkn = F.normalize(rq, dim=-1), F.normalize(rk, dim=-1)
    torch.autograd.backward((rqn, rkn), (dqn.to(F64), dkn.to(F64)))
    assert qn.dtype == dtype and kn.dtype == dtype
    _close(qn, rqn, TOL[dtype], "q / |q|")
    _close(kn, rkn, TOL[dtype], "k / |k|")
    assert torch.equal(kn[0, 7], torch.zeros_like(kn[0, 7]))
    _close(q.grad, rq.grad, TOL[dtype], "dq")
    live = torch.ones(rows, dtype=torch.bool)
    live[7] = False  # the zero row's gradient is dkn / 1e-12: past fp16's range, checked in fp32 below
    _close(k.grad[0, live], rk.grad[0, live], TOL[dtype], "dk")
    if dtype == F32:
        _close(k.grad[0, 7], rk.grad[0, 7], TOL[F32], "dk of the zero row")


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_only_the_inputs_that_ask_get_a_gradient():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 9, 2, 32, generator=gen).requires_grad_(True)
    k = torch.randn(1, 9, 2, 32, generator=gen)
    qn, kn = qk_l2norm(q, k, *_fns(32, F32))
    (qn.sum() + kn.sum()).backward()
    assert q.grad is not None and k.grad is None
    ref = q.detach().double().requires_grad_(True)
    F.normalize(ref, dim=-1).sum().backward()
    _close(q.grad, ref.grad, TOL[F32], "dq")


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="one shape for both"):
        qk_l2norm(torch.zeros(1, 4, 1, 32), torch.zeros(1, 4, 2, 32), *_fns(32, F32))


def _grads(op, q, k, rest, **kw):
    """Output and gradients of a training call whose q and k come from ``q``/``k`` (leaves, or
    torch's normalisation of them) and ``rest`` (leaves)."""
    o, ht = op(q, k, output_final_state=True, **rest, **kw)
    gen = torch.Generator().manual_seed(11)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    ((o * do).sum() + (ht * dht).sum()).backward()
    return o.detach()


@pytest.mark.parametrize("member", ["kda", "gdn"])
def test_the_training_call_takes_the_launches_and_matches_the_torch_ops(member, monkeypatch):
    """With use_qk_l2norm_in_kernel=True a training call runs the l2-norm launches (counted), and
    its output and gradients equal those of the call given torch's normalised q and k, to rounding."""
    import kdagen.ops.l2norm as L

    gen = torch.Generator().manual_seed(7)
    B, T, H, K = 1, 37, 2, 32
    x = dict(q=torch.randn(B, T, H, K, generator=gen) * 3, k=torch.randn(B, T, H, K, generator=gen),
             v=torch.randn(B, T, H, K, generator=gen), beta=torch.rand(B, T, H, generator=gen))
    if member == "kda":
        op, x["g"] = kdagen.chunk_kda, -5 * torch.rand(B, T, H, K, generator=gen)
    else:
        op, x["g"] = kdagen.chunk_gated_delta_rule, F.logsigmoid(torch.randn(B, T, H, generator=gen) + 1)
    runs = []
    real = L.Launch.__call__
    monkeypatch.setattr(L.Launch, "__call__", lambda self: (runs.append(self.kernel), real(self))[1])
    a = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o = _grads(op, a["q"], a["k"], {n: t for n, t in a.items() if n not in ("q", "k")}, use_qk_l2norm_in_kernel=True)
    assert runs.count("qk_l2norm") == 1 and runs.count("qk_l2norm_bwd") == 1
    b = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o2 = _grads(op, F.normalize(b["q"], dim=-1), F.normalize(b["k"], dim=-1),
                {n: t for n, t in b.items() if n not in ("q", "k")})
    assert torch.allclose(o, o2, rtol=0, atol=1e-5)
    for n in x:
        assert torch.allclose(a[n].grad, b[n].grad, rtol=1e-4, atol=1e-4), f"d{n}: {(a[n].grad - b[n].grad).abs().max()}"


@pytest.mark.parametrize("geometry", [(4096, 4), (8192, 8)])
def test_every_tile_geometry_gives_the_same_bits(monkeypatch, geometry):
    """Other rows-per-program and warps than the committed geometry (decision 0031 timed them): the math
    is per row, so each must give the committed geometry's outputs exactly (forward and backward, a row
    count that leaves partial programs)."""
    import kdagen.ops.l2norm as L

    plan = lower(S.kda(), 128, 128, "float32", "chunk")
    fwd_fn = build(plan, plain_train()).fn("qk_l2norm")
    bwd_fn = build(plan, plain_bwd()).fn("qk_l2norm_bwd")
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 37, 2, 40, generator=gen) for _ in range(2))
    dqn, dkn = torch.randn_like(q), torch.randn_like(k)

    def outputs():
        qn, kn, rq, rk = L.normalise(q, k, fwd_fn)
        return (qn, kn, rq, rk) + tuple(L.normalise_bwd(q, k, rq, rk, dqn, dkn, bwd_fn))

    committed, rows = outputs(), L._geometry(q)[3]
    monkeypatch.setattr(L, "ELEMENTS_PER_PROGRAM", geometry[0])
    monkeypatch.setattr(L, "NUM_WARPS", geometry[1])
    assert L._geometry(q)[3] != rows
    for name, a, b in zip(("qn", "kn", "rq", "rk", "dq", "dk"), outputs(), committed):
        assert torch.equal(a, b), f"{name}: {(a - b).abs().max()}"
    assert (committed[0] - F.normalize(q, dim=-1)).abs().max() <= 1e-6
