python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc; tar xzf .tcache/autotune.tgz -C /tmp/tc
M="python3 bench/member_train_variants.py --errors-only --error-shape 1,256,2,128 --variants default,c64h --no-fla"
timeout -k 5 100 $M --member deltanet --out $OUT/dn > $OUT/run96_c64_deltanet.log 2>&1 &
timeout -k 5 100 $M --member gdn --out $OUT/gdn > $OUT/run96_c64_gdn.log 2>&1 &
wait
grep errors $OUT/run96_c64_*.log
timeout -k 5 -s INT 150 python3 bench/serving.py --out $OUT --suite timing > $OUT/run96_serving.log 2>&1
grep -v "^{" $OUT/run96_serving.log | tail -30
timeout -k 5 -s INT 60 python3 bench/dplr_decode_variants.py --pairs 64/2,16/1,32/2 > $OUT/run96_dplr_decode.log 2>&1; cat $OUT/run96_dplr_decode.log
timeout -k 10 -s INT 150 python3 bench/member_train_variants.py --out $OUT/s2 --member deltanet --variants default --shapes 2,16384,16,128 --budget 120 > $OUT/run96_deltanet_s2.log 2>&1
grep -v "^      \|Warn\|warn" $OUT/run96_deltanet_s2.log | tail -8
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
