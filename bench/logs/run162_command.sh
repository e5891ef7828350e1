# run 162 (session 30): slots visited in address order without a sort. decode_slot_grid puts its programs over the
#   pool's slots (row j takes the sequence whose slot is j: a scan of the N slot indices, ~1 KB from L2), so the
#   state streams in address order whatever order the batch holds its slots in.
#   Predicted: slot grid under the scrambled order ~= decode_one_pass under identity (266-268 us, ~95%), i.e.
#   +1.5-2% on decode_one_pass under seven (271-273); the scan and the padding job cost < 0.5%. (timeout_s 300)
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -k 5 -s INT 250 python3 bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" --two-pass "" \
  --hold "" --op-caps "64/2/loaded/0,64/2/loaded/0/identity" \
  --one-pass "64/2/1,64/4/1,64/2/1/0/identity,64/4/1/0/identity" \
  --slot-grid "64/2/1/1,64/4/1/1,64/2/1/0,64/4/1/0,64/2/1/1/identity,64/4/1/1/identity,64/2/1/1/random,64/4/1/1/random,128/4/1/1,128/8/1/1" \
  > $OUT/run162_probe.log 2>&1
grep -v "vs op" $OUT/run162_probe.log | tail -40
grep "vs op" $OUT/run162_probe.log | sort | uniq -c | sort -rn | head -8
