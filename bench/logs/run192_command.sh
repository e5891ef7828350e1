# run 192 (session 38): the K-split across programs (bench/decode_stream_probe.py decode_ksplit), its tiles alone,
#   beside the op and the one-tile pattern in one process (the TMA rows of run 191 left out).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 300 python3 bench/decode_stream_probe.py --batch 256 --stream "" --decode "" \
  --ksplit 4/4,4/2,8/2,8/1,2/4,2/8,16/1 > $OUT/run192_probe.log 2>&1
tail -40 $OUT/run192_probe.log
