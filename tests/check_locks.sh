#!/usr/bin/env bash
# check_locks.sh -- docs/threads.md lists every lock of the code, and only
# those (issue 28, point 2): each mutex and rwlock declared in core/,
# store/, proto/, server/ and tools/ (tests/locks.py: "struct.field FILE
# KIND") must be a row `name` | file | kind of the page's "Locks" table,
# and each row of that table a lock the code declares, in that file, of
# that kind. Prints each mismatch and "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
page=docs/threads.md
pass=0; fail=0
code=$(python3 tests/locks.py core/*.[ch] store/*.[ch] proto/*.[ch] server/*.[ch] tools/*.[ch] | sort) || {
    echo "locks.py failed"; echo "0 passed, 1 failed"; exit 1; }
# rows of the table under "## Locks": | `name` | file | kind | ...
doc=$(awk '/^## /{on = ($0 == "## Locks")} on && /^\| `/' "$page" |
      awk -F'|' '{gsub(/[` ]/, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); print $2, $3, $4}' | sort)
if [ -z "$doc" ]; then
    echo "FAIL: $page has no \"## Locks\" table"; echo "0 passed, 1 failed"; exit 1
fi
while read -r name file kind; do
    if printf '%s\n' "$doc" | grep -qxF "$name $file $kind"; then pass=$((pass + 1))
    else fail=$((fail + 1)); echo "FAIL: $file declares the $kind $name, which $page does not list (as \`$name\` | $file | $kind)"; fi
done <<< "$code"
while read -r name file kind; do
    if printf '%s\n' "$code" | grep -qxF "$name $file $kind"; then pass=$((pass + 1))
    else fail=$((fail + 1)); echo "FAIL: $page lists the $kind $name in $file, which the code does not declare there"; fi
done <<< "$doc"
echo "$(printf '%s\n' "$code" | wc -l) locks in the code"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
