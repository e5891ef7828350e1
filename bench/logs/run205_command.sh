# run 205 (session 39; run 203 with the [V, K] 64 / 2 row): on an H200 only -- the heuristic gives KDA's fp32 [V, K] pool with many pairs on the slot grid
#   8-row tiles on one warp with the lean body (restructured) held to 80 registers: the probe's rows (the op's default
#   is then that config; its lean 8 / 1 with caps 0 / 80 beside the general body, the probe's step), the serving
#   proofs, and the serving table (FLA 0.6.0 in the same process).  (carry [".whl"])
#   (The table: cut at 150 s; the probe rows and the proofs first, as they decide.)
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 120 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 --caps 0,80 > $OUT/run205_probe.log 2>&1
grep -v "against the op o" $OUT/run205_probe.log | tail -16
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 150 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run205_serving_gpu.log 2>&1
tail -12 $OUT/run205_serving_gpu.log
timeout -k 5 -s INT 150 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run205_serving.log 2>&1
grep -v "^{" $OUT/run205_serving.log | tail -30
