# run 134 (session 26): Gated DeltaNet's training with the split intra backward folded into dqkw and the wy launch
#   (ChunkBwdConfig.intra_fold for a scalar decay given as g; the new default) against the unfolded split (run 131's
#   default) and FLA (its Triton guard lifted: time only), both shapes, bf16 errors at (1, 512, 2, 128).
#   (carry [".whl", ".tcache"]; call with timeout_s 420)
# After run 133 (GDN fold: 5.642 / 4.015 ms against FLA 5.258 / 3.624, 0.93x / 0.90x): Plan.qk_row_scaled, no qg or kg
#   written by the forward's intra launch or the re-run (a scalar decay given as g, half precision): the state passes
#   and the output launch take q, k and row scales exp(G), exp(G_n - G) from g on [BT, BV] tiles.
# Predicted: chunk_intra 0.99 -> ~0.55 ms, re-run 0.365 -> ~0.17 at (1, 8192, 96); state passes +0.05 each ->
#   the step ~5.1 ms (~1.03x); at (2, 16384, 16) 4.02 -> ~3.6 (~1.0x).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 340 python3 bench/member_train_variants.py --out $OUT/m --member gdn --variants default \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 110 --budget 300 --fla-gdn-unguarded > $OUT/run134_gdn.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run134_gdn.log | tail -60
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
