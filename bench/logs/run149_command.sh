# run 149 (session 28): where 32-row chunks overtake 64-row ones in Gated DeltaNet's inference forward (run 147-148:
#   c32 1.164 against 1.194 ms at (1, 8192, 96): 384 state programs at BV=32; 0.919 against 0.750 at (2, 16384, 16):
#   128 programs), kdagen only, at 192-768 state programs.
#   bash bench/logs/run149_command.sh   (call with timeout_s 240)
# Predicted: c32 wins (>= 2%) from ~384 programs up, loses below ~256.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 5 -s INT 200 python3 bench/member_fwd_variants.py --out $OUT/v --member gdn --no-fla --budget 180 \
  --variants default,c32 --shapes "1,8192,48,128;1,8192,64,128;4,4096,32,128;1,8192,96,128;2,8192,96,128;1,16384,192,128" \
  > $OUT/run149_gdn_fwd.log 2>&1
grep -v "Warn\|warn" $OUT/run149_gdn_fwd.log | tail -14
