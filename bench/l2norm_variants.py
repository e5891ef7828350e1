"""The training call's l2-norm launches (templates/qk_l2norm.py.j2, kdagen/ops/l2norm.py) at the layer
shapes' row counts under several tile geometries: rows per program (ELEMENTS_PER_PROGRAM // K) and warps.
Per geometry: the forward launch (reads q, k; writes q/|q|, k/|k| and one fp32 factor per row) and the
backward launch (reads q, k, the factors, dqn, dkn; writes dq, dk), median ms (do_bench), their bytes over
time against the device's copy bandwidth, and the largest difference of every output from the committed
geometry's (row-wise math: 0 or a last-bit difference of a sum's order).

    PYTHONPATH=. python3 bench/l2norm_variants.py --out "$OUT"          # on the GPU
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/l2norm_variants.py --smoke
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kdagen.ops.l2norm as L  # noqa: E402
import kdagen.spec as S  # noqa: E402
from kdagen.codegen.lower import lower  # noqa: E402
from kdagen.config import ChunkBwdConfig, ChunkTrainConfig  # noqa: E402
from kdagen.kernels import build  # noqa: E402

# (elements per program, warps); the first is the committed default (16 rows of K = 128 on 4 warps)
GEOMETRIES = [(L.ELEMENTS_PER_PROGRAM, L.NUM_WARPS)] + [g for g in ((2048, 4), (4096, 4), (8192, 4), (8192, 8),
                                                      (16384, 8), (16384, 16), (4096, 8))
                                                  if g != (L.ELEMENTS_PER_PROGRAM, L.NUM_WARPS)]


def run(shapes, dtype, device, smoke=False):
    plan = lower(S.kda(), 128, 128, {torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype], "chunk")
    fwd_fn = build(plan, ChunkTrainConfig()).fn("qk_l2norm")
    bwd_fn = build(plan, ChunkBwdConfig()).fn("qk_l2norm_bwd")
    committed = GEOMETRIES[0]
    rows = []
    copy = None
    if device == "cuda":
        from triton.testing import do_bench
        a = torch.empty(1 << 28, device=device)
        b = torch.empty_like(a)
        copy = 2 * a.numel() * 4 / (do_bench(lambda: b.copy_(a), warmup=20, rep=200, return_mode="median") * 1e-3)
        del a, b
        print(f"device copy {copy / 1e9:.0f} GB/s", flush=True)
    for shape in shapes:
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(*shape, generator=gen, device=device).to(dtype)
        k = torch.randn(*shape, generator=gen, device=device).to(dtype)
        dqn, dkn = torch.randn_like(q), torch.randn_like(k)
        ref = None
        for epp, warps in GEOMETRIES[:2] if smoke else GEOMETRIES:
            L.ELEMENTS_PER_PROGRAM, L.NUM_WARPS = epp, warps
            qn, kn, rq, rk = L.normalise(q, k, fwd_fn)
            dq, dk = L.normalise_bwd(q, k, rq, rk, dqn, dkn, bwd_fn)
            outs = (qn, kn, rq, rk, dq, dk)
            if ref is None:
                ref = outs
            row = dict(shape=list(shape), elements_per_program=epp, rows_per_program=L._geometry(q)[3],
                       num_warps=warps,
                       max_diff_vs_committed=max((a.float() - b.float()).abs().max().item() for a, b in zip(outs, ref)),
                       vs_torch=(qn.float() - torch.nn.functional.normalize(q.float(), dim=-1)).abs().max().item())
            if device == "cuda":
                from triton.testing import do_bench
                n, e, R = q.numel(), q.element_size(), L._geometry(q)[0]
                f_ms = do_bench(lambda: L.normalise(q, k, fwd_fn), warmup=20, rep=200, return_mode="median")
                b_ms = do_bench(lambda: L.normalise_bwd(q, k, rq, rk, dqn, dkn, bwd_fn), warmup=20, rep=200,
                                return_mode="median")
                f_bytes, b_bytes = 4 * n * e + 2 * R * 4, 6 * n * e + 2 * R * 4
                row.update(fwd_ms=f_ms, bwd_ms=b_ms, fwd_pct_copy=100 * f_bytes / (f_ms * 1e-3) / copy,
                           bwd_pct_copy=100 * b_bytes / (b_ms * 1e-3) / copy,
                           floor_ms=(f_bytes + b_bytes) / copy * 1e3)
            print(json.dumps(row), flush=True)
            rows.append(row)
    L.ELEMENTS_PER_PROGRAM, L.NUM_WARPS = committed
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true", help="a small shape, two geometries, no timing (the interpreter)")
    args = ap.parse_args()
    if args.smoke:
        rows = run([(1, 100, 2, 128)], torch.float32, "cpu", smoke=True)
        assert all(r["max_diff_vs_committed"] <= 1e-6 and r["vs_torch"] <= 1e-6 for r in rows), rows
    else:
        rows = run([(1, 8192, 96, 128), (2, 16384, 16, 128)], torch.bfloat16, "cuda")
        print("\n| shape | rows/program x warps | fwd ms (% copy) | bwd ms (% copy) | floor ms | max diff |")
        for r in rows:
            print(f"| {tuple(r['shape'])} | {r['rows_per_program']} x {r['num_warps']} | {r['fwd_ms']:.3f} "
                  f"({r['fwd_pct_copy']:.0f}%) | {r['bwd_ms']:.3f} ({r['bwd_pct_copy']:.0f}%) | {r['floor_ms']:.3f} | "
                  f"{r['max_diff_vs_committed']:.1e} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "l2norm_variants.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
