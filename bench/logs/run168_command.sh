# run 168 (planned in session 30, not lent then or in session 31): the final code on the GPU, and session 31's change
#   A-B-A-B on one machine.  A = .ab/base (006f207, session 30's final; `bash bench/ab_snapshot.sh 006f207 base`),
#   B = main (the slot grid's scan loads every sequence's token range beside the slot indices, so a program's state
#   load waits for one round trip to L2 instead of two).  (carry [".whl", ".tcache", ".ab"], timeout_s 590)
#   Predicted: B=256 packed fp32 267.7 -> ~267.0 us (the batch form's figure: its programs have no offsets' load);
#   the batch form unchanged (the same SASS: 199 registers, 2,288 instructions); B=1 and B=16 unchanged (no slot
#   grid below 4,096 pairs).  Then the serving proofs and the slot grid against the batch grid on B.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/a1 $OUT/b1 $OUT/a2 $OUT/b2 $OUT/g; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
summ() { grep '"kind": "decode' $1 | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['B'], r['op'], r['form'], r['pool'], r.get('l2norm', ''), r.get('slots', ''), '%.2f' % r.get('graph_us', -1), '%.1f' % r.get('eager_us', -1), r.get('error', ''))"; }
for s in a1 b1 a2 b2; do
  case $s in a*) root=.ab/base;; b*) root=.;; esac
  case $s in a*) lay="";; b*) lay="--layouts kv";; esac  # (main's [V, K] rows are run 169's; .ab/base has no --layouts)
  env PYTHONPATH=$root KDAGEN_CACHE_DIR=/tmp/kdc_${s:0:1} timeout -k 5 -s INT 75 python3 $root/bench/serving.py --out $OUT/$s --suite timing $lay > $OUT/run168_$s.log 2>&1
done
for s in a1 b1 a2 b2; do echo "== $s"; summ $OUT/run168_$s.log; grep "copy ceiling" $OUT/run168_$s.log; done
env PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc_b timeout -k 5 -s INT 150 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run168_serving_gpu.log 2>&1
tail -11 $OUT/run168_serving_gpu.log
env PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc_b timeout -k 5 -s INT 100 python3 bench/slot_grid_gpu.py --out $OUT/g --batches 256,512 --pdl-ab > $OUT/run168_slot_grid.log 2>&1
grep "^[0-9]* |\|checks" $OUT/run168_slot_grid.log
