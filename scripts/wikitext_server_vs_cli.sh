#!/bin/bash
# WikiText-2 end to end, the server against the CLI (issue 15): the memory
# (WikiText-2 valid, PTB style, but its last HELD lines) is uploaded into a
# namespace as one text/plain document, then the held-out lines are fed with
# "adapt" and "scores" through a session reading that namespace; the CLI
# scores the same text with `neurocache score --memory` and the same
# settings (neural cache 2000, theta 1, lambda 0.3; unbounded cache k 1024,
# nprobe 8, lambda 0.3; the model's trained index, switch at 65536 pairs).
# Both vocabulary modes: closed (the default) and open (with uniform mu
# 0.01, so that a word nothing predicts still has a finite log-probability).
# EXACT=1 keeps both on the exact flat index (switch at 10^9 pairs), so that
# only float16 keys and summation order separate them. Prints perplexities,
# the largest per-token difference and the memory's streaming speed on both
# sides (upload / --memory). The text is PTB-style, read as written
# (?normalize=false, "normalize": false, --no-normalize: docs/normalisation.md).
#
#   scripts/wikitext_server_vs_cli.sh            # models/demo, HELD=150 lines
#   BIN=/path/to/bin MODEL=dir HELD=150 MEMORY_LINES=N EXACT=1 scripts/wikitext_server_vs_cli.sh
set -euo pipefail
BIN=${BIN:-bin}
MODEL=${MODEL:-models/demo}
DATA=${NEUROCACHE_DATA:-../shared/data}
HELD=${HELD:-150}
SRC="$DATA/wikitext-2/valid.ptb.txt"
[ -f "$SRC" ] || { echo "$SRC is absent (corpora are read from ../shared/data)"; exit 1; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u '+%F %H:%M UTC')"
TMP=$(mktemp -d /tmp/nc-wikitext-XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
N=$(wc -l < "$SRC")
head -n $((N - HELD)) "$SRC" > "$TMP/memory.txt"
[ -n "${MEMORY_LINES:-}" ] && { head -n "$MEMORY_LINES" "$TMP/memory.txt" > "$TMP/m"; mv "$TMP/m" "$TMP/memory.txt"; }
tail -n "$HELD" "$SRC" > "$TMP/text.txt"
echo "memory: $(wc -l < "$TMP/memory.txt") lines of $SRC; held out: its last $HELD lines"

ROOT=
[ "$(id -u)" = 0 ] && ROOT=--allow-root
SWITCH=65536
[ "${EXACT:-0}" = 1 ] && SWITCH=1000000000
echo "index: exact flat up to $SWITCH pairs, then the model's unbounded.faiss"
"$BIN/neurocached" --model "$MODEL" --index-switch-at $SWITCH --port 0 --port-file "$TMP/port" --data-dir "$TMP/data" \
    --log-level warn $ROOT > "$TMP/daemon.log" 2>&1 &
PID=$!
for _ in $(seq 300); do [ -s "$TMP/port" ] && curl -sf "http://127.0.0.1:$(cat "$TMP/port")/ready" > /dev/null && break; sleep 0.2; done
URL="http://127.0.0.1:$(cat "$TMP/port")"

NEURAL='"neural_size":2000,"neural_theta":1,"neural_lambda":0.3'
UNB='"unbounded":true,"knn":1024,"nprobe":8,"unbounded_lambda":0.3'
CLIOPTS="--switch-at $SWITCH --neural-cache 2000 --theta 1 --lambda 0.3 --unbounded --knn 1024 --nprobe 8 --unbounded-lambda 0.3"
for mode in closed open; do
    if [ $mode = open ]; then VOC=',"open_vocab":true,"uniform_mu":0.01'; CV="--open-vocab --uniform-mu 0.01"; else VOC=; CV=; fi
    t0=$(date +%s.%N)
    curl -sf -X POST -H 'Content-Type: text/plain' --data-binary @"$TMP/memory.txt" \
        "$URL/v1/namespaces/wiki-$mode/documents?id=valid&normalize=false" > "$TMP/up.json"
    t1=$(date +%s.%N)
    curl -sf "$URL/v1/sessions" -H 'Content-Type: application/json' \
        -d "{\"id\":\"s-$mode\",\"namespace\":\"wiki-$mode\",\"cache\":{$NEURAL,$UNB$VOC}}" > /dev/null
    python3 -c 'import json,sys; print(json.dumps({"text": open(sys.argv[1]).read(), "adapt": True, "scores": True, "normalize": False}))' \
        "$TMP/text.txt" > "$TMP/feed.json"
    t2=$(date +%s.%N)
    curl -sf "$URL/v1/sessions/s-$mode/feed" -H 'Content-Type: application/json' --data-binary @"$TMP/feed.json" > "$TMP/daemon-$mode.json"
    t3=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$BIN/neurocache" score --model "$MODEL" --no-normalize --memory "$TMP/memory.txt" $CLIOPTS $CV --format json \
        "$TMP/text.txt" > "$TMP/cli-$mode.json" 2> "$TMP/cli-$mode.err"
    python3 - "$mode" "$TMP/up.json" "$TMP/daemon-$mode.json" "$TMP/cli-$mode.json" "$TMP/cli-$mode.err" \
        "$t0" "$t1" "$t2" "$t3" <<'PY'
import json, math, re, sys
mode, up, dj, cj, cerr = sys.argv[1:6]
t0, t1, t2, t3 = map(float, sys.argv[6:10])
u = json.load(open(up)); d = json.load(open(dj))["logprobs"]; c = json.load(open(cj))["logprobs"]
err = open(cerr).read()
assert len(d) == len(c), (len(d), len(c))
def ppl(v):
    return math.inf if any(x is None for x in v) else math.exp(-sum(v) / len(v))
diff = max(abs(a - b) for a, b in zip(d, c) if a is not None and b is not None)
speeds = re.findall(r"stored in [\d.]+ s \((\d+) tokens/s\)", err)
mem_tps = int(speeds[-1]) if speeds else float("nan")
cli = re.search(r"(\d+) tokens scored in ([\d.]+) s", err)
print(f"{mode:6s} tokens {len(d)}  perplexity daemon {ppl(d):.2f}  CLI {ppl(c):.2f}  "
      f"max |dlogp| {diff:.3g}")
print(f"       memory {u['tokens_added']} tokens: upload {u['tokens_added'] / (t1 - t0):.0f} tokens/s "
      f"({t1 - t0:.1f} s), CLI --memory {mem_tps} tokens/s; session feed {t3 - t2:.1f} s, CLI memory + scoring {cli.group(2)} s")
PY
done
kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
