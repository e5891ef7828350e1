# run 136 (session 27): Gated DeltaNet's training under tile variants (no FLA: its step is 5.287 / 3.644 ms in run
# 135), then Nsight Compute on the two state passes at (2, 16384, 16, 128) (stall reasons per SASS line).
#   bash bench/logs/run136_command.sh   (carry [".whl", ".tcache"]; call with timeout_s 560)
# Predicted (run 135: state 0.505, reverse 0.831, dqkw 1.013, wy 0.718 ms at (2, 16384, 16)): st16 -> 256
#   programs of 4 warps (2 per SM): state ~0.40, reverse ~0.65; dq_bk64 dqkw ~0.95 (4 programs per SM);
#   wy_w4 / wy_bk32 within 5% of the default.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/m; [ -f .tcache/autotune.tgz ] && tar xzf .tcache/autotune.tgz -C /tmp/tc
timeout -k 10 -s INT 300 python3 bench/member_train_variants.py --out $OUT/m --member gdn --no-fla \
  --variants default,st16,st16f,st16b,st32,dq_bk64,fold_w8,wy_w4,wy_bk32 --error-shape 1,256,2,128 --budget 270 \
  > $OUT/run136_gdn.log 2>&1
grep -v "Warn\|warn" $OUT/run136_gdn.log | grep -v "^       0.0[0-3]" | tail -150
timeout -k 10 -s INT 150 ncu --clock-control none --kernel-name regex:"chunk_state|chunk_bwd_state" --launch-skip 2 \
  --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section SourceCounters --import-source yes -o $OUT/run136_state -f python3 bench/profile_state.py 2,16384,16,128 \
  --member gdn > $OUT/run136_ncu.txt 2>&1
ncu --import $OUT/run136_state.ncu-rep --print-details all > $OUT/run136_ncu_details.txt 2>&1
ncu --import $OUT/run136_state.ncu-rep --page source --csv --print-source sass > $OUT/run136_ncu_sass.csv 2>&1
tail -5 $OUT/run136_ncu.txt; grep -i "stall\|Duration\|Registers\|Achieved Occ\|Issued Warp\|No Eligible" $OUT/run136_ncu_details.txt | head -60
ls -la $OUT
