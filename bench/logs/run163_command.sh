# run 163 (session 30): (1) the slot grid's padding job read off the scan (pad_job=2) instead of a second load;
#   (2) is the rest the grid's tail? decode_slot_tail gives the last 8-32 slot rows narrower V tiles (16/32), and the
#   slot grid at B=128 and B=512 says whether a fixed drain time is being paid (then % of copy rises with B).
#   Predicted: pad_job=2 ~= pad_job=0 (265.5/264.8); if the tail costs ~3% (half a program's ~16 us life), the tail
#   split gains 1-2% and B=512 reads ~1.5% above B=256.  (timeout_s 300)
export PYTHONPATH=. PYTHONUNBUFFERED=1
SG="64/2/1/0,64/4/1/0,64/2/1/2,64/4/1/2,64/2/1/1,64/4/1/1"
timeout -k 5 -s INT 120 python3 bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" --two-pass "" \
  --hold "" --op-caps "" --one-pass "" --slot-grid "$SG" \
  --slot-tail "64/16/8/2,64/16/16/2,64/16/32/2,64/32/16/2,64/16/8/4,64/16/16/4,64/32/16/4,64/32/32/4" \
  > $OUT/run163_probe256.log 2>&1
for b in 128 512; do
timeout -k 5 -s INT 80 python3 bench/decode_structure_probe.py --out $OUT --batch $b --flat "" --blocks "" --chunks "" --two-pass "" \
  --hold "" --op-caps "" --one-pass "" --slot-grid "64/2/1/2,64/4/1/2" --slot-tail "64/16/16/2,64/16/16/4" > $OUT/run163_probe$b.log 2>&1
done
for f in $OUT/run163_probe*.log; do echo "== $f"; grep -v "vs op" $f; grep "vs op" $f | awk '{print $(NF-2), $(NF-1), $NF}' | sort | uniq -c; done
