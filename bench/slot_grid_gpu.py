"""The decode's slot grid on the GPU (kdagen.cache.heuristics.slot_grid): the op's own step with its
programs over the pool's slots against the batch grid, in one process, with the answer checked
against the float64 recurrence in bf16 each time.

    PYTHONPATH=. python3 bench/slot_grid_gpu.py --out "$OUT"

Rows (H=32, K=V=128, bf16 q/k/v/beta, fp32 g; a packed step, one token per sequence; µs per step
from CUDA-graph replay of 10 steps; % of the 1 GiB copy ceiling, the state's bytes as issue 13
counts them): B sequences over a pool of P slots, sequence n in slot (7 n) mod P ("seven", the
benchmarks' scrambled order) or n ("identity"), and P = 2 B with a third of the sequences padding
(slot -1) -- each with the slot grid forced on and off (the heuristic's pairs threshold moved; the
fast path's entries forgotten between), and with --pdl-ab the slot grid also without the programmatic
dependent launch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.dirname(os.path.abspath(__file__)))

import kdagen  # noqa: E402
from kdagen.cache import heuristics  # noqa: E402
from kdagen.ops import recurrent as R  # noqa: E402
from kdagen.spec.reference import naive_recurrent_kda  # noqa: E402

DEV = "cuda"


def case(B, P, order, pool_dtype=torch.float32, pad_every=0, seed=0):
    """(inputs, pool, slots, cu): a packed step of B sequences over P slots."""
    from serving import Geometry, generator
    gen = generator(seed + B)
    geo = Geometry(B, 32, 128, 128)
    x = geo.tokens(gen, packed=True)
    pool = (0.1 * torch.randn(P, 32, 128, 128, generator=gen, device=DEV)).to(pool_dtype)
    n = torch.arange(B, device=DEV)
    slots = (7 * n) % P if order == "seven" else n
    if pad_every:
        slots = torch.where(n % pad_every == 1, -1, slots)
    return x, pool, slots.to(torch.int32), geo.cu()


def check(x, pool, slots, cu, out, first=16):
    """Relative error of o and the new states of the first ``first`` sequences (padding: o == 0)
    against the float64 recurrence, one step from a copy of the pool."""
    p = pool.clone()
    kdagen.fused_recurrent_kda(**x, initial_state=p, ssm_state_indices=slots, cu_seqlens=cu, out=out)
    torch.cuda.synchronize()
    s = slots[:first].long().cpu()
    live = s >= 0
    ref = [x[m][0, :first][live].unsqueeze(1).double().cpu() for m in ("q", "k", "v", "g", "beta")]
    ro, rs = naive_recurrent_kda(*ref, initial_state=pool[s[live]].double().cpu(), output_final_state=True)
    got_o = out[0, :first].double().cpu()
    err = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    zero_pad = bool((got_o[~live] == 0).all())
    return max(err(got_o[live], ro[:, 0]), err(p[s[live]].double().cpu(), rs)), zero_pad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="16,64,256,512")
    ap.add_argument("--pdl-ab", action="store_true", help="also the slot grid with the programmatic dependent "
                    "launch off (kdagen.ops.recurrent.PDL), beside it on")
    args = ap.parse_args()
    from serving import copy_ceiling_gbs, graph_us
    rows = []
    logf = open(os.path.join(args.out, "slot_grid_gpu.log"), "a")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    copy = copy_ceiling_gbs()
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy ceiling {copy:.0f} GB/s")
    base = heuristics.SLOT_GRID_MIN_PAIRS
    for B in map(int, args.batches.split(",")):
        for label, P, order, pad in (("P=B+4, seven", B + 4, "seven", 0), ("P=B+4, identity", B + 4, "identity", 0),
                                     ("P=2B, seven, every 3rd padding", 2 * B, "seven", 3)):
            if B > 256 and pad:
                continue
            x, pool, slots, cu = case(B, P, order, pad_every=pad)
            out = torch.empty_like(x["v"])
            live = int((slots >= 0).sum())
            nbytes = 2 * live * 32 * 128 * 128 * 4
            pdl_default = getattr(R, "PDL", None)
            for grid in (("slots", "slots, no PDL", "batch") if args.pdl_ab else ("slots", "batch")):
                heuristics.SLOT_GRID_MIN_PAIRS = 1 if grid.startswith("slots") else 10 ** 9
                if pdl_default is not None:
                    R.PDL = pdl_default and grid != "slots, no PDL"
                R._FAST.clear()
                taken = heuristics.slot_grid(B, 32, P) and grid.startswith("slots")
                err, zero_pad = check(x, pool, slots, cu, out)
                us = graph_us(lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots,
                                                                 cu_seqlens=cu, out=out))
                pct = 100 * nbytes / (us * 1e-6) / 1e9 / copy
                row = dict(B=B, case=label, grid=grid, slot_grid_taken=taken, us=round(us, 2), pct_copy=round(pct, 2),
                           rel_err_vs_float64=err, padding_o_zero=zero_pad)
                rows.append(row)
                log(json.dumps(row))
            if pdl_default is not None:
                R.PDL = pdl_default
    heuristics.SLOT_GRID_MIN_PAIRS = base
    R._FAST.clear()
    log("B | case | grid | µs (% of copy) | batch grid / this")
    for r in rows:
        batch = next(b for b in rows if b["B"] == r["B"] and b["case"] == r["case"] and b["grid"] == "batch")
        log(f"{r['B']} | {r['case']} | {r['grid']} | {r['us']:.2f} ({r['pct_copy']:.1f}%) | "
            f"{batch['us'] / r['us']:.3f}x")
    bad = [r for r in rows if not (r["rel_err_vs_float64"] < 5e-3 and r["padding_o_zero"])]
    log(f"checks against float64 (bf16 inputs, fp32 pool, < 5e-3) and padding o == 0: "
        f"{'all pass' if not bad else bad}")
    json.dump(rows, open(os.path.join(args.out, "slot_grid_gpu.json"), "w"), indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
