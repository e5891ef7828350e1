# run 213 (session 41; H200 only): the heuristic with the lean 8 / 1 tile uncapped (run 212: 97.1-97.2% against cap
#   72's 96.4-96.5%): the serving table (FLA 0.6.0 in the same process) and the serving proofs on it.  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 100 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run213_serving.log 2>&1
grep -v "^{" $OUT/run213_serving.log | tail -16
timeout -k 5 -s INT 120 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run213_serving_gpu.log 2>&1
tail -12 $OUT/run213_serving_gpu.log
