"""A family member's inference forward (chunk op, no gradients) under ChunkFwdConfig variants, each
launch timed alone, beside FLA's op of the same name and its kernels (torch.profiler), in one process.

    PYTHONPATH=/tmp/site:. python3 bench/member_fwd_variants.py --out "$OUT" --member gdn \
        [--variants default,la2,bv64] [--budget 300]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/member_fwd_variants.py --smoke --out /tmp/x

A variant is a set of ChunkFwdConfig fields over the heuristic default of the call
(``VARIANTS``).  Per shape and variant: the op's median ms (do_bench), each launch's median ms,
and the largest difference of o and the final state from the default's (they must agree to bf16
rounding).  ``--smoke``: a tiny shape in the interpreter, no FLA: it checks the script, not the speed.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import family_vs_fla as F  # noqa: E402

VARIANTS = {
    "default": {},
    "la2": dict(solve_load_ahead=2),  # the solve's loads of both halves first (KDA's default; 0 for a scalar decay)
    "la1": dict(solve_load_ahead=1),
    "w8": dict(intra_num_warps=8),
    "st2": dict(intra_num_stages=2),
    "bv16": dict(state_block_v=16),
    "bv64": dict(state_block_v=64),
    "bv64w8": dict(state_block_v=64, state_num_warps=8),
    "sw2": dict(state_num_warps=2),
    "ss2": dict(state_num_stages=2),
    "ss4": dict(state_num_stages=4),
    "np": dict(state_prefetch=False),
    "c32": dict(chunk_size=32),
    # (run 147: c32's solve 0.316 against 0.504 ms at (1, 8192, 96), its pass 0.853 against 0.691) the pass's tiles
    # on 32-row chunks, and the 64-row pass on 8 warps
    "sw8": dict(state_num_warps=8),
    "c32sw8": dict(chunk_size=32, state_num_warps=8),
    "c32bv64": dict(chunk_size=32, state_block_v=64),
    "c32bv64w8": dict(chunk_size=32, state_block_v=64, state_num_warps=8),
    "c32ss2": dict(chunk_size=32, state_num_stages=2),
    "c32ss4": dict(chunk_size=32, state_num_stages=4),
    "c32np": dict(chunk_size=32, state_prefetch=False),
}
SHAPES = [(1, 8192, 96, 128), (2, 16384, 16, 128)]
SMOKE_SHAPES = [(1, 70, 2, 32)]
OPS = {"gdn": "chunk_gated_delta_rule", "deltanet": "chunk_delta_rule", "gdn_layer": "chunk_gated_delta_rule"}


def _call_args(member, x):
    """(spec, q, k, v, g, beta, keywords) of kdagen's member launches for bench inputs ``x``."""
    from kdagen.ops.family import gdn_spec
    from kdagen import load_spec

    kw = dict(initial_state=x["initial_state"])
    if member == "gdn_layer":
        kw.update(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"], use_qk_l2norm_in_kernel=True)
        return gdn_spec(True, True), x["q"], x["k"], x["v"], x["g"], x["beta"], kw
    return load_spec(member), x["q"], x["k"], x["v"], x.get("g"), x.get("beta"), kw


def default_config(member, x):
    from kdagen.cache.heuristics import default_chunk_config
    from kdagen.ops.member import _prepare_chunk

    spec, q, k, v, g, beta, kw = _call_args(member, x)
    call, _, _ = _prepare_chunk(spec, q, k, v, g, beta, training=False, **kw)
    return default_chunk_config(call.plan, call.shape)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--member", default="gdn", choices=sorted(OPS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shapes", default="", help="B,T,H,D;B,T,H,D... (default: the issue's two shapes)")
    args = ap.parse_args(argv)
    t0 = time.time()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    import kdagen
    from kdagen.ops.member import chunk_member_launches

    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known {sorted(VARIANTS)}")
    fla = None if (args.no_fla or not cuda) else F.ops(args.member, "fla")
    op = getattr(kdagen, OPS[args.member])
    rows = []
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        shapes = [tuple(int(n) for n in part.split(",")) for part in args.shapes.split(";")]
    for B, T, H, D in shapes:
        x = F.inputs(args.member, B, T, H, D, D, dev)
        base = default_config(args.member, x)
        spec, q, k, v, g, beta, kw = _call_args(args.member, x)
        ref = None
        for name in names:
            if time.time() - t0 > args.budget:
                print(f"budget spent: {name} at {(B, T, H, D)} left out", flush=True)
                break
            row = dict(member=args.member, shape=[B, T, H, D], variant=name)
            try:
                cfg = base.replace(**VARIANTS[name])
                row["config"] = cfg.to_dict()
                run = functools.partial(F.call_chunk, args.member, functools.partial(op, config=cfg), x)
                with torch.no_grad():
                    launches, _ = chunk_member_launches(spec, q, k, v, g, beta, config=cfg, output_final_state=True,
                                                        **kw)
                    for ln in launches:
                        ln()
                    o = run()
                    if ref is None:
                        ref = (o[0].float().clone(), o[1].clone())
                    row["diff_vs_first"] = [float((o[0].float() - ref[0]).abs().max()),
                                            float((o[1] - ref[1]).abs().max())]
                    row["launch_ms"] = {ln.kernel: F.bench_ms(ln, cuda) for ln in launches}
                    row["op_ms"] = F.bench_ms(run, cuda)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
            lt = " ".join(f"{n} {t:.3f}" for n, t in row.get("launch_ms", {}).items())
            print(f"{(B, T, H, D)} {name:8s} op {row.get('op_ms', float('nan')):.3f} ms | {lt} | diff "
                  f"{row.get('diff_vs_first')} {row.get('error', '')} [t={time.time() - t0:.0f}s]", flush=True)
        if fla is not None:
            row = dict(member=args.member, shape=[B, T, H, D], variant="fla")
            try:
                with torch.no_grad():
                    fn = lambda: F.call_chunk(args.member, fla[0], x)  # noqa: E731
                    fn()
                    row["op_ms"] = F.bench_ms(fn, cuda)
                    from torch.profiler import ProfilerActivity, profile
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                    row["kernels_ms"] = {e.key[:60]: e.device_time_total / 1e3 / 3 for e in prof.key_averages()
                                         if e.device_time_total > 0}
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
            kt = " ".join(f"{n} {t:.3f}" for n, t in sorted(row.get("kernels_ms", {}).items(), key=lambda i: -i[1]))
            print(f"{(B, T, H, D)} fla      op {row.get('op_ms', float('nan')):.3f} ms | {kt} {row.get('error', '')}",
                  flush=True)
            dflt = next((r for r in rows if r["shape"] == [B, T, H, D] and r["variant"] == "default"
                         and "op_ms" in r), None)
            if dflt and "op_ms" in row:
                print(f"  FLA / kdagen default: {row['op_ms'] / dflt['op_ms']:.3f}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{args.member}_fwd_variants.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
