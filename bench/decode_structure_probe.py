"""Issue 13's last miss (fp32 pool at B=256 >= 96% of copy): which access *structure* lets a
decode step's state traffic past the 95% that one program per whole [K, BV] tile reaches
(runs 93-95, bench/decode_ceiling.py).

    PYTHONPATH=. python3 bench/decode_structure_probe.py --out "$OUT"        # on the GPU
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/decode_structure_probe.py --smoke   # CPU: the kernels' math

Two questions, answered in one process (µs per step from CUDA-graph replay of 10 steps, % of the
1 GiB copy ceiling serving.py uses; H=32, K=V=128, fp32 pool, slot (7 n) mod P):

1. Pure traffic (each kernel reads the touched slots' bytes and writes them back scaled, no
   recurrence): is the 95% a matter of *how many bytes one program holds* (flat blocks of
   8-64 KB, contiguous) or of *the tile's shape* (half rows of 256 B at a 512 B stride, K-halves
   [64, 128] that are contiguous, quarter tiles)?  A chunk loop that streams [KC, BV] pieces of
   the tile in turn says what a program that never holds the whole tile reaches.
2. A two-pass decode (``decode_two_pass``): the recurrence needs the whole K column of the state
   before it can write any of it (k^T D S), but both K reductions (S^T D k and S^T D q) can be
   accumulated chunk by chunk.  Pass 1 streams the tile in [KC, BV] chunks and only accumulates
   (nothing held); pass 2 re-reads each chunk -- from L2 if it is still there -- applies
   S' = D S + k u^T and writes it.  A program then holds a few KB instead of 32-64 KB, so many
   more fit per SM.  It is timed against the decode op at its defaults, and its o and pool are
   compared to the op's.  If pass 2 misses L2 the traffic is 1.5x and it will show.

Added as the answers came (bench/RESULTS.md, session 29): ``hold_rw`` (the tile held across a K
reduction, without the math), ``decode_one_pass`` (the op's structure with nothing masked, its
inputs loaded beside the state, optionally an L2 prefetch of a later slot), the op's own launch
under register caps and other warps/readouts (--op-caps), and every row under other slot orders
(identity, reversed, random, blocks8; --slot-orders and the rows' order fields).  Session 30:
``decode_slot_grid`` (programs over the pool's slots, each finding its sequence by a scan of the slot
indices: the slots visited in address order whatever the batch's order; optionally a programmatic
dependent launch, PDL) and ``decode_slot_tail`` (its last slot rows on narrower V tiles: the grid's
drain).  Session 32: ``decode_vk_loop`` (a [V, K] pool, each program looping over G contiguous tiles of BV
rows with its token's inputs loaded once; run 169 had found one-tile [V, K] programs issue-bound).
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
def flat_rw(pool, slots, SLOT: tl.constexpr, BLOCK: tl.constexpr):
    """Program j of sequence n: BLOCK contiguous elements of slot slots[n], read and written back."""
    pid = tl.program_id(0)
    n = pid // (SLOT // BLOCK)
    j = pid % (SLOT // BLOCK)
    slot = tl.load(slots + n).to(tl.int64)
    p = pool + slot * SLOT + j * BLOCK + tl.arange(0, BLOCK)
    tl.store(p, tl.load(p) * 0.999)


@triton.jit
def block_rw(pool, slots, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """One [BR, BC] block of a head's [K, V] state per program (column blocks fastest)."""
    pid = tl.program_id(0)
    NC: tl.constexpr = V // BC
    NR: tl.constexpr = K // BR
    i_c = pid % NC
    i_r = (pid // NC) % NR
    i_nh = pid // (NC * NR)
    slot = tl.load(slots + i_nh // HV).to(tl.int64)
    base = pool + (slot * HV + i_nh % HV) * K * V
    p = base + (i_r * BR + tl.arange(0, BR))[:, None] * V + (i_c * BC + tl.arange(0, BC))[None, :]
    tl.store(p, tl.load(p) * 0.999)


@triton.jit
def chunk_rw(pool, slots, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KC: tl.constexpr, BV: tl.constexpr):
    """The decode's [K, BV] tile streamed as [KC, BV] chunks, each read and written back in turn."""
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    slot = tl.load(slots + i_nh // HV).to(tl.int64)
    base = pool + (slot * HV + i_nh % HV) * K * V
    o_v = i_v * BV + tl.arange(0, BV)
    for kc in range(0, K, KC):
        p = base + (kc + tl.arange(0, KC))[:, None] * V + o_v[None, :]
        tl.store(p, tl.load(p) * 0.999)


@triton.jit
def decode_two_pass(q, k, v, g, beta, o, pool, slots, scale,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KC: tl.constexpr, BV: tl.constexpr,
                    POLICY: tl.constexpr):
    """KDA, one token per sequence (packed: token n is sequence n), pool updated in place:
        S' = D S + k u^T,  u = beta (v - S^T D k),  o = S'^T (scale q) = S^T D q~ + (k . q~) u.
    POLICY 1: pass 1's loads evict-last and pass 2's evict-first (keep the tile in L2 between them)."""
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // H
    i_h = i_nh % H
    slot = tl.load(slots + i_n).to(tl.int64)
    base = pool + (slot * H + i_h) * K * V
    o_v = i_v * BV + tl.arange(0, BV)
    tok = i_n * H + i_h
    b_v = tl.load(v + tok * V + o_v).to(tl.float32)
    b_beta = tl.load(beta + tok).to(tl.float32)
    r_q = tl.zeros([BV], dtype=tl.float32)
    r_k = tl.zeros([BV], dtype=tl.float32)
    qk = tl.zeros([KC], dtype=tl.float32)
    for kc in range(0, K, KC):
        o_k = kc + tl.arange(0, KC)
        b_d = tl.exp(tl.load(g + tok * K + o_k).to(tl.float32))
        b_q = tl.load(q + tok * K + o_k).to(tl.float32) * scale
        b_k = tl.load(k + tok * K + o_k).to(tl.float32)
        p = base + o_k[:, None] * V + o_v[None, :]
        if POLICY == 1:
            b_S = tl.load(p, eviction_policy="evict_last")
        else:
            b_S = tl.load(p)
        r_q += tl.sum(b_S * (b_q * b_d)[:, None], axis=0)
        r_k += tl.sum(b_S * (b_k * b_d)[:, None], axis=0)
        qk += b_q * b_k
    b_u = (b_v - r_k) * b_beta
    tl.store(o + tok * V + o_v, (r_q + tl.sum(qk) * b_u).to(o.dtype.element_ty))
    for kc in range(0, K, KC):
        o_k = kc + tl.arange(0, KC)
        b_d = tl.exp(tl.load(g + tok * K + o_k).to(tl.float32))
        b_k = tl.load(k + tok * K + o_k).to(tl.float32)
        p = base + o_k[:, None] * V + o_v[None, :]
        if POLICY == 1:
            b_S = tl.load(p, eviction_policy="evict_first")
        else:
            b_S = tl.load(p)
        tl.store(p, b_S * b_d[:, None] + b_k[:, None] * b_u[None, :])


@triton.jit
def _one_token(q, k, v, g, beta, o, base, tok, o_v, scale, K: tl.constexpr, V: tl.constexpr, LOADED: tl.constexpr):
    """The probe's decode step of one item: its state tile at ``base`` (columns o_v) loaded whole with
    token ``tok``'s inputs, updated, stored; o written.  LOADED: o from the state as loaded (the op's
    readout "loaded"), else from the updated one."""
    o_k = tl.arange(0, K)
    b_S = tl.load(base + o_k[:, None] * V + o_v[None, :])
    b_q = tl.load(q + tok * K + o_k).to(tl.float32) * scale
    b_k = tl.load(k + tok * K + o_k).to(tl.float32)
    b_d = tl.exp(tl.load(g + tok * K + o_k).to(tl.float32))
    b_v = tl.load(v + tok * V + o_v).to(tl.float32)
    b_beta = tl.load(beta + tok).to(tl.float32)
    if LOADED:
        r_q = tl.sum(b_S * (b_q * b_d)[:, None], axis=0)
        b_u = (b_v - tl.sum(b_S * (b_k * b_d)[:, None], axis=0)) * b_beta
        b_S = b_S * b_d[:, None] + b_k[:, None] * b_u[None, :]
        b_o = r_q + tl.sum(b_q * b_k) * b_u
    else:
        b_S = b_S * b_d[:, None]
        b_u = (b_v - tl.sum(b_S * b_k[:, None], axis=0)) * b_beta
        b_S += b_k[:, None] * b_u[None, :]
        b_o = tl.sum(b_S * b_q[:, None], axis=0)
    tl.store(o + tok * V + o_v, b_o.to(o.dtype.element_ty))
    tl.store(base + o_k[:, None] * V + o_v[None, :], b_S)


@triton.jit
def decode_one_pass(q, k, v, g, beta, o, pool, slots, scale, N,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, LOADED: tl.constexpr,
                    TOUCH: tl.constexpr = 0):
    """The decode op's structure (the whole [K, BV] tile loaded, updated, stored) with nothing
    masked (K and BV divide the shapes) and the tile's addresses built from one scalar base:
    what the op's registers cost beyond the tile (its masks, its 64-bit offsets kept live across
    the token loop).  LOADED: o from the state as loaded (the op's readout "loaded").
    TOUCH > 0: an L2 prefetch of one line of sequence n + TOUCH's tile (its slot's page translated
    before its programs start: does the slot order's cost come from address translation?)."""
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // H
    i_h = i_nh % H
    tok = i_n * H + i_h
    o_v = i_v * BV + tl.arange(0, BV)
    slot = tl.load(slots + i_n).to(tl.int64)
    base = pool + (slot * H + i_h) * K * V
    if TOUCH > 0:
        ahead = tl.load(slots + tl.minimum(i_n + TOUCH, N - 1)).to(tl.int64)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                  [pool + (ahead * H + i_h) * K * V + i_v * BV], dtype=tl.int32, is_pure=False, pack=1)
    _one_token(q, k, v, g, beta, o, base, tok, o_v, scale, K, V, LOADED)


@triton.jit
def decode_slot_grid(q, k, v, g, beta, o, pool, slots, scale, N, P,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr,
                     LOADED: tl.constexpr, PAD_JOB: tl.constexpr, PDL: tl.constexpr = 0):
    """decode_one_pass with its programs over the pool's slots instead of the batch: program row j
    takes the sequence whose slot is j (a scan of the BN >= N slot indices; none: nothing to do), so
    the programs visit the pool in address order whatever order the batch holds its slots in.
    PAD_JOB: row j (< N) also writes o = 0 for sequence j when its slot is not in [0, P) (a padding
    sequence, which no slot's row takes); 1: its slot loaded, 2: read off the scan's registers.
    PDL (launched with launch_pdl=True, GPU only): the program waits for the previous grid
    (griddepcontrol.wait) before it reads anything, and lets the next step's grid launch at once
    (launch_dependents), so the next step's programs are resident when this one's last finish."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    i_v = tl.program_id(0)
    i_jh = tl.program_id(1)
    j = i_jh // H
    i_h = i_jh % H
    o_v = i_v * BV + tl.arange(0, BV)
    o_n = tl.arange(0, BN)
    all_slots = tl.load(slots + o_n, mask=o_n < N, other=-1)
    i_n = tl.max(tl.where(all_slots == j, o_n, -1))
    if PAD_JOB == 1:
        if j < N:
            own = tl.load(slots + j)
            if (own < 0) | (own >= P):
                tl.store(o + (j * H + i_h) * V + o_v, tl.zeros([BV], tl.float32).to(o.dtype.element_ty))
    if PAD_JOB == 2:  # sequence j's slot read off the scan's registers (no second load)
        own = tl.sum(tl.where(o_n == j, all_slots, 0))
        if (j < N) & ((own < 0) | (own >= P)):
            tl.store(o + (j * H + i_h) * V + o_v, tl.zeros([BV], tl.float32).to(o.dtype.element_ty))
    if i_n >= 0:
        _one_token(q, k, v, g, beta, o, pool + (j.to(tl.int64) * H + i_h) * K * V, i_n * H + i_h, o_v, scale, K, V,
                   LOADED)


@triton.jit
def _slot_item(q, k, v, g, beta, o, pool, slots, scale, N, j, i_h, i_v,
               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr):
    """decode_slot_grid's item (slot j, head i_h, V tile i_v of width BV), loaded readout."""
    o_v = i_v * BV + tl.arange(0, BV)
    o_n = tl.arange(0, BN)
    all_slots = tl.load(slots + o_n, mask=o_n < N, other=-1)
    i_n = tl.max(tl.where(all_slots == j, o_n, -1))
    if i_n >= 0:
        _one_token(q, k, v, g, beta, o, pool + (j.to(tl.int64) * H + i_h) * K * V, i_n * H + i_h, o_v, scale, K, V, 1)


@triton.jit
def decode_slot_tail(q, k, v, g, beta, o, pool, slots, scale, N, P, TAIL,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BV_T: tl.constexpr,
                     BN: tl.constexpr):
    """decode_slot_grid (loaded readout, no padding job) on a 1-D grid whose last TAIL slot rows take
    narrower V tiles (BV_T): does the grid's tail -- SMs idle while the last wide programs drain --
    cost what the wide tile loses against small programs?"""
    pid = tl.program_id(0)
    NV: tl.constexpr = V // BV
    NVT: tl.constexpr = V // BV_T
    n_big = (P - TAIL) * H * NV
    if pid < n_big:
        _slot_item(q, k, v, g, beta, o, pool, slots, scale, N, pid // (H * NV), (pid // NV) % H, pid % NV,
                   H, K, V, BV, BN)
    else:
        r = pid - n_big
        _slot_item(q, k, v, g, beta, o, pool, slots, scale, N, P - TAIL + r // (H * NVT), (r // NVT) % H, r % NVT,
                   H, K, V, BV_T, BN)


@triton.jit
def _vk_tile(b_S, b_v, p, o_p, b_dq, b_dk, b_d, b_k, b_beta, b_qk):
    """decode_vk_loop's step of one [BV, K] tile (loaded readout) from its loaded state b_S and v b_v:
    o written at o_p, the new tile at p."""
    r_q = tl.sum(b_S * b_dq[None, :], axis=1)
    b_u = (b_v - tl.sum(b_S * b_dk[None, :], axis=1)) * b_beta
    tl.store(o_p, (r_q + b_qk * b_u).to(o_p.dtype.element_ty))
    tl.store(p, b_S * b_d[None, :] + b_u[:, None] * b_k[None, :])


@triton.jit
def decode_vk_loop(q, k, v, g, beta, o, pool, slots, scale, N,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, G: tl.constexpr,
                   BN: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = 0, PREFETCH: tl.constexpr = 0):
    """The step on a pool laid out [P, H, V, K] (``state_v_first``: a V tile of BV rows is one contiguous
    block of BV * K * 4 bytes): a program per (group of G V tiles, slot or sequence, head) loads its token's
    inputs once and loops over its G tiles, each [BV, K] loaded, updated (loaded readout) and stored.  So
    the tiles are small and contiguous (the 4 KB programs that reach 99% of copy as pure traffic, run 169)
    while a program's fixed work -- the scan, q, k, g, their layout -- is paid once per G tiles (run 169:
    one-tile programs at BV = 8 were issue-bound).  STAGES > 1: the tile loop software-pipelined by Triton
    (the next tiles' loads issued asynchronously into shared memory).  BN > 0: rows over the pool's slots
    (a scan of the BN >= N slot indices, as decode_slot_grid: address order whatever the batch's); 0: rows
    over the batch (slot = slots[n]).  PDL as decode_slot_grid's.  PREFETCH = D > 0 (session 34): the tile
    loop unrolled with tile t + D (and its v) loaded into registers before tile t is updated and stored, so
    a program keeps D + 1 tiles' loads in flight instead of one (D = 1 or 2; STAGES is then unused)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    i_g = tl.program_id(0)
    row = tl.program_id(1)
    i_h = row % H
    if BN > 0:
        o_n = tl.arange(0, BN)
        all_slots = tl.load(slots + o_n, mask=o_n < N, other=-1)
        i_n = tl.max(tl.where(all_slots == row // H, o_n, -1))
        slot = (row // H).to(tl.int64)
    else:
        i_n = row // H
        slot = tl.load(slots + i_n).to(tl.int64)
    if i_n >= 0:
        tok = i_n * H + i_h
        o_k = tl.arange(0, K)
        b_q = tl.load(q + tok * K + o_k).to(tl.float32) * scale
        b_k = tl.load(k + tok * K + o_k).to(tl.float32)
        b_d = tl.exp(tl.load(g + tok * K + o_k).to(tl.float32))
        b_beta = tl.load(beta + tok).to(tl.float32)
        b_dq = b_q * b_d
        b_dk = b_k * b_d
        b_qk = tl.sum(b_q * b_k)
        base = pool + (slot * H + i_h) * V * K
        if PREFETCH:
            o_v = i_g * G * BV + tl.arange(0, BV)
            p = base + o_v[:, None] * K + o_k[None, :]
            b_S = tl.load(p)
            b_v = tl.load(v + tok * V + o_v).to(tl.float32)
            if PREFETCH > 1 and G > 1:  # depth 2: tile 1 in flight beside tile 0 from the start
                b_S1 = tl.load(p + BV * K)
                b_v1 = tl.load(v + tok * V + o_v + BV).to(tl.float32)
            for t in tl.static_range(G):
                # (t and PREFETCH are constants here: each branch is decided when the loop is unrolled)
                if t + PREFETCH < G:  # tile t + PREFETCH's loads go out before tile t's work
                    b_S_ahead = tl.load(p + PREFETCH * BV * K)
                    b_v_ahead = tl.load(v + tok * V + o_v + PREFETCH * BV).to(tl.float32)
                _vk_tile(b_S, b_v, p, o + tok * V + o_v, b_dq, b_dk, b_d, b_k, b_beta, b_qk)
                if t + 1 < G:
                    if PREFETCH > 1:
                        b_S = b_S1
                        b_v = b_v1
                        if t + PREFETCH < G:
                            b_S1 = b_S_ahead
                            b_v1 = b_v_ahead
                    else:
                        b_S = b_S_ahead
                        b_v = b_v_ahead
                    o_v = o_v + BV
                    p = p + BV * K
        else:
            for t in tl.range(0, G, num_stages=STAGES):
                o_v = (i_g * G + t) * BV + tl.arange(0, BV)
                p = base + o_v[:, None] * K + o_k[None, :]
                _vk_tile(tl.load(p), tl.load(v + tok * V + o_v).to(tl.float32), p, o + tok * V + o_v,
                         b_dq, b_dk, b_d, b_k, b_beta, b_qk)


@triton.jit
def hold_rw(pool, slots, vec, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
            ROWVECS: tl.constexpr):
    """The decode's tile held whole (a K reduction before the store, as the recurrence needs),
    without its math: S' = S * 0.999 + 1e-9 * (sum_k S)[None, :], plus ROWVECS per-row vectors
    of K (0-3, as the op's q, k and exp g) loaded and used before and after the reduction, so
    their registers (the row dimension spread over few threads) are live as in the op."""
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    slot = tl.load(slots + i_nh // HV).to(tl.int64)
    base = pool + (slot * HV + i_nh % HV) * K * V
    o_k = tl.arange(0, K)
    p = base + o_k[:, None] * V + (i_v * BV + tl.arange(0, BV))[None, :]
    b_S = tl.load(p)
    w = tl.full([K], 1.0, tl.float32)
    if ROWVECS >= 1:
        a = tl.load(vec + o_k + (i_nh % HV) * K)
        b_S = b_S * a[:, None]
    if ROWVECS >= 2:
        w = tl.load(vec + o_k + (i_nh % HV) * K + 1)
    if ROWVECS >= 3:
        w = w * tl.load(vec + o_k + (i_nh % HV) * K + 2)
    r = tl.sum(b_S * w[:, None], axis=0)
    if ROWVECS >= 2:
        b_S = b_S + w[:, None] * r[None, :] * 1e-9
    else:
        b_S = b_S + r[None, :] * 1e-9
    if ROWVECS >= 3:
        b_S = b_S + 1e-9 * tl.sum(b_S * a[:, None], axis=0)[None, :]
    tl.store(p, b_S * 0.999)


def one_pass_step(x, pool, slots, out, BV, warps, loaded, touch=0):
    B, H, K = x["q"].shape[1], x["q"].shape[2], x["q"].shape[3]
    V = x["v"].shape[-1]
    decode_one_pass[(V // BV, B * H)](x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool, slots, K ** -0.5, B,
                                       H=H, K=K, V=V, BV=BV, LOADED=loaded, TOUCH=touch, num_warps=warps)


def slot_grid_step(x, pool, slots, out, BV, warps, loaded, pad_job, pdl=0):
    B, H, K = x["q"].shape[1], x["q"].shape[2], x["q"].shape[3]
    V = x["v"].shape[-1]
    P = pool.shape[0]
    decode_slot_grid[(V // BV, max(P, B) * H)](x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool, slots,
                                                K ** -0.5, B, P, H=H, K=K, V=V, BV=BV, BN=triton.next_power_of_2(B),
                                                LOADED=loaded, PAD_JOB=pad_job, PDL=pdl, num_warps=warps,
                                                **({"launch_pdl": True} if pdl else {}))


def slot_tail_step(x, pool, slots, out, BV, BV_T, tail, warps):
    B, H, K = x["q"].shape[1], x["q"].shape[2], x["q"].shape[3]
    V = x["v"].shape[-1]
    P = pool.shape[0]
    tail = min(tail, P)
    grid = ((P - tail) * H * (V // BV) + tail * H * (V // BV_T),)
    decode_slot_tail[grid](x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool, slots, K ** -0.5, B, P, tail,
                           H=H, K=K, V=V, BV=BV, BV_T=BV_T, BN=triton.next_power_of_2(B), num_warps=warps)


def vk_loop_step(x, pool_vk, slots, out, BV, G, warps, stages, by_slot, pdl=0, prefetch=0):
    """One decode step through decode_vk_loop on a [P, H, V, K] pool; x: packed [1, B, H, *] inputs."""
    B, H, K = x["q"].shape[1], x["q"].shape[2], x["q"].shape[3]
    V = x["v"].shape[-1]
    P = pool_vk.shape[0]
    decode_vk_loop[(V // (BV * G), (P if by_slot else B) * H)](
        x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool_vk, slots, K ** -0.5, B, H=H, K=K, V=V, BV=BV, G=G,
        BN=triton.next_power_of_2(B) if by_slot else 0, STAGES=stages, PDL=pdl, PREFETCH=prefetch, num_warps=warps,
        **({"launch_pdl": True} if pdl else {}))


def two_pass_step(x, pool, slots, out, KC, BV, warps, policy):
    """One decode step through decode_two_pass; x: packed [1, B, H, *] inputs."""
    B, H, K = x["q"].shape[1], x["q"].shape[2], x["q"].shape[3]
    V = x["v"].shape[-1]
    decode_two_pass[(V // BV, B * H)](x["q"], x["k"], x["v"], x["g"], x["beta"], out, pool, slots, K ** -0.5,
                                       H=H, K=K, V=V, KC=KC, BV=BV, POLICY=policy, num_warps=warps)


def order_slots(order, B, P, device):
    """Sequence n's slot under an order: seven ((7 n) mod P, the benchmarks' default), identity (n),
    reversed (P - 1 - n), random (a fixed permutation), blocks8 (runs of 8 consecutive slots, the
    runs in the (7 m) mod (P // 8) order)."""
    n = torch.arange(B, device=device)
    s_o = {"seven": lambda: (7 * n) % P, "identity": lambda: n, "reversed": lambda: P - 1 - n,
           "random": lambda: torch.randperm(P, generator=torch.Generator().manual_seed(3))[:B].to(device),
           "blocks8": lambda: 8 * ((7 * (n // 8)) % (P // 8)) + n % 8}[order]()
    return s_o.to(torch.int32)


def smoke():
    """CPU interpreter: decode_two_pass and decode_one_pass against the float64 recurrence at a tiny shape
    (and the pool's unused slots left as they were)."""
    from kdagen.spec.reference import naive_recurrent_kda
    gen = torch.Generator().manual_seed(0)
    B, H, K, V = 3, 2, 32, 32
    q, k, v = (torch.randn(1, B, H, d, generator=gen) for d in (K, K, V))
    k = torch.nn.functional.normalize(k, dim=-1)
    g = -5 * torch.rand(1, B, H, K, generator=gen)
    beta = torch.rand(1, B, H, generator=gen)
    P = B + 2
    pool = 0.1 * torch.randn(P, H, K, V, generator=gen)
    slots = (torch.arange(B) * 3 % P).to(torch.int32)
    ref = [t.transpose(0, 1).double() for t in (q, k, v, g, beta)]
    o_ref, s_ref = naive_recurrent_kda(*ref, initial_state=pool[slots.long()].double(), output_final_state=True)
    x = dict(q=q, k=k, v=v, g=g, beta=beta)
    untouched = [i for i in range(P) if i not in slots.tolist()]

    def check(label, step):
        """step(pool, out) on a copy of the pool: o and the used slots against float64, the rest untouched."""
        p, out = pool.clone(), torch.empty(1, B, H, V)
        step(p, out)
        eo = (out.transpose(0, 1).double() - o_ref).abs().max().item()
        es = (p[slots.long()].double() - s_ref).abs().max().item()
        assert torch.equal(p[untouched], pool[untouched]), f"{label}: a slot no sequence uses was written"
        print(f"{label}: max |o - float64| {eo:.2e}, |S - float64| {es:.2e}")
        assert eo < 1e-5 and es < 1e-5, (label, eo, es)

    for KC, BV, policy in ((8, 16, 1), (16, 32, 0), (32, 32, 1)):
        check(f"decode_two_pass KC={KC} BV={BV} policy={policy}",
              lambda p, out: two_pass_step(x, p, slots, out, KC, BV, 1, policy))
    for BV, G, warps, stages, by_slot, pf in ((8, 4, 4, 2, 1, 0), (4, 2, 1, 1, 0, 0), (16, 1, 2, 3, 1, 0),
                                              (8, 1, 4, 1, 0, 0), (8, 4, 4, 1, 1, 1), (4, 4, 1, 1, 0, 1),
                                              (16, 1, 2, 1, 1, 1), (4, 4, 2, 1, 1, 2), (16, 2, 2, 1, 0, 2)):
        # (the [V, K] pool: stepped transposed, checked as [K, V])
        def vk(p, out):
            p_vk = p.transpose(-1, -2).contiguous()
            vk_loop_step(x, p_vk, slots, out, BV, G, warps, stages, by_slot, prefetch=pf)
            p.copy_(p_vk.transpose(-1, -2))
        check(f"decode_vk_loop BV={BV} G={G} stages={stages} by_slot={by_slot} prefetch={pf}", vk)
    for BV, loaded in ((16, 0), (32, 1)):
        check(f"decode_one_pass BV={BV} loaded={loaded}", lambda p, out: one_pass_step(x, p, slots, out, BV, 1, loaded))
        check(f"decode_slot_tail BV={BV} tail 2 at BV 16", lambda p, out: slot_tail_step(x, p, slots, out, BV, 16, 2, 1))
        check(f"decode_slot_grid BV={BV} loaded={loaded}",
              lambda p, out: slot_grid_step(x, p, slots, out, BV, 1, loaded, 1 + loaded))
    print("smoke: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--smoke", action="store_true", help="the CPU interpreter check of the decode kernels, no timing")
    ap.add_argument("--flat", default="2048/4,8192/2,8192/4,16384/4,16384/8", help="BLOCK/warps[/order] of flat_rw (order as --slot-orders)")
    ap.add_argument("--blocks", default="128x64/2,128x64/4,64x128/2,64x128/4,32x128/1,32x128/2,128x128/8",
                    help="BRxBC/warps of block_rw")
    ap.add_argument("--chunks", default="16x64/1,32x64/2,16x128/2,32x128/4,8x128/1", help="KCxBV/warps of chunk_rw")
    ap.add_argument("--two-pass", default="8x64/1,16x64/1,16x64/2,32x64/2,8x128/1,16x128/2,16x128/4,32x128/4",
                    help="KCxBV/warps of decode_two_pass (each with policy 1, and the first two also with 0)")
    ap.add_argument("--hold", default="64/2/0,64/2/1,64/2/2,64/2/3,64/4/0,64/4/3,64/2/0/128,64/4/0/64,64/2/0/0/identity,"
                    "64/2/3/0/identity",
                    help="BV/warps/rowvecs[/maxnreg[/seven|identity]] of hold_rw")
    ap.add_argument("--one-pass", default="64/2/0,64/2/1,64/4/0,64/4/1",
                    help="BV/warps/loaded[/touch[/order]] of decode_one_pass (order as --slot-orders)")
    ap.add_argument("--slot-grid", default="64/2/1/1,64/4/1/1,64/2/1/0,64/4/1/0",
                    help="BV/warps/loaded/pad_job[/order[/pdl]] of decode_slot_grid (programs over the pool's slots; order as "
                    "--slot-orders)")
    ap.add_argument("--slot-tail", default="", help="BV/BV_T/tail_rows/warps[/order] of decode_slot_tail")
    ap.add_argument("--vk-loop", default="8/16/4/2/1/1,8/16/4/3/1/1,8/4/4/2/1/1,8/16/2/2/1/1,8/16/4/1/1/1,"
                    "16/8/4/2/1/1,8/16/4/2/0/1", help="BV/G/warps/stages/by_slot[/pdl[/prefetch]] of decode_vk_loop (a [V, K] "
                    "pool, G tiles of BV rows per program; by_slot: rows over the pool's slots; prefetch: the next "
                    "tile(s) loaded into registers ahead: 1 or 2)")
    ap.add_argument("--op-caps", default="64/2/updated/0,64/2/updated/192,64/2/updated/168,64/2/loaded/168,"
                    "64/4/updated/96,64/4/loaded/96,64/4/loaded/80", help="BV/warps/readout/maxnreg[/order]: the op's "
                    "own launch compiled with a register cap (0: none), slots in the order given (as --slot-orders)")
    ap.add_argument("--slot-orders", default="", help="comma-separated slot orders to time the op, flat_rw 16384/8 and "
                    "block_rw [128, 64]/2 under: seven ((7 n) mod P, the default everywhere), identity (n), reversed "
                    "(P - 1 - n), random (a fixed random permutation of the P slots, first B), blocks8 (runs of 8 consecutive slots)")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    import kdagen
    from serving import copy_ceiling_gbs, decode_case, graph_us

    def log(s):
        print(s, flush=True)
        with open(os.path.join(args.out, "decode_structure_probe.log"), "a") as f:
            f.write(s + "\n")

    ceil = copy_ceiling_gbs()
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
        f"copy ceiling {ceil:.0f} GB/s (1 GiB copy_)")
    B, H, K, V = args.batch, 32, 128, 128
    fn, nbytes, err, (x, pool, slots, cu, out) = decode_case(B, True, torch.float32)
    pct = lambda us: 100 * nbytes / (us * 1e-6) / 1e9 / ceil  # noqa: E731
    row = lambda name, us: log(f"{name:44s} {us:8.1f} us {pct(us):6.1f}%")  # noqa: E731
    row("decode op, defaults (packed)", graph_us(fn))
    whole = pool[: B + 4]
    row("torch mul_ in place (scaled to B slots)", graph_us(lambda: whole.mul_(0.999)) * B / whole.shape[0])
    SLOT = H * K * V
    for spec in filter(None, args.flat.split(",")):
        parts = spec.split("/")
        blk, w = map(int, parts[:2])
        order = parts[2] if len(parts) > 2 else "seven"
        s_o = order_slots(order, B, pool.shape[0], pool.device)
        grid = (B * (SLOT // blk),)
        row(f"flat_rw BLOCK={blk} ({blk * 4 // 1024} KB) warps={w} slots {order}",
            graph_us(lambda: flat_rw[grid](pool, s_o, SLOT=SLOT, BLOCK=blk, num_warps=w)))
    for spec in filter(None, args.blocks.split(",")):
        shape, w = spec.split("/")
        br, bc = map(int, shape.split("x"))
        grid = (B * H * (K // br) * (V // bc),)
        row(f"block_rw [{br}, {bc}] warps={w}",
            graph_us(lambda: block_rw[grid](pool, slots, HV=H, K=K, V=V, BR=br, BC=bc, num_warps=int(w))))
    for spec in filter(None, args.chunks.split(",")):
        shape, w = spec.split("/")
        kc, bv = map(int, shape.split("x"))
        grid = (V // bv, B * H)
        row(f"chunk_rw KC={kc} BV={bv} warps={w}",
            graph_us(lambda: chunk_rw[grid](pool, slots, HV=H, K=K, V=V, KC=kc, BV=bv, num_warps=int(w))))
    # the op's answer on a copy of the pool, before any timing updates the pool in place
    p0 = pool.clone()
    p_op, p_tp = pool.clone(), pool.clone()
    o_op, o_tp = torch.empty_like(out), torch.empty_like(out)
    kdagen.fused_recurrent_kda(**x, initial_state=p_op, ssm_state_indices=slots, cu_seqlens=cu, out=o_op)
    P = pool.shape[0]

    def vs_op(step, o_got):
        """step(p_tp) on a fresh copy of the pool: (rel. difference of o_got, of the pool) against the op's."""
        p_tp.copy_(p0)
        step(p_tp)
        torch.cuda.synchronize()
        return (((o_got.float() - o_op.float()).norm() / o_op.float().norm()).item(),
                ((p_tp - p_op).norm() / p_op.norm()).item())

    for order in filter(None, args.slot_orders.split(",")):
        s_o = order_slots(order, B, P, pool.device)
        op = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=s_o, cu_seqlens=cu, out=out)  # noqa: E731
        row(f"slots {order}: decode op, defaults", graph_us(op))
        row(f"slots {order}: flat_rw BLOCK=16384 warps=8",
            graph_us(lambda: flat_rw[(B * (SLOT // 16384),)](pool, s_o, SLOT=SLOT, BLOCK=16384, num_warps=8)))
        row(f"slots {order}: block_rw [128, 64] warps=2",
            graph_us(lambda: block_rw[(B * H * 2,)](pool, s_o, HV=H, K=K, V=V, BR=128, BC=64, num_warps=2)))
    from kdagen.config import RecurrentConfig
    from kdagen.ops.recurrent import fused_recurrent_kda_launch
    for spec in filter(None, args.op_caps.split(",")):
        bv, w, ro, cap, *rest = spec.split("/")
        order = rest[0] if rest else "seven"
        s_o = order_slots(order, B, P, pool.device)
        cfg = RecurrentConfig(block_v=int(bv), num_warps=int(w), num_stages=1, readout=ro)
        ln, (o_l, _), _ = fused_recurrent_kda_launch(**x, initial_state=p_tp, ssm_state_indices=slots, cu_seqlens=cu,
                                                      config=cfg)
        kw = {"maxnreg": int(cap)} if int(cap) else {}
        run = lambda: ln.fn[ln.grid](**ln.args, **ln.constexprs, num_warps=ln.num_warps,  # noqa: E731
                                     num_stages=ln.num_stages, **kw)
        d_o, d_s = vs_op(lambda _: run(), o_l)  # (the launch's arguments hold p_tp)
        for n in [n for n in ln.args if ln.args[n] is p_tp]:
            ln.args[n] = pool  # timed on the pool itself (h0 and ht: the pool, in place)
        for n in [n for n in ln.args if ln.args[n] is slots]:
            ln.args[n] = s_o  # ... under the order asked for
        row(f"op launch BV={bv} warps={w} {ro} maxnreg={cap} slots {order}", graph_us(run))
        log(f"{'':44s} vs op: o {d_o:.1e}, pool {d_s:.1e}")
    vec = torch.ones(H * K + 2, device=pool.device) * 0.999
    for spec in filter(None, args.hold.split(",")):
        parts = spec.split("/")
        shape, w, rv, cap, order = parts + ["0", "seven"][len(parts) - 3:]
        bv = int(shape)
        s_o = order_slots(order, B, P, pool.device)
        kw = {"maxnreg": int(cap)} if int(cap) else {}
        row(f"hold_rw BV={bv} warps={w} rowvecs={rv} maxnreg={cap} slots {order}",
            graph_us(lambda: hold_rw[(V // bv, B * H)](pool, s_o, vec, HV=H, K=K, V=V, BV=bv, ROWVECS=int(rv),
                                                        num_warps=int(w), **kw)))
    def checked_row(name, step, order):
        """step(pool, slots, out): compared with the op on a copy of the pool (the benchmark's slots), then
        timed on the pool with the slots in ``order``."""
        s_o = order_slots(order, B, P, pool.device)
        d_o, d_s = vs_op(lambda p: step(p, slots, o_tp), o_tp)
        log(f"{name} vs op: o {d_o:.1e}, pool {d_s:.1e}")
        row(f"{name} slots {order}", graph_us(lambda: step(pool, s_o, out)))

    for spec in filter(None, args.one_pass.split(",")):
        parts = spec.split("/")
        bv, w, loaded, touch = map(int, (parts + ["0"])[:4])
        checked_row(f"decode_one_pass BV={bv} warps={w} loaded={loaded} touch={touch}",
                    lambda p, s, o: one_pass_step(x, p, s, o, bv, w, loaded, touch),
                    parts[4] if len(parts) > 4 else "seven")
    for spec in filter(None, args.slot_grid.split(",")):
        parts = spec.split("/")
        bv, w, loaded, pad = map(int, parts[:4])
        pdl = int(parts[5]) if len(parts) > 5 else 0
        checked_row(f"decode_slot_grid BV={bv} warps={w} loaded={loaded} pad_job={pad} pdl={pdl}",
                    lambda p, s, o: slot_grid_step(x, p, s, o, bv, w, loaded, pad, pdl),
                    parts[4] if len(parts) > 4 else "seven")
    for spec in filter(None, args.slot_tail.split(",")):
        parts = spec.split("/")
        bv, bvt, tail, w = map(int, parts[:4])
        checked_row(f"decode_slot_tail BV={bv} BV_T={bvt} tail={tail} warps={w}",
                    lambda p, s, o: slot_tail_step(x, p, s, o, bv, bvt, tail, w),
                    parts[4] if len(parts) > 4 else "seven")
    if args.vk_loop:
        pool_vk = p0.transpose(-1, -2).contiguous()  # the same states laid out [P, H, V, K]
        p_vk = torch.empty_like(pool_vk)
    for spec in filter(None, args.vk_loop.split(",")):
        bv, G, w, st, by_slot, *rest = map(int, spec.split("/"))
        pdl = rest[0] if rest else 0
        pf = rest[1] if len(rest) > 1 else 0
        name = f"decode_vk_loop BV={bv} G={G} warps={w} stages={st} by_slot={by_slot} pdl={pdl} prefetch={pf}"
        p_vk.copy_(p0.transpose(-1, -2))
        vk_loop_step(x, p_vk, slots, o_tp, bv, G, w, st, by_slot, pdl, pf)
        torch.cuda.synchronize()
        d_o = ((o_tp.float() - o_op.float()).norm() / o_op.float().norm()).item()
        d_s = ((p_vk.transpose(-1, -2) - p_op).norm() / p_op.norm()).item()
        log(f"{name} vs op: o {d_o:.1e}, pool {d_s:.1e}")
        row(f"{name} slots seven", graph_us(lambda: vk_loop_step(x, pool_vk, slots, out, bv, G, w, st, by_slot, pdl,
                                                                 pf)))
    # the two-pass decode: agreement with the op first (p0, p_op, o_op: above)
    for i, spec in enumerate(filter(None, args.two_pass.split(","))):
        shape, w = spec.split("/")
        kc, bv = map(int, shape.split("x"))
        for policy in ((1, 0) if i < 2 else (1,)):
            d_o, d_s = vs_op(lambda p: two_pass_step(x, p, slots, o_tp, kc, bv, int(w), policy), o_tp)
            us = graph_us(lambda: two_pass_step(x, pool, slots, out, kc, bv, int(w), policy))
            log(f"{'decode_two_pass KC=%d BV=%d warps=%s policy=%d' % (kc, bv, w, policy):44s} {us:8.1f} us "
                f"{pct(us):6.1f}%   vs op: o {d_o:.1e}, pool {d_s:.1e}")
    row("decode op, defaults (packed), again", graph_us(fn))


if __name__ == "__main__":
    main()
