# run 209 (session 40; run 207 on an H200 only): the lean body with row 0 running everything that is not a decode
#   step (the step's program holds the step alone: 72 registers with no spill on its path).  On an H200 only (another
#   card: stopped): the probe's rows -- the op's [V, K] default (64 / 2 as committed; the lean 8 / 1 cap 72 tile with
#   d12f377's heuristic applied), the explicit rows 64 / 2, the general 8 / 1 and lean under caps 0 / 72 / 80 (the
#   "lean cap 72" row decides), and the probe's own step -- then the serving proofs (with the lean body's mixed items
#   in bf16) and the serving table (FLA 0.6.0 in the same process; cut at 150 s).  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 150 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 --caps 0,72,80 > $OUT/run209_probe.log 2>&1
grep -v "against the op o" $OUT/run209_probe.log | tail -18
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 200 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run209_serving_gpu.log 2>&1
tail -14 $OUT/run209_serving_gpu.log
timeout -k 5 -s INT 150 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run209_serving.log 2>&1
grep -v "^{" $OUT/run209_serving.log | tail -30
