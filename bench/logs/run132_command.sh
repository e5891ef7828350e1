# run 132 (session 26): Gated DeltaNet's training with the split intra backward folded into dqkw and the wy launch
#   (ChunkBwdConfig.intra_fold for a scalar decay given as g; the new default) against the unfolded split (run 131's
#   default) and FLA (its Triton guard lifted: time only), both shapes, bf16 errors at (1, 512, 2, 128).
#   (carry [".whl", ".tcache"]; call with timeout_s 420)
# Predicted: the step 6.53 -> ~5.0 ms at (1, 8192, 96) (chunk_bwd_intra's 1.73 ms gone, dqkw ~1.1, wy ~0.9),
#   4.64 -> ~3.6 at (2, 16384, 16); FLA 5.27 / 3.63 -> ~1.05x / ~1.0x.  Errors equal to the unfolded split's to 2 digits.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 380 python3 bench/member_train_variants.py --out $OUT/m --member gdn --variants default,unfold \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 110 --budget 340 --fla-gdn-unguarded > $OUT/run132_gdn.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run132_gdn.log | tail -60
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
