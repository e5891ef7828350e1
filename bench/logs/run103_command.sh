# run 103: main at the end of session 19 (run 102's heuristic) against FLA in one process:
# DeltaNet's and KDA's training step and the layer call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/mt $OUT/b $OUT/c; tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 110 python3 bench/member_train_variants.py --out $OUT/mt --member deltanet --variants default --shapes "2,16384,16,128;1,8192,96,128" --error-shape 1,512,2,128 --budget 95 > $OUT/run103_dn_train.log 2>&1
grep -v "^      \|Warn\|warn" $OUT/run103_dn_train.log | grep -v "^    " | tail -24
timeout -k 10 -s INT 90 python3 bench/fla_warm.py --workers 14 > $OUT/run103_warm.log 2>&1
timeout -k 10 -s INT 250 python3 bench/bench.py --out $OUT/b --suite fwdbwd,layer --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run103_bench.log 2>&1
grep -iv "warn" $OUT/run103_bench.log | grep -v "^    " | tail -60
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
