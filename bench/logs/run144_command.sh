# run 144 (prepared in session 27; after run 143): Gated DeltaNet's backward launches at 64-row chunks on narrower K
# tiles, kdagen only (FLA's step: run 141, 5.268 / 3.626 ms).
#   bash bench/logs/run144_command.sh   (call with timeout_s 300)
# sm_90 static at C=64 (bench/static_report.py sass_mix, session 27): dqkw on one 128-wide K tile 255 registers,
#   368 bytes spilled, 4,016 instructions per warp; on 64-wide tiles (dq_bk64) 241 registers, no spill, 2,496 per
#   warp in twice the programs.  The wy launch's K loop on 64-wide tiles 172 bytes spilled, 7,416 per warp; on 32-wide
#   (wy_bk32) 104 bytes, 6,320.  (At C=32 both were slower: run 136.)
# Predicted: dq_bk64 dqkw 1.295 -> ~1.2 ms at (1, 8192, 96) (no spill traffic); wy_bk32 1.121 -> ~1.05.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 5 -s INT 240 python3 bench/member_train_variants.py --out $OUT/m --member gdn --no-fla \
  --variants default,dq_bk64,wy_bk32 --error-shape 1,256,2,128 --budget 200 > $OUT/run144_gdn.log 2>&1
grep -v "Warn\|warn" $OUT/run144_gdn.log | grep -v "^       0.0[0-3]" | tail -60
