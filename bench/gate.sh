#!/usr/bin/env bash
# The gate's property test (tests/gate_property.rs) for a long budget: generated hostile listings
# (junk, framed claims, renamed, truncated and foreign-signed copies, odd keys, thousands of empty
# newer names) around a genuine chain on a file store, screened as the start-up and every restore
# screen them, the invariants checked in every case.
#   bench/gate.sh                                           2 000 cases
#   GATE_PROPERTY_CASES=N GATE_PROPERTY_SEED=S bench/gate.sh   another budget; a seed replays a run
# Prints the cases and the time they took.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
need_build
need_nextest
export GATE_PROPERTY_CASES="${GATE_PROPERTY_CASES:-2000}"
started=$(date +%s)
out=$(mktemp)
status=0
cargo nextest run --locked --test gate_property --no-fail-fast --no-capture --profile bench >"$out" 2>&1 || status=$?
grep -E 'cases in|panicked|seed|FAIL' "$out" || true
rm -f "$out"
echo "gate: ${GATE_PROPERTY_CASES} cases in $(( $(date +%s) - started )) s"
[ "$status" -eq 0 ] || { echo "gate: a case failed (see above)"; exit 1; }
