"""The solve launch compiled with a register cap (ptxas .maxnreg): does a third or fourth 4-warp
program per SM (255 registers allow two) pay for the spills it costs?  kdagen alone, bf16:

    PYTHONPATH=. python3 bench/solve_maxnreg.py [--caps 0,168,128]

Prints the solve's median time per cap (0: none) at the plain and the layer call, and whether its
outputs are bit-identical to the uncapped launch's (a register cap must not change arithmetic).
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
    ap.add_argument("--caps", default="0,168,128")
    args = ap.parse_args()
    from triton.testing import do_bench

    from forward_vs_fla import inputs
    from kdagen.ops.chunk import chunk_kda_launches

    for case in ("plain", "layer"):
        for (B, T, H, D) in [(1, 8192, 96, 128), (4, 4096, 32, 128)]:
            x, flags = inputs(B, T, H, D, D, case == "layer")
            with torch.no_grad():
                launches, _ = chunk_kda_launches(**x, **flags, output_final_state=True)
            solve = launches[0]
            outs = [n for n in ("qg", "bk", "kgl", "pm", "gn")]
            ref = None
            for cap in map(int, args.caps.split(",")):
                extra = {} if cap == 0 else {"maxnreg": cap}
                run = lambda: solve.fn[solve.grid](**solve.args, **solve.constexprs,  # noqa: E731
                                                   num_warps=solve.num_warps, num_stages=solve.num_stages, **extra)
                try:
                    run()
                    torch.cuda.synchronize()
                    got = [solve.args[n].clone() for n in outs]
                    if ref is None:
                        ref = got
                    same = all(torch.equal(a, b) for a, b in zip(got, ref))
                    ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                    print(f"{case:5s} {B},{T},{H},{D} maxnreg={cap or 'none':>4} solve {ms:.3f} ms "
                          f"bit-identical {same}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{case:5s} {B},{T},{H},{D} maxnreg={cap}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            del x, launches
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
