#!/usr/bin/env bash
# One call on the device machine: install the shipped wheels, restore FLA's Triton autotune
# results from an earlier call, run one step under a time limit that leaves room to save what
# it measured, and save it (logs, JSON, tuning cache and studies, FLA's autotune results) under
# $OUT.  Run from the repository root with `.whl` and `.tcache` carried:
#
#   bash bench/gpu_session.sh bench [seconds]   # kdagen alone: the README's suite (kdagen bench --suite readme)
#   bash bench/gpu_session.sh fla [seconds]     # the same with FLA in one process (--compare fla; FLA's
#                                               # candidates compiled in parallel first), then docs/PERF.md and
#                                               # the README's table written under $OUT from the JSON
#   bash bench/gpu_session.sh build [seconds]   # kdagen build --gpu auto --head-dim 128 --jobs 16, then the
#                                               # same command again (resumed) if 120 s are left
#
# `.whl` holds what the machine's image lacks: fla-core (FLA), and for `build` optuna 5.0.0 with
# alembic, colorlog, mako and SQLAlchemy (the image has none of them).
#
# A `build` call's $OUT/*.json (the tuning cache) copied into .tcache/kdagen/ is restored into
# KDAGEN_CACHE_DIR by later calls, so `bench`/`fla` time the tuned winners (each row names its
# configs).  Copy $OUT/autotune.tgz back into .tcache/ after a call: FLA's first-use autotuning of its
# backward takes minutes per shape and is then skipped.
set -u
OUT=${OUT:?OUT must name the folder whose files come back}
budget=${2:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tc KDAGEN_CACHE_DIR=/tmp/kdc PYTHONUNBUFFERED=1
mkdir -p /tmp/tc /tmp/kdc
if [ -f .tcache/autotune.tgz ]; then tar xzf .tcache/autotune.tgz -C /tmp/tc; fi
# a tuning cache from an earlier `build` call (its $OUT/*.json): the ops then use its winners
if ls .tcache/kdagen/*.json >/dev/null 2>&1; then cp .tcache/kdagen/*.json /tmp/kdc/; fi
# an earlier `build` call's Optuna studies ($OUT/studies.tgz copied into .tcache/): `build` resumes them
if [ -f .tcache/studies.tgz ]; then tar xzf .tcache/studies.tgz -C /tmp/kdc; fi
start=$(date +%s)
case "${1:-}" in
  bench)
    timeout -k 10 -s INT "$budget" python3 -m kdagen.cli bench --suite readme --out "$OUT/perf" \
        --plot "$OUT/perf.png" > "$OUT/console.log" 2>&1 ;;
  fla)
    timeout -k 10 -s INT "$budget" python3 -m kdagen.cli bench --suite readme --compare fla --per-launch --fla-warm-jobs 14 \
        --out "$OUT/perf" --plot "$OUT/perf.png" > "$OUT/console.log" 2>&1
    cp README.md "$OUT/README.md"
    python3 -m kdagen.cli bench --from "$OUT/perf.json" --perf-md "$OUT/PERF.md" --readme "$OUT/README.md" \
        >> "$OUT/console.log" 2>&1 ;;
  build)
    timeout -k 10 -s INT "$budget" python3 -m kdagen.cli build --gpu auto --head-dim 128 --jobs 16 \
        > "$OUT/build.log" 2>&1
    echo "build rc=$? in $(( $(date +%s) - start ))s" >> "$OUT/build.log"
    # the same command again, if time is left: the resumed path (studies and Triton cache kept)
    left=$(( budget - ($(date +%s) - start) ))
    if [ "$left" -gt 120 ]; then
      t1=$(date +%s)
      timeout -k 10 -s INT "$left" python3 -m kdagen.cli build --gpu auto --head-dim 128 --jobs 16 \
          > "$OUT/build_again.log" 2>&1
      echo "build again rc=$? in $(( $(date +%s) - t1 ))s" >> "$OUT/build_again.log"
    fi
    cp /tmp/kdc/*.json "$OUT/" 2>/dev/null
    if [ -d /tmp/kdc/studies ]; then tar czf "$OUT/studies.tgz" -C /tmp/kdc studies; fi ;;
  *)
    echo "usage: bash bench/gpu_session.sh bench|fla|build [seconds]"; exit 2 ;;
esac
rc=$?
echo "step ${1} rc=${rc} in $(( $(date +%s) - start ))s"
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -)
tail -n 25 "$OUT"/*.log
