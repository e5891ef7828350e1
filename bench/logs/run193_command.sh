# run 193 (session 38): the lean [V, K] decode (bench/decode_stream_probe.py decode_vk_lean: R rows of a [V, K] pool a
#   program, the slot's sequence from a one-program map, no scan), its blocks alone, beside the op on both layouts.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 300 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1,8/2,16/1,16/2,16/4,32/4 > $OUT/run193_probe.log 2>&1
tail -30 $OUT/run193_probe.log
