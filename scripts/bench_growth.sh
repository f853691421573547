#!/usr/bin/env bash
# bench_growth.sh -- the growth curve of the unbounded cache's own training
# (issue 35; BENCHMARKS.md "The unbounded cache trains its own index: the
# growth curve"). One memory of real mixed text -- War and Peace, then PTB
# train, then WikiText-2 valid, about 1.75M pairs -- streamed into one
# unbounded cache with the default lifecycle and knobs (its own training at
# 65,536 pairs and at each 4x, nprobe chosen from measured recall, knn
# 1024), read at 100k, 250k, 500k, 1M and 1.75M pairs on held-out text of
# each kind (the tail of War and Peace and of WikiText-2 valid, kept out of
# the memory, and PTB valid), side by side with the static model and with
# the model's fixed unbounded.faiss read at k 1024 / nprobe 8.
#
#   BENCH_MODEL=DIR   model directory (default models/demo)
#   BENCH_SIZES=...   comma list (default 100000,250000,500000,1000000,1750000)
#   BENCH_NQ=N        query tokens of each kind (default 2000)
#   BENCH_REPEAT=R    each kind read R times beside R static passes: the least CPU of each
#   BENCH_QUICK=1     sizes 70000,140000 (a smoke run)
#   BENCH_CACHES=DIR  keep each size's caches there and read them back next run
#   BENCH_OWN_FACTORY=F  the own training's code (default: the cache's own)
# The table is kept in build/bench-growth/growth.md; scripts/growth_plot.sh
# draws it.
# Corpora from ../shared/data (never copied into the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=../shared/data
M=${BENCH_MODEL:-models/demo}
SIZES=${BENCH_SIZES:-100000,250000,500000,1000000,1750000}
[ "${BENCH_QUICK:-0}" = 1 ] && SIZES=70000,140000
WP=$DATA/books/warandpeace.ptb.txt
PT=$DATA/ptb/ptb.train.txt
PV=$DATA/ptb/ptb.valid.txt
WT=$DATA/wikitext-2/valid.ptb.txt
for f in "$WP" "$PT" "$PV" "$WT"; do
    [ -f "$f" ] || { echo "bench_growth: $f is absent: skipped (corpora live in ../shared/data)"; exit 0; }
done
make --no-print-directory "$BUILD/tests/bench_growth" > /dev/null
W=$BUILD/bench-growth
mkdir -p "$W"
# held out: the last 400 lines of War and Peace and of WikiText-2 valid
head -n -400 "$WP" > "$W/wp.mem.txt"
tail -n 400 "$WP" > "$W/wp.held.txt"
head -n -400 "$WT" > "$W/wt2.mem.txt"
tail -n 400 "$WT" > "$W/wt2.held.txt"
cp "$PV" "$W/ptb.valid.txt"
echo "bench_growth: model $M, sizes $SIZES, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
BENCH_STATES=${BENCH_STATES:-$W/states.f16} OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \
    nice -n 10 "$BUILD/tests/bench_growth" "$M" "$W/wp.mem.txt,$PT,$W/wt2.mem.txt" \
    "$W/wp.held.txt,$W/ptb.valid.txt,$W/wt2.held.txt" "$SIZES" | tee "$W/growth.md"
echo "bench_growth: the table is in $W/growth.md (scripts/growth_plot.sh $W/growth.md PNG draws it)"
