# run 212 (session 41; H200 only): run 211 found the op's lean 8 / 1 uncapped at 97.3% against cap 72's 96.5% on the
#   [V, K] pool, once.  The probe's [V, K] rows alone, the lean body uncapped and under cap 72 twice each in one process
#   (d12f377's heuristic applied in the working tree: the default row is lean cap 72).
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopped"; exit 0; }
timeout -k 5 -s INT 150 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 --caps 0,72,0,72 > $OUT/run212_probe.log 2>&1
grep -v "against the op o" $OUT/run212_probe.log | tail -20
