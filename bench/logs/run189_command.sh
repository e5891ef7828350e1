# run 189 (session 37): run 188 (an H100) found the [K, V] pool's 128 / 4 tile (a whole head a program, 2 programs
#   per SM) 0.5% ahead of its 64 / 2 default; on an H200 the op's 128-wide tiles were never timed.  The wide tiles
#   of both layouts beside the defaults (fp32 pool, B=256), for whatever card comes.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/l
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 200 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv 128/4,64/4 --vk 64/4,64/8,128/4 --batch-grid "" --traffic "" > $OUT/run189_layout.log 2>&1
grep -A12 "^B | pool" $OUT/run189_layout.log | tail -10
