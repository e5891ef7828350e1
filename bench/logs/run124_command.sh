# run 124 (session 25), one call: bash bench/logs/run124_command.sh   (carry [".whl", ".tcache"]; ~200 s, no FLA)
# Timing-only experiment (bench/exp/README.md): the training state pass's pairs as ONE 64-row step on W, U, kg as
# stored (no composition: outputs wrong, only the pass's time is read), with chunk b's state formed and stored
# (w64) and without (nomid), in copies of the repository whose chunk_state template is swapped.
# Predicted (FLA's h per call: 0.265 / 0.374 ms): w64 ~0.29 ms at (2, 16384, 16) and ~0.40 at (1, 8192, 96)
# against the per-chunk pass's 0.432 / 0.572; nomid ~ FLA's h.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m1 $OUT/m2
for e in w64 w64_nomid; do
  rm -rf /tmp/$e && mkdir /tmp/$e && cp -r kdagen templates bench pyproject.toml /tmp/$e/
  cp bench/exp/chunk_state_$e.py.j2 /tmp/$e/templates/chunk_state.py.j2
done
(cd /tmp/w64 && PYTHONPATH=/tmp/site:. timeout -k 10 -s INT 200 python3 bench/member_train_variants.py --out $OUT/m1 \
  --member deltanet --no-fla --variants default,spairs,spairs_s2,spairs_w8 --error-shape 1,64,1,128 --budget 190) \
  > $OUT/run124_w64.log 2>&1
(cd /tmp/w64_nomid && PYTHONPATH=/tmp/site:. timeout -k 10 -s INT 150 python3 bench/member_train_variants.py --out $OUT/m2 \
  --member deltanet --no-fla --variants spairs,spairs_s2 --error-shape 1,64,1,128 --budget 140) \
  > $OUT/run124_nomid.log 2>&1
for f in $OUT/run124_w64.log $OUT/run124_nomid.log; do echo "== $f"; grep -A9 "profile" $f | grep "chunk_state\|profile"; done
