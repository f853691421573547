#!/usr/bin/env bash
# check_params.sh -- short parameter lists (issue 28, point 4): no function
# defined in core/, store/, proto/, server/ or tools/ takes more than 6
# parameters (tests/funclen.py --params); a longer list becomes a struct.
# The functions that still do are listed in tests/long_params.allow, each
# with its reason; an entry that no longer has more than 6 fails, so the
# list only shrinks. The parser is first checked on known cases
# (tests/fixtures/params_cases.c). Prints each offender and
# "N passed, N failed" (tests/run_tests.sh).
set -u
cd "$(dirname "$0")/.."
MAX=6
allow=tests/long_params.allow
pass=0; fail=0

# the parser against cases whose counts are written beside them ("want N")
cases=tests/fixtures/params_cases.c
got=$(python3 tests/funclen.py --params "$cases") || { echo "funclen.py failed on $cases"; echo "0 passed, 1 failed"; exit 1; }
want=$(grep -o 'want [0-9]* [a-z_0-9]*' "$cases" | awk '{print $2, $3}')
if [ "$(printf '%s\n' "$got" | awk '{print $1, $3}')" = "$want" ]; then
    pass=$((pass + 1))
else
    fail=$((fail + 1)); echo "FAIL: funclen.py --params on $cases:"; echo "got:"; echo "$got"; echo "want:"; echo "$want"
fi

list=$(python3 tests/funclen.py --params core/*/*.c store/*.c proto/*.c server/*.c server/*/*.c tools/*.c) || {
    echo "funclen.py failed"; echo "0 passed, 1 failed"; exit 1; }
allowed=$(grep -v '^#' "$allow" | awk 'NF {print $1}')
long=0
while read -r n loc name; do
    file=${loc%%:*}
    if [ "$n" -le "$MAX" ]; then pass=$((pass + 1)); continue; fi
    long=$((long + 1))
    if printf '%s\n' "$allowed" | grep -qxF "$file:$name"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1)); echo "FAIL: $loc $name takes $n parameters (> $MAX): pass a struct"
    fi
done <<< "$list"
for e in $allowed; do
    f=${e%%:*}; n=${e#*:}
    if ! printf '%s\n' "$list" | awk -v f="$f" -v n="$n" -v m="$MAX" '$3 == n && index($2, f ":") == 1 && $1 > m {ok=1} END {exit !ok}'; then
        fail=$((fail + 1)); echo "FAIL: $allow lists $e, which no longer takes more than $MAX parameters: remove the line"
    fi
    if ! grep -v '^#' "$allow" | grep -E "^$e[[:space:]]" | grep -q -- '--'; then
        fail=$((fail + 1)); echo "FAIL: $allow: $e has no reason (\"-- why\")"
    fi
done
echo "functions with more than $MAX parameters: $long (allowed: $(printf '%s\n' "$allowed" | grep -c .))"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
