# run 197 (session 38): the op's new lean body (RecurrentConfig.lean: constant masks, one token loop, the slots-alone scan)
#   on the [V, K] pool at 8 / 1 beside its general body, the probe's lean step and the op's defaults, on an H200 only.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 300 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1,16/2 > $OUT/run197_probe.log 2>&1
tail -24 $OUT/run197_probe.log
