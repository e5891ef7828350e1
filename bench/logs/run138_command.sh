# run 138 (session 27): Gated DeltaNet's training at 64-row chunks in today's launches (no FLA: 5.287 / 3.644 ms,
# run 135).  c64h: the heuristic's tiles at C=64; c64w8: dqkw on 8 warps, wy on 4 (no dqkw spill).
#   bash bench/logs/run138_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 300)
# Predicted at (2, 16384, 16): state passes ~0.30 / ~0.55 (FLA's h 0.30, dhu 0.54), out and intra within 10%,
#   dqkw (w8) ~1.0, wy 1.5-2x (sm_90 static: 2x the instructions per row, spilled) -> step ~3.9 (no gain).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 10 -s INT 240 python3 bench/member_train_variants.py --out $OUT/m --member gdn --no-fla \
  --variants default,c64h,c64w8 --error-shape 1,256,2,128 --budget 200 > $OUT/run138_gdn.log 2>&1
grep -v "Warn\|warn" $OUT/run138_gdn.log | grep -v "^       0.0[0-3]" | tail -80
