# run 135 (prepared in session 26 for the next session's first call; refused in session 26 for want of device time):
#   bash bench/logs/run135_command.sh   (carry [".whl", ".tcache"]; ~170 s; call with timeout_s 400)
# Gated DeltaNet's training after run 134 beside FLA (its Triton guard lifted: time only), both shapes:
#   1. g's rows loaded one chunk ahead in both state passes (run 134: the in-loop load put them at 0.812 / 0.607 ms
#      against 0.672 / 0.544 with stored qg and kg at (1, 8192, 96));
#   2. dqkw's diagonal of dA_qk inside its dots (sm_90 static: 2,536 -> 2,240 instructions per warp).
# Predicted: reverse pass ~0.69, state pass ~0.56, dqkw ~1.5 ms -> the step ~5.1 ms at (1, 8192, 96) (~1.03x FLA's
#   5.26), ~3.7 at (2, 16384, 16) (~0.98x FLA's 3.63).  Errors at (1, 512, 2, 128) within 2% of run 134's.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 340 python3 bench/member_train_variants.py --out $OUT/m --member gdn --variants default \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 110 --budget 300 --fla-gdn-unguarded > $OUT/run135_gdn.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run135_gdn.log | tail -60
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
