#!/usr/bin/env bash
# The parser fuzz targets (tests/fuzz.rs) for a long budget: mutated real objects through the delta
# codec, object names, the warden's delta objects (format, compression, codec), etcd-backup-restore's
# objects and etcd's bbolt files, each input bounded in time and memory.
#   bench/fuzz.sh                         1 000 000 inputs per target
#   FUZZ_ITERATIONS=N FUZZ_SEED=S bench/fuzz.sh   another budget; a seed replays a run
# Prints each target's inputs, time and peak memory per input; a failing input is kept in
# target/fuzz-failures/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
need_build
need_nextest
export FUZZ_ITERATIONS="${FUZZ_ITERATIONS:-1000000}"
started=$(date +%s)
out=$(mktemp)
status=0
cargo nextest run --locked --test fuzz --no-fail-fast --no-capture --profile bench >"$out" 2>&1 || status=$?
grep -E '^fuzz |panicked|FAIL|SIGABRT' "$out" || true
rm -f "$out"
echo "fuzz: ${FUZZ_ITERATIONS} inputs per target in $(( $(date +%s) - started )) s"
[ "$status" -eq 0 ] || { echo "fuzz: a target failed (see above)"; exit 1; }
