python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc; tar xzf .tcache/autotune.tgz -C /tmp/tc
S="bench/state_pass_variants.py --no-sweep --budget 60"
timeout -k 5 -s INT 80 python3 $S --member deltanet --shapes "2,16384,16,128;1,8192,96,128" --out $OUT/dn > $OUT/run99_dn.log 2>&1
timeout -k 5 -s INT 80 python3 $S --member kda --shapes "2,16384,16,128;1,8192,96,128" --out $OUT/kda > $OUT/run99_kda.log 2>&1
grep -h "local\|default" $OUT/run99_*.log | cut -c1-300
