# run 214 (session 41; H200 only): run 213's serving table again (its eager B=1 rows, host-bound, read 18.6-21.4 us
#   where run 211 read 12.9-13.4 on the same B=1 code, and FLA's eager rows moved by as much: a noisy host).  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 80 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run214_serving.log 2>&1
grep -v "^{" $OUT/run214_serving.log | tail -14
