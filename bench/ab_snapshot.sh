#!/usr/bin/env bash
# A before/after measurement in one device call (bench/RESULTS.md, run 100): a copy of kdagen,
# templates, bench and search_spaces (and pyproject.toml) at COMMIT under .ab/NAME.  A bench script run
# from the copy -- `python3 .ab/NAME/bench/X.py`, with PYTHONPATH naming .ab/NAME before the checkout --
# imports the copy's kdagen (bench scripts put their own repository root first on sys.path) and renders
# the copy's templates (a checkout that is not installed reads its own: kdagen/resources.py).  Give each
# side its own KDAGEN_CACHE_DIR, and carry `.ab` in the call (it is ignored by git).
#
#   bash bench/ab_snapshot.sh HEAD~1 before
#   # on the device: PYTHONPATH=/tmp/site:.ab/before KDAGEN_CACHE_DIR=/tmp/kdc_before python3 .ab/before/bench/X.py ...
set -euo pipefail
commit=${1:?usage: bash bench/ab_snapshot.sh COMMIT NAME}
name=${2:?usage: bash bench/ab_snapshot.sh COMMIT NAME}
dest=.ab/$name
rm -rf "$dest"
mkdir -p "$dest"
git archive "$commit" kdagen templates bench search_spaces pyproject.toml | tar x -C "$dest"
rm -rf "$dest/bench/logs"  # the logs are large and no script reads them
echo "$dest: $(git rev-parse --short "$commit") ($(du -sh "$dest" | cut -f1))"
