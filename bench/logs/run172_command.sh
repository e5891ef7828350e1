# run 172 (session 32): the probe's decode_vk_loop -- a [V, K] pool, each program looping over G contiguous 4 KB
#   (BV = 8) or 8 KB (BV = 16) tiles with its token's inputs loaded once and the slot-grid scan paid once per G tiles
#   -- against the op's default and the lean slot-grid kernel ([K, V], 4 warps, PDL), one process.
#   (carry [".whl", ".tcache"], timeout_s 590; run 170's command after it in the same call)
#   Predicted (RESULTS, session 32): G=1 near the op's 8/4 slot grid (431 us, run 169), less its masks: ~380 us;
#   G=2 ~320; G=4 ~285; G=16 ~275 (its 64 KB programs drain at the grid's end as the [K, V] tile's do); batch order
#   at G=4 below the slot grid's G=4.  None >= 96% (263.7 us).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc
mkdir -p /tmp/tc $OUT/p; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 170 python3 bench/decode_structure_probe.py --out $OUT/p --flat "" --blocks "" --chunks "" \
  --two-pass "" --hold "" --one-pass "" --op-caps "" --slot-grid 64/4/1/0/seven/1 \
  --vk-loop 8/1/4/1/1/1,8/2/4/2/1/1,8/4/4/2/1/1,8/16/4/2/1/1,8/16/4/3/1/1,8/4/4/2/0/1,8/16/2/2/1/1,16/4/4/2/1/1,16/8/4/2/1/1,8/4/4/1/1/1,8/8/4/2/1/1,16/2/4/2/1/1 \
  > $OUT/run172_probe.log 2>&1
grep -v "^ *$" $OUT/run172_probe.log | grep -v "Warn\|warn" | tail -30
