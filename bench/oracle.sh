#!/usr/bin/env bash
# The differential oracle (tests/oracle.rs) over many seeds: the warden's restore of revision R
# against etcdutl's restore of etcd's own snapshot at R, bucket by bucket, on etcd 3.5.16, 3.6.16 and 3.7.3.
#   bench/oracle.sh            100 seeds (1..100)
#   SEEDS=500 bench/oracle.sh  more
# Prints each failing seed (replay: ORACLE_SEED=N cargo nextest run --test oracle) and a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
need_build
need_etcd36
need_etcd37
need_etcd35
need_nextest
cargo nextest run --locked --no-run --test oracle >/dev/null 2>&1 || cargo nextest run --locked --no-run --test oracle
failed=()
started=$(date +%s)
for seed in $(seq 1 "${SEEDS:-100}"); do
    if ! ORACLE_SEED=$seed cargo nextest run --locked --test oracle --no-fail-fast >"/tmp/oracle-$seed.log" 2>&1; then
        failed+=("$seed")
        echo "oracle: seed $seed FAILED (/tmp/oracle-$seed.log)"
    else
        rm -f "/tmp/oracle-$seed.log"
    fi
done
echo "oracle: ${SEEDS:-100} seeds x 3 etcd releases in $(( $(date +%s) - started )) s, ${#failed[@]} with differences${failed:+: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
