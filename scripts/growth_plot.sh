#!/bin/bash
# growth_plot.sh TABLE PNG [TITLE]: draws the growth curve of
# scripts/bench_growth.sh (its table, which the script keeps in
# build/bench-growth/growth.md) with gnuplot: above, neural + unbounded as a
# share of the static model's tokens per CPU-second against the pairs
# stored, one line a held-out text, the goal of 50% dashed; below, the CPU
# ms a 1,000 tokens, the goal of 1.5x the smallest size's (the mean of its
# texts) dashed, and dotted the static model's beside each read (the
# machine's own drift between sizes: the ratio above is side by side, this
# is not). Only the rows of the default knobs are drawn (not the
# BENCH_NPROBES/BENCH_KNN, BENCH_EXACT or BENCH_PARTS rows).
set -euo pipefail
table=$1 png=$2 title=${3:-"the own training's growth curve"}
command -v gnuplot >/dev/null || { echo "growth_plot: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 2; }
[ -f "$table" ] || { echo "growth_plot: $table is absent: run scripts/bench_growth.sh first" >&2; exit 2; }
data=$(mktemp)
trap 'rm -f "$data"' EXIT
# | pairs | query | nlist, nprobe (recall) | static | n+u | ratio% | ms | ...:
# one gnuplot block (two blank lines apart) a query text, in the table's order
awk -F'|' '
    function trim(s) { gsub(/^ +| +$/, "", s); return s }
    trim($2) ~ /^[0-9]+$/ && trim($4) ~ /^[0-9]+, [0-9]+ \(/ {
        q = trim($3); r = trim($7); sub(/%/, "", r)
        if (!(q in seen)) { seen[q] = ++nq; name[nq] = q }
        rows[seen[q]] = rows[seen[q]] sprintf("%s %s %s %.1f\n", trim($2), r, trim($8), 1e6 / trim($5))
    }
    END {
        for (i = 1; i <= nq; i++) {
            n = name[i]
            sub(/^wp\.held\.txt$/, "War and Peace (held out)", n)
            sub(/^ptb\.valid\.txt$/, "PTB valid", n)
            sub(/^wt2\.held\.txt$/, "WikiText-2 (held out)", n)
            printf "\"%s\" ratio ms static\n%s\n\n", n, rows[i]
        }
    }' "$table" > "$data"
blocks=$(grep -c '^"' "$data" || true)
[ "$blocks" -gt 0 ] || { echo "growth_plot: no rows of the default knobs in $table" >&2; exit 2; }
# the goal of the cost: 1.5x the mean over the texts at the smallest size
goal=$(awk '/^[0-9]/ { if (min == "" || $1 < min) { min = $1; s = 0; n = 0 } if ($1 == min) { s += $3; n++ } }
            END { printf "%.1f", 1.5 * s / n }' "$data")
# the x axis: the sizes read, a little room either side, each a tic
sizes=$(awk '/^[0-9]/ { print $1 }' "$data" | sort -n | uniq)
xlo=$(echo "$sizes" | head -1 | awk '{ print $1 * 0.8 }')
xhi=$(echo "$sizes" | tail -1 | awk '{ print $1 * 1.25 }')
xtics=$(echo "$sizes" | awk '{ l = ($1 >= 1e6) ? sprintf("%.3gM", $1 / 1e6) : sprintf("%gk", $1 / 1e3)
                               printf "%s\"%s\" %s", (NR > 1) ? ", " : "", l, $1 }')
gnuplot <<GP
set terminal pngcairo size 1000,720 font "DejaVu Sans,10" noenhanced
set output "$png"
set multiplot layout 2,1 title "$title"
set logscale x
set xrange [$xlo:$xhi]
set xtics ($xtics)
set grid
set xlabel "pairs stored"
set ylabel "% of the static model's tokens/CPU-s"
set yrange [0:100]
set key inside left bottom
plot for [i=0:$blocks-1] "$data" index i using 1:2 with linespoints pt 7 lw 2 title columnhead(1), \
     50 with lines dt 2 lw 1 lc rgb "black" title "goal: 50%"
set ylabel "CPU ms / 1k tokens"
set yrange [0:*]
set key inside left bottom
plot for [i=0:$blocks-1] "$data" index i using 1:3 with linespoints pt 7 lw 2 title columnhead(1), \
     for [i=0:$blocks-1] "$data" index i using 1:4 with lines dt 3 lw 2 lc i+1 title (i == 0 ? "static model, beside each (dotted)" : ""), \
     $goal with lines dt 2 lw 1 lc rgb "black" title "goal: 1.5x the smallest size's"
unset multiplot
GP
