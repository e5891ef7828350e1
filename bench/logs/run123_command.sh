# run 123 (session 25), one call: bash bench/logs/run123_command.sh   (carry [".whl", ".tcache"]; ~400 s)
# DeltaNet's training step with the forward state pass over pairs of chunks (ChunkTrainConfig.state_pairs),
# three launch shapes, against the default and FLA, both shapes; bf16 errors at (1, 512, 2, 128).
# Predicted: the states-only pass 0.432 -> ~0.30 ms at (2, 16384, 16) and 0.572 -> ~0.40 at (1, 8192, 96)
# (half the sequential steps at <= 1.2x the step time; FLA's h: 0.265 / 0.374), the step 3.249 -> ~3.12 (0.97x
# FLA) and 4.626 -> ~4.45 (1.02x).  Errors: within a rounding of the default's.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 480 python3 bench/member_train_variants.py --out $OUT/m --member deltanet \
  --variants default,spairs,spairs_w8,spairs_s2 --error-shape 1,512,2,128 --warm-workers 14 \
  --warm-budget 120 --budget 460 > $OUT/run123_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|^      \|Warn\|warn" $OUT/run123_deltanet.log | tail -40
grep -A4 "profile" $OUT/run123_deltanet.log | grep "chunk_state\|profile"
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
