# run 175 (session 34): (1) the probe's [V, K] tile loop with the next tile loaded into registers ahead
#   (PREFETCH=1), beside the unprefetched G=4 (run 173: 272.3 us); (2) the op on the [K, V] pool with the state's
#   loads evict-first and stores streaming (stream_state, "/s") and other tiles, slot grid, beside the default.
#   (carry [".whl"], timeout_s <= budget)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc
mkdir -p /tmp/tc $OUT/p $OUT/l
timeout -k 5 -s INT 180 python3 bench/decode_structure_probe.py --out $OUT/p --flat "" --blocks "" --chunks "" \
  --two-pass "" --hold "" --one-pass "" --op-caps "" --slot-grid "" \
  --vk-loop 8/4/4/1/1/1/0,8/4/4/1/1/1/1,8/8/4/1/1/1/1,8/16/4/1/1/1/1,16/4/4/1/1/1/1,16/8/4/1/1/1/1,8/8/2/1/1/1/1,8/16/4/1/0/1/1,8/8/4/1/1/1/2,8/16/4/1/1/1/2 \
  > $OUT/run175_probe.log 2>&1
grep -v "^ *$" $OUT/run175_probe.log | grep -v "Warn\|warn" | tail -24
timeout -k 5 -s INT 150 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv 64/2/s,64/4,64/4/s,32/1,32/2,128/4,128/8 --vk "" --batch-grid "" --traffic "" > $OUT/run175_layout.log 2>&1
tail -14 $OUT/run175_layout.log
# (3) the serving proofs on this commit (the op's Python path gained Dims.decode_shape: same shape dict)
timeout -k 5 -s INT 200 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run175_serving_gpu.log 2>&1
tail -12 $OUT/run175_serving_gpu.log
