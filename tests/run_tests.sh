#!/usr/bin/env bash
# run_tests.sh -- runs each test binary, shows its output, sums the
# "N passed, N failed" lines, and fails if any binary failed or crashed.
set -u
# FAISS's k-means and index training run in OpenMP teams (2 threads here).
# libgomp's default lets a thread that waits at a barrier spin for its
# peers; when another process holds one of the cores (a benchmark, a
# daemon the suite started, a second build) the spinning thread burns the
# time slice its peer needs, and each barrier costs a scheduler tick:
# test_compact took 13-74 s beside a benchmark, 0.65 s with passive waits.
# PASSIVE only changes how an idle thread waits (it sleeps on a futex):
# the same threads split the same work, so results are unchanged. Inherited
# by the daemons the suites start. An OMP_WAIT_POLICY already set is kept.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
total_pass=0; total_fail=0; bad=()
for t in "$@"; do
    name=$(basename "$t")
    echo "== $name"
    t0=${EPOCHREALTIME/[^0-9]/}   # microseconds (the locale's decimal mark taken out)
    out=$("$t" 2> >(sed "s/^/   /" >&2)); rc=$?
    echo "$out"
    # each suite's wall time, so that the one that grows is seen before
    # `make test` passes its 15 minutes (docs/testing.md)
    ds=$(( (${EPOCHREALTIME/[^0-9]/} - t0) / 100000 ))
    echo "-- $name: $((ds / 10)).$((ds % 10)) s"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        bad+=("$name (exit $rc, no summary line)"); total_fail=$((total_fail + 1)); continue
    fi
    p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}')
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
    [ "$rc" -eq 0 ] || [ "$f" -gt 0 ] || { bad+=("$name (exit $rc)"); total_fail=$((total_fail + 1)); }
    [ "$f" -eq 0 ] || bad+=("$name ($f failed)")
done
echo
[ ${#bad[@]} -eq 0 ] || printf 'FAILED: %s\n' "${bad[@]}"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
