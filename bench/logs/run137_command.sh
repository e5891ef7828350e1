# run 137 (session 27): can GDN's sequential state passes share the GPU with the chunk-parallel launches after
# them?  bench/overlap_probe.py at both shapes (timing only; launch values not checked).
#   bash bench/logs/run137_command.sh   (call with timeout_s 300)
# Predicted at (2, 16384, 16): reverse pass 0.82 beside dqkw + wy 1.72 -> two streams ~2.1 ms against ~2.54 serial
#   (dqkw at about half its throughput while the pass holds one program per SM); forward ~0.65 against 0.75.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 10 -s INT 240 python3 bench/overlap_probe.py --member gdn > $OUT/run137_overlap.log 2>&1
grep -v "Warn\|warn" $OUT/run137_overlap.log | tail -40
