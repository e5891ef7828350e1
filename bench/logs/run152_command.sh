# run 152 (session 29): the slot order's cost (seven / identity / reversed / random) on the op and two pure patterns
timeout 500 env PYTHONPATH=. python bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" \
  --two-pass "8x64/1,32x64/2" --slot-orders seven,identity,reversed,random 2>&1 | tail -30
