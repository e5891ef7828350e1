# run 154 (session 29): decode_one_pass under slot orders (seven / identity / blocks8) and with an L2 prefetch of a
#   later sequence's tile (touch = 8, 16, 32, 64 sequences ahead)
timeout 500 env PYTHONPATH=. python bench/decode_structure_probe.py --out $OUT --flat "" --blocks "" --chunks "" \
  --two-pass "" --op-caps "" --slot-orders seven,identity,blocks8 --hold "64/2/0/0/seven,64/2/0/0/identity,64/2/0/0/blocks8" \
  --one-pass "64/2/0/0/seven,64/2/0/0/identity,64/2/0/0/blocks8,64/2/0/8/seven,64/2/0/32/seven,64/2/0/64/seven,64/2/1/0/identity,64/4/0/0/identity,64/4/1/0/identity,64/2/0/16/identity" 2>&1 | tail -40
