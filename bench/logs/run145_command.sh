# run 145 (session 28): decode with FLA's in-kernel flags in the kernel itself (the l2-norm of q and k, the beta
#   sigmoid; a Gated DeltaNet gate's dt_bias read per head) -- no torch pre-processing, no dt_bias copy per call.
#   bash bench/logs/run145_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 420)
# Run 144 before the change, graph replay, H=32, K=V=128: gdn_gate B=1 9.76 us vs FLA 8.67 (0.89x), B=256 267 vs 375;
#   gdn_layer B=1 31.3 us vs FLA 8.70 (0.28x), B=256 300 vs 375.  Predicted: gdn_gate B=1 ~7.5 us (run 40's g-given
#   7.4 + the gate's math; the dt_bias copy gone), gdn_layer B=1 ~7.6 us (>= 1.1x), B=256 ~267 us for both (1.40x);
#   gdn_layer's recurrent_o bf16 error 2.9e-3 -> ~1.7e-3 (q, k normalised in fp32, not rounded to bf16: FLA's 1.66e-3).
#   KDA packed decode with use_qk_l2norm_in_kernel (serving.py's new form): as the plain packed form (~3.5 us at B=1).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/f $OUT/s; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 170 python3 bench/family_vs_fla.py --out $OUT/f --only gdn,gdn_gate,gdn_layer,errors,decode \
  --forward-errors-only --budget 160 > $OUT/run145_decode.log 2>&1
grep -v "^\[fla_warm\]\|Warn\|warn" $OUT/run145_decode.log | tail -24
timeout -k 5 -s INT 200 python3 bench/serving.py --out $OUT/s --suite sync,timing > $OUT/run145_serving.log 2>&1
grep "decode\|PASS\|FAIL\|MISS\|eager_split" $OUT/run145_serving.log | tail -40
