# run 117 (prepared in session 23, which spent its device time on runs 115-116), one call:
#   bash bench/logs/run117_command.sh        (carry [".whl", ".tcache"]; call with timeout_s 600)
# The layer call at both shapes against FLA, the default and gate_launch (ChunkTrainConfig: the in-kernel
# gate in launches of its own, then the plain plan's chunk launches on a float32 g; dz, dA_log, ddt_bias
# from dg after the backward).  Predicted: (2, 16384, 16) 6.95 -> ~6.5-6.6 ms (1.21x -> ~1.28x FLA),
# (1, 8192, 96) 10.03 -> ~9.5 ms (1.26x -> ~1.33x); peak memory up by one fp32 g (0.25 / 0.38 GiB: kdagen
# 3.53 / 5.28 GiB against FLA's 3.77 / 5.66 -- the shape-2 margin is 0.24 GiB, so watch it); every gradient
# within bf16 rounding of the default's (the row's gate_launch_diff_vs_default_d* keys).
# If it wins at both shapes: make gate_launch the default for channel-decay in-kernel gates in
# heuristics.default_train_config, and rerun the error check (bench.py --suite bwd_check) on the layer call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 560 python3 bench/bench.py --out $OUT/b --suite layer,whole --variants gate_launch \
  --train-shapes "2,16384,16,128;1,8192,96,128" > $OUT/run117_layer.log 2>&1
grep -iv "warn" $OUT/run117_layer.log | grep "^layer\|  profile\|^ *[0-9.]* ms  x" | head -40
grep -o '"shape": "[0-9,]*"\|"kdagen_[a-z_0-9]*_ms": [0-9.]*\|"kdagen_[a-z_0-9]*_peak_gib": [0-9.]*\|"fla_ms": [0-9.]*\|"fla_peak_gib": [0-9.]*\|"gate_launch_diff[a-z_]*": [0-9.e-]*' $OUT/run117_layer.log | tr '\n' ' '; echo
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
