# run 141 (session 27): Gated DeltaNet's training with the new default (64-row chunks; the reverse pass on 8 warps
# with many programs) beside FLA (guard lifted: time only), both shapes, errors at (1, 512, 2, 128).  Run 140 timed
# the bench's resolution of the default, which took the backward's 32-row config widened to 64 rows (4 warps in the
# reverse pass: 1.243 ms) instead of the op's; bench/member_train_variants.py configs() now resolves as the op does.
#   bash bench/logs/run141_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 330)
# Predicted: 5.01 / 3.40 ms against FLA 5.27 / 3.62 (1.05x / 1.07x); the reverse pass 0.82 ms at (1, 8192, 96).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 270 python3 bench/member_train_variants.py --out $OUT/m --member gdn --variants default \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 90 --budget 250 --fla-gdn-unguarded > $OUT/run141_gdn.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run141_gdn.log | grep -v "^       0.0[0-3]" | tail -50
