# run 186 (session 37, on run 185's H200, warm): the eager B=1 forms timed round-robin (bench/eager_spread.py).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 150 python3 bench/eager_spread.py --rounds 9 > $OUT/run186_eager.log 2>&1; tail -14 $OUT/run186_eager.log
