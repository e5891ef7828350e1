# run 127 (session 25), one call: bash bench/logs/run127_command.sh   (carry [".whl", ".tcache"]; ~200 s)
# DeltaNet's training step with qg and kg no longer written (Plan.raw_qk: no decay, so qg = q scale and kg = k; the
# forward intra launch and the backward's re-run skip them, the state passes and the output launch read q and k),
# against FLA in the same process, both shapes; bf16 errors at (1, 512, 2, 128).
# Predicted: forward intra 0.478 -> ~0.41 and re-run 0.226 -> ~0.16 ms at (2, 16384, 16) (268 MB written fewer in
# each), 0.710 -> ~0.61 and 0.345 -> ~0.25 at (1, 8192, 96); the step 3.248 -> ~3.11 (0.97x FLA), 4.647 -> ~4.45
# (1.02x).  Errors: o and dh0 may move within a rounding (the scale now multiplies the fp32 product).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 300 python3 bench/member_train_variants.py --out $OUT/m --member deltanet \
  --variants default --error-shape 1,512,2,128 --warm-workers 14 \
  --warm-budget 120 --budget 280 > $OUT/run127_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|^      \|Warn\|warn" $OUT/run127_deltanet.log | tail -14
grep -A10 "profile" $OUT/run127_deltanet.log | grep -v Warn
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
