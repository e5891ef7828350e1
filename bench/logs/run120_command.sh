# run 120 (session 24), one call:
# 1. bench/serving.py, every section (sync-free, graph capture, prefill graph, gates, timing, drift), the eager
#    figure now the median of five loops of 1,000 calls (run 96's single 400-call loop put the same Python path
#    at 13.2 and 15.0 us).  Predicted: B=1 eager 13-14 us for both forms; graph replay as run 96.
# 2. the backward error check at case 2 (K=96, V=192), seeds 3-12, default config only (dh0's ratio to FLA:
#    1.29 / 0.96 / 1.09 at seeds 0-2 in run 118; the estimate is the mean over every draw, all reported).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b $OUT/s; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 200 python3 bench/serving.py --out $OUT/s > $OUT/run120_serving.log 2>&1
grep "PASS\|MISS\|FAIL\|^| \|eager B=1" $OUT/run120_serving.log | head -40
timeout -k 10 -s INT 330 python3 bench/bench.py --out $OUT/b --suite bwd_check --check-cases 2 --check-configs none \
  --seeds 3,4,5,6,7,8,9,10,11,12 > $OUT/run120_check.log 2>&1
grep -c '"kind": "bwd_check"' $OUT/run120_check.log; tail -3 $OUT/run120_check.log | cut -c1-300
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
