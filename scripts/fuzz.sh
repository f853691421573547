#!/usr/bin/env bash
# fuzz.sh SECONDS NAME... -- runs each libFuzzer harness build/fuzz/tests/NAME
# for SECONDS (at nice 19: the machine may be busy), from the committed seeds
# tests/fuzz/corpus/NAME plus the inputs found so far in build/fuzz/corpus/NAME,
# and prints one line per harness: executions, exec/s, coverage (edges) and
# features. Fails if any harness crashed (the input is in build/fuzz/artifacts).
set -u
secs=$1; shift
mkdir -p build/fuzz/artifacts
fail=0
printf '%-16s %12s %9s %7s %8s %7s  %s\n' harness executions exec/s cov ft corpus result
for name in "$@"; do
    short=${name#fuzz_}
    mkdir -p "build/fuzz/corpus/$short" "tests/fuzz/corpus/$short"
    log="build/fuzz/$name.log"
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    nice -n 19 "build/fuzz/tests/$name" -max_total_time="$secs" -print_final_stats=1 \
        -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="build/fuzz/artifacts/$short-" \
        "build/fuzz/corpus/$short" "tests/fuzz/corpus/$short" >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
    last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
    cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*')
    ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*')
    corp=$(echo "$last" | grep -o 'corp: [0-9]*' | grep -o '[0-9]*')
    result=ok
    if [ "$rc" -ne 0 ]; then result="CRASH (exit $rc, see $log)"; fail=1; fi
    printf '%-16s %12s %9s %7s %8s %7s  %s\n' "$short" "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
exit $fail
