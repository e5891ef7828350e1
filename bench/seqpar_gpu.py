"""The sequence-parallel state pass (ChunkFwdConfig.state_segment_chunks) on the GPU, kdagen alone:
per shape and segment length, each launch's time (solve; one pass, or pass A / B / C) and the
op's, the output's difference from the one-pass output, and at a small shape both against the
float64 recurrence.

    PYTHONPATH=. python3 bench/seqpar_gpu.py --out "$OUT" [--segments 0,8,16,32] [--block-v 0,16,32]

Inputs are bench/forward_vs_fla.py's (bf16, g = -5 sigmoid(randn + 2), safe_gate, lower bound -5,
an fp32 initial state).  block_v 0: the heuristic's state_block_v.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = {"long": (1, 65536, 8, 128), "b2t16k": (2, 16384, 16, 128), "b1t8k-h96": (1, 8192, 96, 128),
          "b1t32k-h16": (1, 32768, 16, 128)}


def ms(fn):
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default="long,b2t16k,b1t32k-h16,b1t8k-h96")
    ap.add_argument("--segments", default="0,8,16,32")
    ap.add_argument("--block-v", default="0,16")
    args = ap.parse_args()
    import kdagen
    from forward_vs_fla import inputs
    from kdagen.config import ChunkFwdConfig
    from kdagen.ops.chunk import _configs, _prepare, chunk_kda_launches
    from kdagen.spec.reference import naive_recurrent_kda

    rows = []
    # float64 check at a small shape, one pass against segments.  The benchmark's gates (about
    # -4.4 per token) forget everything within a chunk, so the segments' chain (M S + E) would not
    # be exercised: here g ~ -1e-3 per token, so the state entering a segment still matters at
    # its end (e^-0.5 over 512 tokens)
    x, flags = inputs(1, 4096, 2, 128, 128)
    x["g"] = x["g"] * 2e-4
    ref_o, ref_s = naive_recurrent_kda(x["q"].double(), x["k"].double(), x["v"].double(), x["g"].double(),
                                       x["beta"].double(), initial_state=x["initial_state"].double(),
                                       output_final_state=True)
    one = None
    for L in (0, 8, 16):
        o, s = kdagen.chunk_kda(**x, **flags, output_final_state=True, config=ChunkFwdConfig(state_segment_chunks=L))
        one = one or (o, s)
        row = dict(kind="float64", shape=(1, 4096, 2, 128), segments=L, err_o=rel(o, ref_o), err_state=rel(s, ref_s),
                   diff_o_vs_one_pass=rel(o, one[0]), diff_state_vs_one_pass=rel(s, one[1]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    for name in args.shapes.split(","):
        B, T, H, K = SHAPES[name]
        x, flags = inputs(B, T, H, K, K)
        call, _ = _prepare(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], **flags)
        heur, _ = _configs(call, None, None, False)
        o_ref = None
        for bv in map(int, args.block_v.split(",")):
            for L in map(int, args.segments.split(",")):
                cfg = heur.replace(state_segment_chunks=L, **({"state_block_v": bv} if bv else {}))
                row = dict(kind="time", case=name, shape=(B, T, H, K), segments=L, state_block_v=cfg.state_block_v,
                           heuristic_segments=heur.state_segment_chunks)
                try:
                    launches, (o, ht, _) = chunk_kda_launches(**x, **flags, output_final_state=True, config=cfg)
                    for ln in launches:
                        ln()
                    torch.cuda.synchronize()
                    if o_ref is None:
                        o_ref = (o.clone(), ht.clone())
                    row["diff_o_vs_first"] = rel(o, o_ref[0])
                    row["diff_state_vs_first"] = rel(ht, o_ref[1])
                    row["launch_ms"] = {ln.kernel: ms(ln) for ln in launches}
                    row["op_ms"] = ms(lambda: kdagen.chunk_kda(**x, **flags, output_final_state=True, config=cfg))
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "seqpar_gpu.json"), "w") as f:
        json.dump(dict(rows=rows, torch=torch.__version__, device=torch.cuda.get_device_name()), f, indent=1)


if __name__ == "__main__":
    main()
