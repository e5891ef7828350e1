# run 190 (session 37): the decode step's two K reductions in one tl.reduce (templates/recurrent.py.j2's _sum2:
#   one exchange between a program's warps instead of two; sm_90 barriers 67 -> 61 in the packed step) against the
#   code before it (.ab/before = 29a20bf), A-B-A-B in separate processes on one machine: both layouts' defaults,
#   fp32 and bf16 pools, B=256, each row checked against float64 first.  (carry [".ab"])
export KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for i in 1 2; do
  for side in new before; do
    if [ $side = new ]; then P=.; else P=.ab/before; fi  # (each side runs its own copy of the script)
    mkdir -p $OUT/$side$i
    PYTHONPATH=$P KDAGEN_CACHE_DIR=/tmp/kdc_$side timeout -k 5 -s INT 120 python3 $P/bench/decode_layout_gpu.py \
      --out $OUT/$side$i --batches 256 --pools fp32,bf16 --no-fla --kv "" --vk "" --batch-grid "" --traffic "" \
      > $OUT/run190_${side}$i.log 2>&1
    echo "== $side $i"; grep "^256 |" $OUT/run190_${side}$i.log
  done
done
