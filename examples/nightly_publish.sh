#!/bin/sh
# nightly_publish.sh MATRIX.toml: sweep, publish, gate. Silent when all is well.
set -u
matrix=$1
name=$(basename "$matrix" .toml)
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
orchestrate -q matrix "$matrix" --no-publish >"$log" 2>&1
sweep=$?
orchestrate publish "$name" >>"$log" 2>&1       # targets from [publish]; exit 1: server down
publish=$?
orchestrate history "$matrix" --fail-on-regression >>"$log" 2>&1
gate=$?
if [ "$sweep" -ne 0 ] || [ "$publish" -ne 0 ] || [ "$gate" -ne 0 ]; then
    echo "nightly $matrix: sweep exit $sweep, publish exit $publish, gate exit $gate"
    cat "$log"
    exit 1
fi
