"""Time the inference forward's launches (solve, state pass) for explicit config variants, kdagen
alone, at the plain and the layer call (bench/forward_vs_fla.py's inputs).  For comparing kernel
designs or configs within one process, or two checkouts run one after the other on the same GPU:

    PYTHONPATH=. python3 bench/fwd_variants.py --out "$OUT" [--tag NAME] [--variants default,w8,...]

Each variant is a set of ChunkFwdConfig fields over the heuristic default.  Prints one line per
(case, variant): each launch's median time and the whole op's, and writes variants-TAG.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {
    "default": {},
    "w8": dict(intra_num_warps=8),
    "st2": dict(intra_num_stages=2),
    "tf32": dict(inverse_precision="tf32"),
    "f32": dict(factor_precision="fp32"),
    "c32": dict(chunk_size=32),
    "c32w8": dict(chunk_size=32, intra_num_warps=8),
    "c64": dict(chunk_size=64),
    "la1": dict(solve_load_ahead=1),
    "la2": dict(solve_load_ahead=2),
    "c64la1": dict(chunk_size=64, solve_load_ahead=1),
    "c64la2": dict(chunk_size=64, solve_load_ahead=2),
    "bv16": dict(state_block_v=16),
    "bv64": dict(state_block_v=64),
    "sw8": dict(state_num_warps=8),
    "ss2": dict(state_num_stages=2),
    "c32bv32": dict(chunk_size=32, state_block_v=32),
    "c32bv64": dict(chunk_size=32, state_block_v=64),
    "c32ss2": dict(chunk_size=32, state_block_v=32, state_num_stages=2),
    "bv64sw8": dict(state_block_v=64, state_num_warps=8),
    "bv64ss2": dict(state_block_v=64, state_num_stages=2),
    "bv32": dict(state_block_v=32),
    "sw2": dict(state_num_warps=2),
    "bv16sw2": dict(state_block_v=16, state_num_warps=2),
    "ss2sw2": dict(state_num_stages=2, state_num_warps=2),
    "ss4": dict(state_num_stages=4),
    "np": dict(state_prefetch=False),
    "npss2": dict(state_prefetch=False, state_num_stages=2),
    "npss4": dict(state_prefetch=False, state_num_stages=4),
    "npbv64": dict(state_prefetch=False, state_block_v=64),
    "npc64": dict(state_prefetch=False, chunk_size=64),
    "npc32": dict(state_prefetch=False, chunk_size=32),
    "bv64ss4": dict(state_block_v=64, state_num_stages=4),
}
SHAPES = [(1, 8192, 96, 128), (2, 16384, 16, 128), (4, 4096, 32, 128)]


def bench_ms(fn):
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cases", default="plain,layer", help="of plain, layer (three shapes each), packed64, long")
    ap.add_argument("--extra", default="", help="extra variants as JSON: {name: {field: value}}")
    args = ap.parse_args()
    import kdagen
    from forward_vs_fla import cases, inputs
    from kdagen.cache.heuristics import default_chunk_config
    from kdagen.ops.chunk import _prepare, chunk_kda_launches

    variants = dict(VARIANTS)
    if args.extra:
        variants.update(json.loads(args.extra))
    names = args.variants.split(",") + (list(json.loads(args.extra)) if args.extra else [])
    rows = []
    t0 = time.time()
    print(f"kdagen {kdagen.__version__} from {os.path.dirname(kdagen.__file__)}, {torch.cuda.get_device_name()}",
          flush=True)
    wanted = args.cases.split(",")
    todo = [(c, s, c == "layer", None) for c in ("plain", "layer") if c in wanted for s in SHAPES]
    todo += [c for c in cases() if c[0] in wanted and c[0] not in ("plain", "layer")]  # packed64, long
    for case, (B, T, H, D), layer, cu in todo:
        x, flags = inputs(B, T, H, D, D, layer, cu)
        call, _ = _prepare(**{n: x.get(n) for n in ("q", "k", "v", "g", "beta")},
                           initial_state=x["initial_state"], A_log=x.get("A_log"), dt_bias=x.get("dt_bias"),
                           cu_seqlens=x.get("cu_seqlens"),
                           use_qk_l2norm_in_kernel=flags.get("use_qk_l2norm_in_kernel", False),
                           use_gate_in_kernel=flags.get("use_gate_in_kernel", False),
                           use_beta_sigmoid_in_kernel=flags.get("use_beta_sigmoid_in_kernel", False),
                           safe_gate=True, lower_bound=flags["lower_bound"])
        base = default_chunk_config(call.plan, call.shape)
        ref = None
        for name in names:
            cfg = base.replace(**variants[name])
            row = dict(case=case, shape=[B, T, H, D], variant=name, config=cfg.to_dict())
            try:
                with torch.no_grad():
                    launches, (o, ht, _) = chunk_kda_launches(**x, **flags, output_final_state=True, config=cfg)
                    for ln in launches:
                        ln()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = (o.float().clone(), ht.clone())
                    row["diff_vs_first"] = [float((o.float() - ref[0]).abs().max()),
                                            float((ht - ref[1]).abs().max())]
                    row["launch_ms"] = {ln.kernel: bench_ms(ln) for ln in launches}
                    host = {} if cu is None else {"cu_seqlens_cpu": cu}  # packed: the offsets on the host too
                    row["op_ms"] = bench_ms(lambda: kdagen.chunk_kda(**x, **flags, **host, output_final_state=True,
                                                                     config=cfg))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            lt = " ".join(f"{k} {v:.3f}" for k, v in row.get("launch_ms", {}).items())
            print(f"{case:5s} {B},{T},{H},{D} {name:8s} op {row.get('op_ms', float('nan')):.3f} | {lt} "
                  f"| diff {row.get('diff_vs_first')} {row.get('error', '')} [t={time.time() - t0:.0f}s]",
                  flush=True)
            with open(os.path.join(args.out, f"variants-{args.tag}.json"), "w") as f:
                json.dump(rows, f, indent=1)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
