# run 187 (session 37, on run 185's H200, warm): run 182's Nsight Compute rows (the op on both layouts, mul_ over the
#   pool) on the H200: the lines of run182_command.sh from M= on, with the logs named run187.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
sed -n '/^M=/,$p' bench/logs/run182_command.sh | sed 's/run182/run187/g' > /tmp/ncu.sh; bash /tmp/ncu.sh
