"""The chunk schedule of packed calls (kdagen.ops.schedule): built from the lengths' values, kept
for the last few lengths seen, never stale."""
from __future__ import annotations

import torch

from conftest import F64, TOL, assert_close, make_inputs

import kdagen
from kdagen.ops import schedule as S
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
