#!/usr/bin/env bash
# bench_server.sh -- neurocached on loopback under the C load generator
# (tests/bench_server.c): top-10 predict latency p50/p99 and predictions/s
# with 1, 16 and 64 concurrent sessions (2,000-entry neural cache each),
# driven by the C client and by wrk, with predict batching on and off and
# float32 / float16 neural keys, and scoring tokens/s through HTTP versus the
# CLI, and fairness: predict latency of 16 sessions without and with 2 heavy
# scoring clients (their ratio), and availability (--guard: probes while the workers are busy, refusals). Each row also gives the daemon's CPU time per prediction, which stays
# meaningful on a shared machine. Markdown tables on stdout, for
# BENCHMARKS.md.
#
# Model: models/demo (the shipped 2 x 256 PTB model) when present, else a
# random model of the same shape (speed does not depend on the weights).
# BENCH_SECONDS (default 5) per row. Run on an otherwise idle machine: the
# load generator shares the cores with the daemon.
set -euo pipefail
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
SECONDS_PER_ROW=${BENCH_SECONDS:-5}
export NEUROCACHE_BIN
NEUROCACHE_BIN=$(cd "$BIN" && pwd)
gen="$BUILD/tests/bench_server"
[ -x "$gen" ] || { echo "bench_server: $gen not built (make bench builds it)" >&2; exit 1; }

model_args=()
if [ -f models/demo/model.safetensors ]; then
    model_args=(--model models/demo)
else
    echo "(models/demo absent: a random 2 x 256, V = 10000 model is used)"
fi

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u +%Y-%m-%d)"
load=$(cut -d' ' -f1 /proc/loadavg)
echo "load average before the run: $load"
echo
echo "### predict batching on (default), float32 neural keys; C client (a libcurl thread per session)"
"$gen" "${model_args[@]}" --seconds "$SECONDS_PER_ROW" --clients 1,16,64 --score-tokens 45000
echo
if command -v wrk >/dev/null; then
    echo "### same, wrk client (event loop: less client CPU on the shared cores)"
    "$gen" "${model_args[@]}" --seconds "$SECONDS_PER_ROW" --clients 1,16,64 --wrk 1 --score-tokens 0
    echo
else
    echo "(wrk not installed: wrk rows skipped)"
fi
echo "### float16 neural keys (\"neural_f16\": true: half the bytes read per prediction)"
"$gen" "${model_args[@]}" --seconds "$SECONDS_PER_ROW" --clients 1,64 --f16 1 --score-tokens 0
echo
echo "### predict batching off (--batch-predict false): one decoder product per predict"
"$gen" "${model_args[@]}" --seconds "$SECONDS_PER_ROW" --clients 1,64 --batch 0 --score-tokens 0
echo
echo "### fairness: 16 sessions' predicts without and with 2 clients scoring 47,250-token texts back to back"
"$gen" "${model_args[@]}" --seconds "$SECONDS_PER_ROW" --clients "" --score-tokens 0 --heavy 2 --fair-clients 16
echo
echo "### availability: /health and /ready with 3 workers busy, workers freed on hang-up, 413 refusals (test_server_guard's latencies)"
"$gen" "${model_args[@]}" --guard 1
