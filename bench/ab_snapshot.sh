#!/usr/bin/env bash
# A before/after measurement in one device call: a copy of kdagen, templates and search_spaces (and
# pyproject.toml) at COMMIT under .ab/NAME.  The harness run from the copy -- `python3 -m kdagen.cli bench`
# with PYTHONPATH naming .ab/NAME first -- imports the copy's kdagen and renders the copy's templates (a
# checkout that is not installed reads its own: kdagen/resources.py).  Give each side its own
# KDAGEN_CACHE_DIR, and carry `.ab` in the call (it is ignored by git).
#
#   bash bench/ab_snapshot.sh HEAD~1 before
#   # on the device: PYTHONPATH=/tmp/site:.ab/before KDAGEN_CACHE_DIR=/tmp/kdc_before \
#   #     python3 -m kdagen.cli bench --suite readme --compare fla --out before
set -euo pipefail
commit=${1:?usage: bash bench/ab_snapshot.sh COMMIT NAME}
name=${2:?usage: bash bench/ab_snapshot.sh COMMIT NAME}
dest=.ab/$name
rm -rf "$dest"
mkdir -p "$dest"
git archive "$commit" kdagen templates search_spaces pyproject.toml | tar x -C "$dest"
echo "$dest: $(git rev-parse --short "$commit") ($(du -sh "$dest" | cut -f1))"
