# run 201 (session 39): the op's lean body restructured (a decode step's item straight-line, other lengths two value
#   columns at a time, the shared-slot fill after the step) under register caps (RecurrentConfig.max_registers 0 / 80 /
#   72) beside its general 8 / 1 body, the defaults, and the probe's lean step (with caps 80 / 72 too); fp32 [V, K]
#   pool, B=256.  Either card: an H200 decides the heuristic, an H100 says what it costs there.
export PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 -s INT 200 python3 bench/decode_stream_probe.py --batch 256 --rows decode --decode "" --ksplit "" \
  --lean 8/1 --caps 0,80,72 > $OUT/run201_probe.log 2>&1
grep -v "against the op o" $OUT/run201_probe.log | tail -16
