# run 144 (session 28): (1) GDN's whole layer call -- FLA's in-kernel gate (A_log, dt_bias) and
#   use_qk_l2norm_in_kernel on raw q and k (Qwen3-Next's call) -- training beside FLA's (guard lifted: time only);
#   (2) the forward, decode and forward errors of gdn_gate and gdn_layer beside FLA's (never timed before);
#   (3) GDN's backward at 64 rows on narrower K tiles, kdagen only (static: dqkw spill 368 -> 0 at BK=64).
#   bash bench/logs/run144_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 600)
# Predicted: (1) run 143's gdn_gate step (5.147 / 3.481 ms) + the l2-norm launches (forward ~0.03-0.05 ms: q and k read
#   and written once, 2 x 2 x 201 MB... at (1, 8192, 96) q+k are 2 x 201 MB bf16 -> ~0.12 ms read+write each way; the
#   backward the same again) -> ~5.4 / ~3.65 against FLA's (its l2norm fwd/bwd kernels added too): ~1.0-1.03x.
#   (2) forward: GDN g-given 1.18-1.26x (runs 111-113); the gate in every launch that reads it in kdagen's inference
#   path -> ~1.1-1.2x.  Decode with the gate: ~1.05x as g given.  (3) dq_bk64 dqkw 1.299 -> ~1.2 ms; wy_bk32 1.131 -> ~1.05.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m $OUT/f $OUT/v; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 215 python3 bench/member_train_variants.py --out $OUT/m --member gdn_layer --variants default \
  --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 50 --budget 195 --fla-gdn-unguarded > $OUT/run144_gdn_layer.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run144_gdn_layer.log | grep -v "^       0.0[0-3]" | tail -45
timeout -k 5 -s INT 190 python3 bench/family_vs_fla.py --out $OUT/f --only gdn_gate,gdn_layer,errors,fwd,decode \
  --forward-errors-only --warm-workers 14 --warm-budget 40 --budget 175 > $OUT/run144_forward.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run144_forward.log | tail -22
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
timeout -k 5 -s INT 150 python3 bench/member_train_variants.py --out $OUT/v --member gdn --no-fla \
  --variants default,dq_bk64,wy_bk32 --error-shape 1,256,2,128 --budget 135 > $OUT/run144_gdn.log 2>&1
grep -v "Warn\|warn" $OUT/run144_gdn.log | grep "ms  finite\|^errors\|dqkw\|_wy_" | tail -24
