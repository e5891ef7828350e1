"""General DPLR's forward (chunk_dplr_delta_rule, inference) under training-config variants, kdagen alone:
which of the chunk_train heuristic's choices since run 49 (3.83 ms at (1, 8192, 96, 128)) cost the
5.58 ms of run 88.

    PYTHONPATH=. python3 bench/dplr_fwd_variants.py [--smoke]
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


def main():
    import kdagen
    from kdagen import spec as S
    from kdagen.cache.heuristics import default_train_config
    from kdagen.tuning.families import lower_for
    from family_vs_fla import inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    dev, dt = ("cpu", torch.float32) if a.smoke else ("cuda", torch.bfloat16)
    shapes = [(1, 40, 2, 32)] if a.smoke else [(1, 8192, 96, 128), (2, 16384, 16, 128)]
    for B, T, H, K in shapes:
        for lb in (None, -5.0):
            member = "dplr" if lb is None else "dplr5"
            x = inputs(member, B, T, H, K, K, dev)
            plan = lower_for(S.dplr(S.gate_direct(lb)), "chunk_fwd", K, K, dt)
            d = default_train_config(plan, {"N": B, "HV": H})
            row = dict(member=member, shape=[B, T, H, K], config=str(d))
            variants = {"default": d, "stages2": d.replace(state_num_stages=2),
                        "no_la": d.replace(intra_load_ahead=False),
                        "stages2_bv32w2": d.replace(state_num_stages=2, state_block_v=min(32, plan.BV), state_num_warps=2)}
            kw = {} if lb is None else dict(safe_gate=True, lower_bound=lb)
            for name, cfg in variants.items():
                fn = lambda: kdagen.chunk_dplr_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], x["gk"],  # noqa: E731
                                                          initial_state=x["initial_state"], output_final_state=True,
                                                          config=cfg, **kw)
                try:
                    fn()
                    if a.smoke:
                        t = time.perf_counter(); fn(); row[name] = (time.perf_counter() - t) * 1e3  # noqa: E702
                    else:
                        from triton.testing import do_bench
                        row[name] = float(do_bench(fn, warmup=20, rep=100, return_mode="median"))
                except Exception as e:  # noqa: BLE001
                    row[name] = f"error {type(e).__name__}: {str(e)[:120]}"
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
