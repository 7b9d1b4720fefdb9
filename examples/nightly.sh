#!/bin/sh
# nightly.sh MATRIX.toml: the sweep, then the regression gate. Silent when all is well, so cron
# mails only a night that needs a look, with everything both commands printed.
set -u
matrix=$1
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
orchestrate -q matrix "$matrix" >"$log" 2>&1
sweep=$?
orchestrate history "$matrix" --fail-on-regression >>"$log" 2>&1
gate=$?
if [ "$sweep" -ne 0 ] || [ "$gate" -ne 0 ]; then
    echo "nightly $matrix: sweep exit $sweep, gate exit $gate"
    cat "$log"
    exit 1
fi
