# run 164 (session 30): the op with the slot grid (templates/recurrent.py.j2 SLOT_GRID, heuristics.slot_grid).
#   (1) bench/slot_grid_gpu.py: slot grid against batch grid in one process, B = 16..512, P = B+4 in both orders and
#   P = 2B with padding; each row checked against float64.  Predicted: B=256 seven 271 -> ~265 us (95.3%); identity
#   unchanged (~267-268); P = 2B: the unused slots' programs cost < 1%; B=16: no gain (one wave).
#   (2) the probe's slot grid with PDL (griddepcontrol: the next step's programs resident while this one drains):
#   predicted -0.5 to -1 us.  (3) the serving proofs and the serving table beside FLA.  (timeout_s 540)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/s; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 5 -s INT 150 python3 bench/slot_grid_gpu.py --out $OUT > $OUT/run164_slot_grid.log 2>&1
tail -14 $OUT/run164_slot_grid.log
timeout -k 5 -s INT 80 python3 bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" --two-pass "" \
  --hold "" --one-pass "" --op-caps "" --slot-grid "64/2/1/1/seven/0,64/2/1/1/seven/1,64/4/1/1/seven/0,64/4/1/1/seven/1,64/2/1/1/seven/0,64/2/1/1/seven/1" \
  > $OUT/run164_probe.log 2>&1
grep -v "vs op" $OUT/run164_probe.log | tail -9; grep "vs op" $OUT/run164_probe.log | awk '{print $(NF-2),$(NF-1),$NF}' | sort | uniq -c
timeout -k 5 -s INT 150 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run164_serving_gpu.log 2>&1
tail -11 $OUT/run164_serving_gpu.log
timeout -k 5 -s INT 150 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run164_serving.log 2>&1
grep "PASS\|FAIL\|MISS" $OUT/run164_serving.log | tail -8
