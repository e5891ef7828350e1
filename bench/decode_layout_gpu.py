"""The decode step on a pool laid out [P, HV, V, K] (``state_v_first=True``, FLA's keyword) with narrow
V tiles, against today's [P, HV, K, V] pool, in one process, each row checked against float64.

    PYTHONPATH=. python3 bench/decode_layout_gpu.py --out "$OUT"                  # the H200 sweep
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/decode_layout_gpu.py --check-only --batches 3 --heads 2 \\
        --vk 8/4,16/2 --min-pairs 1                                                # the checks on a CPU

Why (bench/RESULTS.md, sessions 17, 29, 30): in the [K, V] layout a program's [K, BV] tile is K rows of
BV * 4 bytes at a V * 4-byte stride, and only BV >= 64 (256-byte rows) moves it well; such a 32 KB
program stops at ~95-97% of copy even in address order, while flat programs of <= 4 KB (<= 2 16-byte loads
per thread) reach 99% in order.  In the [V, K] layout a V tile of BV rows is one contiguous block of
BV * K * 4 bytes -- 4 KB at BV = 8 -- and its K reductions stay inside the program (the tile holds whole K
columns), so the decode can have the small contiguous programs without splitting K.  (FlashInfer's GDN decode
uses this layout, "k-last", with 8 x 128 tiles on 4 warps.)

Rows (H heads = HV, K = V = 128, bf16 q/k/v/beta, fp32 g, a packed step of one token per sequence, the pool
updated in place; µs per step from CUDA-graph replay of 10 steps; % of the 1 GiB copy ceiling, the state's
bytes as issue 13 counts them): B sequences over P = B + 3..4 slots, sequence n in slot (7 n) mod P:

* ``kdagen`` [K, V] and [V, K]: the heuristic's config ("default") and each BV/warps of --kv / --vk (the
  loaded readout, one stage), the grid the heuristic takes (the slot grid at >= 4,096 pairs) and, for
  --batch-grid's configs, the batch grid forced; a config BV/warps/programs-per-SM/stages is persistent
  programs (no slot grid: their items follow the batch), stage 2 being Triton's pipelined item loop;
* ``FLA`` 0.6.0's fused_recurrent_kda_fwd (BV = 32 on 4 warps, its own choice) in both layouts;
* ``traffic`` (--traffic; fp32, B >= 64): decode_ceiling.tile_rw, the tiles only loaded, scaled and stored, in batch
  order ("seven") and with the slots in address order ("identity") -- what each tile can reach;
* the [K, V] default once more at the end (the drift of the process's clock over the sweep).

Every kdagen and FLA row is checked first (o and the new states of the first 16 sequences against the
float64 recurrence, on a copy of the pool); a row over 5e-3 (bf16 inputs, fp32 pool) fails the script.
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
from kdagen.config import RecurrentConfig  # noqa: E402
from kdagen.ops import recurrent as R  # noqa: E402
from kdagen.spec.reference import naive_recurrent_kda  # noqa: E402

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEV = "cuda" if GPU else "cpu"
TOL = 5e-3


def pairs(spec: str):
    """"64/2,8/4" -> [(64, 2), (8, 4)] (BV / warps); "" -> [].  A third and fourth field, "8/4/16/2":
    persistent programs (RecurrentConfig.programs_per_sm) and their stages (2: Triton's pipelined item loop,
    the next items' tiles loaded asynchronously into shared memory).  A last field "s": the state's loads
    evict-first and its stores streaming (RecurrentConfig.stream_state): "64/2/s" -> (64, 2, "s").  A last
    field "tG": G V tiles per program (RecurrentConfig.tiles_per_program): "8/4/t8" -> (8, 4, "t8")."""
    return [tuple(f if f == "s" or f.startswith("t") else int(f) for f in p.split("/")) for p in spec.split(",") if p]


def config_of(c) -> RecurrentConfig:
    """The RecurrentConfig of a pairs() entry (the loaded readout)."""
    n = [f for f in c if isinstance(f, int)]
    tiles = [int(f[1:]) for f in c if isinstance(f, str) and f.startswith("t")]
    return RecurrentConfig(block_v=n[0], num_warps=n[1], num_stages=n[3] if len(n) > 3 else 1,
                           programs_per_sm=n[2] if len(n) > 2 else 0, readout="loaded", stream_state="s" in c,
                           tiles_per_program=tiles[0] if tiles else 1)


def case(B, H, pool_dtype, seed=0, K=128, V=128):
    """(inputs, pool [P, H, K, V], slots, cu): a packed step of B sequences over P slots, sequence n in
    slot (7 n) mod P."""
    gen = torch.Generator(device=DEV).manual_seed(1000 + B + seed)
    r = lambda *s: torch.randn(1, B, *s, generator=gen, device=DEV)  # noqa: E731
    x = dict(q=r(H, K), k=torch.nn.functional.normalize(r(H, K), dim=-1), v=r(H, V),
             g=-5 * torch.sigmoid(r(H, K) + 2.0), beta=torch.sigmoid(r(H)))
    x = {n: (t.float() if n == "g" else t.to(torch.bfloat16 if GPU else torch.float32)) for n, t in x.items()}
    P = B + 3 + (1 if (B + 3) % 7 == 0 else 0)
    pool = (0.1 * torch.randn(P, H, K, V, generator=gen, device=DEV)).to(pool_dtype)
    slots = ((torch.arange(B, device=DEV) * 7) % P).to(torch.int32)
    return x, pool, slots, torch.arange(B + 1, device=DEV, dtype=torch.int64)


def as_layout(pool_kv, layout):
    return pool_kv.transpose(-1, -2).contiguous() if layout == "vk" else pool_kv.clone()


def step_fn(op, layout, x, pool, slots, cu, out, config=None, fla=None):
    """One decode step of ``op`` ("kdagen" or "FLA") on ``pool`` (in ``layout``), writing ``out``."""
    vf = layout == "vk"
    if op == "FLA":
        idx = slots.long()
        return lambda: fla(**x, initial_state=pool, scale=x["q"].shape[-1] ** -0.5, inplace_final_state=True,  # noqa: E731
                           ssm_state_indices=idx, cu_seqlens=cu, out=out, state_v_first=vf)
    return lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots,  # noqa: E731
                                              cu_seqlens=cu, out=out, config=config, state_v_first=vf)


def check(make, x, pool_kv, layout, slots, first=16):
    """Relative error of o and the new states of the first ``first`` sequences against the float64
    recurrence: one step of ``make(pool, out)`` on a copy of the pool laid out as ``layout``."""
    pool = as_layout(pool_kv, layout)
    out = torch.full_like(x["v"], float("nan"))
    make(pool, out)()
    if GPU:
        torch.cuda.synchronize()
    s = slots[:first].long().cpu()
    ref = [x[n][0, :first].unsqueeze(1).double().cpu() for n in ("q", "k", "v", "g", "beta")]
    ro, rs = naive_recurrent_kda(*ref, initial_state=pool_kv[s].double().cpu(), output_final_state=True)
    got_s = pool[s].double().cpu()
    if layout == "vk":
        got_s = got_s.transpose(-1, -2)
    err = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    return max(err(out[0, :first].double().cpu(), ro[:, 0]), err(got_s, rs))


def force_grid(grid: str):
    """The slot grid as the heuristic takes it ("auto"), or forced off ("batch"); the fast path forgotten."""
    heuristics.SLOT_GRID_MIN_PAIRS = BASE_MIN_PAIRS if grid == "auto" else 10 ** 9
    R._FAST.clear()


BASE_MIN_PAIRS = heuristics.SLOT_GRID_MIN_PAIRS


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="256")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv", default="64/2", help="BV/warps on the [K, V] pool, beside its default")
    ap.add_argument("--vk", default="64/2,32/2,32/4,16/2,16/4,8/2,8/4,8/8,4/4,8/4/4/2,8/4/6/2,8/2/8/2,16/4/4/2",
                    help="BV/warps[/programs per SM/stages] on the [V, K] pool, beside its default")
    ap.add_argument("--batch-grid", default="8/4,16/4", help="[V, K] configs also timed with the batch grid")
    ap.add_argument("--pools", default="fp32", help="fp32 and/or bf16")
    ap.add_argument("--traffic", default="8/4,16/4,64/2", help="[V, K] tiles (BV/warps) also moved without math")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--check-only", action="store_true", help="no timing (the CPU interpreter)")
    ap.add_argument("--min-pairs", type=int, default=None,
                    help="the slot grid's pairs threshold for 'auto' rows (default: the heuristic's)")
    args = ap.parse_args()
    global BASE_MIN_PAIRS
    if args.min_pairs is not None:
        BASE_MIN_PAIRS = args.min_pairs
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "decode_layout_gpu.log"), "a")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    fla = None
    if not args.no_fla:
        try:
            from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as fla
        except Exception as e:  # noqa: BLE001
            log(f"FLA not available: {e!r}")
    copy = None
    if not args.check_only:
        from serving import copy_ceiling_gbs, graph_us
        copy = copy_ceiling_gbs()
        log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{__import__('triton').__version__}; copy ceiling {copy:.0f} GB/s")
    rows = []
    H = args.heads
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    try:  # (a timeout's SIGINT ends the sweep; the rows so far are still summarised)
        for B in map(int, args.batches.split(",")):
            for pname in args.pools.split(","):
                x, pool_kv, slots, cu = case(B, H, dtypes[pname])
                nbytes = 2 * B * H * 128 * 128 * pool_kv.element_size()
                plan = [("kdagen", "kv", None, "auto")] + [("kdagen", "kv", c, "auto") for c in pairs(args.kv)]
                plan += [("kdagen", "vk", None, "auto")] + [("kdagen", "vk", c, "auto") for c in pairs(args.vk)]
                plan += [("kdagen", "vk", c, "batch") for c in pairs(args.batch_grid)]
                if fla is not None:
                    plan += [("FLA", "kv", None, "auto"), ("FLA", "vk", None, "auto")]
                plan += [("kdagen", "kv", None, "auto")]  # the first row again: the drift over the sweep
                for op, layout, c, grid in plan:
                    cfg = None if c is None else config_of(c)
                    force_grid(grid)
                    row = dict(B=B, H=H, pool=pname, op=op, layout=layout,
                               config="default" if c is None else "/".join(map(str, c)), grid=grid)
                    try:
                        make = lambda p, o: step_fn(op, layout, x, p, slots, cu, o, cfg, fla)  # noqa: E731
                        row["rel_err_vs_float64"] = check(make, x, pool_kv, layout, slots)
                        if op == "kdagen":
                            d = R.fused_recurrent_kda_launch(**x, initial_state=as_layout(pool_kv, layout),
                                                             ssm_state_indices=slots, cu_seqlens=cu, config=cfg,
                                                             state_v_first=layout == "vk")[0]
                            row.update(slot_grid=bool(d.constexprs["SLOT_GRID"]), BV=d.constexprs["BV"],
                                       warps=d.num_warps)
                        if not args.check_only:
                            pool = as_layout(pool_kv, layout)
                            out = torch.empty_like(x["v"])
                            us = graph_us(make(pool, out))
                            row.update(us=round(us, 2), pct_copy=round(100 * nbytes / (us * 1e-6) / 1e9 / copy, 2))
                            del pool
                    except Exception as e:  # noqa: BLE001
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    rows.append(row)
                    log(json.dumps(row))
                force_grid("auto")
                if args.check_only or pname != "fp32" or B < 64:  # (the tiles' own traffic: at many pairs only)
                    continue
                import triton
                from decode_ceiling import tile_rw
                for bv, w in pairs(args.traffic):
                    for order in ("seven", "identity"):
                        pool = as_layout(pool_kv, "vk")
                        s = slots if order == "seven" else torch.arange(B, device=DEV, dtype=torch.int32)
                        nv = triton.cdiv(128, bv)
                        run = lambda: tile_rw[(B * H * nv,)](pool, s, HV=H, K=128, V=128, BV=bv, NV=nv,  # noqa: E731
                                                             V_FIRST=True, num_warps=w)
                        us = graph_us(run)
                        row = dict(B=B, H=H, pool=pname, op="traffic", layout="vk", config=f"{bv}/{w}", grid=order,
                                   us=round(us, 2), pct_copy=round(100 * nbytes / (us * 1e-6) / 1e9 / copy, 2))
                        rows.append(row)
                        log(json.dumps(row))
                        del pool
    except KeyboardInterrupt:
        log("interrupted: the rows so far")
    heuristics.SLOT_GRID_MIN_PAIRS = BASE_MIN_PAIRS
    R._FAST.clear()
    log("B | pool | op | layout | BV/warps | grid | µs (% of copy) | rel. err. vs float64")
    for r in rows:
        t = f"{r['us']:.2f} ({r['pct_copy']:.1f}%)" if "us" in r else "-"
        e = f"{r['rel_err_vs_float64']:.1e}" if "rel_err_vs_float64" in r else r.get("error", "-")
        cfg = r["config"] + (f" ({r['BV']}/{r['warps']})" if r["config"] == "default" and "BV" in r else "")
        grid = r["grid"] + (" [slot grid]" if r.get("slot_grid") else "")
        log(f"{r['B']} | {r['pool']} | {r['op']} | {r['layout']} | {cfg} | {grid} | {t} | {e}")
    bad = [r for r in rows if r["op"] != "traffic" and not r.get("rel_err_vs_float64", 1.0) < TOL]
    log(f"checks against float64 (< {TOL}): {'all pass' if not bad else bad}")
    json.dump(rows, open(os.path.join(args.out, "decode_layout_gpu.json"), "w"), indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
