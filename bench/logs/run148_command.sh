# run 148 (session 28): Gated DeltaNet's inference forward, the pass's tiles on 32-row chunks (run 147: the 32-row solve
#   0.316 against 0.504 ms at (1, 8192, 96), the 32-row pass 0.853 against 0.691; c32 1.164 against 1.194 ms there,
#   0.919 against 0.750 at (2, 16384, 16)) and the 64-row pass on 8 warps, kdagen only (FLA: run 147, 1.405 / 0.945).
#   bash bench/logs/run148_command.sh   (call with timeout_s 240)
# Predicted: a 32-row pass near 0.75 ms at (1, 8192, 96) with 64-wide tiles (half the programs re-reading q, k, kgL,
#   P) would make c32 ~1.07 ms (1.31x); sw8 within +-5% of the default.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 5 -s INT 200 python3 bench/member_fwd_variants.py --out $OUT/v --member gdn --no-fla --budget 180 \
  --variants default,c32,sw8,c32sw8,c32bv64,c32bv64w8,c32ss2,c32ss4,c32np > $OUT/run148_gdn_fwd.log 2>&1
grep -v "Warn\|warn" $OUT/run148_gdn_fwd.log | tail -20
