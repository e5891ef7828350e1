# run 106: G_n - G by difference in the training forward's intra launch and the re-run (working tree)
# against 185552f (.ab/base2), kdagen alone; the inverse on tf32 dots (whole step, bwd_check errors);
# Gated DeltaNet's step (scalar decay: the same change) both sides.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/new $OUT/base2 $OUT/chk $OUT/gdn_new $OUT/gdn_base2
run() {  # side outdir suites timeout
  if [ "$1" = new ]; then P=.; B=bench; else P=.ab/$1; B=.ab/$1/bench; fi
  PYTHONPATH=/tmp/site:$P KDAGEN_CACHE_DIR=/tmp/kdc_$1 timeout -k 5 -s INT $4 python3 $B/bench.py --no-fla --out $OUT/$2 --suite $3 --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run106_$2.log 2>&1
}
run new new fwdbwd,layer,whole 150; run base2 base2 fwdbwd,layer 110
for w in new base2; do echo "== $w"; grep -h '^fwd+bwd\|^layer' $OUT/run106_$w.log | cut -c1-150; grep -ho '"kdagen_[a-z_0-9]*inv_tf32_ms": [^,}]*' $OUT/run106_$w.log; grep -h -A9 "profile kdagen.*fwd+bwd 2,16384" $OUT/run106_$w.log | grep "total\|intra\|rerun\|wy"; done
for w in new base2; do
  if [ "$w" = new ]; then P=.; B=bench; else P=.ab/$w; B=.ab/$w/bench; fi
  PYTHONPATH=/tmp/site:$P KDAGEN_CACHE_DIR=/tmp/kdc_$w timeout -k 5 -s INT 70 python3 $B/member_train_variants.py --out $OUT/gdn_$w --member gdn --variants default --no-fla --shapes "2,16384,16,128;1,8192,96,128" --error-shape 1,512,2,128 > $OUT/run106_gdn_$w.log 2>&1
  echo "== gdn $w"; grep "^errors\|^(" $OUT/run106_gdn_$w.log | cut -c1-200
done
PYTHONPATH=/tmp/site:. KDAGEN_CACHE_DIR=/tmp/kdc_new timeout -k 5 -s INT 200 python3 bench/bench.py --no-fla --out $OUT/chk --suite bwd_check > $OUT/run106_bwd_check.log 2>&1
grep -o '"case": "[^"]*"\|"kdagen_[a-z_0-9]*d[a-z_]*": [0-9.e-]*' $OUT/run106_bwd_check.log | tr '\n' ' ' | sed 's/"case"/\n"case"/g'
