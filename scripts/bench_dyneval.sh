#!/bin/bash
# Dynamic evaluation (issue 27, docs/dyneval.md): perplexity of held-out text
# with the model's weights adapted online, alone and beside the caches and
# the gate, hyper-parameters tuned on validation text; per-session memory of
# each subset; the cost of a fed token against the static model.
#   PTB: dyn-stats on PTB train (first 100,000 tokens), tune on the first
#   DYN_TUNE_TOKENS tokens of PTB valid, evaluate on PTB test.
#   War and Peace (closed vocabulary): tune on the first DYN_TUNE_TOKENS
#   tokens of its first 10% (the unbounded cache growing online), evaluate
#   on the first DYN_WP_LINES lines of the other 90% with the whole tenth
#   in the unbounded cache (0 = all of the 90%).
# The defaults are small (the grids, DYN_PTB_LINES, DYN_WP_LINES) because a
# session with dynamic evaluation runs at ~1/10 of the static model's speed
# and the benchmark machine is shared; set them to 0 / larger for the full
# protocol.
# Model: a scratch copy of models/demo (its statistics go into the copy).
# Work and results: build/bench-dyneval; a step whose output is there is
# skipped, so a long run resumes. STEPS="stats ptb wp cost" selects.
set -euo pipefail
BIN=${BIN:-bin}
DATA=${NEUROCACHE_DATA:-../shared/data}
W=${BENCH_DYN_DIR:-build/bench-dyneval}
STEPS=${STEPS:-stats ptb wp cost}
TUNE_TOK=${DYN_TUNE_TOKENS:-5000}
WP_LINES=${DYN_WP_LINES:-1000}
PTB_LINES=${DYN_PTB_LINES:-750}     # of PTB test (0 = all)
LRS=${DYN_LRS:-0.001,0.002,0.003}; DECAYS=${DYN_DECAYS:-0.0025,0.01}; SEGS=${DYN_SEGS:-5,20}; PARAMS=${DYN_PARAMS:-3}
# DYN_OPTS="--dyn-lr X --dyn-decay Y --dyn-segment N --dyn-params P": evaluate with these instead of
# the tune stage's choice (e.g. settings picked by a wider grid on the validation text)
FIXED=${DYN_OPTS:-}
NC="nice -n 10 $BIN/neurocache"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u '+%F %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -f "$DATA/ptb/ptb.train.txt" ] || [ ! -f models/demo/model.safetensors ]; then
    echo "bench_dyneval: corpora (../shared/data) or models/demo absent: skipped"; exit 0
fi
mkdir -p "$W"
M=$W/model
if [ ! -f "$M/model.safetensors" ]; then
    mkdir -p "$M"; cp models/demo/config.json models/demo/vocab.txt models/demo/model.safetensors "$M/"
    [ -f models/demo/unbounded.faiss ] && cp models/demo/unbounded.faiss "$M/"
fi
if [[ " $STEPS " == *" stats "* ]] && [ ! -d "$M/dyneval" ]; then
    echo "== dyn-stats: MS_g on PTB train (first 100,000 tokens, segments of 20)"
    $NC dyn-stats --model "$M" --train "$DATA/ptb/ptb.train.txt" --tokens 100000 --segment 20 2>&1 | tee "$W/stats.txt"
fi
[ -f "$W/stats.txt" ] && cat "$W/stats.txt"
opts_of() { sed -n "s/^$1 .*options: //p" "$2" | head -1; }
dyn_of() { echo "$1" | grep -o -- '--dyn-lr.*'; }
NEU="--neural-cache 500 --theta 0.7 --lambda 0.1"
if [[ " $STEPS " == *" ptb "* ]]; then
    T=$W/ptb-tune.txt
    if [ -z "$FIXED" ] && ! grep -q "^best all" "$T" 2>/dev/null; then
        echo "== PTB: tune --dyn --dyn-params 2 on the first $TUNE_TOK tokens of PTB valid"
        $NC tune --model "$M" --valid "$DATA/ptb/ptb.valid.txt" --neural-cache 500 --thetas 0.7 --lambdas 0.1 \
            --dyn --dyn-params "$PARAMS" --dyn-tokens "$TUNE_TOK" --dyn-lrs "$LRS" --dyn-decays "$DECAYS" \
            --dyn-segments "$SEGS" --no-plot --out "$W/ptb" > "$T"
    fi
    if [ -n "$FIXED" ]; then D=$FIXED; B=$FIXED; else
        cat "$T"; D=$(opts_of "best dyn" "$T"); B=$(dyn_of "$(opts_of "best dyn+caches" "$T")"); fi
    P=$DATA/ptb/ptb.test.txt
    if [ "$PTB_LINES" -gt 0 ]; then head -n "$PTB_LINES" "$P" > "$W/ptb.part.txt"; P=$W/ptb.part.txt; fi
    if ! grep -q "tokens scored" "$W/ptb-eval.txt" 2>/dev/null; then
        echo "== PTB test ($(wc -w < "$P") words): static, neural, dynamic, both"
        $NC eval --model "$M" --csv "$W/ptb-eval.csv" --row "$NEU" --row "$D" --row "$NEU $B" "$P" \
            > "$W/ptb-eval.txt" 2>&1
    fi
    cat "$W/ptb-eval.txt"
    if ! grep -q "tokens scored" "$W/ptb-gate-eval.txt" 2>/dev/null; then
        echo "== PTB test, the same part: the neural cache weighed by the gate (fit-gate on PTB valid), without and with dynamic evaluation"
        [ -f "$M/gate.safetensors" ] || $NC fit-gate --model "$M" --valid "$DATA/ptb/ptb.valid.txt" --hidden 16 $NEU > "$W/ptb-gate.txt" 2>&1
        $NC eval --model "$M" --row "$NEU --gate" --row "$NEU $B --gate" "$P" > "$W/ptb-gate-eval.txt" 2>&1
    fi
    cat "$W/ptb-gate-eval.txt"
fi
if [[ " $STEPS " == *" wp "* ]]; then
    n=$(wc -l < "$DATA/books/warandpeace.ptb.txt"); h=$(( n / 10 ))
    head -n "$h" "$DATA/books/warandpeace.ptb.txt" > "$W/wp.head.txt"
    tail -n +"$(( h + 1 ))" "$DATA/books/warandpeace.ptb.txt" > "$W/wp.rest.txt"
    R=$W/wp.rest.txt
    if [ "$WP_LINES" -gt 0 ]; then head -n "$WP_LINES" "$W/wp.rest.txt" > "$W/wp.part.txt"; R=$W/wp.part.txt; fi
    UB="--unbounded --knn 256 --kernel epanechnikov --switch-at 20000 --threads 2"
    WPC="--neural-cache 2000 --theta 0.7 --lambda 0.3 --unbounded --knn 256 --kernel epanechnikov --unbounded-lambda 0.3"
    T=$W/wp-tune.txt
    if [ -z "$FIXED" ] && ! grep -q "^best all" "$T" 2>/dev/null; then
        echo "== War and Peace: tune --dyn on the first $TUNE_TOK tokens of its first 10%"
        $NC tune --model "$M" --valid "$W/wp.head.txt" --neural-cache 2000 --thetas 0.7 --lambdas 0.3 $UB \
            --unbounded-lambdas 0.3 --dyn --dyn-params "$PARAMS" --dyn-tokens "$TUNE_TOK" --dyn-lrs "$LRS" \
            --dyn-decays "$DECAYS" --dyn-segments "$SEGS" --no-plot --out "$W/wp" > "$T"
    fi
    if [ -n "$FIXED" ]; then D=$FIXED; B=$FIXED; else
        cat "$T"; D=$(opts_of "best dyn" "$T"); B=$(dyn_of "$(opts_of "best dyn+caches" "$T")"); fi
    if ! grep -q "tokens scored" "$W/wp-eval.txt" 2>/dev/null; then
        echo "== War and Peace, $(wc -w < "$R") words of the other 90% (closed vocabulary): static, neural + unbounded, dynamic, both"
        $NC eval --model "$M" --memory "$W/wp.head.txt" --switch-at 20000 --threads 2 --csv "$W/wp-eval.csv" \
            --row "$WPC" --row "$D" --row "$WPC $B" "$R" > "$W/wp-eval.txt" 2>&1
    fi
    cat "$W/wp-eval.txt"
fi
if [[ " $STEPS " == *" cost "* ]]; then
    echo "== cost: tokens/CPU-s of a fed token, static vs dynamic evaluation per subset (PTB valid, first 200 lines)"
    head -n 200 "$DATA/ptb/ptb.valid.txt" > "$W/cost.txt"
    OPENBLAS_NUM_THREADS=1 $NC eval --model "$M" --row "--dyn-lr 0.002 --dyn-params 0 --dyn-segment 20" \
        --row "--dyn-lr 0.002 --dyn-params 1 --dyn-segment 20" --row "--dyn-lr 0.002 --dyn-params 2 --dyn-segment 20" \
        --row "--dyn-lr 0.003 --dyn-params 3 --dyn-segment 20" --row "--dyn-lr 0.002 --dyn-params 2 --dyn-segment 40" \
        "$W/cost.txt" 2>&1 | tail -n 7 | tee "$W/cost-eval.txt"
fi
