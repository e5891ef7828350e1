# run 122 (session 25), one call: bash bench/logs/run122_command.sh   (carry [".whl"]; ~420 s)
# DeltaNet's training step with dqkw on pairs of chunks (ChunkBwdConfig.dqkw_pairs), four tilings, against
# the default (per-chunk dqkw) and FLA, both shapes; bf16 errors at (1, 512, 2, 128).
# Predicted: dqkw 0.672 -> ~0.55 ms at (2, 16384, 16) and 1.052 -> ~0.87 at (1, 8192, 96) (half the per-chunk
# state reads: 0.54 / 0.80 GB less); the step 3.263 -> ~3.15 (0.96x FLA) and 4.640 -> ~4.46 (1.02x).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 540 python3 bench/member_train_variants.py --out $OUT/m --member deltanet \
  --variants default,pairs,pairs_bv64,pairs_w8,pairs_bk64 --error-shape 1,512,2,128 --warm-workers 14 \
  --warm-budget 120 --budget 520 > $OUT/run122_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|^      \|Warn\|warn" $OUT/run122_deltanet.log | tail -40
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
