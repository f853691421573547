#!/bin/bash
# soak_plot.sh CSV PNG [WARMUP_S] [TITLE]: draws a soak's memory curve (the
# --csv of tests/soak.c) with gnuplot: RSS, RSS less the namespaces' memory,
# the namespaces' and the sessions' memory and malloc's free bytes inside its arenas, in MB over
# minutes (MB = 10^6 bytes); the warm-up is shaded.
set -euo pipefail
csv=$1 png=$2 warm=${3:-180} title=${4:-soak}
command -v gnuplot >/dev/null || { echo "soak_plot: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 2; }
gnuplot <<GP
set terminal pngcairo size 1000,520 font "DejaVu Sans,10" noenhanced
set output "$png"
set datafile separator ","
set title "$title"
set xlabel "minutes"
set ylabel "MB"
set grid
set key outside bottom center horizontal
set yrange [0:*]
set object 1 rectangle from 0,graph 0 to $warm/60.0,graph 1 fillcolor rgb "#eeeeee" fillstyle solid noborder behind
set label 1 "warm-up" at $warm/120.0,graph 0.95 center
plot "$csv" every ::1 using (\$1/60):(\$11*1024/1e6) with linespoints pt 7 ps 0.4 lw 2 title "RSS", \
     "" every ::1 using (\$1/60):((\$11*1024-\$24-\$25)/1e6) with lines lw 2 dt 2 title "RSS less namespace memory", \
     "" every ::1 using (\$1/60):((\$24+\$25)/1e6) with lines lw 1 title "namespace memory (with index tables)", \
     "" every ::1 using (\$1/60):(\$21/1e6) with lines lw 1 title "session memory", \
     "" every ::1 using (\$1/60):(\$15/1e6) with lines lw 1 title "malloc arenas free"
GP
