# run 180 (session 37): for an H200 only (the card; sessions 35-36 got H100s, where every decode claim was
#   measured): the op's tile groups beside both layouts' defaults (fp32 pool, B=256), then the serving proofs and
#   the serving table (kdagen beside FLA 0.6.0) on the final code.  On any other card it stops after naming it.
#   (carry [".whl"])
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc $OUT/l $OUT/s
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
timeout -k 5 -s INT 150 python3 bench/decode_layout_gpu.py --out $OUT/l --batches 256 --pools fp32 --no-fla \
  --kv "" --vk 8/4/t2,8/4/t4,16/4/t4 --batch-grid "" --traffic "" > $OUT/run180_layout.log 2>&1
grep -A12 "^B | pool" $OUT/run180_layout.log | tail -8
timeout -k 5 -s INT 170 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run180_serving_gpu.log 2>&1
tail -12 $OUT/run180_serving_gpu.log
timeout -k 5 -s INT 200 python3 bench/serving.py --out $OUT/s --suite timing > $OUT/run180_serving.log 2>&1
grep -v "^{" $OUT/run180_serving.log | tail -40
