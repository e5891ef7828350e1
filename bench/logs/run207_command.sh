# run 207 (session 40): the lean body with row 0 running everything that is not a decode step (the step's program
#   holds the step alone: 72 registers with no spill on its path) and the heuristic's lean 8 / 1 under a 72-register
#   cap for KDA's fp32 [V, K] pool on a decode step's call.  On whichever card comes (the card is printed first):
#   the probe's rows (the op's [V, K] default = lean 8 / 1 cap 72, beside 64 / 2, the general 8 / 1, lean under
#   caps 0 / 72 / 80, and the probe's own step), the serving proofs (with the lean body's mixed items in bf16),
#   and the serving table (FLA 0.6.0 in the same process; cut at 150 s).  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 150 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 --caps 0,72,80 > $OUT/run207_probe.log 2>&1
grep -v "against the op o" $OUT/run207_probe.log | tail -18
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 200 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run207_serving_gpu.log 2>&1
tail -14 $OUT/run207_serving_gpu.log
timeout -k 5 -s INT 150 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run207_serving.log 2>&1
grep -v "^{" $OUT/run207_serving.log | tail -30
