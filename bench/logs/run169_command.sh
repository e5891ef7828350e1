# run 169 (session 32, planned; no device was lent in session 32): the decode on a pool laid out [V, K]
#   (state_v_first=True, FLA's keyword) with narrow V tiles -- each tile one contiguous block of BV * 512 bytes --
#   against today's [K, V] pool, FLA in both layouts, and the tiles' own traffic.  (carry [".whl", ".tcache"],
#   timeout_s 590)
#   Predicted (bench/RESULTS.md, session 32): the [V, K] pool at B=256, fp32, BV=8 on 4 warps, slot grid: >= 96%
#   of copy (<= 263.7 us at 4,220 GB/s), from session 29's flat 4 KB programs in address order at 99.2-99.5%
#   minus the recurrence's ~2.5% (its inputs' 1.2% of bytes, the scan, the K reductions); BV=16 on 4 warps within
#   1% of it; persistent [V, K] programs (8/4 with 4 or 6 per SM, pipelined) below the slot grid (their items
#   follow the batch's scrambled slots, ~4% in session 29); BV=64 on 2 warps in [V, K] no better than [K, V] (run 95: 275.1 us traffic, 285.9 us op).  The tiles'
#   traffic in address order ("identity"): BV=8 / 4 warps >= 98.5%.  B=1 / 16: the [V, K] pool within +-5% of
#   [K, V] at the same tile, narrower [V, K] tiles no slower than the [K, V] defaults.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc
mkdir -p /tmp/tc $OUT/l256 $OUT/lsmall; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 270 python3 bench/decode_layout_gpu.py --out $OUT/l256 --batches 256 > $OUT/run169_layout256.log 2>&1
grep "^[0-9]* |\|checks\|copy ceiling" $OUT/run169_layout256.log
timeout -k 5 -s INT 100 python3 bench/decode_layout_gpu.py --out $OUT/l256b --batches 256 --pools bf16 --kv "" \
  --vk 32/1,16/2,16/4,8/2,8/4 --batch-grid "" --traffic "" > $OUT/run169_layout256_bf16.log 2>&1
grep "^[0-9]* |\|checks" $OUT/run169_layout256_bf16.log
timeout -k 5 -s INT 150 python3 bench/decode_layout_gpu.py --out $OUT/lsmall --batches 1,16 --kv 32/1,16/1 \
  --vk 32/1,16/1,16/2,8/1,8/2,8/4,4/1 --batch-grid "" --traffic "" > $OUT/run169_layout_small.log 2>&1
grep "^[0-9]* |\|checks" $OUT/run169_layout_small.log
