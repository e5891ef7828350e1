# run 184 (session 37): the slot loop with items claimed at run time (an atomic counter; run 183 gave each program a fixed stride of items and lost 5-10%) (RecurrentConfig.slot_programs_per_sm: one-item programs looped over the
#   slot grid's items, so a program's next item's loads follow its stores without waiting for them to drain; run
#   182's Nsight Compute put the drain at 8% of the op's warp cycles) beside both layouts' defaults, fp32 pool,
#   B=256, in one process, each row checked against float64 first.  On an H200 also the [V, K] tile groups.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/l
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name"
case "$name" in *H200*) vk=64/2/l4,64/2/l3,8/4/t2,16/4/t4;; *) vk=64/2/l4,64/2/l3;; esac
timeout -k 5 -s INT 200 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv 64/2/l4,64/2/l3,64/2/l2,64/2/l8,64/4/l2,32/2/l4 --vk "$vk" --batch-grid "" --traffic "" > $OUT/run184_layout.log 2>&1
grep -A16 "^B | pool" $OUT/run184_layout.log | tail -14
