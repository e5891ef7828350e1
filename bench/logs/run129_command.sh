# run 129 (prepared in session 25, for the next session's first call): bash bench/logs/run129_command.sh
#   (carry [".whl", ".tcache"]; ~400 s; call with timeout_s 560)
# Issue 15's last missing same-process figures on the H200:
#  1. GLA's training without a bound (chunk_gla as FLA's users call it) against FLA at both shapes: kdagen 6.56 /
#     5.05 ms (runs 85, 91) were set against FLA's 8.81 ms from run 41 (another process), and FLA's second shape was
#     never timed on the H200 (run 82's 7.27 ms was an H100).  Predicted >= 1.2x at both.
#  2. DeltaNet's training re-timed beside FLA (run 127: 1.07x / 1.01-1.07x; FLA's timed median at the second shape
#     disagreed with its profile).  Predicted 2.98-2.99 / 4.24 ms against FLA's 3.01-3.02 / 4.55.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/f $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 300 python3 bench/family_vs_fla.py --out $OUT/f --only gla,fwdbwd,profile --budget 280 \
  --warm-workers 14 --warm-budget 120 > $OUT/run129_gla.log 2>&1
grep -v "Warn\|warn\|^      " $OUT/run129_gla.log | grep -i "gla\|fwd+bwd\|FLA" | tail -12
timeout -k 10 -s INT 230 python3 bench/member_train_variants.py --out $OUT/m --member deltanet --variants default \
  --error-shape 1,64,1,128 --warm-workers 14 --warm-budget 100 --budget 210 > $OUT/run129_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|^      \|Warn\|warn" $OUT/run129_deltanet.log | tail -8
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
