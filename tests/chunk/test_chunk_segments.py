"""The sequence-parallel state pass of the inference forward (ChunkFwdConfig.state_segment_chunks,
kdagen/ops/chunk_segments.py) against the float64 recurrence, and against the one pass it replaces.

Gates are weak (log decay in [-0.02, 0)) so that a state crosses many chunks: each test also checks
that what enters a late segment matters (the initial state changes its o), or a wrong chain could
pass unnoticed behind decays that forget everything within a chunk."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import kdagen
from kdagen.cache.heuristics import default_chunk_config
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.config import ChunkFwdConfig, ConfigError
from kdagen.ops.chunk import chunk_kda_launches
from kdagen.ops.inputs import select_spec
from kdagen.ops.schedule import segment_schedule
from kdagen.spec.reference import (naive_recurrent_deltanet, naive_recurrent_gdn, naive_recurrent_gla,
                                   naive_recurrent_kda)

from cases import make_inputs
from conftest import TOL, assert_close, poison, rel_err
from plain_configs import plain_fwd

F32, F16, F64 = torch.float32, torch.float16, torch.float64
C = 32


def _cfg(L):
    # tf32 for the solve's inverse, as the heuristic takes for fp16 inputs (fp32 inputs: always exact)
    return plain_fwd(chunk_size=C, state_segment_chunks=L, inverse_precision="tf32")


def _kda(x, L, **kw):
    return kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, config=_cfg(L), **kw)


def _kda_ref(x, h0=True):
    return naive_recurrent_kda(*x.ref_args(), initial_state=x.h0.to(F64) if h0 else None, output_final_state=True,
                               cu_seqlens=x.cu_seqlens)


def _late_segment_depends_on_h0(o_with, o_without, tokens):
    """The initial state still changes o in the last segment: the chain carries it there."""
    assert rel_err(o_with[:, tokens], o_without[:, tokens]) > 1e-3


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
def test_kda_fixed_length_with_a_ragged_last_segment(dt):
    # T = 300: 10 chunks of 32 (the last of 12 tokens), segments of 4 chunks: 4 + 4 + 2; GVA (HV = 2H)
    x = make_inputs(2, 300, 1, 2, 32, 48, dtype=dt, seed=1, g_lo=-0.02)
    launches, _ = chunk_kda_launches(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                     config=_cfg(4))
    assert [ln.kernel for ln in launches] == ["chunk_solve", "chunk_seg_state", "chunk_seg_combine", "chunk_seg_pass"]
    assert launches[1].grid == (2 + 1, 2 * 3 * 2) and launches[3].grid == (2, 2 * 3 * 2)  # V+K tiles; B*NS*HV
    o, ht = _kda(x, 4, initial_state=x.h0, output_final_state=True)
    ro, rh = _kda_ref(x)
    assert o.dtype == dt and ht.dtype == F32
    assert_close(o, ro, TOL[dt], "o")
    assert_close(ht, rh, TOL[dt], "final state")
    o1, h1 = _kda(x, 0, initial_state=x.h0, output_final_state=True)
    assert_close(o, o1.float(), TOL[dt], "o against the one pass")
    assert_close(ht, h1, TOL[dt], "final state against the one pass")
    o0, none = _kda(x, 4)  # no initial state, no final state
    assert none is None
    assert_close(o0, _kda_ref(x, h0=False)[0], TOL[dt], "o without an initial state")
    _late_segment_depends_on_h0(o, o0, slice(256, 300))


def test_every_scratch_element_read_is_written():
    """The intermediates, the segments' scratch and the outputs are NaN before the launches run:
    nothing read may stay unwritten (a masked-off row or column included: K=48, V=48 pad to 64)."""
    x = make_inputs(1, 150, 1, 1, 48, 48, seed=2, g_lo=-0.02)
    launches, (o, ht, hs) = chunk_kda_launches(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0,
                                               output_final_state=True, return_intermediate_states=True,
                                               config=_cfg(2))
    for name in ("qg", "bk", "kgl", "pm", "gn"):
        poison(launches[0].args[name])
    for name in ("he", "hm"):
        poison(launches[1].args[name])
    poison(launches[2].args["hseg"])
    for t in (o, ht, hs):
        poison(t)
    for ln in launches:
        ln()
    ro, rh = _kda_ref(x)
    assert_close(o, ro, TOL[F32], "o")
    assert_close(ht, rh, TOL[F32], "final state")
    assert torch.isfinite(hs).all()


@pytest.mark.parametrize("v_first", [False, True], ids=["KV", "VK"])
def test_intermediate_states_are_the_one_pass_ones(v_first):
    x = make_inputs(1, 230, 1, 2, 32, 32, seed=3, g_lo=-0.02)
    h0 = x.h0.transpose(-1, -2).contiguous() if v_first else x.h0
    out = {}
    for L in (0, 2):
        out[L] = _kda(x, L, initial_state=h0, output_final_state=True, return_intermediate_states=True,
                      state_v_first=v_first)
    (o1, h1, s1), (o2, h2, s2) = out[0], out[2]
    assert s2.shape == s1.shape == (1, 8, 2, 32, 32)
    for c in range(8):
        assert_close(s2[:, c], s1[:, c], TOL[F32], f"state entering chunk {c}")
    assert_close(o2, o1, TOL[F32], "o")
    ro, rh = _kda_ref(x)
    assert_close(o2, ro, TOL[F32], "o against the reference")
    assert_close(h2.transpose(-1, -2) if v_first else h2, rh, TOL[F32], "final state")


LENS = [0, 1, 70, 300, 33]  # empty, shorter than a segment, 2 segments (ragged), 5 segments, 1 segment


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
def test_varlen_segments_stay_within_their_sequence(dt):
    cu = torch.tensor([0] + LENS).cumsum(0).tolist()
    x = make_inputs(1, cu[-1], 1, 1, 32, 32, dtype=dt, seed=4, cu_seqlens=cu, g_lo=-0.02)
    total, NS, idx, offs = segment_schedule(cu, 1, cu[-1], C, 2, "cpu")
    assert (total, NS) == (0 + 1 + 2 + 5 + 1, 0)
    assert idx.tolist() == [[1, 0], [2, 0], [2, 1], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4], [4, 0]]
    assert offs.tolist() == [0, 0, 1, 3, 8]
    o, ht = _kda(x, 2, initial_state=x.h0, output_final_state=True, cu_seqlens_cpu=torch.tensor(cu))
    ro, rh = _kda_ref(x)
    assert_close(o, ro, TOL[dt], "o")
    assert_close(ht, rh, TOL[dt], "final state")
    assert torch.equal(ht[0], x.h0[0])  # a length-0 sequence keeps its state
    o0, _ = _kda(x, 2)
    _late_segment_depends_on_h0(o, o0, slice(cu[3] + 256, cu[4]))
    if dt == F32:
        _, _, hs = _kda(x, 2, initial_state=x.h0, return_intermediate_states=True)
        _, _, hs1 = _kda(x, 0, initial_state=x.h0, return_intermediate_states=True)
        assert_close(hs, hs1, TOL[F32], "per-chunk states against the one pass")


# ------------------------------------------------------------------------- the other members
def _member_inputs(member, T, HV, dt, cu=None):
    gen = torch.Generator().manual_seed(5)
    K, V = 32, 48
    q = torch.randn(1, T, 1, K, generator=gen).to(dt)
    k = F.normalize(torch.randn(1, T, 1, K, generator=gen), dim=-1).to(dt)
    v = torch.randn(1, T, HV, V, generator=gen).to(dt)
    beta = torch.rand(1, T, HV, generator=gen).to(dt)
    if member == "gla":
        g = -0.02 * torch.rand(1, T, HV, K, generator=gen)
    elif member == "gdn":
        g = (-0.02 * torch.rand(1, T, HV, generator=gen)).to(dt)
    else:
        g = None
    N = 1 if cu is None else len(cu) - 1
    return q, k, v, g, beta, torch.randn(N, HV, K, V, generator=gen)


def _member(member, q, k, v, g, beta, L, **kw):
    kw["config"] = _cfg(L)
    if member == "gdn":
        return kdagen.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    if member == "deltanet":
        return kdagen.chunk_delta_rule(q, k, v, beta, **kw)
    return kdagen.chunk_gla(q, k, v, g, **kw)


def _member_ref(member, q, k, v, g, beta, h0, cu=None):
    a = [t.to(F64) for t in (q, k, v)]
    kw = dict(initial_state=None if h0 is None else h0.to(F64), output_final_state=True, cu_seqlens=cu)
    if member == "gdn":
        return naive_recurrent_gdn(*a, g.to(F64), beta.to(F64), **kw)
    if member == "deltanet":
        return naive_recurrent_deltanet(*a, beta.to(F64), **kw)
    return naive_recurrent_gla(*a, g.to(F64), **kw)


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("member", ["gdn", "deltanet", "gla"])
def test_members_scalar_decay_no_decay_and_no_rank1(member, dt):
    q, k, v, g, beta, h0 = _member_inputs(member, 200, 2, dt)
    o, ht = _member(member, q, k, v, g, beta, 2, initial_state=h0, output_final_state=True)
    ro, rh = _member_ref(member, q, k, v, g, beta, h0)
    assert_close(o, ro, TOL[dt], f"{member} o")
    assert_close(ht, rh, TOL[dt], f"{member} final state")
    o0, _ = _member(member, q, k, v, g, beta, 2)
    _late_segment_depends_on_h0(o, o0, slice(192, 200))


@pytest.mark.parametrize("member", ["gdn", "gla"])
def test_members_varlen(member):
    cu = torch.tensor([0] + LENS).cumsum(0)
    q, k, v, g, beta, h0 = _member_inputs(member, int(cu[-1]), 2, F32, cu=cu.tolist())
    o, ht = _member(member, q, k, v, g, beta, 2, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    ro, rh = _member_ref(member, q, k, v, g, beta, h0, cu)
    assert_close(o, ro, TOL[F32], f"{member} o")
    assert_close(ht, rh, TOL[F32], f"{member} final state")


# ------------------------------------------------------------------------- config and sources
def test_config_field_validation():
    for L in (0, 2, 8, 16, 64):
        assert ChunkFwdConfig(state_segment_chunks=L).state_segment_chunks == L
    for bad in (1, 3, 12, -2, True, 2.0):
        with pytest.raises(ConfigError, match="state_segment_chunks"):
            ChunkFwdConfig(state_segment_chunks=bad)
    plan = lower(select_spec(False, True, -5.0, False, False), 256, 256, "bfloat16", "chunk")
    with pytest.raises(ConfigError, match="K <= 128"):
        render("chunk_seg_combine", plan, ChunkFwdConfig(chunk_size=32, state_segment_chunks=8))


def _plans():
    from kdagen.spec.recurrence import get_spec
    specs = {"kda": select_spec(False, True, -5.0, False, False), "gdn": get_spec("gdn"),
             "deltanet": get_spec("deltanet"), "gla": get_spec("gla")}
    return {f"{n}/{K}/{dt}": lower(s, K, K, dt, "chunk") for n, s in specs.items() for K in (48, 128)
            for dt in ("float32", "bfloat16")}


def test_off_leaves_chunk_pass_as_it_was():
    """state_segment_chunks never reaches chunk_pass's source: the one pass renders the same bytes
    whatever the field says, and holds none of the segmented branch.  (When the path was added,
    chunk_pass with the field at 0 was also checked byte-identical to the one before it, over the
    four members, K 48/128, fp32/bf16, C 32/64 and both prefetch settings.)"""
    for name, plan in _plans().items():
        off = render("chunk_pass", plan, plain_fwd(chunk_size=32)).text
        assert render("chunk_pass", plan, plain_fwd(chunk_size=32, state_segment_chunks=8)).text == off, name
        seg = render("chunk_seg_pass", plan, plain_fwd(chunk_size=32, state_segment_chunks=8)).text
        assert "hseg" in seg and "SEG_CHUNKS" in seg and "hseg" not in off and "SEG_CHUNKS" not in off


def test_heuristic_takes_segments_only_for_few_programs_and_long_sequences():
    spec = select_spec(False, True, -5.0, False, False)
    plan = lower(spec, 128, 128, "bfloat16", "chunk")
    long1 = {"T": 65536, "B": 1, "N": 1, "HV": 8, "T_max": 65536}
    assert default_chunk_config(plan, long1).state_segment_chunks == 32  # 32 programs, 1024 chunks
    # 64 and 128 programs: one pass (measured faster on the H200 at (1, 32768, 16) and (2, 16384, 16))
    assert default_chunk_config(plan, dict(long1, HV=16, T=32768, T_max=32768)).state_segment_chunks == 0
    assert default_chunk_config(plan, dict(long1, N=2, B=2, HV=16, T=16384, T_max=16384)).state_segment_chunks == 0
    assert default_chunk_config(plan, dict(long1, N=8, B=8)).state_segment_chunks == 0  # 256 programs
    assert default_chunk_config(plan, dict(long1, T=4096, T_max=4096)).state_segment_chunks == 0  # 64 chunks
    # a packed call: its longest sequence decides, not its total length
    assert default_chunk_config(plan, dict(long1, T_max=2048)).state_segment_chunks == 0
    assert default_chunk_config(plan, {"T": 65536, "B": 1, "N": 1, "HV": 8}).state_segment_chunks == 32
    assert default_chunk_config(plan).state_segment_chunks == 0  # no shape: the one pass
    wide = lower(spec, 256, 256, "bfloat16", "chunk")
    assert default_chunk_config(wide, long1).state_segment_chunks == 0  # K > 128: not available
