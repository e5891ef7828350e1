# run 211 (session 41): run 209's command reordered for a short budget -- on an H200 only: the probe's rows (the
#   "lean cap 72" row decides; the op's [V, K] default row runs with d12f377's heuristic applied in the working tree),
#   then the serving table (FLA 0.6.0 in the same process; cut at 150 s), then the serving proofs.  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 150 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 --caps 0,72,80 > $OUT/run211_probe.log 2>&1
grep -v "against the op o" $OUT/run211_probe.log | tail -18
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 150 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run211_serving.log 2>&1
grep -v "^{" $OUT/run211_serving.log | tail -30
timeout -k 5 -s INT 200 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run211_serving_gpu.log 2>&1
tail -14 $OUT/run211_serving_gpu.log
