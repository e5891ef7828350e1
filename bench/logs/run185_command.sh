# run 185 (session 37): the slot loop reverted (runs 183-184 lost); on the H200 that run 184 found, the serving
#   proofs and the serving table (kdagen beside FLA 0.6.0) on the final code.  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 170 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run185_serving_gpu.log 2>&1
tail -12 $OUT/run185_serving_gpu.log
timeout -k 5 -s INT 220 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run185_serving.log 2>&1
grep -v "^{" $OUT/run185_serving.log | tail -40
