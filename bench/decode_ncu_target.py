"""A packed decode step (H=32, K=V=128, state pool) run a few times for Nsight Compute to profile
one launch of it:

    ncu --clock-control none --kernel-name regex:recurrent --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \\
        --section MemoryWorkloadAnalysis \\
        python3 bench/decode_ncu_target.py --pool bfloat16 --block-v 32 --warps 1 --readout loaded

Without --block-v the op runs its own choice (the heuristic's, or a tuned winner).  ``--mul``
runs torch's in-place ``mul_`` over the whole pool of B + 3 or 4 slots instead -- the same traffic with
nothing else to do, for comparison with the op; profile it with ``--kernel-name-base demangled
--kernel-name regex:MulFunctor``.
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
    ap.add_argument("--block-v", type=int, default=None, help="with --warps: a config (default: the op's own)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--readout", default="loaded")
    ap.add_argument("--tiles-per-program", type=int, default=1)
    ap.add_argument("--state-v-first", action="store_true", help="the pool laid out [P, HV, V, K]")
    ap.add_argument("--mul", action="store_true", help="torch's in-place mul_ over the pool instead")
    args = ap.parse_args()
    from serving import decode_case, pool_slots

    if args.mul:  # nothing else multiplies floats here, so --kernel-name-base demangled regex:MulFunctor finds it
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        pool = torch.randn(pool_slots(args.batch), 32, 128, 128, device=dev, dtype=getattr(torch, args.pool))
        for _ in range(4):
            pool.mul_(1.0)
        if dev == "cuda":
            torch.cuda.synchronize()
        return
    import kdagen
    from kdagen.config import RecurrentConfig

    _, _, err, (x, pool, slots, cu, out) = decode_case(args.batch, True, getattr(torch, args.pool),
                                                       v_first=args.state_v_first)
    print(f"the op against float64 before profiling: {err:.1e}", flush=True)
    if err > 5e-3:
        raise SystemExit("the op's step disagrees with float64")
    cfg = None
    if args.block_v is not None:
        cfg = RecurrentConfig(block_v=args.block_v, num_warps=args.warps, readout=args.readout,
                              tiles_per_program=args.tiles_per_program)
    for _ in range(4):
        kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots, cu_seqlens=cu, out=out,
                                   config=cfg, state_v_first=args.state_v_first)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
