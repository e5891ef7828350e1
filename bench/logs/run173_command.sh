# run 173 (session 33): runs 172 and 170 in one call (a new checkout: no .tcache, so FLA autotunes once here),
#   then FLA's and kdagen's autotune results saved for later calls.  (carry [".whl"], timeout_s 590)
bash bench/logs/run172_command.sh
bash bench/logs/run170_command.sh
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -) 2>/dev/null; ls -la $OUT/autotune.tgz
