# run 121 (session 24), one call: the reverse pass's qg as q exp(G) with the scale applied after its dot (FLA's
# order).  Predicted from the bf16 emulation (tests/bf16_interpreter.py, seeds 0-12 at case 2, 0-2 at case 1; here seeds 0-9 at both):
# dh0's error 0.98-1.03x FLA's at every draw (run 118/120: 0.76-2.60x, mean 1.14x at case 2); the other
# gradients within a few % of runs 118/120; the layer call's time unchanged (one [K, BV] multiply per chunk in
# the reverse pass, one fewer per element in the re-run): 6.66 / 9.60 ms (run 119).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b $OUT/l; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 230 python3 bench/bench.py --out $OUT/b --suite bwd_check --check-configs none \
  --seeds 0,1,2,3,4,5,6,7,8,9 > $OUT/run121_check.log 2>&1
grep -c '"kind": "bwd_check"' $OUT/run121_check.log
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
timeout -k 10 -s INT 200 python3 bench/bench.py --out $OUT/l --suite layer \
  --train-shapes "2,16384,16,128;1,8192,96,128" > $OUT/run121_layer.log 2>&1
grep "^layer" $OUT/run121_layer.log
