# run 102: the reverse pass's tiles after run 100 (more stages and warps), each launch alone; bf16
# gradient errors of KDA's training step against float64 beside FLA's (bwd_check).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/v $OUT/c; tar xzf .tcache/autotune.tgz -C /tmp/tc
for m in "kda 2,16384,16,128 a" "deltanet 2,16384,16,128 b" "kda 1,8192,96,128 c"; do
  set -- $m
  timeout -k 5 -s INT 75 python3 bench/state_pass_variants.py --quick --member $1 --shapes $2 --out $OUT/v/$3 --budget 60 > $OUT/run102_$3.log 2>&1
  echo "== $1 $2"; grep -v Warn $OUT/run102_$3.log | grep "'what'" | sed -e "s/'shape': \[[0-9, ]*\], 'C': 32, //" | cut -c1-150
done
timeout -k 5 -s INT 170 python3 bench/bench.py --out $OUT/c --suite bwd_check --shapes "1,8192,96,128" > $OUT/run102_bwd_check.log 2>&1
grep -iv "warn" $OUT/run102_bwd_check.log | grep -v "^    " | tail -30
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
