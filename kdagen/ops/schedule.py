"""Where the chunks of a call lie: the schedule both chunk forms launch over.

A packed call whose lengths are on the host (``cu_seqlens_cpu``, or a host ``cu_seqlens``) has
its schedule built on the host and copied to the device.  The layers of one model step call the
ops with the same lengths, so the device tensors are kept for the last few (lengths, chunk
length, device, stream) seen and given again: the key holds the lengths' values (never a
tensor's identity, which an in-place rewrite would not change), and the stream the copy was
queued on, so a stream that reuses them is one that ordered the copy before its own kernels.
The kernels only read them.

A packed call whose offsets are only on the device gets a schedule built there by one program
of a generated kernel (templates/chunk_schedule.py.j2, the chunk_fwd family's
:data:`SCHEDULE`-th), without reading anything back (no synchronisation, nothing kept, and a
CUDA graph captures it): its grid is a bound fixed by the shapes -- ``T // C + N`` chunks,
``(T // C + N) // L + N`` segments -- and the entries past the real count name units past the
last sequence's end, which the kernels skip (``chunk_bounds``/``segment_bounds`` in
templates/_macros.py.j2).  Its offsets are checked on the device (start at 0, non-decreasing,
end at T): bad ones stop the stream with a device-side assertion before any kernel reads them,
never a silent wrong answer."""
from __future__ import annotations

from collections import OrderedDict

import torch
import triton

from ..kernels import Launch

SCHEDULE = 5  # the schedule kernel's index among the chunk_fwd family's (codegen.render.FAMILY_KERNELS)
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


def chunk_schedule(seqlens: list[int] | None, B: int, T: int, C: int, device, cu_seqlens=None, kernel=None):
    """(number of chunks, chunk_indices [NT,2] int32 or None, chunk_offsets [N] int32 or None).

    chunk_indices[i] = (sequence, chunk within it) of global chunk i; chunk_offsets[n] = the
    global index of sequence n's first chunk.  With ``seqlens`` (the offsets on the host): built
    on the host and copied to the device once per lengths (:func:`_build_host_schedule`).  Without them but with a device ``cu_seqlens``: built on the
    device over a bound of chunks by ``kernel`` (the chunk_fwd family's schedule kernel), the
    surplus entries past the last sequence's end (the module docstring).  Neither:
    a fixed-length batch, nothing built."""
    if seqlens is None and cu_seqlens is not None:
        return _device_schedule(cu_seqlens, T, C, 1, kernel)
    if seqlens is None:
        return B * triton.cdiv(T, C), None, None
    return _kept(("chunks", tuple(seqlens), C), device, lambda: _build_host_schedule(seqlens, C, 1, device))


def segment_schedule(seqlens: list[int] | None, B: int, T: int, C: int, L: int, device, cu_seqlens=None,
                     kernel=None):
    """The segments of ``L`` chunks of the sequence-parallel state pass
    (:mod:`kdagen.ops.chunk_segments`): (number of segments, segments per sequence NS (fixed
    length; 0 for varlen), seg_indices [S,2] int32 or None, seg_offsets [N] int32 or None).

    A sequence of n chunks has ceil(n / L) segments (its last may be shorter; an empty sequence
    has none).  seg_indices[s] = (sequence, segment within it) of global segment s;
    seg_offsets[n] = the global index of sequence n's first segment.  Fixed length: segment s is
    segment s % NS of sequence s // NS, nothing is built.  Varlen: built from the host-side
    offsets and copied to the device once, as :func:`chunk_schedule`'s, or from a device
    ``cu_seqlens`` on the device over a bound of segments."""
    if seqlens is None and cu_seqlens is not None:
        total, idx, offsets = _device_schedule(cu_seqlens, T, C, L, kernel)
        return total, 0, idx, offsets
    if seqlens is None:
        NS = triton.cdiv(triton.cdiv(T, C), L)
        return B * NS, NS, None, None
    total, idx, offsets = _kept(("segments", tuple(seqlens), C, L), device,
                                lambda: _build_host_schedule(seqlens, C, L, device))
    return total, 0, idx, offsets


def _build_host_schedule(seqlens, C: int, L: int, device):
    """(total, indices, offsets) of the units -- chunks of ``C`` tokens, or segments of ``L``
    chunks -- of the host lengths ``seqlens``, built with tensor ops on the host (a packed batch
    can hold thousands of sequences) and copied to ``device``."""
    cu = torch.tensor(seqlens, dtype=torch.int64)
    units = ((cu[1:] - cu[:-1] + C - 1) // C + L - 1) // L
    offsets = torch.cumsum(units, 0) - units
    total = int(units.sum())
    seq = torch.repeat_interleave(torch.arange(len(units)), units)
    within = torch.arange(total) - torch.repeat_interleave(offsets, units)
    idx = torch.stack([seq, within], 1) if total else torch.zeros(1, 2, dtype=torch.int64)
    return total, to_device(idx.to(torch.int32), device), to_device(offsets.to(torch.int32), device)


def schedule_bound(N: int, T: int, C: int, L: int = 1) -> int:
    """How many units (chunks of ``C`` tokens, or with ``L`` > 1 segments of ``L`` chunks) ``N``
    packed sequences of ``T`` tokens in all can hold at most: a sequence of t tokens holds
    ceil(t / C) <= t / C + 1 chunks, so at most T // C + N in all (the fraction parts sum to
    below N), and ceil(n / L) <= n / L + 1 segments of its n chunks."""
    chunks = T // C + N
    return chunks if L == 1 else chunks // L + N


def _device_schedule(cu_seqlens: torch.Tensor, T: int, C: int, L: int, kernel):
    """(bound, indices [bound, 2] int32, offsets [N] int32) of the units -- chunks of ``C``
    tokens, or segments of ``L`` chunks -- of the sequences ``cu_seqlens`` packs, built on its
    device by one program of ``kernel`` (:func:`schedule_launch`), without reading anything
    back.  Unit i < total is (sequence, unit within it); a surplus unit lies past the last
    sequence's end, which the kernels skip.  The offsets are checked there too (start at 0,
    non-decreasing, end at T): bad ones stop the stream with a device-side assertion queued
    before any kernel reads them (on the host: a RuntimeError)."""
    launch, (indices, offsets, ok) = schedule_launch(cu_seqlens, T, C, L, kernel)
    launch()
    torch._assert_async(ok[0], "cu_seqlens must start at 0, be non-decreasing and end at T (the packed length)")
    return launch.args["bound"], indices, offsets


def schedule_launch(cu_seqlens: torch.Tensor, T: int, C: int, L: int, kernel):
    """The launch of the schedule kernel (templates/chunk_schedule.py.j2, the chunk_fwd family's
    last) for ``cu_seqlens``, described and not run: ``(launch, (indices, offsets, ok))``."""
    N = cu_seqlens.numel() - 1
    bound = max(schedule_bound(N, T, C, L), 1)
    dev = cu_seqlens.device
    indices = torch.empty(bound, 2, dtype=torch.int32, device=dev)
    offsets = torch.empty(N, dtype=torch.int32, device=dev)
    ok = torch.empty(1, dtype=torch.int32, device=dev)
    args = dict(cu_seqlens=cu_seqlens, indices=indices, offsets=offsets, ok=ok, N=N, T=T, bound=bound,
                search_steps=N.bit_length())  # a binary search over N first units
    return Launch("chunk_schedule", kernel, (1,), args, dict(C=C, L=L, BLOCK=SCHEDULE_BLOCK), 4, 1), (indices, offsets, ok)


SCHEDULE_BLOCK = 1024  # the schedule kernel's sequences or units per step


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """``x`` on ``device``; from the host to a GPU through pinned memory, asynchronously (the host
    does not wait for the device)."""
    if x.device == torch.device(device) or x.device.type != "cpu" or torch.device(device).type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)
