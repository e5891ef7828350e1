# run 104: the intra gradients' pass 2 with dG_n and dqg loaded at the top of its K tile, against main
# before it (.old: kdagen, templates and bench at 5787b0e, the parent of this change), kdagen alone.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p $OUT/new $OUT/old
PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc timeout -k 5 -s INT 80 python3 bench/bench.py --no-fla --out $OUT/new --suite fwdbwd --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run104_new.log 2>&1
PYTHONPATH=.old KDAGEN_CACHE_DIR=/tmp/kdc_old timeout -k 5 -s INT 80 python3 .old/bench/bench.py --no-fla --out $OUT/old --suite fwdbwd --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run104_old.log 2>&1
for w in new old; do echo "== $w"; grep -o '"shape": "[0-9,]*"\|"kdagen_ms": [0-9.]*\|"bwd_4_chunk_bwd_intra": [0-9.]*\|"bwd_3_chunk_bwd_wy": [0-9.]*' $OUT/run104_$w.log | tr '\n' ' '; echo; done
