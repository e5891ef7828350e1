python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc; tar xzf .tcache/autotune.tgz -C /tmp/tc
CS=$(ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1); echo "sanitizer: $CS"
for v in c64b c64c c64d c64a; do timeout -k 5 90 python3 bench/member_train_variants.py --launch-check $v > $OUT/run94_check_$v.log 2>&1 & done; wait
tail -n 3 $OUT/run94_check_*.log
timeout -k 5 -s INT 90 python3 bench/decode_ceiling.py --pairs 64/2,64/4,128/4,128/8 > $OUT/run94_decode_ceiling.log 2>&1
timeout -k 5 -s INT 60 python3 bench/decode_variants.py --out $OUT --batches 1,16 --readouts updated,loaded --pairs "float32:64/2,float32:16/1,float32:32/1,float32:32/2,float32:16/2,float32:64/4" > $OUT/run94_decode_b1.log 2>&1
cat $OUT/run94_decode_ceiling.log; grep -v "^$" $OUT/run94_decode_b1.log | tail -30
timeout -k 10 -s INT 230 python3 bench/member_train_variants.py --out $OUT --member deltanet --variants default,c64a --budget 200 > $OUT/run94_deltanet_train.log 2>&1
grep -v "^      " $OUT/run94_deltanet_train.log | tail -20
if [ -n "$CS" ] && ! grep -q "every launch ran" $OUT/run94_check_c64b.log; then timeout -k 5 120 $CS --tool memcheck --print-limit 5 python3 bench/member_train_variants.py --launch-check c64b --error-shape 1,256,2,128 > $OUT/run94_memcheck_c64b.log 2>&1; tail -n 40 $OUT/run94_memcheck_c64b.log; fi
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
