"""Run the training step's launches twice at one shape, for Nsight Compute to profile the second
round's state passes (the first compiles).  On the GPU machine:

    ncu --clock-control none --kernel-name regex:"chunk_state|chunk_bwd_state" --launch-skip 2 \
        --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section SourceCounters python3 bench/profile_state.py 2,16384,16,128

Inputs as bench/bench.py's (bf16, g >= -5 with safe_gate), the heuristic configs at that shape,
or ``--train`` / ``--bwd`` JSON replacing fields of them.
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
    from bench import LOWER, bench_plan, inputs, shape_hint, train_config_for
    from kdagen.cache.heuristics import default_chunk_bwd_config
    from kdagen.ops.chunk import chunk_kda_bwd_launches

    ap = argparse.ArgumentParser()
    ap.add_argument("shape", help="B,T,H,K")
    ap.add_argument("--train", default="{}")
    ap.add_argument("--bwd", default="{}")
    ap.add_argument("--member", default="kda", help="kda, or a family member (its heuristic configs; "
                    "--train/--bwd ignored)")
    ap.add_argument("--fla", action="store_true", help="FLA's op of the member's name instead (forward + backward)")
    a = ap.parse_args()
    B, T, H, K = (int(s) for s in a.shape.split(","))
    if a.member != "kda" or a.fla:
        import family_vs_fla as F
        from state_pass_variants import launches

        if a.fla:
            x = F.inputs(a.member, B, T, H, K, K, "cuda")
            run = F.fwdbwd_fn(a.member, F.ops(a.member, "fla")[0], x)
        else:
            _, fwd, bwd = launches(a.member, B, T, H, K, "cuda", 32)

            def run():
                for ln in list(fwd) + list(bwd):
                    ln()
        for _ in range(2):
            run()
        torch.cuda.synchronize()
        print(f"profiled {a.shape}: {a.member} {'FLA' if a.fla else 'kdagen'}", flush=True)
        return
    x = inputs(B, T, H, K, K)
    do = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16)
    dht = torch.randn(B, H, K, K, device="cuda")
    tcfg = train_config_for(B, T, H, K, **json.loads(a.train))
    bcfg = default_chunk_bwd_config(bench_plan(K, K), shape_hint(B, T, H)).replace(
        chunk_size=tcfg.chunk_size, sub_chunk=tcfg.sub_chunk, **json.loads(a.bwd))
    fwd, bwd, _ = chunk_kda_bwd_launches(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER,
                                         do=do, dht=dht, config=tcfg, bwd_config=bcfg)
    for _ in range(2):
        for ln in list(fwd) + list(bwd):
            ln()
    torch.cuda.synchronize()
    print(f"profiled {a.shape}: {tcfg} / {bcfg}", flush=True)


if __name__ == "__main__":
    main()
