# run 195 (session 38): run 194's rows with the op's scan in the lean kernel (its cost apart from the rest), plus: the map and the step both as programmatic dependent launches
#   (as the op's step is), the lean step with a scan of the slot indices instead of the map (one launch), and the
#   op's own narrow [V, K] tiles; on whatever card the nvidia-h200 kind serves (an H200 decides the lean step).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: run 194 has these rows on an H100"; exit 0; }
timeout -k 5 -s INT 300 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1,16/2,8/2,16/4 > $OUT/run195_probe.log 2>&1
tail -30 $OUT/run195_probe.log
