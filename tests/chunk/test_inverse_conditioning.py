"""Keys that point alike: the chunk forms' triangular inverse (I + A_kk)^-1 stays exact.

With keys nearly parallel and beta near 1, A_kk's entries are near 1 and the powers of A_kk grow to
10^8 over a 32-row tile while the inverse stays bounded: a Neumann product (I - A)(I + A^2)... loses
everything in the cancellation, even in fp32 (docs/decisions/0036-triangular-inverse-by-doubling.md).
FLA's op tests draw such keys (q, k, v uniform in [0, 1), then l2-normalised).  Every chunk op, inference
and training, forward and backward, is checked here against the float64 recurrence in fp32.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cases import reference
from conftest import F64, assert_close

import kdagen

T, H, K, V = 130, 1, 32, 32  # three chunks of 64 rows, the last partial


def _draw(member: str, spread: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1)
    k = F.normalize(1 + spread * torch.randn(1, T, H, K, generator=gen), dim=-1)  # cos(k_i, k_j) ~ 0.9
    v = torch.randn(1, T, H, V, generator=gen)
    beta = 1 - 0.05 * torch.rand(1, T, H, generator=gen)
    x = dict(q=q, k=k, v=v, beta=beta, h0=torch.randn(1, H, K, V, generator=gen))
    if member == "kda":
        x["g"] = -0.02 * torch.rand(1, T, H, K, generator=gen)
    elif member == "gdn":
        x["g"] = -0.02 * torch.rand(1, T, H, generator=gen)
    return x


def _op(member, x):
    kw = dict(initial_state=x["h0"], output_final_state=True)
    if member == "kda":
        return kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    if member == "gdn":
        return kdagen.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    if member == "delta":
        return kdagen.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], **kw)
    # general DPLR as the delta rule: FLA's (a, b) = (k, -beta k) the transition, beta k the written key
    bk = x["beta"][..., None] * x["k"]
    return kdagen.chunk_dplr_delta_rule(x["q"], bk, x["v"], x["k"], -bk, torch.zeros_like(x["k"]), **kw)


# (general DPLR's inference runs its training forward: its training case covers both)
@pytest.mark.parametrize("member, training", [(m, t) for m in ("kda", "gdn", "delta") for t in (False, True)]
                         + [("dplr", True)])
def test_keys_that_point_alike(member, training):
    x = _draw(member, spread=0.3)
    leaves = {n: t.clone().requires_grad_(training) for n, t in x.items()}
    with torch.set_grad_enabled(training):
        o, ht = _op(member, leaves)
    refs = {n: t.to(F64).requires_grad_(training) for n, t in x.items()}
    with torch.set_grad_enabled(training):
        ro, rht = reference("delta" if member == "dplr" else member, refs)  # (DPLR: the delta rule)
    assert_close(o, ro, 1e-4, "o")
    assert_close(ht, rht, 1e-4, "final state")
    if not training:
        return
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(ro.shape, generator=gen), torch.randn(rht.shape, generator=gen)
    ((o * do).sum() + (ht * dht).sum()).backward()
    ((ro * do.to(F64)).sum() + (rht * dht.to(F64)).sum()).backward()
    for n in ("q", "k", "v", "h0") + (("beta",) if member != "dplr" else ()):
        assert_close(leaves[n].grad, refs[n].grad, 1e-4, "d" + n)
