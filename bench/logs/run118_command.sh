# run 118 (session 24): the backward error check at both cases, seeds 0-2 (issue 17's error bar; case 2,
# K=96 V=192, had only seed 0 measured).  bash bench/logs/run118_command.sh  (carry [".whl", ".tcache"])
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 570 python3 bench/bench.py --out $OUT/b --suite bwd_check --seeds 0,1,2 > $OUT/run118_check.log 2>&1
grep '"kind": "bwd_check"' $OUT/run118_check.log | cut -c1-1500
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
