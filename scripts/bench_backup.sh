#!/usr/bin/env bash
# bench_backup.sh -- online backup of a 1M-pair namespace under load (issue
# 38's acceptance; tests/bench_backup.c does the work and says how):
# 16 sessions reading the namespace and 2 clients uploading into it; the
# readers' predict p50/p99 in windows without a backup and during one
# (POST /v1/admin/backup), alternated; each backup's duration and size;
# then a backup taken with the uploads paused, restored by `neurocache
# restore` into a fresh daemon, which must hold the same pairs and answer
# the same predictions as the original. Markdown on stdout, for
# BENCHMARKS.md#backup.
#
# The namespace is filled once through HTTP on models/demo from PTB train
# then WikiText-2 valid (../shared/data; skipped, saying so, when absent)
# until it holds BENCH_PAIRS pairs, its own index trained (15-20 minutes of
# LSTM and k-means work on 2 shared cores), and kept in BENCH_SEED (1.7 GB);
# each run serves a copy of it (2-5 minutes a run).
#
#   BENCH_PAIRS      pairs of the namespace (default 1000000)
#   BENCH_SEED       the filled data_dir kept between runs (default build/bench-backup/seed)
#   BENCH_ROUNDS     rounds of (window without, backup) (default 6)
#   BENCH_WINDOW     seconds of a window without a backup (default 10)
#   BENCH_UPLOAD_PAUSE_MS  pause of each uploader between two 1,000-word documents (default 200)
#   BENCH_BEFORE     a bin/ directory of another build: runs before, this, before, this
#                    (BENCH_AB pairs, default 2), the comparison of predictions only with this build
set -euo pipefail
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
export OPENBLAS_NUM_THREADS=1
MODEL=${MODEL:-models/demo}
DATA=${DATA:-../shared/data}
SEED=${BENCH_SEED:-$BUILD/bench-backup/seed}
RUN=${SEED%/*}/run
gen="$BUILD/tests/bench_backup"
[ -x "$gen" ] || { echo "bench_backup: $gen not built (make bench builds it)" >&2; exit 1; }
[ -f "$MODEL/model.safetensors" ] || { echo "bench_backup: $MODEL absent: skipped" >&2; exit 0; }
corpora=("$DATA/ptb/ptb.train.txt" "$DATA/wikitext-2/valid.ptb.txt")
upload_text="$DATA/books/warandpeace.ptb.txt"
probe_text="$DATA/ptb/ptb.test.txt"
for f in "${corpora[@]}" "$upload_text" "$probe_text"; do
    [ -f "$f" ] || { echo "bench_backup: $f absent (see $DATA/SOURCES.md): skipped" >&2; exit 0; }
done

status=0
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u '+%Y-%m-%d %H:%M UTC')"
run() {   # $1: the bin/ directory under test; $2: compare 0|1
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); binaries: $1"
    NEUROCACHE_BIN=$(cd "$1" && pwd) "$gen" --model "$MODEL" --seed "$SEED" --run "$RUN" \
        --corpus "$(IFS=,; echo "${corpora[*]}")" --pairs "${BENCH_PAIRS:-1000000}" \
        --rounds "${BENCH_ROUNDS:-6}" --window "${BENCH_WINDOW:-10}" \
        --upload-text "$upload_text" --upload-pause-ms "${BENCH_UPLOAD_PAUSE_MS:-200}" \
        --probe-text "$probe_text" --compare "$2" || { status=1; echo "(this run FAILED: see its messages)"; }
    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
}
if [ -n "${BENCH_BEFORE:-}" ]; then
    for i in $(seq "${BENCH_AB:-2}"); do
        echo "### A (before: $BENCH_BEFORE), run $i"; run "$BENCH_BEFORE" 0
        echo "### B (this build: $BIN), run $i"; run "$BIN" "$([ "$i" = 1 ] && echo 1 || echo 0)"
    done
else
    run "$BIN" 1
fi
exit $status
