# run 131 (session 26): GDN's training beside FLA's with FLA's Triton-version guard lifted (time only: FLA says its
#   gated chunk_bwd_dqkwg is wrong on Triton < 3.7.1 + Hopper, its #640), both shapes, and both profiles kernel by kernel.
#   (carry [".whl", ".tcache"]; call with timeout_s 480)
# Predicted: FLA's GDN step ~ its DeltaNet step + its dg work, ~5.0 / 3.4 ms; kdagen's 6.78 / 4.86 (run 106) -> ~0.7x.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/f; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 420 python3 bench/family_vs_fla.py --out $OUT/f --only gdn,fwdbwd,profile --budget 400 \
  --warm-workers 14 --warm-budget 200 --fla-gdn-unguarded > $OUT/run131_gdn.log 2>&1
grep -v "Warn\|warn\|^\[fla_warm\]" $OUT/run131_gdn.log | tail -70
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
