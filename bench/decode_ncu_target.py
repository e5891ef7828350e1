"""A packed decode step (H=32, K=V=128, state pool) run a few times for Nsight Compute to profile
one launch of it:

    ncu --clock-control none --kernel-name regex:recurrent --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \\
        --section MemoryWorkloadAnalysis \\
        python3 bench/decode_ncu_target.py --pool bfloat16 --block-v 32 --warps 1 --readout loaded
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
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--pool", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--block-v", type=int, default=64)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--readout", default="updated")
    args = ap.parse_args()
    import kdagen
    from kdagen.config import RecurrentConfig
    from serving import decode_case

    _, _, _, (x, pool, slots, cu, out) = decode_case(args.batch, True, getattr(torch, args.pool))
    cfg = RecurrentConfig(block_v=args.block_v, num_warps=args.warps, readout=args.readout)
    for _ in range(4):
        kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots, cu_seqlens=cu, out=out, config=cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
