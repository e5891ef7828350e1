"""Two structures for the fp32 decode step (issue 13's B=256 row) that one-tile programs do not
have: persistent programs whose state tiles stream through Hopper's tensor memory accelerator
(TMA), and a (sequence, head)'s state split over K across programs that exchange their K sums.

    PYTHONPATH=. python3 bench/decode_stream_probe.py [--batch 256] [--rows stream,decode]
    PYTHONPATH=. python3 bench/decode_stream_probe.py --stream "" --decode "" --ksplit 4/4,8/2
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/decode_stream_probe.py --check-only --batch 3 --ksplit 1/4

The K-split (``decode_ksplit``): KS consecutive programs take K / KS whole rows each of one
(sequence, head)'s state (a contiguous block: 16 KB at KS = 4), write their partial K sums to a
scratch buffer, count themselves in a per-group counter and wait for the others (a spin on an
acquire load), then sum the KS partials in a fixed order and update their rows.  Programs that
wait for one another cannot run in the interpreter (it runs programs one after another), so there
it is checked at KS = 1 only; on the GPU every row is checked against the op first.

The design (nothing like it was measured before: session 17's TMA rows were one tile per
program, sessions 11/34's persistent loops went through cp.async or registers): a grid of
``programs_per_sm`` x SMs programs, each taking the items (sequence, head, V tile) it, it + G, ...
in a ``tl.range(num_stages=S)`` loop whose state tile is a tensor-descriptor load, so that
Triton's pipeliner issues each tile's load S - 1 items ahead into shared memory (an mbarrier,
no registers held), and whose new state goes out as a TMA store that overlaps the next item.

Rows (µs from CUDA-graph replay of 10 steps, % of the 1 GiB device copy, as serving.py counts):
- ``stream``: the access pattern alone (each tile scaled and written back in place): one tile a
  program (the op's pattern) against the persistent TMA loop over (S, warps, BV, programs per SM,
  slot order: address or the benchmarks' scrambled (7 n) mod P);
- ``decode``: the KDA decode step (packed, one token per sequence, fp32 [K, V] pool in place)
  as a persistent TMA loop and as the K-split, checked against ``kdagen.fused_recurrent_kda`` on
  the same inputs first (o and pool), beside the op itself.
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
def stream_one_tile(pool, slots, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                    BK: tl.constexpr = 0):
    """One program per item (sequence n, head, K slice, V tile), its [BK, BV] tile (BK = 0: all of K) of
    slot slots[n] scaled in place."""
    NV: tl.constexpr = V // BV
    RK: tl.constexpr = K if BK == 0 else BK
    NK: tl.constexpr = K // RK
    item = tl.program_id(0)
    i_v = item % NV
    i_k = (item // NV) % NK
    i_n = (item // (NV * NK)) // HV
    i_hv = (item // (NV * NK)) % HV
    slot = tl.load(slots + i_n).to(tl.int64)
    o_k = i_k * RK + tl.arange(0, RK)
    o_v = i_v * BV + tl.arange(0, BV)
    p = pool + (slot * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p, tl.load(p) * 0.999)


@triton.jit
def stream_tma(desc, slots, n_items, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
               S: tl.constexpr):
    """Persistent: program p takes items p, p + G, ...; each tile loaded through the descriptor (the
    pool as [P * HV * K, V]) S - 1 items ahead by Triton's pipeliner, scaled, stored through it."""
    NV: tl.constexpr = V // BV
    for it in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=S):
        i_v = it % NV
        i_n = (it // NV) // HV
        i_hv = (it // NV) % HV
        row = (tl.load(slots + i_n) * HV + i_hv) * K
        b = desc.load([row, i_v * BV])
        desc.store([row, i_v * BV], b * 0.999)


@triton.jit
def decode_tma(q, k, v, g, beta, o, desc, slots, cu, n_items, P, scale,
               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, S: tl.constexpr):
    """The KDA decode step (one token per sequence, packed by cu_seqlens, the fp32 pool [P, H, K, V]
    updated in place at slot slots[n]) as persistent programs over the items (n, head, V tile): the
    state tile through the descriptor (S - 1 items ahead), the step's readout from the loaded state
        o = S^T (D q) + (k . q) u,   u = beta (v - S^T (D k)),   S' = D S + k u^T,   D = Diag(exp g),
    the new tile stored through the descriptor.  A padding sequence (slot outside [0, P)) reads a
    wholly out-of-bounds tile (zeros), writes none, and gets o = 0."""
    NV: tl.constexpr = V // BV
    o_k = tl.arange(0, K)
    o_bv = tl.arange(0, BV)
    for it in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=S):
        i_v = it % NV
        i_n = (it // NV) // H
        i_h = (it // NV) % H
        slot = tl.load(slots + i_n)
        ok = (slot >= 0) & (slot < P)
        row = tl.where(ok, (slot * H + i_h) * K, -K)
        b_S = desc.load([row, i_v * BV])
        t = tl.load(cu + i_n)
        b_q = tl.load(q + (t * H + i_h) * K + o_k).to(tl.float32) * scale
        b_k = tl.load(k + (t * H + i_h) * K + o_k).to(tl.float32)
        b_d = tl.exp(tl.load(g + (t * H + i_h) * K + o_k).to(tl.float32))
        b_beta = tl.load(beta + t * H + i_h).to(tl.float32)
        b_v = tl.load(v + (t * H + i_h) * V + i_v * BV + o_bv).to(tl.float32)
        b_rq = tl.sum(b_S * (b_q * b_d)[:, None], axis=0)
        b_u = (b_v - tl.sum(b_S * (b_k * b_d)[:, None], axis=0)) * b_beta
        b_o = b_rq + tl.sum(b_k * b_q) * b_u
        tl.store(o + (t * H + i_h) * V + i_v * BV + o_bv, tl.where(ok, b_o, 0.).to(o.dtype.element_ty))
        desc.store([row, i_v * BV], b_S * b_d[:, None] + b_k[:, None] * b_u[None, :])


@triton.jit
def decode_ksplit(q, k, v, g, beta, o, pool, slots, cu, part, flags, P, scale,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KS: tl.constexpr):
    """The KDA decode step (as decode_tma) with each (sequence, head)'s state split over KS programs of
    [K / KS, V] rows (whole rows: one contiguous block of K / KS * V * 4 bytes each), which exchange
    their partial K sums through global memory: each writes S_j^T (D q), S_j^T (D k) and k_j . q_j of
    its rows to ``part``, counts itself in ``flags`` (release), waits until all KS have (acquire), and
    sums the KS partials in the fixed order j = 0..KS-1 (so every member gets the same u, and the
    result does not depend on arrival order).  The last member out resets the group's counters, so
    they are 0 again for the next launch (a CUDA graph replays the same buffers).  Member 0 writes o.
    Consecutive programs form a group and are dispatched in order, so a waiting group's members are
    all resident; the interpreter (one program after another) cannot run KS > 1."""
    BKS: tl.constexpr = K // KS
    W: tl.constexpr = 2 * V + 16  # a member's partials: S^T D q [V], S^T D k [V], k . q (padded)
    pid = tl.program_id(0)
    j = pid % KS
    grp = pid // KS
    i_n = grp // H
    i_h = grp % H
    slot = tl.load(slots + i_n).to(tl.int64)
    ok = (slot >= 0) & (slot < P)
    t = tl.load(cu + i_n)
    o_kk = j * BKS + tl.arange(0, BKS)
    o_v = tl.arange(0, V)
    p_s = pool + (slot * H + i_h) * K * V + o_kk[:, None] * V + o_v[None, :]
    b_S = tl.load(p_s, mask=ok, other=0.)
    b_q = tl.load(q + (t * H + i_h) * K + o_kk).to(tl.float32) * scale
    b_k = tl.load(k + (t * H + i_h) * K + o_kk).to(tl.float32)
    b_d = tl.exp(tl.load(g + (t * H + i_h) * K + o_kk).to(tl.float32))
    b_v = tl.load(v + (t * H + i_h) * V + o_v).to(tl.float32)
    b_beta = tl.load(beta + t * H + i_h).to(tl.float32)
    mine = part + (grp * KS + j) * W
    tl.store(mine + o_v, tl.sum(b_S * (b_q * b_d)[:, None], axis=0))
    tl.store(mine + V + o_v, tl.sum(b_S * (b_k * b_d)[:, None], axis=0))
    tl.store(mine + 2 * V, tl.sum(b_k * b_q))
    tl.debug_barrier()  # every thread's partials written before the count that publishes them
    n = tl.atomic_add(flags + 2 * grp, 1, sem="release") + 1
    while n < KS:
        n = tl.atomic_add(flags + 2 * grp, 0, sem="acquire")
    tl.debug_barrier()
    o_j = tl.arange(0, KS)
    theirs = part + (grp * KS + o_j) * W
    rq = tl.sum(tl.load(theirs[:, None] + o_v[None, :], cache_modifier=".cg"), axis=0)
    rk = tl.sum(tl.load(theirs[:, None] + V + o_v[None, :], cache_modifier=".cg"), axis=0)
    kq = tl.sum(tl.load(theirs + 2 * V, cache_modifier=".cg"))
    tl.debug_barrier()
    if tl.atomic_add(flags + 2 * grp + 1, 1) == KS - 1:  # the last out: the group's counters back to 0
        tl.atomic_xchg(flags + 2 * grp, 0)
        tl.atomic_xchg(flags + 2 * grp + 1, 0)
    b_u = (b_v - rk) * b_beta
    if j == 0:
        tl.store(o + (t * H + i_h) * V + o_v, tl.where(ok, rq + kq * b_u, 0.).to(o.dtype.element_ty))
    tl.store(p_s, b_S * b_d[:, None] + b_k[:, None] * b_u[None, :], mask=ok)


@triton.jit
def inverse_slots(slots, inv, NS, P, BP: tl.constexpr, BS: tl.constexpr, PDL: tl.constexpr = False):
    """One program: inv[slot] = the sequence whose slot it is, -1 for a slot no sequence has (the lean
    kernel's map from its slot to its sequence; sequences sharing a slot: one of them).  PDL: launched
    as a programmatic dependent launch (waits for the previous grid before it touches anything)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    o_p = tl.arange(0, BP)
    tl.store(inv + o_p, -1, mask=o_p < P)
    tl.debug_barrier()  # every slot cleared before any is claimed
    o_n = tl.arange(0, BS)
    s = tl.load(slots + o_n, mask=o_n < NS, other=-1)
    tl.store(inv + s, o_n, mask=(o_n < NS) & (s >= 0) & (s < P))


@triton.jit
def decode_vk_lean(q, k, v, g, beta, o, pool, inv, cu, scale,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, PDL: tl.constexpr = False,
                   NS=0, SCAN: tl.constexpr = 0, SCAN_OFFSETS: tl.constexpr = False):
    """The KDA decode step on a [P, H, V, K] pool (``state_v_first``) with R rows a program -- one
    contiguous block of R * K * 4 bytes holding whole K columns, so both K reductions stay in the
    program -- and nothing else per program but one load of inv[slot]: programs over (slot, head,
    row block) in address order, the slot's sequence from the map ``inverse_slots`` made (no scan of
    the slot indices), no masks (K and V whole, R divides V)."""
    if PDL:  # as the op: nothing read before the previous grid (the map) is done
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    NR: tl.constexpr = V // R
    i_r = tl.program_id(0) % NR
    i_sh = tl.program_id(0) // NR
    slot = i_sh // H
    i_h = i_sh % H
    if SCAN:  # no map: the slot's sequence from a scan of the NS slot indices (``inv`` is the slots here)
        o_sn = tl.arange(0, SCAN)
        hit = tl.load(inv + o_sn, mask=o_sn < NS, other=-1) == slot
        if SCAN_OFFSETS:  # as the op's slot grid: every sequence's offset loaded beside the slots
            all_bos = tl.load(cu + o_sn, mask=o_sn < NS, other=0)
            n = tl.max(tl.where(hit, o_sn, -1))
            t = tl.max(tl.where(hit, all_bos, -1))
        else:
            n = tl.max(tl.where(hit, o_sn, -1))
    else:
        n = tl.load(inv + slot)
    if n < 0:
        return
    if not SCAN_OFFSETS:
        t = tl.load(cu + n)
    o_k = tl.arange(0, K)
    o_r = i_r * R + tl.arange(0, R)
    p_s = pool + i_sh.to(tl.int64) * V * K + o_r[:, None] * K + o_k[None, :]
    b_S = tl.load(p_s)
    b_q = tl.load(q + (t * H + i_h) * K + o_k).to(tl.float32) * scale
    b_k = tl.load(k + (t * H + i_h) * K + o_k).to(tl.float32)
    b_d = tl.exp(tl.load(g + (t * H + i_h) * K + o_k).to(tl.float32))
    b_v = tl.load(v + (t * H + i_h) * V + o_r).to(tl.float32)
    b_beta = tl.load(beta + t * H + i_h).to(tl.float32)
    b_rq = tl.sum(b_S * (b_q * b_d)[None, :], axis=1)
    b_u = (b_v - tl.sum(b_S * (b_k * b_d)[None, :], axis=1)) * b_beta
    tl.store(o + (t * H + i_h) * V + o_r, (b_rq + tl.sum(b_k * b_q) * b_u).to(o.dtype.element_ty))
    tl.store(p_s, b_S * b_d[None, :] + b_u[:, None] * b_k[None, :])


def run_vk_lean_scan(x, pool, slots, cu, out, R, warps, pdl=False, offsets=False, maxnreg=0):
    """The lean [V, K] step in one launch: each program scans the slot indices (no map); offsets: and
    loads every sequence's offset beside them, as the op's slot grid does; maxnreg: a register cap."""
    B = slots.numel()
    P, H, V, K = pool.shape
    kw = dict(launch_pdl=True, PDL=True) if pdl else {}
    if maxnreg:
        kw["maxnreg"] = maxnreg
    decode_vk_lean[(P * H * (V // R),)](x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool, slots, cu, K ** -0.5,
                                        H=H, K=K, V=V, R=R, num_warps=warps, NS=B,
                                        SCAN=max(16, triton.next_power_of_2(B)), SCAN_OFFSETS=offsets, **kw)


def run_vk_lean(x, pool, slots, cu, out, R, warps, inv, remap=True, pdl=False):
    """The lean [V, K] step: the slot map (one program; left out with remap=False, inv as it is),
    then the step (o of padding sequences is not written: the probe's inputs have none).  pdl: both
    launched as programmatic dependent launches (sm_90), as the op's step is."""
    B = slots.numel()
    P, H, V, K = pool.shape
    kw = dict(launch_pdl=True, PDL=True) if pdl else {}
    if remap:
        inverse_slots[(1,)](slots, inv, B, P, BP=triton.next_power_of_2(P), BS=triton.next_power_of_2(B), **kw)
    decode_vk_lean[(P * H * (V // R),)](x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool, inv, cu, K ** -0.5,
                                        H=H, K=K, V=V, R=R, num_warps=warps, **kw)


def run_ksplit(x, pool, slots, cu, out, KS, warps, scratch):
    B, H, K, V = slots.numel(), pool.shape[1], pool.shape[2], pool.shape[3]
    part, flags = scratch
    decode_ksplit[(B * H * KS,)](x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool, slots, cu, part, flags,
                                 pool.shape[0], K ** -0.5, H=H, K=K, V=V, KS=KS, num_warps=warps)


def ksplit_scratch(B, H, V, KS, device):
    return (torch.zeros(B * H * KS * (2 * V + 16), dtype=torch.float32, device=device),
            torch.zeros(2 * B * H, dtype=torch.int32, device=device))


def _allocator(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def pool_desc(pool, BV):
    from triton.tools.tensor_descriptor import TensorDescriptor
    P, HV, K, V = pool.shape
    return TensorDescriptor(pool, [P * HV * K, V], [V, 1], [K, BV])


def n_programs(per_sm):
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    return per_sm * 2


def run_decode(x, pool, slots, cu, out, BV, S, warps, per_sm):
    B, H, K, V = slots.numel(), pool.shape[1], pool.shape[2], pool.shape[3]
    n_items = B * H * (V // BV)
    decode_tma[(min(n_programs(per_sm), n_items),)](
        x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool_desc(pool, BV), slots, cu, n_items, pool.shape[0],
        K ** -0.5, H=H, K=K, V=V, BV=BV, S=S, num_warps=warps, num_stages=S)


def check_against_op(x, pool, slots, cu, out, step, v_first=False):
    """``step()``'s o and pool against the op's on the same inputs (see check_decode)."""
    import kdagen
    p0 = pool.clone()
    kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots, cu_seqlens=cu, out=out,
                               state_v_first=v_first)
    o_ref, s_ref = out.clone(), pool.clone()
    pool.copy_(p0)
    out.zero_()
    step()
    rel = lambda a, b: ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()  # noqa: E731
    err = (rel(out, o_ref), rel(pool, s_ref))
    pool.copy_(p0)
    return err


def check_decode(x, pool, slots, cu, out, BV, S, warps, per_sm):
    """The TMA loop's o and pool against the op's on the same inputs: (o's, the pool's) largest difference
    over the largest value.  o is bf16, so a different order of the K sums may flip its rounding (up to 2^-8
    of max|o|); the pool is float32."""
    return check_against_op(x, pool, slots, cu, out, lambda: run_decode(x, pool, slots, cu, out, BV, S, warps, per_sm))


def verdict(e_o, e_s):
    return "ok" if e_o < 4e-3 and e_s < 1e-5 else "WRONG"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rows", default="stream,decode")
    ap.add_argument("--stream", default="3/4/64/1,3/4/64/2,4/4/64/1,2/4/64/2,3/8/64/1,3/8/128/1,4/8/128/1,2/4/128/1",
                    help="persistent TMA rows S/warps/BV/programs-per-SM")
    ap.add_argument("--decode", default="3/4/64/1,3/4/64/2,4/4/64/1,2/4/64/2,3/8/64/1,3/8/128/1,2/8/128/1",
                    help="decode rows S/warps/BV/programs-per-SM")
    ap.add_argument("--ksplit", default="4/4,4/2,8/2,8/1,2/4,2/8",
                    help="K-split rows KS/warps (KS programs of K / KS whole rows per (sequence, head))")
    ap.add_argument("--lean", default="8/1,8/2,16/1,16/2,16/4,32/4",
                    help="lean [V, K] rows R/warps (R rows of the [V, K] pool a program)")
    ap.add_argument("--caps", default="0",
                    help="register caps (RecurrentConfig.max_registers; 0: none) of the op's lean rows and the"
                         " lean step's scan rows, comma-separated")
    ap.add_argument("--check-only", action="store_true", help="check the decode rows against the op, time nothing")
    args = ap.parse_args()
    import serving
    from serving import decode_case

    triton.set_allocator(_allocator)
    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    B, H, K, V = args.batch, 32, 128, 128
    op, nbytes, err, (x, pool, slots, cu, out) = decode_case(B, True, torch.float32)
    print(f"B={B}: the op against float64 {err:.2e}; pool {tuple(pool.shape)}", flush=True)
    decode_rows = [tuple(map(int, r.split("/"))) for r in args.decode.split(",") if r]  # (empty: none)
    for S, w, bv, per_sm in decode_rows:
        e_o, e_s = check_decode(x, pool, slots, cu, out, bv, S, w, per_sm)
        print(f"decode_tma S={S} warps={w} BV={bv} per_sm={per_sm}: against the op o {e_o:.2e}, pool {e_s:.2e}"
              f" {verdict(e_o, e_s)}", flush=True)
    ksplit_rows = [tuple(map(int, r.split("/"))) for r in args.ksplit.split(",") if r]
    ks_scratch = {}
    for KS, w in ksplit_rows:
        if not gpu and KS > 1:  # its members wait for one another: programs run one after another here
            continue
        ks_scratch[KS] = ks_scratch.get(KS) or ksplit_scratch(B, H, V, KS, pool.device)
        e_o, e_s = check_against_op(x, pool, slots, cu, out,
                                    lambda: run_ksplit(x, pool, slots, cu, out, KS, w, ks_scratch[KS]))
        left = int(ks_scratch[KS][1].abs().sum())
        print(f"decode_ksplit KS={KS} warps={w}: against the op o {e_o:.2e}, pool {e_s:.2e}, counters left {left}"
              f" {verdict(e_o, e_s) if left == 0 else 'WRONG'}", flush=True)
    lean_rows = [tuple(map(int, r.split("/"))) for r in args.lean.split(",") if r]
    if lean_rows:
        _, _, err_vk, (x_vk, pool_vk, slots_vk, cu_vk, out_vk) = decode_case(B, True, torch.float32, v_first=True)
        inv = torch.empty(pool_vk.shape[0], dtype=torch.int32, device=pool_vk.device)
        print(f"[V, K] pool: the op against float64 {err_vk:.2e}", flush=True)
        for R, w in lean_rows:
            e_o, e_s = check_against_op(x_vk, pool_vk, slots_vk, cu_vk, out_vk,
                                        lambda: run_vk_lean(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w, inv),
                                        v_first=True)
            print(f"decode_vk_lean R={R} warps={w}: against the op o {e_o:.2e}, pool {e_s:.2e} {verdict(e_o, e_s)}",
                  flush=True)
            e_o, e_s = check_against_op(x_vk, pool_vk, slots_vk, cu_vk, out_vk,
                                        lambda: run_vk_lean_scan(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w),
                                        v_first=True)
            print(f"decode_vk_lean R={R} warps={w}, scan: against the op o {e_o:.2e}, pool {e_s:.2e}"
                  f" {verdict(e_o, e_s)}", flush=True)
            e_o, e_s = check_against_op(x_vk, pool_vk, slots_vk, cu_vk, out_vk,
                                        lambda: run_vk_lean_scan(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w,
                                                                 offsets=True), v_first=True)
            print(f"decode_vk_lean R={R} warps={w}, the op's scan: against the op o {e_o:.2e}, pool {e_s:.2e}"
                  f" {verdict(e_o, e_s)}", flush=True)
    if args.check_only or not gpu:
        return
    ceil = serving.copy_ceiling_gbs()
    print(f"copy ceiling {ceil:.0f} GB/s (1 GiB copy_); {torch.cuda.get_device_name()}", flush=True)
    pct = lambda us: 100 * nbytes / (us * 1e-6) / 1e9 / ceil  # noqa: E731
    graph_us = serving.graph_us
    whole = pool[: B]
    us = graph_us(lambda: whole.mul_(0.999))
    print(f"torch mul_ in place, the first B slots         {us:8.2f} us {pct(us):5.1f}%", flush=True)
    if "stream" in args.rows:
        orders = {"address": torch.arange(B, device=pool.device, dtype=slots.dtype), "scrambled": slots}
        for name, sl in orders.items():
            us = graph_us(lambda: stream_one_tile[(B * H * 2,)](pool, sl, HV=H, K=K, V=V, BV=64, num_warps=2))
            print(f"one tile a program, BV=64, 2 warps, {name:9s}  {us:8.2f} us {pct(us):5.1f}%", flush=True)
            for bk, bv, w in ((32, 128, 4), (16, 128, 2), (64, 128, 4)):  # the K-split's tiles alone
                us = graph_us(lambda: stream_one_tile[(B * H * (K // bk) * (V // bv),)](
                    pool, sl, HV=H, K=K, V=V, BV=bv, BK=bk, num_warps=w))
                print(f"one [{bk}, {bv}] tile a program, {w} warps, {name:9s}  {us:8.2f} us {pct(us):5.1f}%", flush=True)
            for r in filter(None, args.stream.split(",")):
                S, w, bv, per_sm = map(int, r.split("/"))
                n_items = B * H * (V // bv)
                desc = pool_desc(pool, bv)
                try:
                    us = graph_us(lambda: stream_tma[(n_programs(per_sm),)](
                        desc, sl, n_items, HV=H, K=K, V=V, BV=bv, S=S, num_warps=w, num_stages=S))
                    print(f"TMA loop S={S} warps={w} BV={bv:3d} {per_sm}/SM, {name:9s} {us:8.2f} us {pct(us):5.1f}%",
                          flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"TMA loop S={S} warps={w} BV={bv} {per_sm}/SM: {type(e).__name__}: {str(e)[:160]}", flush=True)
    if "decode" in args.rows:
        us = graph_us(op)
        print(f"the op (default config)                        {us:8.2f} us {pct(us):5.1f}%", flush=True)
        for S, w, bv, per_sm in decode_rows:
            try:
                us = graph_us(lambda: run_decode(x, pool, slots, cu, out, bv, S, w, per_sm))
                print(f"decode_tma S={S} warps={w} BV={bv:3d} {per_sm}/SM        {us:8.2f} us {pct(us):5.1f}%", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"decode_tma S={S} warps={w} BV={bv} {per_sm}/SM: {type(e).__name__}: {str(e)[:160]}", flush=True)
        import kdagen
        from kdagen.config import RecurrentConfig
        for stream in (False, True):  # the default's tile with its loads evict-first and stores streaming
            cfg = RecurrentConfig(block_v=64, num_warps=2, num_stages=1, readout="loaded", stream_state=stream)
            us = graph_us(lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots,
                                                             cu_seqlens=cu, out=out, config=cfg))
            print(f"the op, 64 / 2 loaded, stream_state={stream!s:5}     {us:8.2f} us {pct(us):5.1f}%", flush=True)
        for KS, w in ksplit_rows:
            try:
                us = graph_us(lambda: run_ksplit(x, pool, slots, cu, out, KS, w, ks_scratch[KS]))
                print(f"decode_ksplit KS={KS} warps={w} ({K // KS} rows a program)   {us:8.2f} us {pct(us):5.1f}%",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"decode_ksplit KS={KS} warps={w}: {type(e).__name__}: {str(e)[:160]}", flush=True)
        if lean_rows:
            def op_vk(cfg=None):  # the op's step on the [V, K] pool (cfg None: its default config)
                kdagen.fused_recurrent_kda(**x_vk, initial_state=pool_vk, ssm_state_indices=slots_vk, cu_seqlens=cu_vk,
                                           out=out_vk, state_v_first=True, config=cfg)

            us = graph_us(op_vk)
            print(f"the op on the [V, K] pool (default)            {us:8.2f} us {pct(us):5.1f}%", flush=True)
            cfg = RecurrentConfig(block_v=64, num_warps=2, num_stages=1, readout="loaded")  # the former default
            us = graph_us(lambda: op_vk(cfg))
            print(f"the op on the [V, K] pool, 64 / 2 loaded        {us:8.2f} us {pct(us):5.1f}%", flush=True)
            caps = [int(c) for c in args.caps.split(",") if c]
            for R, w in lean_rows[:3]:  # the op's own narrow [V, K] tiles (slot grid: a scan a program)
                # its general body, and the config's lean one under each register cap
                for lean, cap in [(False, 0)] + [(True, c) for c in caps]:
                    cfg = RecurrentConfig(block_v=R, num_warps=w, num_stages=1, readout="loaded", lean=lean,
                                          max_registers=cap)
                    e_o, e_s = check_against_op(x_vk, pool_vk, slots_vk, cu_vk, out_vk, lambda: op_vk(cfg), v_first=True)
                    us = graph_us(lambda: op_vk(cfg))
                    print(f"the op on the [V, K] pool, {R:2d} / {w} loaded{', lean' if lean else '      '}"
                          f"{f' cap {cap}' if cap else ''}  {us:8.2f} us"
                          f" {pct(us):5.1f}% (against the default: o {e_o:.1e}, pool {e_s:.1e} {verdict(e_o, e_s)})",
                          flush=True)
            for R, w in lean_rows:
                for cap in caps:
                    if cap:  # the lean step's scan rows under a register cap
                        us = graph_us(lambda: run_vk_lean_scan(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w, pdl=True,
                                                               maxnreg=cap))
                        print(f"decode_vk_lean R={R:2d} warps={w}: a scan, PDL, cap {cap} {us:8.2f} us {pct(us):5.1f}%",
                              flush=True)
                us = graph_us(lambda: run_vk_lean(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w, inv))
                us2 = graph_us(lambda: run_vk_lean(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w, inv, remap=False))
                us4 = graph_us(lambda: run_vk_lean(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w, inv, pdl=True))
                us5 = graph_us(lambda: run_vk_lean_scan(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w, pdl=True))
                us6 = graph_us(lambda: run_vk_lean_scan(x_vk, pool_vk, slots_vk, cu_vk, out_vk, R, w, pdl=True,
                                                        offsets=True))
                us3 = graph_us(lambda: stream_one_tile[(B * H * (V // R),)](  # its blocks alone, in address order
                    pool_vk, torch.arange(B, device=pool.device, dtype=slots.dtype), HV=H, K=V, V=K, BV=K, BK=R,
                    num_warps=w))
                print(f"decode_vk_lean R={R:2d} warps={w}: with the map {us:8.2f} us {pct(us):5.1f}% | both PDL"
                      f" {us4:8.2f} us {pct(us4):5.1f}% | a scan, PDL {us5:8.2f} us {pct(us5):5.1f}%"
                      f" | the op's scan {us6:8.2f} us {pct(us6):5.1f}% | without"
                      f" {us2:8.2f} us {pct(us2):5.1f}% | its blocks alone {us3:8.2f} us {pct(us3):5.1f}%",
                      flush=True)
        ident = torch.arange(B, device=pool.device, dtype=slots.dtype)
        for KS, w in ksplit_rows[:2]:
            us = graph_us(lambda: run_ksplit(x, pool, ident, cu, out, KS, w, ks_scratch[KS]))
            print(f"decode_ksplit KS={KS} warps={w}, slots in address order {us:8.2f} us {pct(us):5.1f}%", flush=True)
        us = graph_us(op)
        print(f"the op again                                   {us:8.2f} us {pct(us):5.1f}%", flush=True)
        if lean_rows:
            us = graph_us(op_vk)
            print(f"the op on the [V, K] pool (default) again      {us:8.2f} us {pct(us):5.1f}%", flush=True)


if __name__ == "__main__":
    main()
