# run 156 (session 29): the serving table under the new defaults (KDA's fp32 state at many pairs on the loaded
#   readout), and whether Triton's flat in-place kernel in small blocks and slot order reaches torch's mul_.
#   bash bench/logs/run156_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 420)
# Predicted: B=256 packed fp32 ~271 us (93.2%; run 155's "op launch ... loaded"), batch ~270; slots in batch order
#   ~268; flat_rw in slot order at 4-8 KB blocks: if it reaches ~99% (torch's mul_), what the decode loses to
#   torch is its program granularity; if it stays ~95-96%, something in how Triton's kernel issues its traffic.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 110 python3 bench/decode_structure_probe.py --out $OUT \
  --flat "1024/4/identity,2048/4/identity,2048/4/seven,8192/4/identity,4096/8/identity" --blocks "" --chunks "" \
  --two-pass "" --op-caps "64/2/updated/0,64/2/loaded/0" --slot-orders seven,identity --hold "" --one-pass "" \
  > $OUT/run156_probe.log 2>&1
tail -20 $OUT/run156_probe.log
timeout -k 5 -s INT 220 python3 bench/serving.py --out $OUT/s --suite sync,timing > $OUT/run156_serving.log 2>&1
grep "decode\|PASS\|FAIL\|MISS\|eager_split" $OUT/run156_serving.log | tail -40
