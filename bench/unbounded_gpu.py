"""Training calls whose per-channel gate has no promised bound (chunk_kda without safe_gate, chunk_gla),
which take the checked diagonal tiles (factorised where a sub-tile's decay span allows, element-wise
else), against the same calls with the bound promised, kdagen alone, in one process.

    PYTHONPATH=. python3 bench/unbounded_gpu.py --out "$OUT" [--budget 200]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/unbounded_gpu.py --smoke --out /tmp/x   # CPU: checks the script

KDA: bench/bench.py's inputs (g in [-5, 0)), fwd+bwd of q, k, v, g, beta, h0 at (1, 8192, 96, 128) and
(2, 16384, 16, 128): bounded (safe_gate, -5), unbounded under the backward's heuristic (the intra gradients
on 4 warps since run 85), and unbounded with them on 2 warps (run 85's "free" row) and on 4 with BK=16.  GLA: bench/family_vs_fla.py's inputs (g = logsigmoid(x + 2),
unclamped: gla; clamped at -5 and promised: gla5).  Each row also gives the unbounded call's largest
difference from the bounded one's gradients (the same inputs: the same factorised products wherever the
spans allow).
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
T0 = time.time()
SHAPES = [(1, 8192, 96, 128), (2, 16384, 16, 128)]


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def main():
    from triton.testing import do_bench

    import kdagen
    from bench import LOWER, _grads, inputs
    from family_vs_fla import fwdbwd_fn
    from family_vs_fla import inputs as fam_inputs
    from kdagen.cache.heuristics import default_chunk_bwd_config
    from kdagen.ops.chunk import chunk_bwd_config
    from kdagen.ops.inputs import select_spec
    from kdagen.tuning.families import lower_for

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in fp32 on the CPU (the interpreter)")
    a = ap.parse_args()
    rows = []
    dev, dt, shapes = ("cpu", torch.float32, [(1, 70, 2, 32)]) if a.smoke else ("cuda", torch.bfloat16, SHAPES)
    if a.smoke:
        def ms(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
    else:
        ms = lambda fn: float(do_bench(fn, warmup=20, rep=80, return_mode="median"))  # noqa: E731
    free_plan = lower_for(select_spec(False, False, None, False, False), "chunk_fwd", shapes[0][3], shapes[0][3],
                          torch.float32 if a.smoke else torch.bfloat16)
    for B, T, H, K in shapes:
        if time.time() - T0 > a.budget:
            log("budget spent")
            break
        x = inputs(B, T, H, K, K, dtype=dt, device=dev)
        names = ("q", "k", "v", "g", "beta", "initial_state")
        for n in names:
            x[n] = x[n].detach().requires_grad_(True)
        do = torch.randn(B, T, H, K, device=dev, dtype=dt)
        dht = torch.randn(B, H, K, K, device=dev)
        bounded = lambda: _grads(lambda d: kdagen.chunk_kda(**d, output_final_state=True, safe_gate=True,  # noqa: E731
                                                            lower_bound=LOWER), x, do, dht)
        free = lambda: _grads(lambda d: kdagen.chunk_kda(**d, output_final_state=True), x, do, dht)  # noqa: E731
        row = dict(call="kda", shape=[B, T, H, K])
        ref = [t.clone() for t in bounded()]
        row["bounded_ms"] = ms(bounded)
        base = default_chunk_bwd_config(free_plan, {"N": B, "HV": H})
        for name, cfg in (("free", None), ("free_w2", base.replace(intra_num_warps=2)),
                          ("free_w4_bk16", base.replace(intra_num_warps=4, intra_block_k=16))):
            try:
                if cfg is None:
                    got = free()
                    row[f"{name}_ms"] = ms(free)
                else:
                    with chunk_bwd_config(cfg):
                        got = free()
                        row[f"{name}_ms"] = ms(free)
                row[f"{name}_max_diff_vs_bounded"] = max(float((p.float() - q.float()).abs().max()) for p, q in zip(got, ref))
            except Exception as e:  # noqa: BLE001
                row[f"{name}_ms"] = f"error {type(e).__name__}: {str(e)[:160]}"
            log(json.dumps(row))
        rows.append(row)
        del x
        if not a.smoke:
            torch.cuda.empty_cache()
    for B, T, H, K in shapes:
        if time.time() - T0 > a.budget:
            log("budget spent")
            break
        row = dict(call="gla", shape=[B, T, H, K])
        for member, fn in (("gla", kdagen.chunk_gla),
                           ("gla5", lambda *p, **kw: kdagen.chunk_gla(*p, safe_gate=True, lower_bound=-5.0, **kw))):
            x = fam_inputs(member, B, T, H, K, K, dev)
            run = fwdbwd_fn(member, fn, x)
            run()
            row[f"{member}_ms"] = ms(run)
            log(json.dumps(row))
            del x, run
            if not a.smoke:
                torch.cuda.empty_cache()
        rows.append(row)
    with open(os.path.join(a.out, "unbounded.json"), "w") as f:
        json.dump(dict(device="cpu" if a.smoke else torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
