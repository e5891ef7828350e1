"""Input dtypes as FLA 0.6.0 takes them (kdagen.ops.inputs.fla_dtypes): q, k, v (and DPLR's a, b)
may mix float32 and float16; they are computed in one dtype (torch.promote_types: the cast is
exact), o comes back in the dtype FLA returns it in (q's or v's, per op), and gradients in each
input's own dtype.  And bf16 under Triton's interpreter, whose bf16 arithmetic is wrong: every op
computes from float32 copies and rounds o to bf16 once -- never garbage.

Interpreter; small shapes.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cases import make_inputs
from conftest import F64, TOL, assert_close, rel_err

import kdagen
from kdagen.spec.reference import naive_recurrent_gdn, naive_recurrent_kda

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
B, T, H, HV, K, V = 1, 20, 1, 2, 16, 16


def _values(seed=1):
    """Inputs whose values are exact in float16 and bfloat16 (so every cast of them is exact)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=r(B, T, H, K), k=F.normalize(r(B, T, H, K), dim=-1), v=r(B, T, HV, V),
             gk=-0.5 * torch.rand(B, T, HV, K, generator=gen), gs=-0.5 * torch.rand(B, T, HV, generator=gen),
             beta=0.25 + 0.5 * torch.rand(B, T, HV, generator=gen),
             a=-0.5 * F.normalize(r(B, T, HV, K), dim=-1), b=0.5 * F.normalize(r(B, T, HV, K), dim=-1),
             h0=r(B, HV, K, V))
    return {n: t.to(BF16).to(F16).float() for n, t in x.items()}


# op, its call from a dict of inputs, the inputs it takes, the input whose dtype o has (FLA 0.6.0's)
OPS = {
    "chunk_kda": (lambda t, **kw: kdagen.chunk_kda(t["q"], t["k"], t["v"], t["gk"], t["beta"], **kw),
                  "q k v gk beta", "q"),
    "fused_recurrent_kda": (lambda t, **kw: kdagen.fused_recurrent_kda(t["q"], t["k"], t["v"], t["gk"], t["beta"],
                                                                       **kw), "q k v gk beta", "v"),
    "chunk_gated_delta_rule": (lambda t, **kw: kdagen.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["gs"],
                                                                             t["beta"], **kw), "q k v gs beta", "q"),
    "fused_recurrent_gated_delta_rule": (lambda t, **kw: kdagen.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], t["gs"], beta=t["beta"], **kw), "q k v gs beta", "v"),
    "chunk_delta_rule": (lambda t, **kw: kdagen.chunk_delta_rule(t["q"], t["k"], t["v"], t["beta"], **kw),
                         "q k v beta", "q"),
    "fused_recurrent_delta_rule": (lambda t, **kw: kdagen.fused_recurrent_delta_rule(t["q"], t["k"], t["v"],
                                                                                     t["beta"], **kw),
                                   "q k v beta", "q"),
    "chunk_gla": (lambda t, **kw: kdagen.chunk_gla(t["q"], t["k"], t["v"], t["gk"], **kw), "q k v gk", "v"),
    "fused_recurrent_gla": (lambda t, **kw: kdagen.fused_recurrent_gla(t["q"], t["k"], t["v"], gk=t["gk"], **kw),
                            "q k v gk", "q"),
    "chunk_dplr_delta_rule": (lambda t, **kw: kdagen.chunk_dplr_delta_rule(t["q"], t["k"], t["v"], t["a"], t["b"],
                                                                           t["gk"], **kw), "q k v a b gk", "q"),
    "fused_recurrent_dplr_delta_rule": (lambda t, **kw: kdagen.fused_recurrent_dplr_delta_rule(
        t["q"], t["k"], t["v"], t["a"], t["b"], t["gk"], **kw), "q k v a b gk", "v"),
}


def _run(op, dtypes, grad=False, **kw):
    call, names, _ = OPS[op]
    base = _values()
    t = {n: base[n].to(dtypes.get(n, F32)).requires_grad_(grad) for n in names.split()}
    h0 = base["h0"].clone().requires_grad_(grad)
    o, ht = call(t, initial_state=h0, output_final_state=True, **kw)
    return o, ht, t, h0


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("mix", ["v16", "q16", "qk16"])
def test_mixed_dtypes_compute_in_float32_and_return_fla_dtypes(op, mix):
    """float16 among float32 operands: the same numbers as the all-float32 call (the cast up is
    exact), o rounded to the dtype FLA returns it in, the final state float32."""
    names = {"v16": "v", "q16": "q", "qk16": "qk"}[mix]
    dtypes = {n: F16 for n in names} | ({"a": F16, "b": F16} if "q" in names and "a" in OPS[op][1] else {})
    out_from = OPS[op][2]
    o, ht, t, _ = _run(op, dtypes)
    o32, ht32, _, _ = _run(op, {})
    assert o.dtype == t[out_from].dtype, (op, mix, o.dtype)
    assert ht.dtype == F32
    assert torch.equal(o, o32.to(o.dtype)) and torch.equal(ht, ht32)


@pytest.mark.parametrize("op", ["chunk_kda", "chunk_gated_delta_rule", "fused_recurrent_kda",
                                "chunk_dplr_delta_rule"])
def test_mixed_dtypes_gradients_come_back_in_each_inputs_dtype(op):
    """Gradients through the cast: each input's gradient is the all-float32 call's, in its dtype."""
    dtypes = {"k": F16, "v": F16, "beta": F16, "a": F16}
    o, ht, t, h0 = _run(op, dtypes, grad=True)
    o32, ht32, t32, h032 = _run(op, {}, grad=True)
    gen = torch.Generator().manual_seed(5)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    ((o.float() * do).sum() + (ht * dht).sum()).backward()
    ((o32 * do.to(o.dtype).float()).sum() + (ht32 * dht).sum()).backward()
    for n, x in t.items():
        assert x.grad is not None and x.grad.dtype == x.dtype, (n, x.grad)
        assert torch.equal(x.grad, t32[n].grad.to(x.dtype)), n
    assert torch.equal(h0.grad, h032.grad)


def test_mixed_dtypes_against_float64():
    """chunk_kda with q, k float32 and v, beta float16 (and its gradient), fused_recurrent_kda and
    chunk_gated_delta_rule likewise: against the float64 reference."""
    x = make_inputs(1, 37, 1, 2, 32, 32, seed=2)
    q, k, g = x.q, x.k, x.g
    v, beta = x.v.half(), x.beta.half()
    ro, rht = naive_recurrent_kda(q.to(F64), k.to(F64), v.to(F64), g.to(F64), beta.to(F64),
                                  initial_state=x.h0.to(F64), output_final_state=True)
    for fn, out_dtype in ((kdagen.chunk_kda, F32), (kdagen.fused_recurrent_kda, F16)):
        o, ht = fn(q, k, v, g, beta, initial_state=x.h0, output_final_state=True)
        assert o.dtype == out_dtype
        assert_close(o, ro, TOL[out_dtype], f"{fn.__name__} o")
        assert_close(ht, rht, TOL[F32], f"{fn.__name__} final state")
    gs = x.g[..., 0].contiguous()
    ro, _ = naive_recurrent_gdn(q.to(F64), k.to(F64), v.to(F64), gs.to(F64), beta.to(F64),
                                initial_state=x.h0.to(F64))
    o, _ = kdagen.chunk_gated_delta_rule(q, k, v, gs, beta, initial_state=x.h0)
    assert o.dtype == F32
    assert_close(o, ro, TOL[F32], "chunk_gated_delta_rule o")
    # the gradient of v (float16) through chunk_kda against the reference's
    vl = v.clone().requires_grad_(True)
    o, _ = kdagen.chunk_kda(q, k, vl, g, beta, initial_state=x.h0)
    gen = torch.Generator().manual_seed(4)
    do = torch.randn(o.shape, generator=gen)
    (o * do).sum().backward()
    v64 = v.to(F64).requires_grad_(True)
    ro, _ = naive_recurrent_kda(q.to(F64), k.to(F64), v64, g.to(F64), beta.to(F64), initial_state=x.h0.to(F64))
    (ro * do.to(F64)).sum().backward()
    assert vl.grad.dtype == F16
    assert_close(vl.grad, v64.grad, TOL[F16], "dv")


def test_out_of_the_output_dtype_with_mixed_inputs():
    """``out=`` in the dtype FLA returns o in (v's, for the recurrent op) receives o."""
    x = make_inputs(1, 9, 1, 2, 16, 16, seed=3)
    v = x.v.half()
    ref, _ = kdagen.fused_recurrent_kda(x.q, x.k, v, x.g, x.beta, initial_state=x.h0)
    out = torch.full_like(v, float("nan"))
    o, _ = kdagen.fused_recurrent_kda(x.q, x.k, v, x.g, x.beta, initial_state=x.h0, out=out)
    assert o is out and torch.equal(out, ref)


# ------------------------------------------------------------------ bf16 under the interpreter

BF16_TOL = 8e-3  # o rounded to bf16 once: 2^-9 relative per element


@pytest.mark.parametrize("op", ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule", "chunk_gla",
                                "chunk_dplr_delta_rule"])
def test_bf16_in_the_interpreter_is_float32_rounded_once(op):
    """The interpreter's bf16 arithmetic is wrong (chunk_kda gave values ~1e10): the ops compute
    from float32 copies and round o to bf16 at the end -- the all-float32 call's o, rounded."""
    names = OPS[op][1].split()
    o, ht, _, _ = _run(op, {n: BF16 for n in names})
    o32, ht32, _, _ = _run(op, {})
    assert o.dtype == BF16 and ht.dtype == F32
    assert torch.equal(o, o32.to(BF16)) and torch.equal(ht, ht32)


def test_bf16_kda_in_the_interpreter_against_float64():
    x = make_inputs(1, 37, 1, 2, 32, 32, seed=2)
    q, k, v, g, beta = (t.to(BF16) for t in (x.q, x.k, x.v, x.g, x.beta))
    h0 = x.h0.to(BF16)
    ro, rht = naive_recurrent_kda(q.to(F64), k.to(F64), v.to(F64), g.to(F64), beta.to(F64),
                                  initial_state=h0.to(F64), output_final_state=True)
    for fn in (kdagen.chunk_kda, kdagen.fused_recurrent_kda):
        o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        assert o.dtype == BF16
        assert rel_err(o, ro) <= BF16_TOL, fn.__name__
        assert_close(ht, rht, TOL[F32], f"{fn.__name__} final state")


def test_bf16_state_pool_in_the_interpreter_is_updated_in_place():
    """A bf16 pool: run on a float32 copy and rounded back into the caller's pool, in place."""
    x = make_inputs(2, 5, 1, 2, 16, 16, seed=6)
    idx = torch.tensor([3, 0])
    pool32 = torch.randn(4, 2, 16, 16, generator=torch.Generator().manual_seed(7)).to(BF16).float()
    pool = pool32.to(BF16)
    q, k, v, g, beta = (t.to(BF16) for t in (x.q, x.k, x.v, x.g, x.beta))
    o, ret = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx)
    o32, _ = kdagen.fused_recurrent_kda(*(t.float() for t in (q, k, v, g, beta)), initial_state=pool32,
                                        ssm_state_indices=idx)
    assert ret is pool and o.dtype == BF16
    assert torch.equal(o, o32.to(BF16)) and torch.equal(pool, pool32.to(BF16))
