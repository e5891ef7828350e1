# run 153 (session 29): the op's launch under register caps (maxnreg), the tile held across a reduction (hold_rw,
#   0-3 row vectors), the op's structure without masks or 64-bit offset tensors (decode_one_pass)
timeout 500 env PYTHONPATH=. python bench/decode_structure_probe.py --out $OUT --flat "" --blocks "128x64/2" --chunks "" \
  --two-pass "" 2>&1 | tail -40
