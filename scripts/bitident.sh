#!/bin/sh
# bitident.sh -- md5 of `neurocache score --format json` under each cache
# setting a component change must leave bit-identical (issue 39: record
# before the change, compare after; the same figures or the change moved a
# number). One line per setting: its name, then the md5 of the JSON.
#
#   scripts/bitident.sh [BIN] [TEXT] [MEMORY] [GATE_MODEL]
#
# BIN: the neurocache binary (default bin/neurocache). TEXT: the scored text
# (default the first 140 lines of PTB valid, ~3.2k tokens). MEMORY: what
# the unbounded settings stream into the cache first (default the first
# 2,400 lines of PTB train, ~53k tokens: flat below the default switch at
# 65,536 pairs; the IVF setting switches at 20,000, where the cache trains
# its own index, synchronously: no timing in the numbers). GATE_MODEL: a
# copy of models/demo with a gate fitted (demo ships none; make one with
#   cp -a models/demo G && neurocache fit-gate --model G --valid FIT \
#       --neural-size 200 --unigram-size 200 --unbounded --memory MEMORY);
# without it the gate setting is skipped.
set -eu
BIN=${1:-bin/neurocache}
PTB=${PTB:-../shared/data/ptb}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
TEXT=${2:-}
MEMORY=${3:-}
GATE=${4:-}
if [ -z "$TEXT" ]; then TEXT=$TMP/text.txt; head -140 "$PTB/ptb.valid.txt" >"$TEXT"; fi
if [ -z "$MEMORY" ]; then MEMORY=$TMP/mem.txt; head -2400 "$PTB/ptb.train.txt" >"$MEMORY"; fi

run() { # name model options...
    name=$1 model=$2
    shift 2
    printf '%-22s %s\n' "$name" "$("$BIN" score --model "$model" --format json "$@" "$TEXT" 2>/dev/null | md5sum | cut -d' ' -f1)"
}
M=models/demo
run static $M
run neural $M --neural-size 2000
run neural-global-norm $M --neural-size 2000 --global-norm
run unigram $M --unigram-size 2000
run neural+unigram $M --neural-size 2000 --unigram-size 2000
run unbounded-flat $M --unbounded --memory "$MEMORY"
run unbounded-ivf $M --unbounded --memory "$MEMORY" --switch-at 20000
run unbounded-open-vocab $M --unbounded --memory "$MEMORY" --open-vocab --uniform-mu 0.01 --neural-size 500
if [ -n "$GATE" ]; then
    run gate "$GATE" --gate --neural-size 200 --unigram-size 200 --unbounded --memory "$MEMORY" --switch-at 20000
fi
run dyn-lr $M --dyn-lr 0.002
