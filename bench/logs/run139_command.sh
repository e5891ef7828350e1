# run 139 (session 27): Gated DeltaNet at C=64, the tiles of the launches that lost at (1, 8192, 96) in run 138
# (no FLA: 5.287 / 3.644 ms in run 135).
#   bash bench/logs/run139_command.sh   (call with timeout_s 300)
# Predicted at (1, 8192, 96): the reverse pass on 32-wide tiles (384 programs, 4 B spilled against 16) 1.24 -> ~0.8 ms,
#   the step 5.44 -> ~5.0 (1.06x FLA); 8 warps ~0.9; the forward intra on 8 warps 0.76 -> ~0.68.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 10 -s INT 260 python3 bench/member_train_variants.py --out $OUT/m --member gdn --no-fla \
  --variants c64h,c64s32,c64s32s2,c64sw8,c64s32i8r2 --error-shape 1,256,2,128 --budget 230 > $OUT/run139_gdn.log 2>&1
grep -v "Warn\|warn" $OUT/run139_gdn.log | grep -v "^       0.0[0-3]" | tail -80
