"""Decode (fused_recurrent_kda, packed, state pool) timed per RecurrentConfig, from CUDA-graph
replay, at H=32, K=V=128, for an fp32 and a bf16 pool: which tile and warp count moves the state
closest to the copy ceiling.

    PYTHONPATH=. python3 bench/decode_variants.py --out "$OUT" [--batches 16,256]

Prints one line per (batch, pool dtype, config): time per step, % of copy, and the difference of
o and of the pool against the heuristic config's (they must agree to rounding).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="16,256")
    ap.add_argument("--block-v", default="16,32,64,128")
    ap.add_argument("--warps", default="1,2,4,8")
    ap.add_argument("--readouts", default="updated,loaded", help="RecurrentConfig.readout values to time")
    ap.add_argument("--pairs", default="", help="instead of the block-v x warps grid: 'pool:BV/warps[/pps[/stages]][/s],...', "
                    "e.g. 'float32:64/4,bfloat16:32/1/8/s,bfloat16:64/4/2/3' (pool dtype names as torch spells them; "
                    "then RecurrentConfig.programs_per_sm, 0 when left out, and num_stages, 1 when left out; a "
                    "final /s: stream_state)")
    ap.add_argument("--fla", action="store_true", help="also time FLA's packed decode with an fp32 pool (same process)")
    args = ap.parse_args()
    import kdagen
    from kdagen.config import RecurrentConfig
    from serving import copy_ceiling_gbs, decode_case, graph_us

    ceil = copy_ceiling_gbs()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    rows = []
    for B in map(int, args.batches.split(",")):
        for pool_dtype in (torch.float32, torch.bfloat16):
            _, nbytes, _, (x, pool, slots, cu, out) = decode_case(B, True, pool_dtype)
            p0 = pool.clone()
            ref = None
            grid = [(bv, w, 0, 1, r) for bv in map(int, args.block_v.split(",")) for w in map(int, args.warps.split(","))
                    for r in args.readouts.split(",")]
            if args.pairs:
                name = str(pool_dtype)[6:]
                grid = []
                for p in args.pairs.split(","):
                    pool_name, fields = p.split(":")
                    parts = fields.split("/")
                    stream = parts[-1] == "s"
                    f = [int(x) for x in (parts[:-1] if stream else parts)]
                    pps = f[2] if len(f) > 2 else 0
                    stages = f[3] if len(f) > 3 else 1
                    if pool_name == name:
                        grid += [(f[0], f[1], pps, stages, r, stream) for r in args.readouts.split(",")]
            else:
                grid = [g + (False,) for g in grid]
            for bv, w, pps, stages, readout, stream in grid:
                cfg = RecurrentConfig(block_v=bv, num_warps=w, num_stages=stages, readout=readout, programs_per_sm=pps,
                                      stream_state=stream)
                row = dict(B=B, pool=str(pool_dtype)[6:], block_v=bv, num_warps=w, readout=readout, programs_per_sm=pps,
                           num_stages=stages, stream_state=stream)
                try:
                    pool.copy_(p0)
                    fn = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots,  # noqa: E731
                                                            cu_seqlens=cu, out=out, config=cfg)
                    fn()
                    torch.cuda.synchronize()
                    got = (out.float().clone(), pool.float().clone())
                    if ref is None:
                        ref = got
                    row["diff"] = [float((got[0] - ref[0]).abs().max()), float((got[1] - ref[1]).abs().max())]
                    us = graph_us(fn)
                    row.update(us=us, pct_copy=100 * nbytes / (us * 1e-6) / 1e9 / ceil)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                rows.append(row)
                print(f"B={B:4d} {row['pool']:9s} BV={bv:4d} warps={w} pps={pps:2d} stages={stages} {readout:7s}{' stream' if stream else ''} "
                      f"{row.get('us', float('nan')):8.1f} us {row.get('pct_copy', float('nan')):5.1f}% "
                      f"diff {row.get('diff')} {row.get('error', '')}", flush=True)
            del x, pool, p0, out
            torch.cuda.empty_cache()
        if args.fla:
            from serving import fla_decode
            fla, ver = fla_decode()
            if fla is not None:
                fn, nbytes, err, _ = decode_case(B, True, torch.float32, fla=fla)
                us = graph_us(fn)
                rows.append(dict(B=B, op=f"fla {ver}", pool="float32", us=us, pct_copy=100 * nbytes / (us * 1e-6) / 1e9 / ceil,
                                 err_vs_float64=err))
                print(f"B={B:4d} FLA {ver} float32 pool (packed) {us:8.1f} us {rows[-1]['pct_copy']:5.1f}% "
                      f"(error vs float64 {err:.1e})", flush=True)
    with open(os.path.join(args.out, "decode_variants.json"), "w") as f:
        json.dump(dict(copy_GBps=ceil, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
