#!/usr/bin/env bash
# oracle_fastscan.sh -- FAISS's 8-bit IVF-PQ against its 4-bit fast-scan
# codes on real hidden states: recall and CPU a query (issue 35's next
# method; BENCHMARKS.md, the growth curve). Not part of `make bench`.
#
#   scripts/oracle_fastscan.sh [STATES] [N] [NLIST] [Q]
#   STATES  bench_growth's BENCH_STATES file (default build/bench-growth/states.f16,
#           written by scripts/bench_growth.sh)
#   N       states read (default 200000), NLIST lists (default 1024), Q queries held out (300)
# FAISS's fast-scan kernels are compiled here from the source `make deps`
# unpacked (build/faiss_src) with AVX2, as deps.sh does for the IVF-PQ ones:
# Debian's generic build would time its scalar emulation.
set -euo pipefail
cd "$(dirname "$0")/.."
STATES=${1:-build/bench-growth/states.f16}
[ -f "$STATES" ] || { echo "oracle_fastscan: $STATES is absent: run scripts/bench_growth.sh first (BENCH_STATES)"; exit 0; }
grep -qw avx2 /proc/cpuinfo || { echo "oracle_fastscan: needs AVX2"; exit 0; }
SRC=$(ls -d build/faiss_src/faiss-* 2>/dev/null | head -1)
[ -n "$SRC" ] || { echo "oracle_fastscan: build/faiss_src is absent: run make deps"; exit 1; }
O=build/oracle-fastscan
mkdir -p "$O"
FLAGS=(-std=c++17 -O3 -mavx2 -mfma -mf16c -mpopcnt -fopenmp -DFINTEGER=int -I"$SRC")
objs=()
for u in IndexFastScan IndexIVFFastScan IndexPQFastScan IndexIVFPQFastScan impl/pq4_fast_scan \
         impl/pq4_fast_scan_search_1 impl/pq4_fast_scan_search_qbs utils/quantize_lut utils/partitioning; do
    o="$O/$(basename "$u").o"
    [ "$o" -nt "$SRC/faiss/$u.cpp" ] || g++ "${FLAGS[@]}" -c "$SRC/faiss/$u.cpp" -o "$o"
    objs+=("$o")
done
g++ "${FLAGS[@]}" scripts/oracle_fastscan.cpp "${objs[@]}" \
    -Wl,--whole-archive build/faiss_c/libfaiss_simd.a -Wl,--no-whole-archive -lfaiss -lopenblas -llapack -lgomp \
    -o "$O/oracle_fastscan"
echo "oracle_fastscan: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=$(nproc) "$O/oracle_fastscan" "$STATES" "${2:-200000}" "${3:-1024}" "${4:-300}"
