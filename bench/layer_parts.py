"""Where the layer call's extra solve time goes: the solve launch timed with each in-kernel flag
alone (q/k l2-norm, beta sigmoid, the gate from A_log/dt_bias) and all together, against the
plain call, kdagen alone, bf16:

    PYTHONPATH=. python3 bench/layer_parts.py

Inputs are bench/forward_vs_fla.py's: a flag that is on takes the layer's raw tensor, a flag
that is off the plain call's prepared one (normalised k, beta in (0, 1), g in [-5, 0)).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PARTS = {
    "plain": (),
    "l2norm": ("l2norm",),
    "beta_sigmoid": ("beta",),
    "gate": ("gate",),
    "l2norm+gate": ("l2norm", "gate"),
    "layer": ("l2norm", "beta", "gate"),
}


def main():
    from triton.testing import do_bench

    from forward_vs_fla import LOWER, inputs
    from kdagen.ops.chunk import chunk_kda_launches

    for (B, T, H, D) in [(1, 8192, 96, 128), (4, 4096, 32, 128)]:
        plain, _ = inputs(B, T, H, D, D, False)
        raw, _ = inputs(B, T, H, D, D, True)
        base = None
        for name, on in PARTS.items():
            x = dict(v=plain["v"], initial_state=plain["initial_state"])
            x["q"], x["k"] = (raw["q"], raw["k"]) if "l2norm" in on else (plain["q"], plain["k"])
            x["beta"] = raw["beta"] if "beta" in on else plain["beta"]
            flags = dict(safe_gate=True, lower_bound=LOWER, use_qk_l2norm_in_kernel="l2norm" in on,
                         use_beta_sigmoid_in_kernel="beta" in on, use_gate_in_kernel="gate" in on)
            if "gate" in on:
                x.update(g=raw["g"], A_log=raw["A_log"], dt_bias=raw["dt_bias"])
            else:
                x["g"] = plain["g"]
            with torch.no_grad():
                launches, _ = chunk_kda_launches(**x, **flags, output_final_state=True)
                for ln in launches:
                    ln()
                solve = launches[0]
                ms = do_bench(solve, warmup=25, rep=100, return_mode="median")
            base = base or ms
            print(f"{B},{T},{H},{D} {name:13s} solve {ms:.3f} ms (+{ms - base:.3f})", flush=True)
        del plain, raw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
