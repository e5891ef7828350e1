# run 108 (prepared in session 21, which had no device time; run it first in the next session), two calls:
#   bash bench/logs/run108_command.sh check    # FLA warm-up, the error check at seeds 0-2    (~340 s)
#   bash bench/logs/run108_command.sh timing   # the training step and the layer call         (~300 s)
# Issue 17's error bar: dh0's ratio to FLA at seed 0 is one bf16 rounding of qg per element (the CPU emulation
# gives 1.81 / 1.51 / 1.80e-3 at seeds 0-2 of case 2 -- is FLA's 1.40 as noisy?); qg_split (qg as hi + lo,
# emulated 1.81 -> 0.14e-3) and the tf32 diagonal with it, for errors and for speed, plain and layer call.
# FLA's autotune cache (.tcache) was lost with session 20's checkout: the first call warms from scratch and
# brings the autotune results back in $OUT/autotune.tgz: copy it to .tcache/autotune.tgz before the second call
# (a machine given back in between starts bare; with the results, FLA compiles only its winners).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b $OUT/c; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
if [ "$1" = check ]; then
  timeout -k 10 -s INT 240 python3 bench/fla_warm.py --workers 14 > $OUT/run108_warm.log 2>&1
  timeout -k 10 -s INT 100 python3 bench/bench.py --out $OUT/c --suite bwd_check --seeds 0,1,2 > $OUT/run108_check.log 2>&1
  grep '"kind": "bwd_check"' $OUT/run108_check.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line[line.index('{'):])
    print(r['case'], 'seed', r['seed'], ' '.join(f'{k}={v*1e3:.2f}' for k, v in r.items() if k.endswith(('_dg', '_dv', '_dbeta', '_dinitial_state')) and isinstance(v, float)))"
else
  timeout -k 10 -s INT 300 python3 bench/bench.py --out $OUT/b --suite fwdbwd,layer,whole --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run108_bench.log 2>&1
  grep -iv "warn" $OUT/run108_bench.log | grep "^fwd+bwd\|^layer" | head
  grep -o '"shape": "[0-9,]*"\|"kdagen_[a-z_0-9]*_ms": [0-9.]*\|"[a-z_0-9]*_speedup": [0-9.]*\|"fla_ms": [0-9.]*' $OUT/run108_bench.log | tr '\n' ' '; echo
fi
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
