"""Configs fitted to the GPU's shared memory (kdagen.cache.smem) and the run-time fallback of a config
that does not compile (kdagen.ops.fallback), on the CPU: the estimate's step-down of general DPLR's
64-row chunks at K = V = 100 for Hopper's 227 KiB (the heuristic's three-stage state passes need 264 KB
there), no step-down where the configs fit, no fitting without a GPU or target, and a launch that
raises OutOfResources giving one warning, the next config down and the float64 recurrence's answer in
the interpreter.  The estimate against sm_90 compiles is tests/sm90/test_smem_fit_sm90.py."""
from __future__ import annotations

import warnings

import pytest
import torch
from triton.runtime.errors import OutOfResources

from cases import inputs, reference
from conftest import TOL, assert_close
from plain_configs import plain_train

import kdagen
from kdagen import spec as S
from kdagen.cache import smem
from kdagen.cache.gpus import get_profile
from kdagen.kernels import Launch
from kdagen.ops import chunk_call as C
from kdagen.ops import fallback
from kdagen.ops.dplr import _configs as dplr_configs
from kdagen.ops.dplr import _prepare as dplr_prepare
from kdagen.ops.member import _prepare_chunk

F32 = torch.float32
H100 = get_profile("h100")
LIMIT = H100.smem_per_block_bytes


def _dplr_call(dt, K, training, B=2, T=64, H=2):
    gen = torch.Generator().manual_seed(0)
    q, k, v, a, b = (torch.randn(B, T, H, K, generator=gen).to(dt) for _ in range(5))
    gk = -torch.rand(B, T, H, K, generator=gen)
    call, _, _ = dplr_prepare("t", q, k, v, a, b, gk, training=training)
    return call


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("training", [False, True])
def test_dplr_64_row_chunks_at_K100_fit_hopper(dt, training):
    call = _dplr_call(dt, 100, training)
    raw = [c for c in dplr_configs("t", call, None, training, 64) if c is not None]
    assert smem.limit() is None  # no GPU here: nothing is fitted
    assert any(not smem.fits(c.kernel, call.plan, c, LIMIT) for c in raw)  # the configs
    with smem.target(H100):
        fitted = [c for c in dplr_configs("t", call, None, training, 64) if c is not None]
    for r, f in zip(raw, fitted):
        assert f.chunk_size == 64  # the caller's chunk length is kept
        assert smem.fits(f.kernel, call.plan, f, LIMIT), (f.short(), smem.estimate(f.kernel, call.plan, f))
        # stepped down by pipeline stages first: the V tiles stay
        assert f.state_block_v == r.state_block_v and f.state_num_stages == 2 < r.state_num_stages


@pytest.mark.parametrize("member,dt,K", [("gdn", torch.bfloat16, 128), ("kda", torch.bfloat16, 128),
                                         ("delta", torch.float16, 64), ("dplr", torch.bfloat16, 128)])
@pytest.mark.parametrize("shape", [(2, 64, 2), (16, 64, 64)])
def test_heuristic_configs_that_fit_are_not_stepped_down(member, dt, K, shape):
    """At the head dims the heuristics were measured on the fitted configs are the heuristic's own."""
    B, T, H = shape
    if member == "dplr":
        call = _dplr_call(dt, K, True, B, T, H)
    else:
        spec = {"gdn": S.gdn(), "kda": S.kda(S.gate_direct(None)), "delta": S.deltanet()}[member]
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, T, H, K, generator=gen).to(dt) for _ in range(3))
        beta = torch.rand(B, T, H, generator=gen).to(dt)
        g = {"gdn": -torch.rand(B, T, H), "kda": -torch.rand(B, T, H, K), "delta": None}[member]
        call, _, _ = _prepare_chunk(spec, q, k, v, g, beta, training=True)
    for training in (False, True):
        if member == "dplr":
            raw = dplr_configs("t", call, None, training, None)
        else:
            raw = C.chunk_configs(call, None, None, training)
        with smem.target(H100):
            fitted = dplr_configs("t", call, None, training, None) if member == "dplr" else \
                C.chunk_configs(call, None, None, training)
        assert fitted == raw


def test_step_down_is_deterministic_and_ends():
    call = _dplr_call(torch.float16, 256, False)
    cfg = plain_train(chunk_size=64, state_block_v=64, state_num_stages=4)
    seq = [cfg]
    while (nxt := smem.step_down("chunk_train", call.plan, seq[-1], "chunk_state")) is not None:
        seq.append(nxt)
    assert [(c.state_num_stages, c.state_block_v) for c in seq] == [(4, 64), (3, 64), (2, 64), (2, 32), (2, 16),
                                                                     (1, 16)]
    assert smem.fit("chunk_train", call.plan, cfg, 64 * 1024) == seq[-1]


def test_a_config_that_does_not_compile_falls_back(monkeypatch):
    """The first config's state launch raises OutOfResources (as on an H100 at 64-row chunks, K = V = 100):
    one warning, the next config down runs, and o and the final state are the float64 recurrence's."""
    B, T, H, HV, K, V = 1, 70, 1, 2, 48, 40
    q, k, v, a, b, g, h0 = inputs("dplr", B, T, H, HV, K, V).take("q", "k", "v", "a", "b", "g", "h0")
    first = plain_train(chunk_size=64, state_block_v=16, state_num_stages=3)
    ran, real_call = [], Launch.__call__

    def call(self):
        if self.kernel == "chunk_state" and self.num_stages == 3:
            raise OutOfResources(264192, LIMIT, "shared memory")
        ran.append((self.kernel, self.num_stages))
        real_call(self)

    monkeypatch.setattr(Launch, "__call__", call)
    monkeypatch.setattr(fallback, "_NEXT", {})
    monkeypatch.setattr(fallback, "_WARNED", set())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        o, ht = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, output_final_state=True,
                                             config=first)
        o2, ht2 = kdagen.chunk_dplr_delta_rule(q, k, v, a, b, g, initial_state=h0, output_final_state=True,
                                               config=first)
    msgs = [str(x.message) for x in w if "does not compile" in str(x.message)]
    assert len(msgs) == 1 and "chunk_state" in msgs[0], msgs
    # the first call: the intra launch, the failed state launch, then both launches of the 2-stage config;
    # the second call goes straight to the 2-stage config
    assert ran == [("chunk_intra", 2), ("chunk_intra", 2), ("chunk_state", 2)] * 1 + [("chunk_intra", 2),
                                                                                      ("chunk_state", 2)]
    assert fallback.replacement("chunk_train", kdagen.ops.dplr._prepare(
        "t", q, k, v, a, b, g, initial_state=h0)[0].plan, first) == first.replace(state_num_stages=2)
    ro, rh = reference("dplr", q=q, k=k, v=v, a=a, b=b, g=g, h0=h0)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")
    assert torch.equal(o2, o) and torch.equal(ht2, ht)
