#!/usr/bin/env bash
# check_asserts.sh -- core/ and store/ state their invariants (issue 39
# point 4; nc_common.h NC_ASSERT, kept in release builds): at least one
# NC_ASSERT per 100 lines of their source, counted over every .c, .h and
# .cpp of the two folders. A file that falls below one per 400 lines is
# listed (not failed) as where to add the next ones.
# Prints "N passed, N failed" (tests/run_tests.sh).
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0
files=$(ls core/*/*.c core/*/*.h core/*/*.cpp store/*.c store/*.h)
lines=$(cat $files | wc -l)
asserts=$(cat $files | grep -o 'NC_ASSERT(' | wc -l)
# the macro's own definition is not an assert
asserts=$((asserts - $(grep -c '#define NC_ASSERT(' core/base/nc_common.h)))
need=$(( (lines + 99) / 100 ))
echo "core/ and store/: $lines lines, $asserts NC_ASSERT (need $need: one per 100 lines)"
if [ "$asserts" -ge "$need" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $asserts asserts, $need needed"; fi
for f in $files; do
    l=$(wc -l < "$f"); a=$(grep -o 'NC_ASSERT(' "$f" | wc -l)
    [ "$l" -ge 400 ] && [ $((a * 400)) -lt "$l" ] && echo "  few: $f $l lines, $a asserts"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
