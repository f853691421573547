#!/bin/bash
# Dynamic evaluation (issue 27, docs/dyneval.md): perplexity of held-out text
# with the model's weights adapted online, alone and beside the caches and
# the gate, hyper-parameters tuned on validation text; per-session memory of
# each subset; the cost of a fed token against the static model.
#   PTB: dyn-stats on PTB train, tune on PTB valid (first DYN_TUNE_TOKENS
#   tokens), evaluate on PTB test.
#   War and Peace (closed vocabulary): tune on the first 10% (also the
#   unbounded cache's memory), evaluate on the other 90%.
# Model: a scratch copy of models/demo (its statistics go into the copy).
# Work and results: build/bench-dyneval (each step kept: a rerun skips what
# is done, so a long run can be resumed). STEPS="stats ptb wp cost" selects.
set -euo pipefail
BIN=${BIN:-bin}
DATA=${NEUROCACHE_DATA:-../shared/data}
W=${BENCH_DYN_DIR:-build/bench-dyneval}
STEPS=${STEPS:-stats ptb wp cost}
TUNE_TOK=${DYN_TUNE_TOKENS:-20000}
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
NEU="--neural-cache 500 --theta 0.7 --lambda 0.1"
if [[ " $STEPS " == *" stats "* ]] && [ ! -d "$M/dyneval" ]; then
    echo "== dyn-stats: MS_g on PTB train (first 100,000 tokens, segments of 20)"
    $NC dyn-stats --model "$M" --train "$DATA/ptb/ptb.train.txt" --tokens 100000 --segment 20 2>&1 | tee "$W/stats.txt"
fi
[ -f "$W/stats.txt" ] && cat "$W/stats.txt"
opts_of() { sed -n "s/^$1 .*options: //p" "$2"; }
if [[ " $STEPS " == *" ptb "* ]]; then
    echo "== PTB: gate for the neural cache (fit-gate on PTB valid)"
    [ -f "$M/gate.safetensors" ] || $NC fit-gate --model "$M" --valid "$DATA/ptb/ptb.valid.txt" --hidden 16 $NEU > "$W/ptb-gate.txt" 2>&1
    for P in 2 0; do
        T=$W/ptb-tune-p$P.txt
        if [ ! -s "$T" ] || ! grep -q "^best all" "$T"; then
            echo "== PTB: tune --dyn --dyn-params $P on the first $TUNE_TOK tokens of PTB valid"
            # the sparse subset: its learning rate only, on a quarter of the text
            G=(); [ "$P" = 0 ] && G=(--dyn-tokens $(( TUNE_TOK / 4 )) --dyn-lrs 0.002,0.005,0.01,0.02 --dyn-decays 0.02 --dyn-segments 20)
            $NC tune --model "$M" --valid "$DATA/ptb/ptb.valid.txt" --neural-cache 500 --thetas 0.7 --lambdas 0.1 \
                --dyn --dyn-params $P --dyn-tokens "$TUNE_TOK" "${G[@]}" --no-plot --out "$W/ptb-p$P" > "$T"
        fi
        cat "$T"
    done
    D2=$(opts_of "best dyn" "$W/ptb-tune-p2.txt" | head -1); B2=$(opts_of "best dyn+caches" "$W/ptb-tune-p2.txt")
    D0=$(opts_of "best dyn" "$W/ptb-tune-p0.txt" | head -1); B0=$(opts_of "best dyn+caches" "$W/ptb-tune-p0.txt")
    BD2=$(echo "$B2" | grep -o -- '--dyn-lr.*')
    if [ ! -s "$W/ptb-eval.txt" ]; then
        echo "== PTB test: static, neural, dynamic (LSTM, biases), both, and with the gate"
        $NC eval --model "$M" --csv "$W/ptb-eval.csv" --row "$NEU" --row "$D2" --row "$B2" --row "$D0" --row "$B0" \
            --row "$NEU --gate" --row "$NEU $BD2 --gate" "$DATA/ptb/ptb.test.txt" > "$W/ptb-eval.txt" 2>&1
    fi
    cat "$W/ptb-eval.txt"
fi
if [[ " $STEPS " == *" wp "* ]]; then
    n=$(wc -l < "$DATA/books/warandpeace.ptb.txt"); h=$(( n / 10 ))
    head -n "$h" "$DATA/books/warandpeace.ptb.txt" > "$W/wp.head.txt"
    tail -n +"$(( h + 1 ))" "$DATA/books/warandpeace.ptb.txt" > "$W/wp.rest.txt"
    WPC="--neural-cache 2000 --theta 0.7 --lambda 0.3 --unbounded --knn 256 --kernel epanechnikov --unbounded-lambda 0.3 --switch-at 20000 --threads 2"
    T=$W/wp-tune.txt
    if [ ! -s "$T" ] || ! grep -q "^best all" "$T"; then
        echo "== War and Peace: tune --dyn on its first 10% (first $TUNE_TOK tokens, the whole tenth as memory)"
        $NC tune --model "$M" --valid "$W/wp.head.txt" --memory "$W/wp.head.txt" --neural-cache 2000 --thetas 0.7 \
            --lambdas 0.3 --unbounded --knn 256 --kernel epanechnikov --unbounded-lambdas 0.3 --switch-at 20000 \
            --threads 2 --dyn --dyn-params 2 --dyn-tokens "$TUNE_TOK" --no-plot --out "$W/wp" > "$T"
    fi
    cat "$T"
    D=$(opts_of "best dyn" "$T" | head -1); B=$(opts_of "best dyn+caches" "$T" | grep -o -- '--dyn-lr.*')
    if [ ! -s "$W/wp-eval.txt" ]; then
        echo "== War and Peace's other 90% (closed vocabulary): static, neural + unbounded, dynamic, both"
        $NC eval --model "$M" --memory "$W/wp.head.txt" --switch-at 20000 --threads 2 --csv "$W/wp-eval.csv" \
            --row "$WPC" --row "$D" --row "$WPC $B" "$W/wp.rest.txt" > "$W/wp-eval.txt" 2>&1
    fi
    cat "$W/wp-eval.txt"
fi
if [[ " $STEPS " == *" cost "* ]]; then
    echo "== cost: tokens/CPU-s of a fed token, static vs dynamic evaluation (PTB valid, first 2000 lines)"
    head -n 2000 "$DATA/ptb/ptb.valid.txt" > "$W/cost.txt"
    for P in 0 1 2 3; do
        $NC eval --model "$M" --row "--dyn-lr 0.001 --dyn-params $P --dyn-segment 20" "$W/cost.txt" 2>&1 | tail -n 2
    done
fi
