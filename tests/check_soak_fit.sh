#!/usr/bin/env bash
# check_soak_fit.sh -- soak --from-csv's fit of anonymous RSS less the
# namespaces on time and namespace entries (tests/soak.c trend_fit) finds
# the slopes a synthetic CSV was made with: 30,000 kB + 0.5 kB/s + 1.2 kB
# per 100 entries, entries drawn from 50k-400k, Gaussian noise of 50 kB,
# every 17th sample in a training (left out of the fit). 181 samples of
# noise 50 kB, times spread over 1440-7200 s (sd 1,663 s) and entries over
# 350k (sd 101k), drawn independently, give the time slope a standard
# error of 50 / (sqrt(181) 1663) = 2.2 kB per 1000 s and the entries' 3.7
# kB per 100k (sigma / (sqrt(n) sd)): the bounds below, +-25 and +-30, are
# 11 and 8 of them (whichever awk's generator draws), and still fail a
# fit that keeps the training samples (+5,000 kB on every 17th: +1,343 kB
# per 100k entries with mawk's draws) or one singular in either regressor
# (no fitted line).
# Prints "N passed, N failed" (tests/run_tests.sh).
set -u
cd "$(dirname "$0")/.."
SOAK=${BUILD:-build}/tests/soak
pass=0; fail=0
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
awk 'BEGIN {
    srand(7)
    print "t_s,process_resident_bytes:anon,namespace_memory_bytes,index_tables_bytes,namespace_entries,namespace_index_training_in_progress"
    for (i = 0; i < 240; i++) {
        t = 30 * (i + 1); e = 50000 + int(rand() * 350000); ns = e * 80
        g = sqrt(-2 * log(1 - rand())) * cos(6.283185307 * rand())   # Box-Muller
        kb = 30000 + 0.5 * t + 0.012 * e + 50 * g
        tr = i % 17 == 0
        if (tr) kb += 5000    # a training: its buffers, not in the fit
        printf "%d,%d,%d,0,%d,%d\n", t, kb * 1024 + ns, ns, e, tr
    }
}' > "$tmp"
out=$("$SOAK" --from-csv "$tmp" --warmup 1440 2>&1)
echo "$out"
line=$(echo "$out" | grep "fitted on time")
bt=$(echo "$line" | sed -n 's/.*: \([-+][0-9]*\) kB per 1000 s.*/\1/p')
be=$(echo "$line" | sed -n 's/.*, \([-+][0-9]*\) kB per 100,000 entries.*/\1/p')
if [ -n "$bt" ] && [ -n "$be" ] && [ "${bt#+}" -ge 475 ] && [ "${bt#+}" -le 525 ] &&
   [ "${be#+}" -ge 1170 ] && [ "${be#+}" -le 1230 ]; then
    pass=$((pass + 1))
else
    fail=$((fail + 1)); echo "FAIL: fitted ${bt:-?} kB per 1000 s and ${be:-?} kB per 100k entries, made with +500 and +1200"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
