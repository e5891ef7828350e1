# run 158 (session 29): run 157's finding (small programs, few 16-byte loads per thread: 99% in slot order) applied to
#   the decode: the op's own launch on 8, 16 and 32 warps (fewer loads per thread: 4, 2, 1 per 16 bytes of a 64-wide
#   tile's row share), with register caps where ptxas leaves one program per SM, in both slot orders.
#   Predicted: if the per-thread load count is what costs, 64/16 and 128/32 move toward block_rw's 94.6/96.8%;
#   if the bytes each program holds (32-64 KB) are, nothing here beats 64/2's 93.3/94.8%.  (call with timeout_s 300)
export PYTHONPATH=. PYTHONUNBUFFERED=1
V="64/2/loaded/0,64/8/loaded/0,64/8/loaded/80,64/16/loaded/0,64/16/loaded/64,64/16/updated/0,128/16/loaded/64,128/32/loaded/0,32/8/loaded/0,32/8/loaded/64,32/16/loaded/0,64/4/loaded/128"
VI=$(echo $V | sed 's#,#/identity,#g')/identity
timeout -k 5 -s INT 250 python3 bench/decode_structure_probe.py --out $OUT --flat "" --blocks "128x64/8,128x64/16,128x128/32" \
  --chunks "" --two-pass "" --hold "64/16/0,128/32/0" --one-pass "" --op-caps "$V,$VI" > $OUT/run158_probe.log 2>&1
grep -v "vs op" $OUT/run158_probe.log | tail -40
grep "vs op" $OUT/run158_probe.log | sort | uniq -c | sort -rn | head -5
