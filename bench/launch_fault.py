"""Which launch of a training step faults on the GPU, shape by shape: each shape in its own
process (an illegal access ends the CUDA context), every launch followed by a synchronise.

    python bench/launch_fault.py "2,16384,16,128" "2,1024,16,128" --train '{"chunk_size": 64}'
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r'''
import json, sys, torch
sys.path.insert(0, "bench")
from bench import LOWER, bench_plan, inputs, shape_hint
from kdagen.cache.heuristics import default_chunk_bwd_config, default_train_config
from kdagen.ops.chunk import chunk_kda_bwd_launches
B, T, H, K = (int(x) for x in sys.argv[1].split(","))
train_kw, bwd_kw = json.loads(sys.argv[2]), json.loads(sys.argv[3])
x = inputs(B, T, H, K, K)
plan, hint = bench_plan(K, K), shape_hint(B, T, H)
tcfg = default_train_config(plan, hint).replace(**train_kw)
bcfg = default_chunk_bwd_config(plan, hint).replace(chunk_size=tcfg.chunk_size, sub_chunk=tcfg.sub_chunk, **bwd_kw)
do = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16)
dht = torch.randn(B, H, K, K, device="cuda")
fwd, bwd, out = chunk_kda_bwd_launches(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER, config=tcfg,
                                       bwd_config=bcfg, do=do, dht=dht)
for ln in list(fwd) + list(bwd):
    print("launch", ln.kernel, "grid", ln.grid, {k: v for k, v in ln.constexprs.items() if k in ("BT", "BK", "BV")},
          flush=True)
    ln()
    torch.cuda.synchronize()
print("ok", {n: bool(torch.isfinite(t).all()) for n, t in out.items() if t is not None}, flush=True)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--train", default="{}")
    ap.add_argument("--bwd", default="{}")
    a = ap.parse_args()
    for sh in a.shapes:
        r = subprocess.run([sys.executable, "-c", CHILD, sh, a.train, a.bwd], capture_output=True, text=True,
                           timeout=300)
        lines = r.stdout.strip().splitlines()
        print(json.dumps(dict(shape=sh, train=a.train, bwd=a.bwd, rc=r.returncode, last=lines[-2:],
                              err=r.stderr.strip().splitlines()[-1:] if r.returncode else [])), flush=True)


if __name__ == "__main__":
    main()
