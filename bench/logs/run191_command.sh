# run 191 (session 38): persistent TMA-pipelined programs (bench/decode_stream_probe.py): the access pattern
#   alone, and the KDA decode step checked against the op; the op's stream_state on the slot grid.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 400 python3 bench/decode_stream_probe.py --batch 256 > $OUT/run191_probe.log 2>&1
cat $OUT/run191_probe.log | tail -60
