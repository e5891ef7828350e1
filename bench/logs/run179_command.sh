# run 179 (session 36, its last minutes): the tile rows once more, for an H200 if the kind serves one (runs 176-178
#   came on H100s): both layouts' defaults and the closest tile groups, fp32 pool, B=256.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/l
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout -k 5 -s INT 130 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv "" --vk 8/4/t2,8/4/t4,16/4/t4 --batch-grid "" --traffic "" > $OUT/run179_layout.log 2>&1
grep -A12 "^B | pool" $OUT/run179_layout.log | tail -8
