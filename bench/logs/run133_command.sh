# run 133 (session 26): Gated DeltaNet's training with the split intra backward folded into dqkw and the wy launch
#   (ChunkBwdConfig.intra_fold for a scalar decay given as g; the new default) against the unfolded split (run 131's
#   default) and FLA (its Triton guard lifted: time only), both shapes, bf16 errors at (1, 512, 2, 128).
#   (carry [".whl", ".tcache"]; call with timeout_s 420)
# After run 132 (dqkw 1.18 -> 2.12 ms: 564 bytes of spill): the loop over V first, dW stored before dA_qk's pass,
#   dg's A_qk part from one [C, C] tile (M = (D o dA) o Q K^T: row sums less column sums); static sm_90: spill 0,
#   2,536 instructions per warp (DeltaNet's fold 1,104); on 8 warps 128 registers, 1,696 per warp (variant fold_w8).
# Predicted: dqkw ~1.3 ms at (1, 8192, 96) -> the step ~5.3 ms (1.0x FLA's 5.28); fold_w8 within 0.1 ms of it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 380 python3 bench/member_train_variants.py --out $OUT/m --member gdn --variants default,fold_w8,unfold \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 110 --budget 330 --fla-gdn-unguarded > $OUT/run133_gdn.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run133_gdn.log | tail -60
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
