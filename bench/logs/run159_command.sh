# run 159 (session 29): the serving proofs on the H200 after this session's two decode changes (the one-item path's
#   constant masks and scalar state base; KDA's loaded readout at many pairs), then the serving table once more
#   (run 156's eager rows, 16.7-21.9 us, disagreed with its own eager_split of the same op, 12.5-12.8 us: the host).
#   bash bench/logs/run159_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 420)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 200 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run159_serving_gpu.log 2>&1
tail -13 $OUT/run159_serving_gpu.log
timeout -k 5 -s INT 180 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run159_serving.log 2>&1
grep "PASS\|FAIL\|MISS\|eager_split" $OUT/run159_serving.log | tail -12
