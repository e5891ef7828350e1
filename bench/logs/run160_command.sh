# run 160 (session 29): is the B=1 decode slower after this session's template change? Runs 155/156/159 timed the
#   fp32 pool at B=1 at 3.48-3.54 / 3.62-3.66 us (batch / packed) against run 145's 3.26 / 3.46 (FLA moved 1-2%).
#   A-B-A on one machine: serving.py's timing suite (kdagen only: FLA not on the path) with this session's template,
#   with session 28's (1a11b72, carried in .tcache/), and with this session's again; heuristics as now.
#   bash bench/logs/run160_command.sh   (carry [".tcache"]; call with timeout_s 400)
export PYTHONPATH=. PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
cp templates/recurrent.py.j2 /tmp/new.j2
for v in new old new2; do
  if [ $v = old ]; then cp .tcache/recurrent_1a11b72.py.j2 templates/recurrent.py.j2; else cp /tmp/new.j2 templates/recurrent.py.j2; fi
  mkdir -p $OUT/$v
  KDAGEN_CACHE_DIR=/tmp/kdc_$v timeout -k 5 -s INT 110 python3 bench/serving.py --out $OUT/$v --suite timing > $OUT/run160_$v.log 2>&1
  echo "== $v"; grep '"kind": "decode' $OUT/run160_$v.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['B'], r['form'], r['pool'], r.get('l2norm', ''), r.get('slots', ''), '%.2f' % r['graph_us'])"
done
cp /tmp/new.j2 templates/recurrent.py.j2
