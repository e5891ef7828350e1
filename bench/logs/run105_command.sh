# run 105: pass 2's exclusive cumsum by a scan (working tree) against main before it (.ab/base: 75fa74d),
# kdagen alone, sides alternated twice; the whole-step variant bwd_inv_tf32 on the new side.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/tc $OUT/new $OUT/base $OUT/new2 $OUT/base2 $OUT/dn_new $OUT/dn_base
run() {  # side outdir suites
  if [ "$1" = new ]; then P=.; B=bench; else P=.ab/$1; B=.ab/$1/bench; fi
  PYTHONPATH=/tmp/site:$P KDAGEN_CACHE_DIR=/tmp/kdc_$1 timeout -k 5 -s INT 140 python3 $B/bench.py --no-fla --out $OUT/$2 --suite $3 --shapes "1,8192,96,128;2,16384,16,128" > $OUT/run105_$2.log 2>&1
}
run new new fwdbwd,layer,whole; run base base fwdbwd,layer; run new new2 fwdbwd,layer; run base base2 fwdbwd,layer
for w in new base new2 base2; do echo "== $w"; grep -h '^fwd+bwd\|^layer' $OUT/run105_$w.log | cut -c1-150; grep -ho '"v:[^"]*": [^,}]*' $OUT/run105_$w.log; grep -h -A3 "profile kdagen.*fwd+bwd 2,16384" $OUT/run105_$w.log | grep "intra\|total"; done
for w in new base; do
  if [ "$w" = new ]; then P=.; B=bench; else P=.ab/$w; B=.ab/$w/bench; fi
  PYTHONPATH=/tmp/site:$P KDAGEN_CACHE_DIR=/tmp/kdc_$w timeout -k 5 -s INT 80 python3 $B/member_train_variants.py --out $OUT/dn_$w --member deltanet --variants default --no-fla --shapes "2,16384,16,128;1,8192,96,128" --error-shape 1,512,2,128 > $OUT/run105_dn_$w.log 2>&1
  echo "== deltanet $w"; grep -v "^      \|Warn\|warn" $OUT/run105_dn_$w.log | grep -v "^    " | tail -8
done
