# run 150 (session 28): Gated DeltaNet's inference forward after its bf16 plans took 32-row chunks with many state
#   programs (heuristics.infers_on_32_row_chunks, from runs 147-149), beside FLA's, g given, the in-kernel gate and
#   the gate + l2-norm (the last two unmeasured at 32 rows before this run).
#   bash bench/logs/run150_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 300)
# Predicted: (1, 8192, 96) g given 1.194 -> 1.164 ms (1.18x -> 1.21x); gate / gate + l2-norm -2..-3% likewise;
#   (2, 16384, 16) unchanged (128 programs: 64 rows).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/f; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 200 python3 bench/family_vs_fla.py --out $OUT/f --only gdn,gdn_gate,gdn_layer,fwd --budget 190 \
  > $OUT/run150_forward.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run150_forward.log | tail -12
