python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc; tar xzf .tcache/autotune.tgz -C /tmp/tc
S=bench/state_pass_variants.py
timeout -k 5 -s INT 150 python3 $S --member deltanet --shapes 2,16384,16,128 --fla --out $OUT/dn2 --budget 130 > $OUT/run97_dn2.log 2>&1
grep -v Warn $OUT/run97_dn2.log | grep -v "^  " | cut -c1-230 | tail -40
timeout -k 5 -s INT 100 python3 $S --member kda --shapes 2,16384,16,128 --out $OUT/kda2 --budget 80 > $OUT/run97_kda2.log 2>&1
grep -v Warn $OUT/run97_kda2.log | cut -c1-200 | tail -30
timeout -k 5 -s INT 100 python3 $S --member deltanet --shapes 1,8192,96,128 --out $OUT/dn1 --budget 80 > $OUT/run97_dn1.log 2>&1
grep -v Warn $OUT/run97_dn1.log | cut -c1-200 | tail -30
timeout -k 10 -s INT 130 python3 bench/member_train_variants.py --out $OUT/mt --member deltanet --variants default,split,split_w2 --shapes "2,16384,16,128;1,8192,96,128" --error-shape 1,512,2,128 --budget 110 > $OUT/run97_dn_train.log 2>&1
grep -v "^      \|Warn\|warn" $OUT/run97_dn_train.log | tail -40
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
