# run 188 (session 37): run 187's Nsight Compute on the H200 put 40% of the op's warp time outside memory waits
#   (short scoreboard, wait, barrier, MIO) with only 8 warps per SM (4 programs by registers); the [K, V] tiles that
#   fit more programs per SM (sm_90 compile: 32/2 167 registers -> 6 per SM, 32/1 8, 16/1 16, 32/4 5, 64/4 3,
#   128/4 2), never timed on the slot grid on an H200, beside the default (fp32 pool, B=256).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/l
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 200 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv 32/2,32/1,32/4,16/1,16/2,64/4,128/4 --vk "" --batch-grid "" --traffic "" > $OUT/run188_layout.log 2>&1
grep -A14 "^B | pool" $OUT/run188_layout.log | tail -12
