#!/bin/bash
# Replication through Redis Streams (issue 8): two replicas a and b on
# loopback, a real redis-server. Streams PTB's validation set into
# replica a's namespace and measures: a's ingest rate, the time until b
# holds every pair (b's apply rate, tokens/s), the lag of small documents
# on an idle pair (median/max over 30), the catch-up of b restarted after
# ptb.test.txt was streamed while it was down, and Redis bytes per token.
# Needs redis-server (make deps-test), a model (MODEL, default models/demo, else
# runs/demo) and ../shared/data/ptb (says so and exits 0 when absent).
set -euo pipefail
BIN=${BIN:-bin}
DATA=${NEUROCACHE_DATA:-../shared/data}
MODEL=${MODEL:-}
if [ -z "$MODEL" ]; then
    if [ -f models/demo/model.safetensors ]; then MODEL=models/demo; else MODEL=runs/demo; fi
fi
command -v redis-server >/dev/null || { echo "bench_replication: redis-server not installed (make deps-test); skipped"; exit 0; }
[ -f "$DATA/ptb/ptb.valid.txt" ] || { echo "bench_replication: $DATA/ptb absent; skipped"; exit 0; }
[ -f "$MODEL/model.safetensors" ] || { echo "bench_replication: no model in $MODEL; skipped"; exit 0; }

work=$(mktemp -d /tmp/nc-bench-repl-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# A copy of the model: runs/demo may be rewritten by a training run.
mkdir -p "$work/model" && cp "$MODEL"/config.json "$MODEL"/vocab.txt "$MODEL"/model.safetensors "$work/model/"
cp "$BIN"/neurocached "$work/"   # and of the daemon: a rebuild meanwhile must not break the run

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
RP=$(port); PA=$(port); PB=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 </dev/null &
pids+=($!)
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-root)
start() {   # tag port
    nice "$work"/neurocached "${root[@]}" --model "$work/model" --port "$2" --replica-tag "$1" \
        --redis "127.0.0.1:$RP" --data-dir "$work/data-$1" --snapshot-period 0 --log-level warn \
        >/dev/null 2>>"$work/$1.log" &
    echo $!
}
wait_ready() { for _ in $(seq 600); do curl -fs "localhost:$1/ready" >/dev/null && return 0; sleep 0.05; done; echo "replica on $1 not ready" >&2; exit 1; }
entries() { curl -s "localhost:$1/v1/namespaces/$2" | jq -r '.entries // 0'; }
now() { date +%s.%N; }

A=$(start a "$PA"); pids+=("$A"); B=$(start b "$PB"); pids+=("$B")
wait_ready "$PA"; wait_ready "$PB"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); $(date -u +%F)"
echo "model: $MODEL ($(jq -r '"V=\(.vocab_size) H=\(.hidden_size) L=\(.num_layers)"' "$work/model/config.json"))"

# 1. Bulk: ptb.valid.txt through a.
t0=$(now)
curl -s -X POST -H 'Content-Type: text/plain' --data-binary @"$DATA/ptb/ptb.valid.txt" \
    "localhost:$PA/v1/namespaces/bench/documents" >/dev/null
t1=$(now)
na=$(entries "$PA" bench)
while [ "$(entries "$PB" bench)" != "$na" ]; do sleep 0.02; done
t2=$(now)
python3 - "$na" "$t0" "$t1" "$t2" <<'PY'
import sys
n, t0, t1, t2 = int(sys.argv[1]), *map(float, sys.argv[2:])
print(f"bulk: {n} tokens streamed into a in {t1-t0:.2f} s ({n/(t1-t0):.0f} tokens/s, LSTM + log + publish)")
print(f"      b holds all of them {t2-t1:.2f} s after a answered, {t2-t0:.2f} s after the start "
      f"({n/(t2-t0):.0f} tokens/s applied by b, end to end)")
PY

# 2. Lag of small documents on an idle pair.
lags=(); rlags=()
for i in $(seq 30); do
    before=$(entries "$PB" bench)
    curl -s -X POST -H 'Content-Type: text/plain' --data-binary "the market rose $i points today ." \
        "localhost:$PA/v1/namespaces/bench/documents" >/dev/null
    s=$(now)
    while [ "$(entries "$PB" bench)" = "$before" ]; do :; done
    lags+=("$(python3 -c "print(($(now) - $s) * 1000)")")
    rlags+=("$(curl -s "localhost:$PB/v1/replication" | jq -r .last_lag_ms)")
done
printf '%s\n' "${lags[@]}" | sort -n | awk '{a[NR]=$1} END {printf "lag, one-line documents (30), a answered -> b shows the pairs (curl+jq polling): median %.1f ms, max %.1f ms\n", a[int((NR+1)/2)], a[NR]}'
printf '%s\n' "${rlags[@]}" | sort -n | awk '{a[NR]=$1} END {printf "lag, same documents, XADD on a -> added on b (/v1/replication last_lag_ms): median %d ms, max %d ms\n", a[int((NR+1)/2)], a[NR]}'

# 3. Catch-up after a restart.
kill -TERM "$B"; while kill -0 "$B" 2>/dev/null; do sleep 0.05; done   # drained and gone
curl -s -X POST -H 'Content-Type: text/plain' --data-binary @"$DATA/ptb/ptb.test.txt" \
    "localhost:$PA/v1/namespaces/bench/documents" >/dev/null
na2=$(entries "$PA" bench)
t0=$(now)
B=$(start b "$PB"); pids+=("$B")
wait_ready "$PB"
t1=$(now)
while [ "$(entries "$PB" bench)" != "$na2" ]; do sleep 0.02; done
t2=$(now)
caught=$(curl -s "localhost:$PB/v1/replication" | jq -r .applied_tokens)
python3 - "$caught" "$t0" "$t1" "$t2" <<'PY'
import sys
n, t0, t1, t2 = int(sys.argv[1]), *map(float, sys.argv[2:])
print(f"catch-up: b restarted after {n} tokens were streamed into a: ready in {t1-t0:.2f} s, "
      f"caught up {t2-t1:.2f} s later ({n/(t2-t1):.0f} tokens/s applied)")
PY
mem=$(redis-cli -p "$RP" info memory | awk -F: '/^used_memory:/{print $2}' | tr -d '\r')
echo "redis: $(redis-cli -p "$RP" xlen neurocache:ns:bench | tr -d '\r') entries, $mem bytes used, $((mem / na2)) bytes per token"
curl -s "localhost:$PB/v1/replication" | jq -c '{applied_tokens, refused_entries, max_lag_ms}'

# 4. Sessions moving between replicas: state size, export/import, migrate
# CLI, and a drain handing 50 sessions (neural cache 2000, 1000 tokens fed
# each) to the peer.
PC=$(port); PD=$(port)
peers="c=http://127.0.0.1:$PC,d=http://127.0.0.1:$PD"
startp() {  # tag port
    nice "$work"/neurocached "${root[@]}" --model "$work/model" --port "$2" --replica-tag "$1" \
        --peers "$peers" --data-dir "$work/data-$1" --log-level warn >/dev/null 2>>"$work/$1.log" &
    echo $!
}
C=$(startp c "$PC"); pids+=("$C"); D=$(startp d "$PD"); pids+=("$D")
wait_ready "$PC"; wait_ready "$PD"
ids=()
for i in $(seq 50); do
    id=$(curl -s -H 'Content-Type: application/json' -d '{"cache":{"neural_size":2000,"neural_theta":0.3,"neural_lambda":0.1,"unigram_size":2000}}' \
        "localhost:$PC/v1/sessions" | jq -r .id)
    sed -n "$((i * 40)),$((i * 40 + 43))p" "$DATA/ptb/ptb.valid.txt" | jq -Rs '{text: .}' |
        curl -s -H 'Content-Type: application/json' -d @- "localhost:$PC/v1/sessions/$id/feed" >/dev/null
    ids+=("$id")
done
tok=$(curl -s "localhost:$PC/v1/sessions/${ids[0]}" | jq -r .tokens)
g=$(curl -s -o "$work/state.bin" -w '%{time_total}' "localhost:$PC/v1/sessions/${ids[0]}/state")
p=$(curl -s -o /dev/null -w '%{time_total}' -X PUT --data-binary @"$work/state.bin" "localhost:$PD/v1/sessions/copy/state")
echo "session state: $(stat -c %s "$work/state.bin") bytes after $tok tokens (neural 2000 f32 keys, unigram 2000); GET $(python3 -c "print(round($g*1000,1))") ms, PUT $(python3 -c "print(round($p*1000,1))") ms"
t0=$(now)
"$BIN"/neurocache migrate --from "http://127.0.0.1:$PC" --to "http://127.0.0.1:$PD" --session "${ids[1]}" >/dev/null 2>&1
t1=$(now)
echo "neurocache migrate of one session: $(python3 -c "print(round(($t1 - $t0) * 1000, 1))") ms (process start included)"
n=$(curl -s "localhost:$PC/v1/sessions" | jq -r .count)
t0=$(now)
kill -TERM "$C"; while kill -0 "$C" 2>/dev/null; do sleep 0.02; done
t1=$(now)
echo "drain: SIGTERM to exit with $n sessions handed to the peer: $(python3 -c "print(round($t1 - $t0, 2))") s; peer now holds $(curl -s "localhost:$PD/v1/sessions" | jq -r .count)"
