#!/usr/bin/env bash
# bench_cache.sh -- perplexities and costs of the caches (BENCHMARKS.md
# "Caches"). Corpora are read from ../shared/data (never copied into the
# repo); the model is models/demo (else runs/demo, read only: it is copied to
# the work directory, where build-index writes its unbounded.faiss).
#
#   BENCH_MODEL=DIR   model directory (default models/demo, else runs/demo)
#   BENCH_STEPS="index ptb wp wt2 cost gate"   what to run (default all)
#   BENCH_QUICK=1     small grids and corpora (a smoke run, figures meaningless)
#   BENCH_EVAL_LINES=N  out-of-domain evaluation on the N lines after the
#                     tuning part (default 0 = all the rest: War and Peace's
#                     535k words)
#   BENCH_NEURAL_SIZES="2000 5000 10000 20000"  neural cache sizes tuned
#   BENCH_THREADS=2   FAISS threads of tune/eval's unbounded searches
#
# For each corpus the cache hyper-parameters are tuned with `neurocache tune`
# (PTB: on PTB valid; War and Peace and WikiText-2, out of domain: on their
# first 10% of lines), then `neurocache eval` reports static / unigram /
# neural / unbounded / neural+unbounded on PTB test, or on the other 90%
# with the first 10% already in the unbounded cache (--memory).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
BUILD=${BUILD:-build}
NC="nice -n 5 $BIN/neurocache"
DATA=../shared/data
STEPS=${BENCH_STEPS:-index ptb wp wt2 cost gate}
SRC=${BENCH_MODEL:-}
if [ -z "$SRC" ]; then
    if [ -f models/demo/model.safetensors ]; then SRC=models/demo; else SRC=runs/demo; fi
fi
for f in "$DATA/ptb/ptb.train.txt" "$DATA/ptb/ptb.valid.txt" "$DATA/ptb/ptb.test.txt" \
         "$DATA/books/warandpeace.ptb.txt" "$DATA/wikitext-2/valid.ptb.txt"; do
    [ -f "$f" ] || { echo "bench_cache: $f is absent: caches benchmark skipped (corpora live in ../shared/data)"; exit 0; }
done
[ -f "$SRC/model.safetensors" ] || { echo "bench_cache: no model in $SRC: skipped (make demo-model)"; exit 0; }

W=$BUILD/bench-cache
M=$W/model
mkdir -p "$M"
sum=$(sha1sum "$SRC/model.safetensors" | cut -c1-12)
if [ "$(cat "$M/source.sha" 2>/dev/null)" != "$sum" ]; then
    rm -f "$M"/*
    cp "$SRC/config.json" "$SRC/vocab.txt" "$SRC/model.safetensors" "$M/"
    echo "$sum" > "$M/source.sha"
fi
echo "bench_cache: model $SRC (model.safetensors sha1 $sum), work dir $W"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(date -u '+%Y-%m-%d %H:%M UTC')"

if [ "${BENCH_QUICK:-0}" = 1 ]; then
    GRID=(--thetas 0.3,1 --lambdas 0.1,0.2 --unigram-lambdas 0.1 --unbounded-lambdas 0.2,0.5)
    LIM=3000
else
    GRID=(--thetas 0.3,0.5,0.7,1,1.5,2 --lambdas 0.05,0.1,0.15,0.2,0.3,0.4,0.5,0.6,0.7 --unigram-lambdas 0.05,0.1,0.2,0.3
          --unbounded-lambdas 0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8)
    LIM=0
fi
# the unbounded cache: k=1024, nprobe 8, exact until 20,000 pairs, then the
# model's trained IVF4096,PQ32 (build-index on PTB train)
# (its searches on BENCH_THREADS FAISS threads, default 2: the machine's cores)
UB=(--knn 1024 --nprobe 8 --switch-at 20000 --threads "${BENCH_THREADS:-2}")

cut_lines() {   # cut_lines FILE FROM TO OUT: lines [FROM, TO) (TO=0: to the end), LIM caps
    local to=$3
    if [ "$LIM" -gt 0 ]; then to=$(( $2 + LIM / 20 )); fi
    if [ "$to" -eq 0 ]; then tail -n +"$(( $2 + 1 ))" "$1" > "$4"; else sed -n "$(( $2 + 1 )),${to}p" "$1" > "$4"; fi
}

EVAL_LINES=${BENCH_EVAL_LINES:-0}
rest_end() { if [ "$EVAL_LINES" -gt 0 ]; then echo $(( $1 + EVAL_LINES )); else echo 0; fi; }

if [[ " $STEPS " == *" index "* ]] && [ ! -f "$M/unbounded.faiss" ]; then
    # 160,000 states sampled from the first 15,000 lines (~330k words) of PTB
    # train: as many training points as the whole file would give, at a third
    # of the LSTM pass
    echo "== build-index on PTB train (first 15000 lines)"
    head -n 15000 "$DATA/ptb/ptb.train.txt" > "$W/ptb.train.head.txt"
    $NC build-index --no-normalize --model "$M" --corpus "$W/ptb.train.head.txt" 2>&1 | grep -v '^  [0-9]' | tail -4
fi

# one corpus: NAME TUNE_FILE EVAL_FILE MEMORY EXTRA_OPTS...
# MEMORY "-": the evaluated text starts with an empty unbounded cache (PTB:
# test after valid); else that file (the tuning part, which precedes the
# evaluated text in the same book) is streamed into it first, as a server
# that has read the beginning of the book would have it.
# The neural cache size is tuned too: each of NEURAL_SIZES gets its own
# theta x lambda grid, and the size whose neural+unbounded setting is best
# on the tuning text is kept.
NEURAL_SIZES=${BENCH_NEURAL_SIZES:-2000 5000 10000 20000}
run_corpus() {
    local name=$1 tunef=$2 evalf=$3 memf=$4; shift 4
    local out=$W/$name mem=()
    [ "$memf" = - ] || mem=(--memory "$memf")
    echo "== $name: tune on $(basename "$tunef") ($(wc -w < "$tunef") words), eval on $(basename "$evalf") ($(wc -w < "$evalf") words)${mem[*]:+, memory ${memf##*/}} $*"
    local best="" bestp=""
    for n in $NEURAL_SIZES; do
        $NC tune --no-normalize --model "$M" --valid "$tunef" --unigram-cache 2000 --neural-cache "$n" --unbounded "${UB[@]}" \
            "${GRID[@]}" --out "$out-tune-n$n" "$@" > "$out-tune-n$n.txt"
        local p
        p=$(sed -n 's/^best neural+unbounded: perplexity \([0-9.]*\).*/\1/p' "$out-tune-n$n.txt")
        echo "   neural cache N=$n: best neural+unbounded on the tuning text $p"
        if [ -z "$bestp" ] || [ "$(echo "$p < $bestp" | bc)" = 1 ]; then best=$n; bestp=$p; fi
    done
    cp "$out-tune-n$best.txt" "$out-tune.txt"
    echo "   kept N=$best"
    cat "$out-tune.txt"
    local uni neu ub nub
    uni=$(sed -n 's/^best unigram: .*options: //p' "$out-tune.txt")
    neu=$(sed -n 's/^best neural: .*options: //p' "$out-tune.txt")
    ub=$(sed -n 's/^best unbounded: .*options: //p' "$out-tune.txt")
    nub=$(sed -n 's/^best neural+unbounded: .*options: //p' "$out-tune.txt")
    strip() { echo "$1" | sed 's/--open-vocab//; s/--uniform-mu [^ ]*//; s/--switch-at [^ ]*//'; }
    $NC eval --no-normalize --model "$M" "${UB[@]:4}" "${mem[@]}" --csv "$out-eval.csv" "$@" \
        --row "$(strip "$uni")" --row "$(strip "$neu")" --row "$(strip "$ub")" --row "$(strip "$nub")" "$evalf" \
        | tee "$out-eval.txt"
}

if [[ " $STEPS " == *" ptb "* ]]; then
    f=$W/ptb.test.txt; cut_lines "$DATA/ptb/ptb.test.txt" 0 0 "$f"
    v=$W/ptb.valid.txt; cut_lines "$DATA/ptb/ptb.valid.txt" 0 0 "$v"
    run_corpus ptb "$v" "$f" -
fi
if [[ " $STEPS " == *" wp "* ]]; then
    n=$(wc -l < "$DATA/books/warandpeace.ptb.txt"); h=$(( n / 10 ))
    cut_lines "$DATA/books/warandpeace.ptb.txt" 0 "$h" "$W/wp.head.txt"
    cut_lines "$DATA/books/warandpeace.ptb.txt" "$h" "$(rest_end "$h")" "$W/wp.rest.txt"
    run_corpus wp "$W/wp.head.txt" "$W/wp.rest.txt" "$W/wp.head.txt"
    run_corpus wp-open "$W/wp.head.txt" "$W/wp.rest.txt" "$W/wp.head.txt" --open-vocab --uniform-mu 0.01
fi
if [[ " $STEPS " == *" wt2 "* ]]; then
    n=$(wc -l < "$DATA/wikitext-2/valid.ptb.txt"); h=$(( n / 10 ))
    cut_lines "$DATA/wikitext-2/valid.ptb.txt" 0 "$h" "$W/wt2.head.txt"
    cut_lines "$DATA/wikitext-2/valid.ptb.txt" "$h" "$(rest_end "$h")" "$W/wt2.rest.txt"
    run_corpus wt2 "$W/wt2.head.txt" "$W/wt2.rest.txt" "$W/wt2.head.txt"
    run_corpus wt2-open "$W/wt2.head.txt" "$W/wt2.rest.txt" "$W/wt2.head.txt" --open-vocab --uniform-mu 0.01
fi
if [[ " $STEPS " == *" cost "* ]]; then
    echo "== cost of the neural cache (PTB valid, N=2000): static vs neural rows"
    $NC eval --no-normalize --model "$M" --row "--neural-cache 2000 --theta 0.3 --lambda 0.1" \
        --row "--neural-cache 2000 --theta 0.3 --lambda 0.1 --f16-keys" "$DATA/ptb/ptb.valid.txt"
    echo "== cost of the unbounded cache against stored states (memory: hidden states of War and Peace's"
    echo "   head, beyond 100k synthetic; queries: War and Peace's last 400 lines)"
    n=$(wc -l < "$DATA/books/warandpeace.ptb.txt")
    head -n $(( n - 400 )) "$DATA/books/warandpeace.ptb.txt" > "$W/wp.mem.txt"
    tail -n 400 "$DATA/books/warandpeace.ptb.txt" > "$W/wp.q.txt"
    lam=$(sed -n 's/^best unbounded: .*--unbounded-lambda \([^ ]*\).*/\1/p' "$W/wp-tune.txt" 2>/dev/null || true)
    sizes=${BENCH_SIZES:-10000,100000,1000000}
    # 100k real states (LSTM over War and Peace), the rest real + noise
    BENCH_THREADS=1 BENCH_REAL=${BENCH_REAL:-100000} nice -n 5 "$BUILD/tests/bench_cache" "$M" "$M/unbounded.faiss" \
        "$W/wp.mem.txt,$DATA/ptb/ptb.train.txt" "$W/wp.q.txt" "$sizes" "${lam:-0.3}" 2000 1000000
    echo "== the same on both cores (FAISS on 2 OpenMP threads, OpenBLAS on 1 while searching; no exact rows)"
    BENCH_THREADS=2 BENCH_NO_EXACT=1 BENCH_REAL=${BENCH_REAL:-100000} nice -n 5 "$BUILD/tests/bench_cache" "$M" \
        "$M/unbounded.faiss" "$W/wp.mem.txt,$DATA/ptb/ptb.train.txt" "$W/wp.q.txt" "$sizes" "${lam:-0.3}" 2000 0
fi

if [[ " $STEPS " == *" gate "* ]]; then
    # The adaptive mixture (issue 18): the gate fitted on validation text (PTB
    # valid; the first 10% of War and Peace / WikiText-2) and evaluated on the
    # held-out text beside the constant-lambda row of the same settings (the
    # settings tuned in BENCHMARKS.md "Caches"). Each model copy holds its own
    # gate (links to the model's files).
    GH=${BENCH_GATE_HIDDEN:-16}
    # the trained index: the index step's, else the source model's
    [ -f "$M/unbounded.faiss" ] || [ ! -f "$SRC/unbounded.faiss" ] || cp "$SRC/unbounded.faiss" "$M/"
    gate_dir() { mkdir -p "$W/$1"; for f in config.json vocab.txt model.safetensors unbounded.faiss; do
        ln -sf "$(cd "$M" && pwd)/$f" "$W/$1/$f"; done; rm -f "$W/$1"/gate.*; echo "$W/$1"; }
    n=$(wc -l < "$DATA/books/warandpeace.ptb.txt"); h=$(( n / 10 ))
    cut_lines "$DATA/books/warandpeace.ptb.txt" 0 "$h" "$W/wp.head.txt"
    cut_lines "$DATA/books/warandpeace.ptb.txt" "$h" "$(rest_end "$h")" "$W/wp.rest.txt"
    n=$(wc -l < "$DATA/wikitext-2/valid.ptb.txt"); h=$(( n / 10 ))
    cut_lines "$DATA/wikitext-2/valid.ptb.txt" 0 "$h" "$W/wt2.head.txt"
    cut_lines "$DATA/wikitext-2/valid.ptb.txt" "$h" "$(rest_end "$h")" "$W/wt2.rest.txt"
    run_gate() {   # run_gate NAME FIT_FILE EVAL_FILE MEMORY|- OPTIONS...
        local name=$1 fitf=$2 evalf=$3 memf=$4; shift 4
        local d mem=()
        d=$(gate_dir "gate-$name")
        [ "$memf" = - ] || mem=(--memory "$memf")
        echo "== gate $name: fit on $(basename "$fitf"), eval on $(basename "$evalf") $*"
        $NC fit-gate --no-normalize --model "$d" --valid "$fitf" --hidden "$GH" "$@" | tee "$W/gate-$name-fit.txt"
        $NC eval --no-normalize --model "$d" "${mem[@]}" --csv "$W/gate-$name-eval.csv" "$@" --gate "$evalf" \
            | tee "$W/gate-$name-eval.txt"
    }
    run_gate ptb "$DATA/ptb/ptb.valid.txt" "$DATA/ptb/ptb.test.txt" - --neural-cache 500 --theta 0.7 --lambda 0.1
    run_gate wp "$W/wp.head.txt" "$W/wp.rest.txt" "$W/wp.head.txt" --neural-cache 2000 --theta 0.7 --lambda 0.3 \
        --unbounded --knn 256 --kernel epanechnikov --unbounded-lambda 0.3 "${UB[@]:2}"
    run_gate wp-open "$W/wp.head.txt" "$W/wp.rest.txt" "$W/wp.head.txt" --neural-cache 2000 --theta 0.7 \
        --lambda 0.4 --unbounded --unbounded-lambda 0.3 "${UB[@]}" --open-vocab --uniform-mu 0.01
    run_gate wt2 "$W/wt2.head.txt" "$W/wt2.rest.txt" "$W/wt2.head.txt" --neural-cache 2000 --theta 0.7 \
        --lambda 0.4 --unbounded --unbounded-lambda 0.1 "${UB[@]}"
    # real hidden states only (War and Peace's head, then PTB train): the
    # cost step's synthetic copies (real + noise) put ten near-identical
    # neighbours around every query, which no fitting text shows a gate
    echo "== adaptive retrieval at 1M stored states (unbounded cache alone, lambda 0.5, real states)"
    d=$(gate_dir gate-ub)
    $NC fit-gate --no-normalize --model "$d" --valid "$W/wp.head.txt" --hidden "$GH" --unbounded --knn 1024 \
        --unbounded-lambda 0.5 "${UB[@]:2}" | tee "$W/gate-ub-fit.txt"
    n=$(wc -l < "$DATA/books/warandpeace.ptb.txt")
    head -n $(( n - 400 )) "$DATA/books/warandpeace.ptb.txt" > "$W/wp.mem.txt"
    tail -n 400 "$DATA/books/warandpeace.ptb.txt" > "$W/wp.q.txt"
    BENCH_GATE_SKIPS=${BENCH_GATE_SKIPS:-0,-1,0.3,0.4,0.5} BENCH_THREADS=2 BENCH_NO_EXACT=1 \
        BENCH_REAL=${BENCH_GATE_REAL:-1000000} nice -n 5 "$BUILD/tests/bench_cache" "$d" "$M/unbounded.faiss" \
        "$W/wp.mem.txt,$DATA/ptb/ptb.train.txt" "$W/wp.q.txt" "${BENCH_GATE_SIZES:-1000000}" 0.5 2000 0
fi
