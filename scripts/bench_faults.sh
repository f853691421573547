#!/bin/bash
# Fault schedule for replicas (issue 24): tests/test_replica_faults with many rounds
# over several seeds -- three replicas, Redis and HAProxy on loopback, kill
# -9, SIGTERM, Redis restarts with and without appendonly, partitions from
# Redis, namespace deletes, under clients streaming documents and feeding
# with adapt; the checker's figures (lost, duplicated, resurrected must be
# 0) on the line "faults: ...". FAULT_ROUNDS rounds per seed (default 18)
# over FAULT_SEEDS (default 11,12,13): 54 rounds. Needs haproxy and
# redis-server (make deps; says so and exits 0 when absent).
set -euo pipefail
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || { echo "bench_faults: redis-server not installed (make deps); skipped"; exit 0; }
[ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null || { echo "bench_faults: haproxy not installed (make deps); skipped"; exit 0; }
[ -x "$BUILD/tests/test_replica_faults" ] || make --no-print-directory "$BUILD/tests/test_replica_faults"
start=$(date +%s)
NEUROCACHE_BIN="$(cd "$BIN" && pwd)" NEUROCACHE_FAULT_ROUNDS=${FAULT_ROUNDS:-18} \
    NEUROCACHE_FAULT_SEEDS=${FAULT_SEEDS:-11,12,13} nice -n 10 "$BUILD/tests/test_replica_faults"
echo "bench_faults: $(( $(date +%s) - start )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
