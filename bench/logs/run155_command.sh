# run 155 (session 29): the decode's one-item kernel after dropping its masks where nothing needs masking
#   (K == BK, BV divides V: constant masks the compiler drops) and addressing the state tile from a scalar
#   64-bit base plus 32-bit offsets; then the serving table and proofs again.
#   bash bench/logs/run155_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 580)
# Predicted (runs 151-154, bench/decode_structure_probe.py): the op at B=256, fp32 pool, scrambled slots from
#   273.8 us (92.4%) to ~271 us (93.2-93.3%, decode_one_pass's figure: its masks and offsets are what differ);
#   slots in batch order ~268-270 us (94.3-95.1%). 96% stays out of reach (the structure's own ceiling, hold_rw,
#   is 95.1% scrambled / 96.8% ordered, and the step's q, k, g, v, o add 1.2% of the state's bytes).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 110 python3 bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" \
  --two-pass "" --op-caps "64/2/updated/0,64/2/loaded/0,64/4/updated/0,64/4/loaded/0" --slot-orders seven,identity \
  --hold "64/2/0/0/seven,64/2/0/0/identity" --one-pass "64/2/0/0/seven,64/2/0/0/identity,64/4/1/0/identity" \
  > $OUT/run155_probe.log 2>&1
tail -30 $OUT/run155_probe.log
timeout -k 5 -s INT 220 python3 bench/serving.py --out $OUT/s --suite sync,timing > $OUT/run155_serving.log 2>&1
grep "decode\|PASS\|FAIL\|MISS\|eager_split" $OUT/run155_serving.log | tail -40
timeout -k 5 -s INT 200 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run155_serving_gpu.log 2>&1
tail -15 $OUT/run155_serving_gpu.log
