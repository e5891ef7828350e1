# run 171 (session 32): session 31's shorter slot-grid scan timed A-B-A-B on one machine, kdagen alone, [K, V] rows:
#   A = .ab/base (006f207, session 30's final; `bash bench/ab_snapshot.sh 006f207 base`), B = main.
#   (carry [".whl", ".tcache", ".ab"], timeout_s 590)
#   Predicted: B=256 packed fp32 267.6-267.7 (A) -> 266.9-267.0 us (B); the batch form and B = 1, 16 within noise.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/a1 $OUT/b1 $OUT/a2 $OUT/b2; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
summ() { grep '"kind": "decode' $1 | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['B'], r['op'], r['form'], r['pool'], r.get('l2norm', ''), r.get('slots', ''), '%.2f' % r.get('graph_us', -1), '%.1f' % r.get('eager_us', -1), r.get('error', ''))"; }
for s in a1 b1 a2 b2; do
  case $s in a*) root=.ab/base; lay="";; b*) root=.; lay="--layouts kv";; esac
  env PYTHONPATH=$root KDAGEN_CACHE_DIR=/tmp/kdc_${s:0:1} timeout -k 5 -s INT 90 python3 $root/bench/serving.py --out $OUT/$s --suite timing $lay > $OUT/run171_$s.log 2>&1
done
for s in a1 b1 a2 b2; do echo "== $s"; summ $OUT/run171_$s.log; grep "copy ceiling" $OUT/run171_$s.log; done
