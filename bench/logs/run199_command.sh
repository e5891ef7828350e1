# run 199 (session 38): run 198 cut to what the budget left allows (a refused start took 180 s): on an H200 only, the
#   probe's rows (the op's default on the [V, K] pool -- now the lean 8 / 1 -- beside its general 8 / 1, the probe's
#   lean step and the [K, V] default) and the serving proofs; the serving table is left for the next session.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 90 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 > $OUT/run199_probe.log 2>&1
grep -v "against the op o" $OUT/run199_probe.log | tail -12
timeout -k 5 -s INT 120 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run199_serving_gpu.log 2>&1
tail -12 $OUT/run199_serving_gpu.log
