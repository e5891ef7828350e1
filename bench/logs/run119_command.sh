# run 119 (session 24): what qg_split (the reverse pass's qg as hi + lo: dh0's error 10x below FLA's) costs
# now, under the defaults with the gate launched apart (heuristics, session 24), in the layer call and the
# plain step, both shapes, same process as FLA.  Predicted: layer (2, 16384, 16) 6.67 -> ~6.80-6.85 ms (its
# reverse pass has ~1 program per SM, so the extra registers cost no occupancy: only the fp32 qg's bytes),
# (1, 8192, 96) 9.64 -> ~10.09 (run 108's +0.45); the plain step +0.15 / +0.45 ms.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 560 python3 bench/bench.py --out $OUT/b --suite layer,fwdbwd,whole --variants qg_split \
  --train-shapes "2,16384,16,128;1,8192,96,128" > $OUT/run119.log 2>&1
grep "^layer\|speedup\|^ *[0-9.]* ms  x\|  profile" $OUT/run119.log | grep -v "^ *0.0" | head -60
grep -o '"kind": "[a-z_]*"\|"shape": "[0-9,]*"\|"kdagen_[a-z_0-9]*_ms": [0-9.]*\|"kdagen_ms": [0-9.]*\|"kdagen[a-z_0-9]*_peak_gib": [0-9.]*\|"fla_ms": [0-9.]*\|"fla_peak_gib": [0-9.]*\|"qg_split_diff[a-z_]*": [0-9.e-]*' $OUT/run119.log | tr '\n' ' '; echo
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
