# run 157 (session 29): run 156 found Triton's flat in-place kernel at 99.2% of copy in 4 KB programs (4 warps, slots
#   in order) and 93.7% in 8 KB ones: which quantity the cliff follows -- bytes per program, 16-byte loads per
#   thread, bytes in flight per SM -- and whether small programs also reach it with the slots scrambled.
#   (call with timeout_s 240)
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -k 5 -s INT 200 python3 bench/decode_structure_probe.py --out $OUT \
  --flat "1024/4/seven,1024/4/random,512/4/identity,512/2/identity,1024/2/identity,1024/8/identity,2048/8/identity,2048/16/identity,4096/16/identity,512/4/seven" \
  --blocks "" --chunks "" --two-pass "" --op-caps "" --hold "" --one-pass "" > $OUT/run157_probe.log 2>&1
tail -20 $OUT/run157_probe.log
