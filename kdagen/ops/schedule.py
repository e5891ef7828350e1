"""Where the chunks of a call lie: the schedule both chunk forms launch over."""
from __future__ import annotations

import torch
import triton


def chunk_schedule(seqlens: list[int] | None, B: int, T: int, C: int, device):
    """(number of chunks, chunk_indices [NT,2] int32 or None, chunk_offsets [N] int32 or None).

    chunk_indices[i] = (sequence, chunk within it) of global chunk i; chunk_offsets[n] = the
    global index of sequence n's first chunk.  Built with tensor ops on the host (a packed
    batch can hold thousands of sequences) and copied to the device once."""
    if seqlens is None:
        return B * triton.cdiv(T, C), None, None
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
