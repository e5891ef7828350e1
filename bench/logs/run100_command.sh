# run 100: the state passes with every tile load issued ahead (A_qk^T read transposed and masked after
# the load; G_n a chunk ahead in the forward) against main before (.old: kdagen, templates and bench of
# f273c3b, with this state_pass_variants.py), each launch alone.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/new $OUT/old; tar xzf .tcache/autotune.tgz -C /tmp/tc
S=bench/state_pass_variants.py
for m in "kda 2,16384,16,128" "deltanet 2,16384,16,128" "kda 1,8192,96,128"; do
  set -- $m
  PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc timeout -k 5 -s INT 75 python3 $S --quick --member $1 --shapes $2 --out $OUT/new/$1_$2 --budget 60 > $OUT/run100_new_$1_$2.log 2>&1
  PYTHONPATH=/tmp/site:.old KDAGEN_CACHE_DIR=/tmp/kdc_old timeout -k 5 -s INT 75 python3 .old/$S --quick --member $1 --shapes $2 --out $OUT/old/$1_$2 --budget 60 > $OUT/run100_old_$1_$2.log 2>&1
  for w in new old; do echo "== $w $1 $2"; grep -v Warn $OUT/run100_${w}_$1_$2.log | grep "'what'" | sed -e "s/'shape': \[[0-9, ]*\], 'C': 32, //" | cut -c1-150; done
done
