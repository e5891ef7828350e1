"""What an fp32 decode step's state traffic can reach on this GPU: the decode kernel's own
access pattern (one [K, BV] tile of a pool slot read and written back in place, the same grid
and warps) without the recurrence's math, against the copy ceiling serving.py uses.

    PYTHONPATH=. python3 bench/decode_ceiling.py [--batch 256] [--pairs 64/2,64/4,128/4,128/8,32/1,32/2]

Rows (µs from CUDA-graph replay of 10 steps, % of the 1 GiB device copy):
- torch ``copy_`` of the pool's bytes into another buffer (read + write, out of place);
- torch ``mul_`` of the pool in place (read + write, in place);
- a Triton kernel per (BV, warps): each program loads its item's tile as the decode kernel
  addresses it (slot (7 n) mod P, head, V tile), scales it and stores it back;
- the same tiles through Hopper's tensor memory accelerator (a host-side TensorDescriptor);
- the decode op itself (``fused_recurrent_kda``, packed, the pool updated in place) at the same
  (BV, warps): what the recurrence's loads of q, k, g, beta, v and its two K reductions add.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def tile_rw(pool, slots, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
            NV: tl.constexpr, V_FIRST: tl.constexpr = False):
    """Each program loads its item's [K, BV] tile as the decode kernel addresses it, scales it and
    stores it back.  V_FIRST: the pool laid out [P, HV, V, K] (``state_v_first``), where a V tile's
    BV rows of K are one contiguous block."""
    item = tl.program_id(0)
    i_v = item % NV
    i_n = (item // NV) // HV
    i_hv = (item // NV) % HV
    slot = tl.load(slots + i_n).to(tl.int64)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    if V_FIRST:
        p = pool + (slot * HV + i_hv) * K * V + o_v[None, :] * K + o_k[:, None]
    else:
        p = pool + (slot * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    s = tl.load(p)
    tl.store(p, s * 0.999)


@triton.jit
def tile_rw_tma(desc, slots, HV: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr):
    """The same tiles through the tensor memory accelerator (Hopper's bulk copies: one
    instruction per tile, no per-thread addresses); ``desc``: the pool as [P * HV * K, V]."""
    item = tl.program_id(0)
    i_v = item % NV
    i_n = (item // NV) // HV
    i_hv = (item // NV) % HV
    slot = tl.load(slots + i_n)
    row = (slot * HV + i_hv) * K
    s = desc.load([row, i_v * BV])
    desc.store([row, i_v * BV], s * 0.999)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--pairs", default="64/2,64/4,128/4,128/8,32/1,32/2")
    ap.add_argument("--v-first", action="store_true", help="also the pool laid out [P, HV, V, K] (state_v_first=True)")
    args = ap.parse_args()
    import kdagen
    from kdagen.config import RecurrentConfig
    from serving import copy_ceiling_gbs, decode_case, graph_us

    ceil = copy_ceiling_gbs()
    print(f"copy ceiling {ceil:.0f} GB/s (1 GiB copy_)", flush=True)
    B, H, K, V = args.batch, 32, 128, 128
    fn, nbytes, _, (x, pool, slots, cu, out) = decode_case(B, True, torch.float32)
    pct = lambda us: 100 * nbytes / (us * 1e-6) / 1e9 / ceil  # noqa: E731
    other = torch.empty(nbytes // 8, device=pool.device)
    src = torch.empty_like(other)
    us = graph_us(lambda: other.copy_(src))
    print(f"torch copy_ of the same bytes (out of place)      {us:8.1f} us {pct(us):5.1f}%", flush=True)
    del other, src
    whole = pool[: B + 1] if pool.shape[0] > B else pool
    us = graph_us(lambda: whole.mul_(0.999))
    print(f"torch mul_ in place ({whole.shape[0]} slots of {pool.shape[0]})        "
          f"{us * B / whole.shape[0]:8.1f} us (scaled to B) {pct(us * B / whole.shape[0]):5.1f}%", flush=True)
    for pair in args.pairs.split(","):
        bv, w = map(int, pair.split("/"))
        nv = V // bv
        grid = (B * H * nv,)
        run = lambda: tile_rw[grid](pool, slots, HV=H, K=K, V=V, BV=bv, NV=nv, num_warps=w)  # noqa: E731
        try:
            us = graph_us(run)
            line = f"tile read+write BV={bv:3d} warps={w}                 {us:8.1f} us {pct(us):5.1f}%"
        except Exception as e:  # noqa: BLE001
            line = f"tile read+write BV={bv:3d} warps={w}: {type(e).__name__}: {str(e)[:120]}"
        try:
            cfg = RecurrentConfig(block_v=bv, num_warps=w, num_stages=1)
            op = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots,  # noqa: E731
                                                    cu_seqlens=cu, out=out, config=cfg)
            us2 = graph_us(op)
            line += f" | decode op {us2:8.1f} us {pct(us2):5.1f}%"
        except Exception as e:  # noqa: BLE001
            line += f" | decode op: {type(e).__name__}: {str(e)[:120]}"
        print(line, flush=True)
        if args.v_first:
            run = lambda: tile_rw[grid](pool, slots, HV=H, K=K, V=V, BV=bv, NV=nv, V_FIRST=True, num_warps=w)  # noqa: E731
            us = graph_us(run)
            line = f"V-first tile read+write BV={bv:3d} warps={w}         {us:8.1f} us {pct(us):5.1f}%"
            cfg = RecurrentConfig(block_v=bv, num_warps=w, num_stages=1)
            op = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots,  # noqa: E731
                                                    cu_seqlens=cu, out=out, config=cfg, state_v_first=True)
            us2 = graph_us(op)
            print(line + f" | decode op, state_v_first {us2:8.1f} us {pct(us2):5.1f}%", flush=True)
        try:
            from triton.tools.tensor_descriptor import TensorDescriptor
            desc = TensorDescriptor(pool, [pool.shape[0] * H * K, V], [V, 1], [K, bv])
            tma = lambda: tile_rw_tma[grid](desc, slots, HV=H, K=K, BV=bv, NV=nv, num_warps=w)  # noqa: E731
            us = graph_us(tma)
            print(f"tile read+write through TMA BV={bv:3d} warps={w}     {us:8.1f} us {pct(us):5.1f}%", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"tile through TMA BV={bv:3d} warps={w}: {type(e).__name__}: {str(e)[:160]}", flush=True)


if __name__ == "__main__":
    main()
