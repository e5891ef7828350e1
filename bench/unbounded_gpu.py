"""Training calls under each gate contract, kdagen alone, in one process: a promised bound trusted
(check_gate_bound=False: the unchecked factorised diagonals), the same bound checked (True, the
default for KDA and GLA: repair launches re-run the chunks whose sub-tiles span over the limit), and no bound
(chunk_kda without safe_gate, chunk_gla: checked too), under the unbounded plan's heuristic tiles and
under the bounded plan's (the element-wise fallback now runs one column at a time on the fast path's
tiles, so it may not need the narrower ones).

    PYTHONPATH=. python3 bench/unbounded_gpu.py --out "$OUT" [--budget 200]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/unbounded_gpu.py --smoke --out /tmp/x   # CPU: checks the script

KDA: bench/bench.py's inputs (g in [-5, 0)), fwd+bwd of q, k, v, g, beta, h0 at (1, 8192, 96, 128) and
(2, 16384, 16, 128).  GLA: bench/family_vs_fla.py's inputs (g = logsigmoid(x + 2), unclamped: gla; clamped
at -5 and promised: gla5, checked and trusted) and general DPLR's alike (dplr, dplr5).  Each KDA row gives every variant's largest difference
from the bounded call's gradients (the same inputs: the same factorised products wherever the spans allow).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
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
    from kdagen.cache.heuristics import default_chunk_bwd_config, default_train_config
    from kdagen.ops.chunk import chunk_bwd_config
    from kdagen import spec as S
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
        def call(cfg=None, bcfg=None, **kw):
            return lambda: _grads(lambda d: kdagen.chunk_kda(**d, output_final_state=True, config=cfg, **kw), x, do, dht)

        bounded_kw = dict(safe_gate=True, lower_bound=LOWER)
        row = dict(call="kda", shape=[B, T, H, K])
        ref = [t.clone() for t in call(**bounded_kw)()]
        bplan = lower_for(select_spec(False, True, LOWER, False, False), "chunk_fwd", K, K, dt)
        shape = {"N": B, "HV": H}
        tcfg, bcfg = default_train_config(free_plan, shape), default_chunk_bwd_config(free_plan, shape)
        btcfg, bbcfg = default_train_config(bplan, shape), default_chunk_bwd_config(bplan, shape)
        variants = [
            ("bounded", None, None, bounded_kw),  # the default: the promise checked (repair launches)
            ("trusted", btcfg.replace(check_gate_bound=False), bbcfg.replace(check_gate_bound=False), bounded_kw),
            ("checked", btcfg.replace(check_gate_bound=True), bbcfg.replace(check_gate_bound=True), bounded_kw),
            ("free", None, None, {}),  # the unbounded plan's heuristic tiles
            ("free_fwd_bt", tcfg.replace(intra_block_k=btcfg.intra_block_k), None, {}),  # the bounded plan's intra tile
            ("free_bwd_bt", None, bcfg.replace(intra_num_warps=bbcfg.intra_num_warps), {}),  # its warps in the intra grads
            ("free_bt", tcfg.replace(intra_block_k=btcfg.intra_block_k),
             bcfg.replace(intra_num_warps=bbcfg.intra_num_warps), {}),
        ]
        for name, cfg, bwd_cfg, kw in variants:
            try:
                run = call(cfg, **kw)
                if bwd_cfg is None:
                    got = run()
                    row[f"{name}_ms"] = ms(run)
                else:
                    with chunk_bwd_config(bwd_cfg):
                        got = run()
                        row[f"{name}_ms"] = ms(run)
                row[f"{name}_max_diff_vs_bounded"] = max(float((p.float() - q.float()).abs().max()) for p, q in zip(got, ref))
            except Exception as e:  # noqa: BLE001
                row[f"{name}_ms"] = f"error {type(e).__name__}: {str(e)[:160]}"
            log(json.dumps(row))
        rows.append(row)
        del x
        if not a.smoke:
            torch.cuda.empty_cache()
    fam = {"gla": (S.gla, kdagen.chunk_gla), "dplr": (S.dplr, kdagen.chunk_dplr_delta_rule)}
    for member, (make_spec, op) in fam.items():
        for B, T, H, K in shapes:
            if time.time() - T0 > a.budget:
                log("budget spent")
                break
            row = dict(call=member, shape=[B, T, H, K])
            plan = lower_for(make_spec(S.gate_direct(None)), "chunk_fwd", K, K, dt)
            plan5 = lower_for(make_spec(S.gate_direct(-5.0)), "chunk_fwd", K, K, dt)
            shape = {"N": B, "HV": H}
            t5, b5 = default_train_config(plan5, shape), default_chunk_bwd_config(plan5, shape)
            free_bt = (default_train_config(plan, shape).replace(intra_block_k=t5.intra_block_k),
                       default_chunk_bwd_config(plan, shape).replace(intra_num_warps=b5.intra_num_warps))
            bound = dict(safe_gate=True, lower_bound=-5.0)
            variants = [(member, None, None, {}), (member + "_bt", *free_bt, {}),  # unbounded: its tiles, the bounded's
                        (member + "5", None, None, bound),  # the heuristic's (GLA: checked; DPLR: trusted)
                        (member + "5_trusted", t5.replace(check_gate_bound=False), b5.replace(check_gate_bound=False), bound),
                        (member + "5_checked", t5.replace(check_gate_bound=True), b5.replace(check_gate_bound=True), bound)]
            for name, cfg, bcfg, kw in variants:
                inp = name.split("_")[0]  # gla/dplr inputs: unclamped; gla5/dplr5: clamped at -5
                x = fam_inputs(inp, B, T, H, K, K, dev)
                fn = functools.partial(op, config=cfg, **kw) if cfg is not None else functools.partial(op, **kw)
                try:
                    with chunk_bwd_config(bcfg) if bcfg is not None else contextlib.nullcontext():
                        run = fwdbwd_fn(inp, fn, x)
                        run()
                        row[f"{name}_ms"] = ms(run)
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_ms"] = f"error {type(e).__name__}: {str(e)[:160]}"
                log(json.dumps(row))
                del x
                if not a.smoke:
                    torch.cuda.empty_cache()
            rows.append(row)
    with open(os.path.join(a.out, "unbounded.json"), "w") as f:
        json.dump(dict(device="cpu" if a.smoke else torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
