# run 168 (session 30): the final code at 5d65241 on the GPU: the serving proofs; the slot grid with and without PDL
#   beside the batch grid at B = 256 and 512 (each row checked against float64); the probe after its refactor (one
#   helper for the step of one item) -- its slot-grid rows should read as in runs 162-164 (265-267 us).
#   (carry [".whl", ".tcache"], timeout_s 400)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/g; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 150 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run168_serving_gpu.log 2>&1
tail -11 $OUT/run168_serving_gpu.log
timeout -k 5 -s INT 100 python3 bench/slot_grid_gpu.py --out $OUT/g --batches 256,512 --pdl-ab > $OUT/run168_slot_grid.log 2>&1
grep "^[0-9]* |\|checks" $OUT/run168_slot_grid.log
timeout -k 5 -s INT 80 python3 bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" --two-pass "" \
  --hold "" --op-caps "" --one-pass "64/2/1" --slot-grid "64/2/1/1,64/4/1/0/seven/1" --slot-tail "64/32/16/4" > $OUT/run168_probe.log 2>&1
grep -v "vs op" $OUT/run168_probe.log | tail -7; grep "vs op" $OUT/run168_probe.log
