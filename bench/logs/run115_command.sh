# run 115 (prepared in session 22, which spent its device time on runs 108-114), three calls, in this order:
#   bash bench/logs/run115_command.sh deltanet   # DeltaNet: the committed fold (dqkw forms dA_qk in a V pass of its own:
#                                                # 182 registers, no spill) checked in bf16 and timed against the split
#                                                # default and FLA; errors at (1, 512, 2, 128)           (~300 s)
#   bash bench/logs/run115_command.sh kda        # KDA under the new default (diag_precision tf32 for bf16 bounded
#                                                # gates) and with the intra gradients on 4 warps (intra_w4: no
#                                                # spill in pass 2 on sm_90): training step and layer call, both
#                                                # shapes, vs FLA (~450 s; call with timeout_s 600)
#   bash bench/logs/run115_command.sh check2     # the error check at seeds 0-2, both cases (case 2 did not fit run 108)
# Predictions: DeltaNet fold_bk64 dqkw ~0.65 ms (spilling form 0.876) -> step ~3.23 / ~4.75 ms (0.93x / 0.96x FLA);
# KDA default = run 107's diag_tf32 row (8.63 / 5.93 ms, 1.33x / 1.30x); layer (2, 16384, 16) ~6.9 ms (~1.21x);
# intra_w4: pass 2 without its spill, but twice the warps per program -- no prediction of the sign (run 85 chose 2).
# Order: kda first (issue 17's decision), then deltanet, then check2.
# After each call: copy $OUT/autotune.tgz to .tcache/autotune.tgz (carry [".whl", ".tcache"]).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/b $OUT/c $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
case "$1" in
deltanet)
  timeout -k 10 -s INT 320 python3 bench/member_train_variants.py --out $OUT/m --member deltanet \
    --variants default,fold_bk64 --error-shape 1,512,2,128 --warm-workers 14 --warm-budget 90 --budget 300 \
    > $OUT/run115_deltanet.log 2>&1
  grep -v "^\[fla_warm\]\|^      \|Warn\|warn" $OUT/run115_deltanet.log | tail -16 ;;
kda)
  timeout -k 10 -s INT 560 python3 bench/bench.py --out $OUT/b --suite fwdbwd,layer,whole --variants intra_w4 \
    > $OUT/run115_kda.log 2>&1
  grep -iv "warn" $OUT/run115_kda.log | grep "^fwd+bwd\|^layer"
  grep -o '"shape": "[0-9,]*"\|"kdagen_[a-z_0-9]*_ms": [0-9.]*\|"fla_ms": [0-9.]*' $OUT/run115_kda.log | tr '\n' ' '; echo ;;
check2)
  timeout -k 10 -s INT 280 python3 bench/bench.py --out $OUT/c --suite bwd_check --seeds 0,1,2 > $OUT/run115_check.log 2>&1
  grep '"kind": "bwd_check"' $OUT/run115_check.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line[line.index('{'):])
    print(r['case'], 'seed', r['seed'], ' '.join(f'{k}={v*1e3:.2f}' for k, v in r.items() if k.endswith(('_dq', '_dk', '_dg', '_dv', '_dbeta', '_dinitial_state')) and isinstance(v, float)))" ;;
esac
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
