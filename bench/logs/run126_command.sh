# run 126 (session 25), one call: bash bench/logs/run126_command.sh   (carry [".whl", ".tcache"]; ~200 s)
# DeltaNet's training step with the folded dqkw on narrower K tiles (run 125 found dqkw not bound by its state
# reads: any added work slowed it; its 182 registers leave 2 programs of 4 warps per SM).  Against the default and
# FLA, both shapes.  Predicted: BK=64 (128 registers, 4 programs per SM) dqkw 0.677 -> ~0.6 ms at (2, 16384, 16)
# and 1.040 -> ~0.9 at (1, 8192, 96) despite the dA pass done twice per chunk; BK=32 no better than 64.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 480 python3 bench/member_train_variants.py --out $OUT/m --member deltanet \
  --variants default,dq_bk64,dq_bk64_bv32,dq_bk32 --error-shape 1,512,2,128 --warm-workers 14 \
  --warm-budget 120 --budget 460 > $OUT/run126_deltanet.log 2>&1
grep -v "^\[fla_warm\]\|^      \|Warn\|warn" $OUT/run126_deltanet.log | tail -30
grep -A4 "profile" $OUT/run126_deltanet.log | grep "dqkw\|profile"
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
