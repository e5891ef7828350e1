# run 104: the intra gradients' pass 2 with dG_n and dqg loaded at the top of its K tile (HEAD), against
# the commit before it (.ab/before: bench/ab_snapshot.sh a822ea9 before), kdagen alone, each side twice;
# then Nsight Compute on pass 2 as it stands (before) at the second shape.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/new $OUT/before $OUT/new2 $OUT/before2
run() {  # side outdir
  if [ "$1" = new ]; then P=.; B=bench; else P=.ab/$1; B=.ab/$1/bench; fi
  PYTHONPATH=/tmp/site:$P KDAGEN_CACHE_DIR=/tmp/kdc_$1 timeout -k 5 -s INT 100 python3 $B/bench.py --no-fla --out $OUT/$2 --suite fwdbwd --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run104_$2.log 2>&1
}
run new new; run before before; run new new2; run before before2
for w in new before new2 before2; do echo "== $w"; grep -o '"shape": "[0-9,]*"\|"kdagen_ms": [0-9.]*\|"kdagen_stored_ms": [0-9.]*\|"bwd_[0-9]_chunk_bwd_[a-z]*": [0-9.]*' $OUT/run104_$w.log | tr '\n' ' '; echo; grep " x[12] " $OUT/run104_$w.log | head -16; done
PYTHONPATH=/tmp/site:.ab/before KDAGEN_CACHE_DIR=/tmp/kdc_before timeout -k 5 -s INT 150 ncu --clock-control none --kernel-name regex:"chunk_bwd_intra" --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis python3 .ab/before/bench/profile_state.py 2,16384,16,128 > $OUT/run104_ncu_pass2.txt 2>&1
grep -v "^==PROF==\|^    ---\|^$" $OUT/run104_ncu_pass2.txt | tail -90
