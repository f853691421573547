#!/usr/bin/env bash
# bench_namespace.sh -- neurocached with one namespace of N stored states
# (default 1,000,000): top-10 predict with the unbounded cache, p50/p99 of
# one session, predictions/s of 64 sessions (the same state again, a
# one-word feed before each predict, or the word in the predict's "text"),
# and the predict latency while
# a client streams documents into the namespace (tests/bench_server.c
# --namespace). Markdown tables on stdout, for BENCHMARKS.md.
#
# The namespace is not uploaded through HTTP (an LSTM pass over 1M tokens
# first): tests/bench_ns_seed writes it through the store (log, IVF index,
# snapshot) from hidden states saved by bench_cache (BENCH_STATES), and the
# daemon opens it from the snapshot. Each run works on a copy of the seeded
# directory (streaming adds to it).
#
#   BENCH_STATES   states file of bench_cache (required unless BENCH_SEEDED exists)
#   BENCH_SEEDED   where the seeded data_dir is kept (default build/bench-ns/seed)
#   BENCH_N        stored states (default 1000000)
#   BENCH_SECONDS  seconds per row (default 5)
#   MODEL          model directory with its trained unbounded.faiss (default models/demo)
#   BENCH_KNN, BENCH_NPROBE  the sessions' knn and nprobe (default: the defaults)
set -euo pipefail
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
export NEUROCACHE_BIN OPENBLAS_NUM_THREADS=1
NEUROCACHE_BIN=$(cd "$BIN" && pwd)
MODEL=${MODEL:-models/demo}
N=${BENCH_N:-1000000}
S=${BENCH_SECONDS:-5}
SEEDED=${BENCH_SEEDED:-$BUILD/bench-ns/seed}
RUN=${SEEDED%/*}/run
gen="$BUILD/tests/bench_server"
seed="$BUILD/tests/bench_ns_seed"
for b in "$gen" "$seed"; do
    [ -x "$b" ] || { echo "bench_namespace: $b not built (make bench builds it)" >&2; exit 1; }
done
[ -f "$MODEL/unbounded.faiss" ] || { echo "bench_namespace: $MODEL/unbounded.faiss absent (neurocache build-index)" >&2; exit 1; }
if [ ! -d "$SEEDED/namespaces/ns" ]; then
    [ -n "${BENCH_STATES:-}" ] || { echo "bench_namespace: set BENCH_STATES (bench_cache's saved states)" >&2; echo "bench_namespace: skipped" >&2; exit 0; }
    mkdir -p "$SEEDED/namespaces"
    "$seed" "$MODEL" "$BENCH_STATES" "$SEEDED/namespaces/ns" "$N" >&2
fi
fresh() { rm -rf "$RUN" && cp -a "$SEEDED" "$RUN"; }
row() { fresh; echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"; "$gen" --model "$MODEL" --data-dir "$RUN" --namespace ns \
    --neural 200 --seconds "$S" --score-tokens 0 ${BENCH_KNN:+--knn $BENCH_KNN} ${BENCH_NPROBE:+--nprobe $BENCH_NPROBE} \
    "$@"; echo; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "### the same query again and again (a session's state does not move between predicts)"
row --clients 1,64
echo "### a one-word feed (untimed, an LSTM step and a search of its own) before each predict: a new query each time"
row --clients 1,64 --feed-between 1
echo "### the new word in the predict's own \"text\" (fed in the predict's batch): one request a prediction, a new query each time"
row --clients 1,64 --feed-between 2
echo "### one session, then 16, without and with a client streaming 45,000-word documents into the namespace"
row --clients "" --stream 1 --fair-clients 1 --feed-between 1
row --clients "" --stream 1 --fair-clients 16 --feed-between 1
rm -rf "$RUN"
