# run 125 (session 25), one call: bash bench/logs/run125_command.sh   (carry [".whl", ".tcache"]; ~300 s)
# DeltaNet's training step with dqkw's chunk pairs in their second form (ChunkBwdConfig.dqkw_pairs: per-chunk
# programs; the pair's programs read S_a and dS_b only and correct with [C, C] products), three tilings,
# against the default and FLA, both shapes; bf16 errors at (1, 512, 2, 128).
# Predicted: dqkw 0.672 -> ~0.55 ms at (2, 16384, 16), 1.038 -> ~0.86 at (1, 8192, 96) (the partner's state
# tiles from L2); the step 3.25 -> ~3.13 (0.97x FLA), 4.63 -> ~4.45 (1.02x).  Errors: within a rounding.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 480 python3 bench/member_train_variants.py --out $OUT/m --member deltanet \
  --variants default,pairs,pairs_bv64,pairs_w8 --error-shape 1,512,2,128 --warm-workers 14 \
  --warm-budget 120 --budget 460 > $OUT/run125_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|^      \|Warn\|warn" $OUT/run125_deltanet.log | tail -30
grep -A4 "profile" $OUT/run125_deltanet.log | grep "dqkw\|profile"
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
