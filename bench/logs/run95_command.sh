python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc; tar xzf .tcache/autotune.tgz -C /tmp/tc
CS=/usr/local/cuda-13.0/bin/compute-sanitizer
M="python3 bench/member_train_variants.py --member deltanet"
for v in default c64b; do PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 5 120 $CS --tool memcheck --print-limit 8 $M --out $OUT/mc_$v --variants $v --errors-only --error-shape 1,256,2,128 > $OUT/run95_memcheck_$v.log 2>&1 & done
for v in c64a c64c c64d; do timeout -k 5 100 $M --launch-check $v > $OUT/run95_check_$v.log 2>&1 & done
wait
for f in $OUT/run95_memcheck_*.log; do echo "== $f"; grep -v "^ *$" $f | grep -v "Warning\|warn" | tail -n 25; done
tail -qn 1 $OUT/run95_check_*.log
timeout -k 10 -s INT 140 $M --out $OUT/s1 --variants default,c64a,c64c,c64d --shapes 1,8192,96,128 --budget 100 > $OUT/run95_deltanet_s1.log 2>&1
timeout -k 10 -s INT 140 $M --out $OUT/s2 --variants default,c64a,c64c,c64d --shapes 2,16384,16,128 --budget 100 > $OUT/run95_deltanet_s2.log 2>&1
grep -v "^      " $OUT/run95_deltanet_s*.log | grep -v "Warn\|warn\|return Var"
timeout -k 5 -s INT 60 python3 bench/decode_ceiling.py --pairs 64/2,64/4,128/8 --v-first > $OUT/run95_decode_ceiling.log 2>&1; cat $OUT/run95_decode_ceiling.log
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
