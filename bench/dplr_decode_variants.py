"""General DPLR's decode step (``fused_recurrent_dplr_delta_rule``, one token, H=32, K=V=128,
fp32 states) per RecurrentConfig, beside FLA's op of the same name in the same process.

    PYTHONPATH=/tmp/site:. python3 bench/dplr_decode_variants.py [--batches 1,256] [--pairs 64/2,32/1,16/1]

Both libraries take the state in and return a new final state (FLA's call); kdagen's heuristic
config is the first row.  Times: µs per call from a CUDA graph of 10 calls (the graph's launch
cost spread over ten) and from a graph of one call (bench/family_vs_fla.py's measure).  Every
variant's o and final state are compared with the heuristic's (they must agree to rounding).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--pairs", default="64/2,64/4,32/1,32/2,32/4,16/1,16/2,128/4")
    args = ap.parse_args()
    import kdagen
    from kdagen.config import RecurrentConfig
    import family_vs_fla as F
    from serving import graph_us

    fla = F.ops("dplr", "fla")
    for B in map(int, args.batches.split(",")):
        x = F.inputs("dplr", B, 1, 32, 128, 128, "cuda")
        rows = [("kdagen heuristic", None)] + [
            (f"kdagen BV={p.split('/')[0]} warps={p.split('/')[1]}",
             RecurrentConfig(block_v=int(p.split("/")[0]), num_warps=int(p.split("/")[1]), num_stages=1))
            for p in args.pairs.split(",")]
        ref = None
        for name, cfg in rows:
            kw = {} if cfg is None else dict(config=cfg)
            fn = lambda kw=kw: F.call_recurrent("dplr", kdagen.fused_recurrent_dplr_delta_rule, x, **kw)  # noqa: E731
            try:
                with torch.no_grad():
                    o, s = fn()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = (o.float(), s.float())
                    diff = max(float((o.float() - ref[0]).abs().max()), float((s.float() - ref[1]).abs().max()))
                    t10, t1 = graph_us(fn), F.graph_us(fn, True)
                print(f"B={B:3d} {name:28s} {t10:7.2f} us (graph of 10) {t1:7.2f} us (graph of 1)  diff {diff:.1e}",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"B={B:3d} {name:28s} {type(e).__name__}: {str(e)[:160]}", flush=True)
        if fla is not None:
            fn = lambda: F.call_recurrent("dplr", fla[1], x)  # noqa: E731
            with torch.no_grad():
                o, s = fn()
                torch.cuda.synchronize()
                diff = max(float((o.float() - ref[0]).abs().max()), float((s.float() - ref[1]).abs().max()))
                t10, t1 = graph_us(fn), F.graph_us(fn, True)
            print(f"B={B:3d} {'FLA 0.6.0':28s} {t10:7.2f} us (graph of 10) {t1:7.2f} us (graph of 1)  diff {diff:.1e}",
                  flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
