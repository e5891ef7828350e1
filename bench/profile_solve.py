"""Run the inference forward twice at one shape, for Nsight Compute to profile the second call's
launches (the first compiles).  On the GPU machine:

    ncu --clock-control none --kernel-name regex:chunk_solve --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        python3 bench/profile_solve.py plain      # or: layer

Shapes: B=1, T=8192, H=96, K=V=128, bf16 (bench/forward_vs_fla.py's inputs).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    import kdagen
    from forward_vs_fla import inputs

    case = sys.argv[1] if len(sys.argv) > 1 else "plain"
    if case not in ("plain", "layer"):
        raise SystemExit(f"case must be plain or layer, got {case!r}")
    x, flags = inputs(1, 8192, 96, 128, 128, case == "layer")
    with torch.no_grad():
        for _ in range(2):
            kdagen.chunk_kda(**x, **flags, output_final_state=True)
    torch.cuda.synchronize()
    print(f"profiled {case}", flush=True)


if __name__ == "__main__":
    main()
