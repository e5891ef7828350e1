# run 165 (session 30): the decode with its first token's loads beside the state's (the peel) and a programmatic
#   dependent launch (PDL), against main at 37a74db (slot grid only), A-B-A on one machine.  B = the new code, carried
#   in .ab/peel (call with carry [".whl", ".tcache", ".ab"], timeout_s 560).
#   Predicted: B=256 scrambled, slot grid 268.6 -> ~267 us with the peel (the probe's one-pass kernel, 266.4-267.4)
#   and a further -0.7 us with PDL (the probe, run 164); B=1 and B=16 unchanged within 2% (session 29's leaner
#   template lost 5-8% at B=1: watched here).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/a1 $OUT/b1 $OUT/a2 $OUT/sa $OUT/sb; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
A="env PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc_a"; B="env PYTHONPATH=.ab/peel KDAGEN_CACHE_DIR=/tmp/kdc_b"
$A timeout -k 5 -s INT 60 python3 bench/slot_grid_gpu.py --out $OUT/a1 --batches 256 > $OUT/run165_a1.log 2>&1
$B timeout -k 5 -s INT 80 python3 .ab/peel/bench/slot_grid_gpu.py --out $OUT/b1 --batches 256 --pdl-ab > $OUT/run165_b1.log 2>&1
$A timeout -k 5 -s INT 60 python3 bench/slot_grid_gpu.py --out $OUT/a2 --batches 256 > $OUT/run165_a2.log 2>&1
for f in a1 b1 a2; do echo "== $f"; grep "^256 |\|checks" $OUT/run165_$f.log; done
$B timeout -k 5 -s INT 80 python3 .ab/peel/bench/serving.py --out $OUT/sb --suite timing > $OUT/run165_serving_b.log 2>&1
$A timeout -k 5 -s INT 80 python3 bench/serving.py --out $OUT/sa --suite timing > $OUT/run165_serving_a.log 2>&1
for f in a b; do echo "== serving $f"; grep '"kind": "decode' $OUT/run165_serving_$f.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['B'], r['form'], r['pool'], r.get('l2norm', ''), r.get('slots', ''), '%.2f' % r.get('graph_us', -1), '%.1f' % r.get('eager_us', -1), r.get('error', ''))"; done
env PYTHONPATH=/tmp/site:.ab/peel KDAGEN_CACHE_DIR=/tmp/kdc_b timeout -k 5 -s INT 150 python3 -m pytest -q -p no:cacheprovider .ab/peel/bench/test_serving_gpu.py -rA > $OUT/run165_serving_gpu.log 2>&1
tail -11 $OUT/run165_serving_gpu.log
