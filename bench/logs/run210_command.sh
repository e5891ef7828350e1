# run 210 (session 40; the end of the session's device time): run 209's probe rows alone, on an H200 only -- the op's
#   [V, K] default (lean 8 / 1 under a 72-register cap) beside 64 / 2, the general 8 / 1, lean under caps 0 / 72 / 80
#   and the probe's own step, in one process.  (no carry)
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 150 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 --caps 0,72,80 > $OUT/run210_probe.log 2>&1
grep -v "against the op o" $OUT/run210_probe.log | tail -18
