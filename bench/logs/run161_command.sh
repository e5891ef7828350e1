# run 161 (session 29): the final code (session 28's decode template, KDA's loaded readout at many pairs): the loaded
#   against the updated readout at B=256 in one process (both slot orders), the serving proofs, the serving table
#   beside FLA.   bash bench/logs/run161_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 420)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 100 python3 bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" --two-pass "" \
  --hold "" --one-pass "" --op-caps "64/2/updated/0,64/2/loaded/0,64/2/updated/0/identity,64/2/loaded/0/identity,64/2/updated/0,64/2/loaded/0" \
  > $OUT/run161_probe.log 2>&1
grep -v "vs op" $OUT/run161_probe.log | tail -9
timeout -k 5 -s INT 150 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run161_serving_gpu.log 2>&1
tail -11 $OUT/run161_serving_gpu.log
timeout -k 5 -s INT 150 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run161_serving.log 2>&1
grep "PASS\|FAIL\|MISS" $OUT/run161_serving.log | tail -8
