# run 176 (session 35): run 175's plan (never run: no device in session 34) plus the op's new tile groups.
#   (the op's rows first: they decide; the probe's after)
#   (1) the probe's [V, K] tile loop, prefetched (PREFETCH 1, 2) and not;
#   (2) the op (fused_recurrent_kda, fp32 pool, B=256): [V, K] pools with tiles_per_program G (a program over G
#       V tiles of 8, the next tile's state loaded into registers ahead), beside the default configs of both
#       layouts and the [K, V] stream config (the serving proofs are left to a later call: device time).  (carry [".whl"])
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc
mkdir -p /tmp/tc $OUT/p $OUT/l
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout -k 5 -s INT 200 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv 64/2/s --vk 8/4,8/4/t4,8/4/t8,8/4/t16,16/4/t8,8/2/t8,8/4/s/t8 --batch-grid "" --traffic "" \
  > $OUT/run176_layout.log 2>&1
tail -18 $OUT/run176_layout.log
timeout -k 5 -s INT 110 python3 bench/decode_structure_probe.py --out $OUT/p --flat "" --blocks "" --chunks "" \
  --two-pass "" --hold "" --one-pass "" --op-caps "" --slot-grid "" \
  --vk-loop 8/4/4/1/1/1/0,8/8/4/1/1/1/1,8/16/4/1/1/1/1,8/8/4/1/1/1/2 \
  > $OUT/run176_probe.log 2>&1
grep -v "^ *$" $OUT/run176_probe.log | grep -v "Warn\|warn" | tail -22
