"""Where the chunks of a call lie: the schedule both chunk forms launch over.

A packed call's schedule is built on the host from the sequences' lengths and copied to the
device.  The layers of one model step call the ops with the same lengths, so the device tensors
are kept for the last few (lengths, chunk length, device, stream) seen and given again: the key
holds the lengths' values (never a tensor's identity, which an in-place rewrite would not change),
and the stream the copy was queued on, so a stream that reuses them is one that ordered the copy
before its own kernels.  The kernels only read them."""
from __future__ import annotations

from collections import OrderedDict

import torch
import triton

_KEPT: OrderedDict = OrderedDict()
_KEPT_MAX = 32


def _kept(key: tuple, device, make):
    """``make()``'s result for ``key`` (a tuple of host values) on ``device``, made once while it
    stays among the last :data:`_KEPT_MAX` keys used; on a GPU the key also holds the current
    stream (the one the copy is queued on).  Not while a CUDA graph is being captured: a copy
    queued then runs only when the graph replays, so its tensors are made afresh and not kept."""
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return make()
        key += (str(device), torch.cuda.current_stream(device).cuda_stream)
    else:
        key += (str(device),)
    hit = _KEPT.get(key)
    if hit is None:
        hit = _KEPT[key] = make()
        if len(_KEPT) > _KEPT_MAX:
            _KEPT.popitem(last=False)
    else:
        _KEPT.move_to_end(key)
    return hit


def chunk_schedule(seqlens: list[int] | None, B: int, T: int, C: int, device):
    """(number of chunks, chunk_indices [NT,2] int32 or None, chunk_offsets [N] int32 or None).

    chunk_indices[i] = (sequence, chunk within it) of global chunk i; chunk_offsets[n] = the
    global index of sequence n's first chunk.  Built with tensor ops on the host (a packed
    batch can hold thousands of sequences) and copied to the device once per lengths (the
    module docstring)."""
    if seqlens is None:
        return B * triton.cdiv(T, C), None, None
    return _kept(("chunks", tuple(seqlens), C), device, lambda: _build_chunk_schedule(seqlens, C, device))


def _build_chunk_schedule(seqlens, C, device):
    cu = torch.tensor(seqlens, dtype=torch.int64)
    nchunks = (cu[1:] - cu[:-1] + C - 1) // C
    offsets = torch.cumsum(nchunks, 0) - nchunks
    total = int(nchunks.sum())
    seq = torch.repeat_interleave(torch.arange(len(nchunks)), nchunks)
    within = torch.arange(total) - torch.repeat_interleave(offsets, nchunks)
    idx = torch.stack([seq, within], 1) if total else torch.zeros(1, 2, dtype=torch.int64)
    return total, to_device(idx.to(torch.int32), device), to_device(offsets.to(torch.int32), device)


def segment_schedule(seqlens: list[int] | None, B: int, T: int, C: int, L: int, device):
    """The segments of ``L`` chunks of the sequence-parallel state pass
    (:mod:`kdagen.ops.chunk_segments`): (number of segments, segments per sequence NS (fixed
    length; 0 for varlen), seg_indices [S,2] int32 or None, seg_offsets [N] int32 or None).

    A sequence of n chunks has ceil(n / L) segments (its last may be shorter; an empty sequence
    has none).  seg_indices[s] = (sequence, segment within it) of global segment s;
    seg_offsets[n] = the global index of sequence n's first segment.  Fixed length: segment s is
    segment s % NS of sequence s // NS, nothing is built.  Varlen: built from the host-side
    offsets and copied to the device once, as :func:`chunk_schedule`'s."""
    if seqlens is None:
        NS = triton.cdiv(triton.cdiv(T, C), L)
        return B * NS, NS, None, None
    return _kept(("segments", tuple(seqlens), C, L), device, lambda: _build_segment_schedule(seqlens, C, L, device))


def _build_segment_schedule(seqlens, C, L, device):
    cu = torch.tensor(seqlens, dtype=torch.int64)
    nseg = ((cu[1:] - cu[:-1] + C - 1) // C + L - 1) // L
    offsets = torch.cumsum(nseg, 0) - nseg
    total = int(nseg.sum())
    seq = torch.repeat_interleave(torch.arange(len(nseg)), nseg)
    within = torch.arange(total) - torch.repeat_interleave(offsets, nseg)
    idx = torch.stack([seq, within], 1) if total else torch.zeros(1, 2, dtype=torch.int64)
    return total, 0, to_device(idx.to(torch.int32), device), to_device(offsets.to(torch.int32), device)


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """``x`` on ``device``; from the host to a GPU through pinned memory, asynchronously (the host
    does not wait for the device)."""
    if x.device == torch.device(device) or x.device.type != "cpu" or torch.device(device).type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)
