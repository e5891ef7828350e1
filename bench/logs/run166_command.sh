# run 166 (session 30): is the first token's peel worth keeping beside PDL?  A-B-A-B on one machine: C = main at
#   37a74db + PDL (.ab/pdl), B = + PDL + the peel (.ab/peel; run 165's B).  serving.py's timing suite, kdagen alone
#   (C, B), then beside FLA (C, B); and the serving proofs with C.  (carry [".whl", ".tcache", ".ab"], timeout_s 560)
#   Predicted: B=256 equal (run 165: the peel moved nothing there); B=1/16: the peel within +-3%.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/c1 $OUT/b1 $OUT/c2 $OUT/b2; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
summ() { grep '"kind": "decode' $1 | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['B'], r['op'], r['form'], r['pool'], r.get('l2norm', ''), r.get('slots', ''), '%.2f' % r.get('graph_us', -1), '%.1f' % r.get('eager_us', -1), r.get('error', ''))"; }
env PYTHONPATH=.ab/pdl KDAGEN_CACHE_DIR=/tmp/kdc_c timeout -k 5 -s INT 80 python3 .ab/pdl/bench/serving.py --out $OUT/c1 --suite timing > $OUT/run166_c1.log 2>&1
env PYTHONPATH=.ab/peel KDAGEN_CACHE_DIR=/tmp/kdc_b timeout -k 5 -s INT 80 python3 .ab/peel/bench/serving.py --out $OUT/b1 --suite timing > $OUT/run166_b1.log 2>&1
env PYTHONPATH=/tmp/site:.ab/pdl KDAGEN_CACHE_DIR=/tmp/kdc_c timeout -k 5 -s INT 130 python3 .ab/pdl/bench/serving.py --out $OUT/c2 --suite timing > $OUT/run166_c2.log 2>&1
env PYTHONPATH=/tmp/site:.ab/peel KDAGEN_CACHE_DIR=/tmp/kdc_b timeout -k 5 -s INT 130 python3 .ab/peel/bench/serving.py --out $OUT/b2 --suite timing > $OUT/run166_b2.log 2>&1
for f in c1 b1 c2 b2; do echo "== $f"; summ $OUT/run166_$f.log | grep kdagen; grep "copy ceiling" $OUT/run166_$f.log; done
echo "== FLA (c2, b2)"; summ $OUT/run166_c2.log | grep fla; summ $OUT/run166_b2.log | grep fla
grep "PASS\|FAIL\|MISS" $OUT/run166_b2.log | tail -6
env PYTHONPATH=/tmp/site:.ab/pdl KDAGEN_CACHE_DIR=/tmp/kdc_c timeout -k 5 -s INT 150 python3 -m pytest -q -p no:cacheprovider .ab/pdl/bench/test_serving_gpu.py -rA > $OUT/run166_serving_gpu_c.log 2>&1
tail -3 $OUT/run166_serving_gpu_c.log
