# run 182 (session 37): on an H200 (the issue's card), run 181's H200 rows (tile groups, serving proofs, serving
#   table).  On another card, Nsight Compute on one B=256 fp32-pool step of the op ([K, V] and [V, K] defaults)
#   and on torch's in-place mul_ over the same pool: DRAM bytes moved, throughput, stalls -- what the op does
#   that mul_ does not.  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name"
case "$name" in *H200*) exec bash bench/logs/run181_command.sh;; esac
M=dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis"
for t in "kv:recurrent:" "vk:recurrent:--state-v-first" "mul:MulFunctor:--mul"; do
  IFS=: read tag kn extra <<< "$t"
  timeout -k 5 -s INT 120 ncu --clock-control none --kernel-name-base demangled --kernel-name regex:$kn --launch-skip 2 --launch-count 1 --print-details all $S \
    --metrics $M python3 bench/decode_ncu_target.py $extra > $OUT/run182_ncu_$tag.txt 2>&1
  echo "== $tag"; grep -E "against float64|Duration|DRAM Throughput|dram__|lts__t_sectors|Registers Per|Achieved Occupancy|Block Limit Reg|Warp Cycles Per Issued|Issued Warp Per|No Eligible|smsp__inst_executed|sm__warps_active" $OUT/run182_ncu_$tag.txt | head -30
done
