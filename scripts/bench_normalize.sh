#!/bin/bash
# bench_normalize.sh -- ordinary text against its PTB-style copy (issue 23):
# the normaliser's cost (tokens/s of tokenize() normalised against white-space
# split, interleaved runs: tests/bench_normalize.c), then for each raw corpus
# and its .ptb.txt copy the unknown-word rate and perplexity of the demo
# model (static, no cache), through `neurocache score` and through the
# daemon's POST /v1/score (the same numbers both ways): the raw text
# normalised by the model's "text" conventions, the raw text white-space
# split (--no-normalize: what every client got before), and the .ptb.txt
# copy white-space split (it is already in the conventions).
#
#   scripts/bench_normalize.sh                  # models/demo, War and Peace and WikiText-2 valid
#   MODEL=dir STEPS="cost cli daemon" ROWS="raw-normalised raw-whitespace ptb-whitespace" ONLY=wikitext \
#       scripts/bench_normalize.sh
set -euo pipefail
BIN=${BIN:-bin}
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/demo}
DATA=${NEUROCACHE_DATA:-../shared/data}
STEPS=${STEPS:-cost cli daemon}
ROWS=${ROWS:-raw-normalised raw-whitespace ptb-whitespace}
ONLY=${ONLY:-}   # only the corpora whose path contains this
PAIRS=("$DATA/books/warandpeace.txt:$DATA/books/warandpeace.ptb.txt" "$DATA/wikitext-2/valid.txt:$DATA/wikitext-2/valid.ptb.txt")
for p in "${PAIRS[@]}"; do
    for f in ${p//:/ }; do [ -f "$f" ] || { echo "bench_normalize: $f is absent: skipped (corpora live in ../shared/data)"; exit 0; }; done
done
[ -f "$MODEL/model.safetensors" ] || { echo "bench_normalize: no model in $MODEL: skipped"; exit 0; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u '+%F %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"
TMP=$(mktemp -d /tmp/nc-normalize-XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

# rows: "file mode" -> the three ways to read it
runs() {
    for p in "${PAIRS[@]}"; do
        raw=${p%%:*} ptb=${p#*:}
        [[ "$raw" == *"$ONLY"* ]] || continue
        [[ " $ROWS " == *" raw-normalised "* ]] && echo "$raw normalised"
        [[ " $ROWS " == *" raw-whitespace "* ]] && echo "$raw whitespace"
        [[ " $ROWS " == *" ptb-whitespace "* ]] && echo "$ptb whitespace"
        true
    done
}

if [[ " $STEPS " == *" cost "* ]]; then
    echo; echo "== the normaliser's cost: tokenize() of each file, best of 3 interleaved runs"
    [ -x "$BUILD/tests/bench_normalize" ] || make --no-print-directory "$BUILD/tests/bench_normalize" > /dev/null
    nice "$BUILD/tests/bench_normalize" --model "$MODEL" --runs 3 $(for p in "${PAIRS[@]}"; do echo "${p%%:*}"; done)
fi

if [[ " $STEPS " == *" cli "* ]]; then
    echo; echo "== neurocache score (static model)"
    printf '%-44s %-11s %9s %9s %7s %10s\n' file mode tokens unknown unk% perplexity
    runs | while read -r f mode; do
        flag=; [ "$mode" = whitespace ] && flag=--no-normalize
        # shellcheck disable=SC2086
        nice "$BIN/neurocache" score --model "$MODEL" $flag --format json "$f" > "$TMP/cli.json" 2> "$TMP/cli.err"
        sed -n 's/^\([0-9]*\) tokens scored in .*perplexity \([0-9.]*\), unknown words \([0-9]*\) (\([0-9.]*\)%).*/\1 \3 \4 \2/p' "$TMP/cli.err" |
            { read -r n u r p; printf '%-44s %-11s %9s %9s %6s%% %10s\n' "$f" "$mode" "$n" "$u" "$r" "$p"; }
    done
fi

if [[ " $STEPS " == *" daemon "* ]]; then
    echo; echo "== the daemon: POST /v1/score {\"text\": <the file>, \"normalize\": ...} (static model)"
    ROOT=
    [ "$(id -u)" = 0 ] && ROOT=--allow-root
    "$BIN/neurocached" --model "$MODEL" --port 0 --port-file "$TMP/port" --data-dir "$TMP/data" --log-level warn \
        --max-body-bytes 100000000 --max-tokens-per-request 10000000 --request-timeout 3600 $ROOT > "$TMP/daemon.log" 2>&1 &
    PID=$!
    for _ in $(seq 300); do [ -s "$TMP/port" ] && curl -sf "http://127.0.0.1:$(cat "$TMP/port")/ready" > /dev/null && break; sleep 0.2; done
    URL="http://127.0.0.1:$(cat "$TMP/port")"
    printf '%-44s %-11s %9s %9s %7s %10s\n' file mode tokens unknown unk% perplexity
    runs | while read -r f mode; do
        norm=true; [ "$mode" = whitespace ] && norm=false
        python3 -c 'import json,sys; print(json.dumps({"text": open(sys.argv[1]).read(), "normalize": sys.argv[2] == "true"}))' \
            "$f" "$norm" > "$TMP/req.json"
        curl -sf "$URL/v1/score" -H 'Content-Type: application/json' --data-binary @"$TMP/req.json" > "$TMP/d.json"
        python3 - "$f" "$mode" "$TMP/d.json" <<'PY'
import json, sys
f, mode, path = sys.argv[1:4]
d = json.load(open(path))
n = len(d["tokens"])
print(f"{f:44s} {mode:11s} {n:9d} {d['unk_count']:9d} {100.0 * d['unk_count'] / n:6.2f}% {d['ppl']:10.4f}")
PY
    done
fi
