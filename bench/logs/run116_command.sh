# run 116 (session 23), one call: bash bench/logs/run116_command.sh   (carry [".whl", ".tcache"]; ~450 s)
#  1. the l2-norm launches under seven tile geometries at both layer shapes (bench/l2norm_variants.py).
#     Predicted: 64 rows on 8 warps (the new default) from ~50% to >= 80% of copy: fwd 0.127 -> ~0.075 ms,
#     bwd 0.186 -> ~0.11 ms at (2, 16384, 16, 128).
#  2. the layer call at (2, 16384, 16, 128) against FLA (issue 17's 1.25x floor): predicted 6.951 -> ~6.82 ms.
#  3. DeltaNet's step at (2, 16384, 16, 128), the folded default against the split as it was (no FLA: its
#     warm-up alone takes 100 s; FLA 3.015 / 3.004 ms in runs 110-111). Predicted ~3.25 vs 3.62.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b $OUT/m $OUT/l; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 60 python3 bench/l2norm_variants.py --out $OUT/l > $OUT/run116_l2norm.log 2>&1
grep "^|" $OUT/run116_l2norm.log
timeout -k 10 -s INT 230 python3 bench/bench.py --out $OUT/b --suite layer --train-shapes 2,16384,16,128 \
  > $OUT/run116_layer.log 2>&1
grep -iv "warn" $OUT/run116_layer.log | grep "^layer\|  profile\|qk_l2norm\|bwd_intra\|^ *[0-9.]* ms  x" | head -16
timeout -k 10 -s INT 140 python3 bench/member_train_variants.py --out $OUT/m --member deltanet --no-fla \
  --variants default,unfold --shapes 2,16384,16,128 --error-shape 1,64,1,128 --budget 130 > $OUT/run116_deltanet.log 2>&1
grep -v "Warn\|warn\|^      " $OUT/run116_deltanet.log | tail -8
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
