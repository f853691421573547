#!/bin/bash
# Static-model scoring speed (issue 2): a randomly initialised 2-layer,
# 256-unit LSTM with the PTB vocabulary scores ptb.test.txt through the
# batched path and the step path, next to OpenBLAS sgemm's measured GFLOP/s.
# Corpora are read from ../shared/data/ptb (the program says so when absent).
set -euo pipefail
BUILD=${BUILD:-build}
DATA=${NEUROCACHE_DATA:-../shared/data}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u +%F)"
"$BUILD"/tests/bench_score --data "$DATA/ptb" --threads "$(nproc)"
