python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc; tar xzf .tcache/autotune.tgz -C /tmp/tc
S=bench/state_pass_variants.py
timeout -k 5 -s INT 170 python3 $S --member deltanet --shapes 2,16384,16,128 --fla --out $OUT/dn2 --budget 150 > $OUT/run97_dn2.log 2>&1
grep -v Warn $OUT/run97_dn2.log | grep -v "^  " | cut -c1-260 | tail -40
timeout -k 5 -s INT 120 python3 $S --member kda --shapes 2,16384,16,128 --out $OUT/kda2 --budget 100 > $OUT/run97_kda2.log 2>&1
grep -v Warn $OUT/run97_kda2.log | cut -c1-200 | tail -30
timeout -k 5 -s INT 120 python3 $S --member deltanet --shapes 1,8192,96,128 --out $OUT/dn1 --budget 100 > $OUT/run97_dn1.log 2>&1
grep -v Warn $OUT/run97_dn1.log | cut -c1-200 | tail -30
NCU="/usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis"
command -v ncu >/dev/null && NCU="ncu ${NCU#* }"
timeout -k 5 60 $NCU --kernel-name regex:"chunk_state|chunk_bwd_state" --launch-skip 2 --launch-count 2 python3 bench/profile_state.py 2,16384,16,128 --member deltanet > $OUT/run97_ncu_ours.txt 2>&1
timeout -k 5 60 $NCU --kernel-name regex:"kernel_h_blockdim|dhu_blockdim" --launch-skip 3 --launch-count 3 python3 bench/profile_state.py 2,16384,16,128 --member deltanet --fla > $OUT/run97_ncu_fla.txt 2>&1
tail -5 $OUT/run97_ncu_ours.txt $OUT/run97_ncu_fla.txt
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
