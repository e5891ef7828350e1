# run 170 (session 32): the final code's serving table beside FLA with [V, K] rows (the heuristic's narrower
#   [V, K] tiles at B=1 / 16 adopted from run 169), and the serving proofs (sync-free and graph capture now also
#   on a [V, K] pool).  (carry [".whl", ".tcache"], timeout_s 590)
#   Predicted: [K, V] rows as run 169 (B=256 packed fp32 266.9-267.0 us); [V, K] rows: B=1 fp32 packed ~2.6 us,
#   B=16 ~13.9 us, B=256 fp32 ~270.8 us, bf16 ~148 us (1.98x FLA's batch fp32 step).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc
mkdir -p /tmp/tc $OUT/t; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
summ() { grep '"kind": "decode' $1 | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['B'], r['op'], r['form'], r['pool'], r.get('layout', 'kv'), r.get('l2norm', ''), r.get('slots', ''), '%.2f' % r.get('graph_us', -1), '%.1f' % r.get('eager_us', -1), '%.1e' % r.get('rel_err_vs_float64', -1), r.get('error', ''))"; }
timeout -k 5 -s INT 180 python3 bench/serving.py --out $OUT/t --suite timing > $OUT/run170_timing.log 2>&1
summ $OUT/run170_timing.log; grep "copy ceiling\|eager B=1" $OUT/run170_timing.log; grep "PASS\|MISS\|FAIL" $OUT/run170_timing.log | sort -u
timeout -k 5 -s INT 200 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run170_serving_gpu.log 2>&1
tail -12 $OUT/run170_serving_gpu.log
