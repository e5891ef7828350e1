# run 93 (2026-12-02 ≈23:58 UTC, H200), as sent to the device machine (one line there)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc; tar xzf .tcache/autotune.tgz -C /tmp/tc; nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 80 python3 bench/decode_ceiling.py > $OUT/run93_decode_ceiling.log 2>&1
timeout -k 5 -s INT 70 python3 bench/dplr_decode_variants.py > $OUT/run93_dplr_decode.log 2>&1
timeout -k 10 -s INT 400 python3 bench/member_train_variants.py --out $OUT --member deltanet --warm-workers 14 --warm-budget 100 --budget 280 > $OUT/run93_deltanet_train.log 2>&1
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
