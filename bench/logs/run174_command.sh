# run 174 (session 33): (1) the eager B=1 figure's spread over rounds (run 173's table read 16.0 us for the packed
#   form and its split 12.6 us in one process); (2) the probe's vk_loop unpipelined at G = 8, 16 (run 173's fit
#   t(G) = 265.0 + 29.2 / G us from G = 1, 4 predicts 268.6 and 266.8: no better than 96% = 265.0 us).
#   (carry [".whl"], timeout_s <= budget)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc
mkdir -p /tmp/tc $OUT/p
timeout -k 5 -s INT 100 python3 bench/eager_spread.py --rounds 9 > $OUT/run174_eager.log 2>&1; tail -8 $OUT/run174_eager.log
timeout -k 5 -s INT 90 python3 bench/decode_structure_probe.py --out $OUT/p --flat "" --blocks "" --chunks "" \
  --two-pass "" --hold "" --one-pass "" --op-caps "" --slot-grid "" \
  --vk-loop 8/8/4/1/1/1,8/16/4/1/1/1,16/8/4/1/1/1 > $OUT/run174_probe.log 2>&1
grep -v "^ *$" $OUT/run174_probe.log | grep -v "Warn\|warn" | tail -12
