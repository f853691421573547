#!/bin/bash
# Online adaptation (issue 6): adaptation throughput of the real daemon
# (a corpus streamed into a namespace over HTTP, chunked), durable adds with
# an fsync per request vs group commit, recovery time per million pairs, and
# predict latency with the unbounded cache (k 1024, nprobe 8) at 100k, 1M and
# a synthetic 10M pairs. Model: models/demo (2x256), else a read-only copy of
# runs/demo. The IVF4096,PQ32 index is the model's unbounded.faiss, else one
# trained with `neurocache build-index` into a scratch directory (never into
# the model directory). Corpora are read from ../shared/data/ptb. Set
# BENCH_ADAPT_QUICK=1 for small sizes, BENCH_ADAPT_MB=N for the upload size
# (default 5 MB of PTB, about 900k tokens).
set -euo pipefail
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
DATA=${NEUROCACHE_DATA:-../shared/data}
PTB="$DATA/ptb"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u '+%F %H:%M UTC')"
if [ ! -f "$PTB/ptb.train.txt" ]; then
    echo "bench_adapt: $PTB/ptb.train.txt is absent: skipped (corpora are read from ../shared/data)"
    exit 0
fi
SRC=${NEUROCACHE_BENCH_MODEL:-models/demo}
[ -f "$SRC/model.safetensors" ] || SRC=runs/demo
if [ ! -f "$SRC/model.safetensors" ]; then
    echo "bench_adapt: no model in models/demo or runs/demo: skipped"
    exit 0
fi
TMP=$(mktemp -d /tmp/nc-bench-adapt-XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
mkdir -p "$TMP/model"
cp "$SRC/config.json" "$SRC/vocab.txt" "$SRC/model.safetensors" "$TMP/model/"
MODEL="$TMP/model"
echo "model: $SRC ($(grep -o '"hidden_size": *[0-9]*' "$MODEL/config.json"), $(grep -o '"num_layers": *[0-9]*' "$MODEL/config.json"))"
cat "$PTB/ptb.train.txt" "$PTB/ptb.valid.txt" "$PTB/ptb.test.txt" > "$TMP/ptb.all.txt"
QUICK=${BENCH_ADAPT_QUICK:-0}
# MB: megabytes of the corpus streamed through the daemon (0 = all of it)
if [ "$QUICK" = 1 ]; then SAMPLE=20000; FACTORY=IVF256,PQ32; SIZES="20000 100000"; REC=100000; FLAT=50000; MB=1;
else SAMPLE=160000; FACTORY=IVF4096,PQ32; SIZES="100000 1000000 10000000"; REC=1000000; FLAT=200000; MB=${BENCH_ADAPT_MB:-5}; fi

echo; echo "== durable adds: fsync per request vs group commit"
nice "$BUILD"/tests/bench_adapt fsync "$MODEL" 3

if [ "$QUICK" != 1 ] && [ -f "$SRC/unbounded.faiss" ]; then
    # the model's own trained index (build-index on PTB train, IVF4096,PQ32)
    echo; echo "== the model's unbounded.faiss ($SRC)"
    cp "$SRC/unbounded.faiss" "$TMP/unbounded.faiss"
else
    echo; echo "== training $FACTORY on $SAMPLE hidden states of ptb.train (neurocache build-index)"
    t0=$(date +%s.%N)
    nice "$BIN"/neurocache build-index --model "$MODEL" --no-normalize --corpus "$PTB/ptb.train.txt" --factory "$FACTORY" \
        --sample "$SAMPLE" --threads "$(nproc)" --out "$TMP/unbounded.faiss" 2>&1 | tail -n 2
    echo "trained in $(echo "$(date +%s.%N) - $t0" | bc) s"
fi

echo; echo "== adaptation throughput: the daemon, PTB (train+valid+test) streamed as text/plain, chunked"
cp "$TMP/unbounded.faiss" "$MODEL/unbounded.faiss"
for fs in group none; do
    rm -rf "$TMP/data"
    EXTRA=(); [ "$(id -u)" = 0 ] && EXTRA=(--allow-root)
    "$BIN"/neurocached --model "$MODEL" --data-dir "$TMP/data" --port 0 --port-file "$TMP/port" \
        --fsync "$fs" --log-format text "${EXTRA[@]}" 2> "$TMP/daemon.log" &
    PID=$!
    for _ in $(seq 100); do [ -s "$TMP/port" ] && curl -sf "http://127.0.0.1:$(cat "$TMP/port")/ready" >/dev/null && break; sleep 0.1; done
    PORT=$(cat "$TMP/port")
    BODY="$TMP/ptb.all.txt"
    if [ "$MB" != 0 ]; then head -c "${MB}000000" "$TMP/ptb.all.txt" > "$TMP/part.txt"; BODY="$TMP/part.txt"; fi
    t0=$(date +%s.%N)
    OUT=$(curl -sS -H 'Content-Type: text/plain' -H 'Transfer-Encoding: chunked' --data-binary @"$BODY" \
        "http://127.0.0.1:$PORT/v1/namespaces/bench/documents?id=ptb&normalize=false")
    t1=$(date +%s.%N)
    TOK=$(echo "$OUT" | grep -o '"tokens_added":[0-9]*' | cut -d: -f2)
    HWM=$(grep VmHWM /proc/$PID/status | awk '{print $2}')
    INFO=$(curl -s "http://127.0.0.1:$PORT/v1/namespaces/bench")
    echo "fsync=$fs: $TOK tokens in $(printf '%.1f' "$(echo "$t1 - $t0" | bc)") s = $(printf '%.0f' "$(echo "$TOK / ($t1 - $t0)" | bc -l)") tokens/s; daemon peak RSS $((HWM / 1024)) MB; $(echo "$INFO" | grep -o '"index":{[^}]*}')"
    if [ "$fs" = group ]; then
        # two uploads at once (one per core), into a second namespace
        L=$(wc -l < "$BODY"); split -l $(((L + 1) / 2)) "$BODY" "$TMP/half."
        t0=$(date +%s.%N)
        for h in "$TMP"/half.*; do
            curl -sS -H 'Content-Type: text/plain' -H 'Transfer-Encoding: chunked' --data-binary @"$h" \
                "http://127.0.0.1:$PORT/v1/namespaces/bench2/documents" > "$h.out" &
        done
        wait $(jobs -p | grep -v "^$PID\$") 2>/dev/null || true
        t1=$(date +%s.%N)
        TOK2=$(cat "$TMP"/half.*.out | grep -o '"tokens_added":[0-9]*' | cut -d: -f2 | paste -sd+ | bc)
        echo "fsync=$fs, 2 concurrent uploads: $TOK2 tokens in $(printf '%.1f' "$(echo "$t1 - $t0" | bc)") s = $(printf '%.0f' "$(echo "$TOK2 / ($t1 - $t0)" | bc -l)") tokens/s"
    fi
    kill "$PID"; wait "$PID" || true; PID=
    rm -f "$TMP/port"
done
rm -f "$MODEL/unbounded.faiss"

echo; echo "== recovery time ($REC pairs of the model's hidden states, IVF-PQ index)"
nice "$BUILD"/tests/bench_adapt recovery "$MODEL" "$TMP/ptb.all.txt" "$REC" "$TMP/unbounded.faiss"
echo; echo "== recovery time ($FLAT pairs, exact flat index)"
nice "$BUILD"/tests/bench_adapt recovery "$MODEL" "$TMP/ptb.all.txt" "$FLAT"

echo; echo "== predict latency with the unbounded cache"
# shellcheck disable=SC2086
nice "$BUILD"/tests/bench_adapt predict "$MODEL" "$TMP/ptb.all.txt" "$TMP/unbounded.faiss" $SIZES
