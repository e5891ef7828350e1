# run 151 (session 29): bench/decode_structure_probe.py's first version, its default rows (flat blocks, tile shapes,
#   chunk loops, the two-pass decode). Its two-pass "vs op" column after the first row compared against a pool the
#   timing had already advanced (fixed before run 152: the op's answer is taken first, on a copy); timings stand.
#   (call with timeout_s 560)
timeout 500 env PYTHONPATH=. python bench/decode_structure_probe.py --out $OUT 2>&1 | tail -60
