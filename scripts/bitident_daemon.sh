#!/bin/sh
# bitident_daemon.sh -- the daemon's side of bitident.sh: one session per
# cache setting on a fresh data directory, fed with adapt into the default
# namespace, then predict (components, explain) and one-word feeds each
# followed by a predict (the memo's path: a predict's search and logits
# read again by the next feed), all responses (session ids and the
# namespace's incarnation blanked) printed as one md5 per setting. Run it
# with two builds and compare.
#
#   scripts/bitident_daemon.sh BIN_DIR [TEXT]    (KEEP=DIR: the responses kept there)
set -eu
BIN=${1:?usage: bitident_daemon.sh BIN_DIR [TEXT]}
TEXT=${2:-}
TMP=$(mktemp -d)
trap 'kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -rf "$TMP"' EXIT
[ -n "$TEXT" ] || { TEXT=$TMP/text.txt; head -40 "${PTB:-../shared/data/ptb}/ptb.valid.txt" >"$TEXT"; }
"$BIN/neurocached" --model models/demo --data-dir "$TMP/data" --port 0 --port-file "$TMP/port" \
    --threads 1 --batch-threads 1 --allow-root 2>"$TMP/log" &
PID=$!
for _ in $(seq 300); do [ -s "$TMP/port" ] && break; sleep 0.2; done
[ -s "$TMP/port" ] || { cat "$TMP/log" >&2; exit 1; }
URL=http://127.0.0.1:$(cat "$TMP/port")/v1
for _ in $(seq 300); do [ "$(curl -s -o /dev/null -w '%{http_code}' "${URL%/v1}/ready")" = 200 ] && break; sleep 0.2; done
post() { curl -s "$URL/$1" -H 'Content-Type: application/json' -d "$2"; }
body=$(jq -Rs '{text: ., adapt: true, scores: true}' "$TEXT")
run() { # name cache-json
    sid=$(post sessions "{\"cache\": $2}" | jq -r .id)
    [ "$sid" != null ] || { echo "$1: no session" >&2; exit 1; }
    {
        post "sessions/$sid/feed" "$body"
        post "sessions/$sid/predict" '{"top_k": 20, "components": true, "explain": true}'
        for w in the market fell on monday and the dow rose; do
            post "sessions/$sid/feed" "{\"text\": \"$w\", \"scores\": true}"
            post "sessions/$sid/predict" '{"top_k": 5, "components": true}'
            post "sessions/$sid/predict" '{"top_k": 5}'
        done
    } | sed -E 's/ses_[0-9a-f]+/SES/g; s/"namespace_incarnation":[0-9]+/"namespace_incarnation":N/g' >"$TMP/$1.out"
    printf '%-16s %s\n' "$1" "$(md5sum <"$TMP/$1.out" | cut -d' ' -f1)"
    [ -z "${KEEP:-}" ] || cp "$TMP/$1.out" "$KEEP/"
}
run neural '{"neural_size": 500}'
run neural-global '{"neural_size": 500, "global_norm": true}'
run unigram '{"unigram_size": 500}'
run unbounded '{"unbounded": true, "knn": 256, "neural_size": 200}'
run unbounded-open '{"unbounded": true, "knn": 256, "open_vocab": true, "uniform_mu": 0.01}'
