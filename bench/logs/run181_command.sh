# run 181 (session 37): the op's tile groups on the [K, V] pool (G V tiles a program, the next tile's loads ahead;
#   never timed: sessions 35-36 timed them on [V, K] only) beside both layouts' defaults, fp32 pool, B=256, on
#   whatever card comes.  On an H200 (the card) also the [V, K] groups, the serving proofs and the
#   serving table (kdagen beside FLA 0.6.0) on the final code.  (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/l $OUT/s
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name"
case "$name" in *H200*) vk=8/4/t2,8/4/t4,16/4/t4;; *) vk="";; esac
timeout -k 5 -s INT 150 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv 64/4/t2,32/4/t4,32/2/t2 --vk "$vk" --batch-grid "" --traffic "" > $OUT/run181_layout.log 2>&1
grep -A12 "^B | pool" $OUT/run181_layout.log | tail -10
case "$name" in *H200*) ;; *) exit 0;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 170 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run181_serving_gpu.log 2>&1
tail -12 $OUT/run181_serving_gpu.log
timeout -k 5 -s INT 200 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run181_serving.log 2>&1
grep -v "^{" $OUT/run181_serving.log | tail -40
