# run 135 (session 26; 227 s of device time left: kdagen alone, no FLA): Gated DeltaNet's training after run 134 with g's
#   rows loaded one chunk ahead in both state passes (run 134: the in-loop load of g put them at 0.812 / 0.607 ms against
#   0.672 / 0.544 with stored qg and kg at (1, 8192, 96)).  Not a ratio: FLA's figures are run 134's (5.256 / 3.630 ms).
# Predicted: chunk_bwd_state ~0.69, chunk_state ~0.56 -> the step ~5.15 ms at (1, 8192, 96), ~3.7 at (2, 16384, 16).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 5 -s INT 150 python3 bench/member_train_variants.py --out $OUT/m --member gdn --variants default --no-fla \
  --error-shape 1,512,2,128 --budget 140 > $OUT/run135_gdn.log 2>&1
grep -v "Warn\|warn" $OUT/run135_gdn.log | tail -30
