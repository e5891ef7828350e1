# run 167 (session 30): the final code (.ab/peel: slot grid, PDL, the peel) at B=256 with the fp32 pool on 4 warps
#   against the default 2 (the probe's slot-grid kernel: 4 warps 0.5-1 us faster, runs 162-164), A-B-A-B in one process.
#   Predicted: 4 warps -0.5 to -1 us (~267.6 -> ~267).  (carry [".ab"], timeout_s 200)
export PYTHONUNBUFFERED=1 PYTHONPATH=.ab/peel KDAGEN_CACHE_DIR=/tmp/kdc_w
timeout -k 5 -s INT 150 python3 - <<'PY' 2>&1 | tee $OUT/run167_warps.log
import sys; sys.path[:0] = [".ab/peel", ".ab/peel/bench"]
import torch, kdagen
from kdagen.config import RecurrentConfig
from serving import decode_case, graph_us, copy_ceiling_gbs
copy = copy_ceiling_gbs()
print(f"copy ceiling {copy:.0f} GB/s")
fn, nbytes, err, (x, pool, slots, cu, out) = decode_case(256, True, torch.float32)
for rep in range(2):
    for w in (2, 4):
        cfg = RecurrentConfig(block_v=64, num_warps=w, num_stages=1, readout="loaded")
        step = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots, cu_seqlens=cu, out=out, config=cfg)
        us = graph_us(step)
        print(f"B=256 packed fp32 pool, BV=64, {w} warps, loaded: {us:.2f} us, {100 * nbytes / (us * 1e-6) / 1e9 / copy:.2f}% of copy")
print(f"default (2 warps): {graph_us(fn):.2f} us")
PY
