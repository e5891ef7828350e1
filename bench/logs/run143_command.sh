# run 143 (prepared in session 27 for the next session's first call; refused in session 27 for want of device time):
#   bash bench/logs/run143_command.sh   (carry [".whl", ".tcache"]; ~5 min; call with timeout_s 480)
# (1) Gated DeltaNet's training with FLA's in-kernel gate after the change that launches the gate apart
#     (ChunkTrainConfig.gate_launchable takes a scalar decay; the chunk launches are the member with g given on its own
#     configs: 64-row chunks, the folded backward) beside FLA's (guard lifted: time only), both shapes.
#     Predicted: run 141's g-given step (4.997 / 3.391 ms) + the gate's two launches (~0.03 ms: z, g and dg, 4-12 MB)
#     -> ~5.03 / ~3.42 against FLA's 5.289 / 3.645 (run 142): ~1.05x / ~1.07x (run 142, before: 0.746x / 0.724x).
# (2) DeltaNet's default after its few-head shape took 64-row chunks: predicted 4.20 / 2.91 ms against FLA's
#     4.56 / 3.02 (1.09x / 1.035x; run 142's c64h row had the same configs).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m $OUT/d; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 200 python3 bench/member_train_variants.py --out $OUT/m --member gdn_gate --variants default \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 60 --budget 180 --fla-gdn-unguarded > $OUT/run143_gdn_gate.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run143_gdn_gate.log | grep -v "^       0.0[0-3]" | tail -45
timeout -k 5 -s INT 200 python3 bench/member_train_variants.py --out $OUT/d --member deltanet --variants default \
  --error-shape 1,256,2,128 --warm-workers 14 --warm-budget 60 --budget 180 > $OUT/run143_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run143_deltanet.log | grep "ms  finite\|^errors\|FLA /" | tail -12
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
