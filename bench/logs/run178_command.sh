# run 178 (session 36): run 176/177 came on an H100; the same rows again for an H200 if one comes (the card),
#   else a repeat on the H100: the op's tile groups on the [V, K] pool beside both layouts' defaults (fp32 pool,
#   B=256), the in-place mul_ ceiling (the probe), then the serving table (kdagen beside FLA 0.6.0).  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/l $OUT/s $OUT/p
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 150 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv 64/2/s --vk 8/4/t2,8/4/t4,8/4/t8,16/4/t4 --batch-grid "" --traffic "" > $OUT/run178_layout.log 2>&1
grep -A20 "^B | pool" $OUT/run178_layout.log | tail -12
timeout -k 5 -s INT 90 python3 bench/decode_structure_probe.py --out $OUT/p --flat "" --blocks "" --chunks "" \
  --two-pass "" --hold "" --one-pass "" --op-caps "" --slot-grid "" --vk-loop 8/4/4/1/1/1/0 > $OUT/run178_probe.log 2>&1
grep -v "^ *$" $OUT/run178_probe.log | grep -v "Warn\|warn" | tail -6
timeout -k 5 -s INT 200 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run178_serving.log 2>&1
grep -v "^{" $OUT/run178_serving.log | tail -16
