# run 146 (session 28): the serving proofs on the H200 after the decode kernel took FLA's in-kernel flags
#   (sync-free calls, the packed decode captured in a CUDA graph and replayed, the packed prefill graph, the gates
#   at / below the bound and -inf in bf16 against float64).
#   bash bench/logs/run146_command.sh   (call with timeout_s 300)
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
timeout -k 5 -s INT 270 python3 -m pytest -q -p no:cacheprovider bench/test_serving_gpu.py -rA > $OUT/run146_serving_gpu.log 2>&1
tail -25 $OUT/run146_serving_gpu.log
