# run 107: main at the end of session 20 against FLA in one process: KDA's training step and the layer call
# (with the fp32-diagonal variants for issue 17's error bar), then DeltaNet's training step.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b $OUT/mt; tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 90 python3 bench/fla_warm.py --workers 14 > $OUT/run107_warm.log 2>&1
timeout -k 10 -s INT 230 python3 bench/bench.py --out $OUT/b --suite fwdbwd,layer,whole --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run107_bench.log 2>&1
grep -iv "warn" $OUT/run107_bench.log | grep "^fwd+bwd\|^layer\|x[12] " | head -60
grep -o '"shape": "[0-9,]*"\|"kdagen_[a-z_0-9]*diag_tf32_ms": [0-9.]*\|"fla_ms": [0-9.]*' $OUT/run107_bench.log | tr '\n' ' '; echo
timeout -k 10 -s INT 85 python3 bench/member_train_variants.py --out $OUT/mt --member deltanet --variants default --shapes "2,16384,16,128;1,8192,96,128" --error-shape 1,512,2,128 --budget 75 > $OUT/run107_dn_train.log 2>&1
grep -v "^      \|Warn\|warn" $OUT/run107_dn_train.log | grep -v "^    " | tail -14
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
