# run 177 (session 36): run 176 came on an H100 (80 GB HBM3), where the default [K, V] pool already steps at 97.2% of
#   copy: the serving proofs and the serving table (kdagen beside FLA 0.6.0) on the same machine, so the issue's
#   table has an H100 column measured in one process.  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 170 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run177_serving_gpu.log 2>&1
tail -12 $OUT/run177_serving_gpu.log
timeout -k 5 -s INT 200 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run177_serving.log 2>&1
grep -v "^{" $OUT/run177_serving.log | tail -40
