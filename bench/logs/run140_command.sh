# run 140 (session 27): Gated DeltaNet's training with the new default (64-row chunks, the reverse pass on 8 warps
# with many programs: kdagen/cache/heuristics.py trains_on_64_row_chunks) beside FLA (guard lifted: time only), both
# shapes, errors at (1, 512, 2, 128); then DeltaNet at C=64 beside FLA (is 64 rows worth it there too?).
#   bash bench/logs/run140_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 560)
# Predicted: GDN 5.01 / 3.40 ms against FLA 5.29 / 3.64 (1.05x / 1.07x), errors as run 139's c64 rows;
#   DeltaNet c64h / c64sw8 against its default (run 129/130: 4.248 / 2.988 ms): unknown (runs 93-96, an older design,
#   lost 2x at C=64).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m $OUT/d; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 250 python3 bench/member_train_variants.py --out $OUT/m --member gdn --variants default \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 100 --budget 230 --fla-gdn-unguarded > $OUT/run140_gdn.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run140_gdn.log | grep -v "^       0.0[0-3]" | tail -50
timeout -k 10 -s INT 250 python3 bench/member_train_variants.py --out $OUT/d --member deltanet \
  --variants default,c64h,c64sw8,c64s32 --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 90 --budget 230 \
  > $OUT/run140_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run140_deltanet.log | grep "ms  finite\|^errors\|FLA /" | tail -30
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
