#!/usr/bin/env bash
# check_locks.sh -- docs/threads.md lists every lock and every thread-local
# variable of the code, and only those (issue 28, point 2): each mutex and
# rwlock declared in core/, store/, proto/, server/ and tools/
# (tests/locks.py: "struct.field FILE KIND") must be a row `name` | file |
# kind of the page's "Locks" table, each thread-local variable defined there
# (tests/locks.py --tls: "NAME FILE") a row `name` | file of its
# "Thread-local state" table, and each row of either table something the
# code declares, in that file (of that kind). Prints each mismatch and
# "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
page=docs/threads.md
pass=0; fail=0
srcs=(core/*/*.[ch] core/*/*.cpp store/*.[ch] proto/*.[ch] server/*.[ch] server/*/*.[ch] tools/*.[ch])

# The rows of the table under "## SECTION" of the page: | `name` | c2 | c3 | ...,
# as "name c2" (ncols 2) or "name c2 c3" (ncols 3).
rows() {
    awk -v sec="## $1" '/^## /{on = ($0 == sec)} on && /^\| `/' "$page" |
        awk -F'|' -v n="$2" '{gsub(/[` ]/, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4);
                              if (n == 3) print $2, $3, $4; else print $2, $3}' | sort
}

# compare WHAT SECTION CODE DOC: every line of CODE in DOC and back.
compare() {
    local what=$1 section=$2 code=$3 doc=$4 line
    if [ -z "$doc" ]; then
        fail=$((fail + 1)); echo "FAIL: $page has no \"## $section\" table"; return
    fi
    while read -r line; do
        if printf '%s\n' "$doc" | grep -qxF "$line"; then pass=$((pass + 1))
        else fail=$((fail + 1)); echo "FAIL: the code declares the $what \"$line\" (name file [kind]), which $page's \"$section\" does not list"; fi
    done <<< "$code"
    while read -r line; do
        if printf '%s\n' "$code" | grep -qxF "$line"; then pass=$((pass + 1))
        else fail=$((fail + 1)); echo "FAIL: $page's \"$section\" lists the $what \"$line\" (name file [kind]), which the code does not declare there"; fi
    done <<< "$doc"
    echo "$(printf '%s\n' "$code" | wc -l) ${what}s in the code"
}

code=$(python3 tests/locks.py "${srcs[@]}" | sort) || {
    echo "locks.py failed"; echo "0 passed, 1 failed"; exit 1; }
compare lock Locks "$code" "$(rows Locks 3)"
tls=$(python3 tests/locks.py --tls "${srcs[@]}" | sort) || {
    echo "locks.py --tls failed"; echo "$pass passed, $((fail + 1)) failed"; exit 1; }
compare thread-local "Thread-local state" "$tls" "$(rows 'Thread-local state' 2)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
