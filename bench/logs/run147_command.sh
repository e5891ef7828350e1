# run 147 (session 28): Gated DeltaNet's inference forward (g given) under ChunkFwdConfig variants, each launch timed
#   alone, beside FLA's chunk_gated_delta_rule and its kernels (profiler), both shapes (bench/member_fwd_variants.py,
#   new).  Its forward was last looked at in run 40 (1.18x / 1.26x); the goal is 1.5x.
#   bash bench/logs/run147_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 420)
# Predicted: la2 (the solve's loads of both halves first, KDA's default, off for a scalar decay) -5..-10% of the solve
#   (KDA's: 1.073 -> 0.966 ms, run 50); the state-pass tiles within +-5% of the default; c32 slower (run 24-26).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/v; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 330 python3 bench/member_fwd_variants.py --out $OUT/v --member gdn --budget 300 > $OUT/run147_gdn_fwd.log 2>&1
grep -v "Warn\|warn" $OUT/run147_gdn_fwd.log | tail -34
