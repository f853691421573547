#!/usr/bin/env bash
# valgrind.sh [TEST_BINARY...] -- runs integration tests with every
# neurocached they start under valgrind's memcheck (full leak check). Each
# daemon's report goes to build/valgrind/vg.<pid>.log; at the end one line per
# daemon: errors, definitely/indirectly lost bytes. Exit 1 if any daemon had a
# memcheck error or a definite/indirect leak. The tests themselves may fail
# on timing under valgrind's slow-down: their results are printed apart.
set -u
out=build/valgrind
mkdir -p "$out/bin"
rm -f "$out"/vg.*.log
root=$PWD
# A private copy: other builds relinking bin/ during the run must not pull
# the binary from under the tests.
cp bin/neurocached "$out/neurocached.real" && cp bin/neurocache "$out/neurocache.real" || exit 1
cat > "$out/bin/neurocached" <<WRAP
#!/bin/sh
exec valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect \\
    --errors-for-leak-kinds=definite,indirect --num-callers=30 \\
    --suppressions=$root/scripts/valgrind.supp \\
    --log-file=$root/$out/vg.%p.log $root/$out/neurocached.real "\$@"
WRAP
chmod +x "$out/bin/neurocached"
ln -sf "$root/$out/neurocache.real" "$out/bin/neurocache"
if [ $# -eq 0 ]; then
    set -- build/tests/test_server build/tests/test_http_badinput build/tests/test_auth \
           build/tests/test_namespace_server
fi
NEUROCACHE_BIN="$root/$out/bin" bash tests/run_tests.sh "$@"
echo
echo "== valgrind (memcheck) per daemon"
bad=0; n=0
for f in "$out"/vg.*.log; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    errs=$(grep -o 'ERROR SUMMARY: [0-9,]*' "$f" | tail -n 1 | grep -o '[0-9,]*$' | tr -d ,)
    def=$(grep -o 'definitely lost: [0-9,]* bytes' "$f" | tail -n 1 | grep -o '[0-9,]* bytes' | tr -d ,)
    ind=$(grep -o 'indirectly lost: [0-9,]* bytes' "$f" | tail -n 1 | grep -o '[0-9,]* bytes' | tr -d ,)
    printf '%-40s errors %-4s definitely lost %-12s indirectly lost %s\n' "$(basename "$f")" \
        "${errs:-?}" "${def:-0 bytes}" "${ind:-0 bytes}"
    if [ "${errs:-1}" != 0 ]; then bad=1; fi
done
echo "$n daemons checked"
exit $bad
