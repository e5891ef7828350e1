# run 196 (session 38): run 195's rows on an H200, with the lean kernel also at 32 and 64 rows (64 / 2 is the op's [V, K]
#   default tile); it stops at once on any other card. Run 195's rows: the op's scan in the lean kernel, the map and the step as PDL launches
#   (as the op's step is), the lean step with a scan of the slot indices instead of the map (one launch), and the
#   op's own narrow [V, K] tiles; on whatever card the nvidia-h200 kind serves (an H200 decides the lean step).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: runs 194-195 have these rows on H100s"; exit 0; }
timeout -k 5 -s INT 300 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1,16/2,8/2,16/4,32/2,64/2 > $OUT/run196_probe.log 2>&1
tail -30 $OUT/run196_probe.log
