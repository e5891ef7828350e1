"""The chunk schedule of packed calls (kdagen.ops.schedule): built from the lengths' values, kept
for the last few lengths seen, never stale; or, with the offsets on the device only, built there
over a bound without reading them back."""
from __future__ import annotations

import pytest
import torch

from cases import make_inputs
from conftest import F64, TOL, assert_close, run_poisoned
from plain_configs import plain_fwd

import kdagen
from kdagen.kernels import build
from kdagen.ops import schedule as S
from kdagen.ops.chunk import chunk_kda_launches
from kdagen.spec.reference import naive_recurrent_kda


def _direct(seqlens, C):
    idx, offsets, at = [], [], 0
    for n, (a, b) in enumerate(zip(seqlens, seqlens[1:])):
        chunks = -(-(b - a) // C)
        offsets.append(at)
        idx += [[n, i] for i in range(chunks)]
        at += chunks
    return at, idx, offsets


def test_the_schedule_is_kept_per_lengths_and_built_right():
    S._KEPT.clear()
    lens = [0, 5, 5, 70, 71, 200]
    total, idx, off = S.chunk_schedule(lens, 1, 200, 32, "cpu")
    want = _direct(lens, 32)
    assert (total, idx.tolist(), off.tolist()) == want
    again = S.chunk_schedule(list(lens), 1, 200, 32, "cpu")
    assert again[1] is idx and again[2] is off  # the same lengths: the kept tensors
    other = S.chunk_schedule([0, 5, 6, 70, 71, 200], 1, 200, 32, "cpu")
    assert other[1] is not idx and (other[0], other[1].tolist(), other[2].tolist()) == \
        _direct([0, 5, 6, 70, 71, 200], 32)
    assert S.chunk_schedule(lens, 1, 200, 64, "cpu")[1] is not idx  # another chunk length
    seg = S.segment_schedule(lens, 1, 200, 32, 2, "cpu")
    assert S.segment_schedule(lens, 1, 200, 32, 2, "cpu")[2] is seg[2]
    # chunks per sequence 1, 0, 3, 1, 5: segments of two chunks 1, 0, 2, 1, 3
    assert seg[0] == 7 and seg[2].tolist() == [[0, 0], [2, 0], [2, 1], [3, 0], [4, 0], [4, 1], [4, 2]]


def test_only_the_last_few_lengths_are_kept():
    S._KEPT.clear()
    first = S.chunk_schedule([0, 1, 2], 1, 2, 32, "cpu")
    for n in range(S._KEPT_MAX):
        S.chunk_schedule([0, 1, 3 + n], 1, 3 + n, 32, "cpu")
    assert len(S._KEPT) == S._KEPT_MAX
    assert S.chunk_schedule([0, 1, 2], 1, 2, 32, "cpu")[1] is not first[1]  # evicted, built again


def test_offsets_rewritten_in_place_give_the_new_schedule():
    """The kept schedule is keyed by the lengths' values: a cu_seqlens tensor rewritten in place
    (here without a version bump, as a graph replay or a custom kernel would) gives the answer
    for its new values."""
    # 64-row chunks: 1 + 3 chunks, then 2 + 1 (the same count, another schedule)
    x = make_inputs(1, 150, 1, 1, 16, 16, seed=5, cu_seqlens=[0, 10, 150])
    ref = []
    for cu in ([0, 10, 150], [0, 100, 150]):
        x.cu_seqlens.data.copy_(torch.tensor(cu))
        o, ht = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                 cu_seqlens=x.cu_seqlens, safe_gate=True, lower_bound=-5.0)
        q, k, v, g, beta = x.ref_args()
        ro, rh = naive_recurrent_kda(q, k, v, g, beta, initial_state=x.h0.to(F64), output_final_state=True,
                                     cu_seqlens=torch.tensor(cu))
        assert_close(o, ro, TOL[torch.float32], f"o for {cu}")
        assert_close(ht, rh, TOL[torch.float32], f"final state for {cu}")
        ref.append(o)
    assert not torch.allclose(ref[0], ref[1])


# ------------------------------------------------------------- built on the device (no read-back)


def _schedule_kernel():
    """The chunk_fwd family's schedule kernel (templates/chunk_schedule.py.j2), as the ops get it."""
    from kdagen import spec as SP
    from kdagen.codegen.lower import lower
    from kdagen.ops.chunk_fwd import SCHEDULE

    return build(lower(SP.kda(SP.gate_direct(-5.0)), 16, 16, "float32", "chunk"), plain_fwd()).fns[SCHEDULE]


def test_the_schedule_kernel_is_where_the_ops_look_for_it():
    from kdagen.codegen.render import FAMILY_KERNELS

    assert FAMILY_KERNELS["chunk_fwd"][S.SCHEDULE] == "chunk_schedule"


def test_the_device_schedule_is_the_host_one_then_surplus():
    """Offsets on the device only: the schedule is built there over the bound T // C + N (or
    (T // C + N) // L + N segments); its first entries are the host schedule's, the rest
    units past the last sequence's end, and the first-unit offsets are the host's."""
    gen = torch.Generator().manual_seed(3)
    for trial in range(12):  # (the interpreter runs the schedule kernel: ~0.1 s a call)
        n = int(torch.randint(1, 9, (1,), generator=gen))
        lens = torch.tensor([0, 1, 2, 31, 32, 33, 64, 65, 200])[torch.randint(0, 9, (n,), generator=gen)]
        cu = [0] + torch.cumsum(lens, 0).tolist()
        T = cu[-1]
        for C in (32, 64):
            total, idx, off = _direct(cu, C)
            bound, didx, doff = S.chunk_schedule(None, 1, T, C, "cpu", torch.tensor(cu), _schedule_kernel())
            assert bound == max(T // C + n, 1) >= total
            assert didx.tolist()[:total] == idx and doff.tolist() == off, (cu, C)
            # the surplus: chunks past the last sequence's end (the kernels skip them)
            assert all(s == n - 1 and i * C >= cu[-1] - cu[-2] for s, i in didx.tolist()[total:])
            for L in (2, 4):
                want = S.segment_schedule(cu, 1, T, C, L, "cpu")
                sb, ns, sidx, soff = S.segment_schedule(None, 1, T, C, L, "cpu", torch.tensor(cu), _schedule_kernel())
                assert ns == 0 and sb == max(S.schedule_bound(n, T, C, L), 1) >= want[0]
                assert sidx.tolist()[:want[0]] == want[2].tolist() and soff.tolist() == want[3].tolist()
                assert all(s == n - 1 and i * L * C >= cu[-1] - cu[-2] for s, i in sidx.tolist()[want[0]:])


def test_the_device_schedule_spans_more_sequences_and_units_than_one_step():
    """More sequences and units than the kernel takes in one step (SCHEDULE_BLOCK): the running
    sum carries over, and every unit's sequence is found."""
    gen = torch.Generator().manual_seed(8)
    lens = torch.randint(0, 70, (S.SCHEDULE_BLOCK + 300,), generator=gen)
    lens[::7] = 0
    cu = [0] + torch.cumsum(lens, 0).tolist()
    for C, L in ((32, 1), (32, 2)):
        want = _direct(cu, C) if L == 1 else S.segment_schedule(cu, 1, cu[-1], C, L, "cpu")
        got = (S.chunk_schedule(None, 1, cu[-1], C, "cpu", torch.tensor(cu), _schedule_kernel()) if L == 1 else
               S.segment_schedule(None, 1, cu[-1], C, L, "cpu", torch.tensor(cu), _schedule_kernel()))
        total, idx, off = (want[0], want[1], want[2]) if L == 1 else (want[0], want[2].tolist(), want[3].tolist())
        gidx, goff = (got[1], got[2]) if L == 1 else (got[2], got[3])
        assert got[0] > S.SCHEDULE_BLOCK and total > S.SCHEDULE_BLOCK
        assert gidx.tolist()[:total] == idx and goff.tolist() == off


def test_the_device_schedule_checks_the_offsets():
    """Bad offsets are refused where they live (on a GPU a device-side assertion; on the host
    at once), before any kernel reads them."""
    for bad in ([1, 5, 10], [0, 6, 5, 10], [0, 5, 9]):
        with pytest.raises(RuntimeError, match="cu_seqlens must start at 0, be non-decreasing and end at T"):
            S.chunk_schedule(None, 1, 10, 32, "cpu", torch.tensor(bad), _schedule_kernel())


def _device_only(monkeypatch):
    """Make a host cu_seqlens behave as one on a GPU that the call must not read back: the
    lengths reach the op only where it asks for a read (training, intermediate states)."""
    from kdagen.ops import inputs
    real = inputs.host_seqlens
    reads = []

    def unread_unless_synced(cu, T, cu_cpu=None, *, sync=True):
        if cu_cpu is None and not sync:
            return None
        reads.append("cu_seqlens_cpu" if cu_cpu is not None else "cu_seqlens")
        return real(cu, T, cu_cpu, sync=sync)

    monkeypatch.setattr(inputs, "host_seqlens", unread_unless_synced)
    return reads


@pytest.mark.parametrize("cu, C, L", [([0, 0, 1, 40, 40, 41, 105], 32, 0), ([0, 0, 1, 40, 40, 41, 105], 64, 0),
                                      ([0, 3, 130, 130, 200], 32, 2)])
def test_a_packed_call_with_device_offsets_matches_the_recurrence(monkeypatch, cu, C, L):
    """The inference call with device-only offsets (schedule built over a bound, surplus
    programs returning at once): bit-identical to the host-scheduled call, within the float32
    bound of the float64 recurrence, with length-0/1 sequences and the sequence-parallel pass."""
    x = make_inputs(1, cu[-1], 1, 2, 32, 32, seed=9, cu_seqlens=cu)
    config = plain_fwd(chunk_size=C, state_segment_chunks=L)
    kw = dict(initial_state=x.h0, output_final_state=True, cu_seqlens=x.cu_seqlens, safe_gate=True,
              lower_bound=-5.0, config=config)
    host = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, **kw)
    reads = _device_only(monkeypatch)
    launches, _ = chunk_kda_launches(x.q, x.k, x.v, x.g, x.beta, **kw)
    assert launches[0].grid[0] == len(cu) - 1 + cu[-1] // C  # the bound, not the real count
    got = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, **kw)
    assert reads == [], "the inference call read the offsets back"
    assert torch.equal(got[0], host[0]) and torch.equal(got[1], host[1])
    q, k, v, g, beta = x.ref_args()
    ro, rh = naive_recurrent_kda(q, k, v, g, beta, initial_state=x.h0.to(F64), output_final_state=True,
                                 cu_seqlens=torch.tensor(cu))
    assert_close(got[0], ro, TOL[torch.float32], "o")
    assert_close(got[1], rh, TOL[torch.float32], "final state")
    # surplus programs write nothing: every output and intermediate NaN-filled first is overwritten
    launches, (o, ht, _) = chunk_kda_launches(x.q, x.k, x.v, x.g, x.beta, **kw)
    run_poisoned(launches, (o, ht))
    assert torch.equal(o, host[0]) and torch.equal(ht, host[1])


def test_what_needs_the_lengths_still_reads_them(monkeypatch):
    """return_intermediate_states (its shape is the chunk count) and training (the backward)
    read device offsets back; use_graph=True there is refused, and for inference it builds the
    schedule on the device even when cu_seqlens_cpu is given (a captured graph must not freeze
    host lengths)."""
    cu = [0, 1, 40, 105]
    x = make_inputs(1, cu[-1], 1, 1, 16, 16, seed=4, cu_seqlens=cu)
    reads = _device_only(monkeypatch)
    _, _, hs = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, return_intermediate_states=True,
                                chunk_size=64)
    assert reads == ["cu_seqlens"] and hs.shape[1] == 1 + 1 + 2
    with pytest.raises(ValueError, match="use_graph=True with cu_seqlens is not supported for return_inter"):
        kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, return_intermediate_states=True,
                         use_graph=True)
    q = x.q.clone().requires_grad_()
    with pytest.raises(ValueError, match="use_graph=True with cu_seqlens is not supported for a training call"):
        kdagen.chunk_kda(q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, use_graph=True)
    reads.clear()
    plain = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, cu_seqlens_cpu=torch.tensor(cu))
    graph = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, cu_seqlens_cpu=torch.tensor(cu),
                             use_graph=True, max_num_seqs=8)
    assert reads == ["cu_seqlens_cpu"] and torch.equal(plain[0], graph[0])  # the graph call read nothing



@pytest.mark.parametrize("member", ["gdn", "deltanet", "gla"])
def test_the_family_ops_build_their_packed_schedule_on_the_device_too(monkeypatch, member):
    """Every member's inference chunk op (a scalar decay's solve, no decay, no rank-1 part) takes
    the device-built schedule with device-only offsets (int32 here): bit-identical to its
    host-scheduled call, nothing read back."""
    from kdagen.ops import family

    cu = [0, 1, 40, 40, 105]
    x = make_inputs(1, cu[-1], 1, 2, 16, 16, seed=11, cu_seqlens=cu)
    offsets = x.cu_seqlens.to(torch.int32)
    if member == "gdn":
        g = x.g[..., 0].contiguous()  # a decay per token and value head
        call = lambda **kw: family.chunk_gated_delta_rule(x.q, x.k, x.v, g, x.beta, initial_state=x.h0,  # noqa: E731
                                                         output_final_state=True, **kw)
    elif member == "deltanet":
        call = lambda **kw: family.chunk_delta_rule(x.q, x.k, x.v, x.beta, initial_state=x.h0,  # noqa: E731
                                                   output_final_state=True, **kw)
    else:
        call = lambda **kw: family.chunk_gla(x.q, x.k, x.v, x.g, initial_state=x.h0, output_final_state=True,  # noqa: E731
                                            **kw)
    host = call(cu_seqlens=offsets)
    reads = _device_only(monkeypatch)
    built = []
    real = S._device_schedule
    monkeypatch.setattr(S, "_device_schedule", lambda *a: built.append(a[2:]) or real(*a))
    got = call(cu_seqlens=offsets)
    assert reads == [], "the inference call read the offsets back"
    assert built, "the schedule was not built on the device"
    assert torch.equal(got[0], host[0]) and torch.equal(got[1], host[1])
