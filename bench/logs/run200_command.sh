# run 200 (session 38): run 199 cut again (refused starts left ~4 minutes of device time): on an H200 only, the
#   probe's rows -- the op's default on the [V, K] pool (now the lean 8 / 1) beside its general 8 / 1, the probe's
#   lean step and the [K, V] default, each checked first.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 100 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 > $OUT/run200_probe.log 2>&1
grep -v "against the op o" $OUT/run200_probe.log | tail -12
