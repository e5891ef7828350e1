# run 142 (session 27): (1) Gated DeltaNet's training with FLA's in-kernel gate (use_gate_in_kernel, A_log, dt_bias:
# the layer's call; kdagen keeps 32-row chunks and the unfolded split there) beside FLA's (guard lifted: time only),
# both shapes, errors at (1, 512, 2, 128); (2) DeltaNet at (2, 16384, 16) on 64-row chunks beside FLA (run 140 cut).
#   bash bench/logs/run142_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 450)
# Predicted: (1) kdagen ~5.6 / ~4.0 ms (the g-given step at 32 rows, run 135, plus the gate's launches ~0.3 ms),
#   FLA's ~5.4 / ~3.7 (its gate fused into its cumsum): ~0.95x -- unknown; (2) c64h ~2.7 ms against 2.98 (the state
#   passes' steps halved at few heads, as GDN's 3.88 -> 3.40).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m $OUT/d; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 230 python3 bench/member_train_variants.py --out $OUT/m --member gdn_gate --variants default \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 100 --budget 210 --fla-gdn-unguarded > $OUT/run142_gdn_gate.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run142_gdn_gate.log | grep -v "^       0.0[0-3]" | tail -50
timeout -k 10 -s INT 170 python3 bench/member_train_variants.py --out $OUT/d --member deltanet --shapes 2,16384,16,128 \
  --variants default,c64h,c64sw8 --error-shape 1,256,2,128 --warm-workers 14 --warm-budget 60 --budget 150 \
  > $OUT/run142_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run142_deltanet.log | grep -v "^       0.0[0-3]" | tail -45
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
