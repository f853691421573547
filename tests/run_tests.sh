#!/usr/bin/env bash
# run_tests.sh -- runs each test binary, shows its output, sums the
# "N passed, N failed" lines, and fails if any binary failed or crashed.
set -u
total_pass=0; total_fail=0; bad=()
for t in "$@"; do
    name=$(basename "$t")
    echo "== $name"
    out=$("$t" 2> >(sed "s/^/   /" >&2)); rc=$?
    echo "$out"
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
