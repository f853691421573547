#!/bin/bash
# Training throughput (issue 3): forward + backward + clipping + SGD of the
# PTB benchmark model (2 layers, 256 units, V = 10,000, BPTT 35, batch 20,
# dropout 0.25) on random tokens, 1 and 2 OpenBLAS threads. The end-to-end
# figure (real PTB, with validation) is in runs/*/curve.csv of `make demo-model`.
set -euo pipefail
BUILD=${BUILD:-build}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u +%F)"
for th in 1 "$(nproc)"; do
    "$BUILD"/tests/bench_train 60 "$th" 10000 256 2 35 20
done
