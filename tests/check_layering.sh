#!/usr/bin/env bash
# check_layering.sh -- the layering rules the compiler alone does not keep
# (issue 28, points 3 and 4), checked on the source:
#  1. core allocates, opens, reads, writes and syncs only through the fault
#     layer (core/fault.h, nc_common.h), so fault injection cannot be
#     bypassed by a call that forgot the wrapper: no raw call of the names
#     below in core/*.c outside core/fault.c (and nc_common.c's
#     posix_memalign, the aligned allocator behind nc_alloc). Formatted
#     output (fprintf) into a stream opened with nc_fopen is allowed: its
#     failure surfaces at fflush/fclose, which the writers check.
#  2. the per-folder include paths of the Makefile (INC_<folder>): a core
#     file cannot include a header of store, proto, tools or server; store
#     and proto cannot include server's; tools cannot include server's or
#     store's. Each is a probe compiled with the folder's flags that must
#     fail, beside one including the folder's own header that must compile.
# Prints each violation and "N passed, N failed" (tests/run_tests.sh).
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*"; }

RAW='malloc|calloc|realloc|reallocarray|strdup|strndup|aligned_alloc|posix_memalign|valloc|fopen|fdopen|freopen|open|openat|creat|read|pread|readv|write|pwrite|writev|fread|fwrite|getline|getdelim|mmap|fsync|fdatasync|sync_file_range'
# C source with comments, string and character literals blanked, so a word
# in a comment or a message is not a call.
strip_c() {
    perl -0777 -pe 's{/\*.*?\*/}{ " " x length($&) }gse; s{//[^\n]*}{}g; s{"(\\.|[^"\\\n])*"}{""}g; s{'"'"'(\\.|[^'"'"'\\\n])*'"'"'}{0}g' "$1"
}
for f in core/*.c; do
    [ "$f" = core/fault.c ] && continue
    hits=$(strip_c "$f" | grep -nE "(^|[^A-Za-z0-9_.>])($RAW)[[:space:]]*\(" |
           { if [ "$f" = core/nc_common.c ]; then grep -v 'posix_memalign'; else cat; fi })
    if [ -n "$hits" ]; then
        ko "$f calls libc directly, not through the fault layer (fault.h):"
        printf '%s\n' "$hits" | sed "s|^|    $f:|"
    else
        ok
    fi
done

CC=${CC:-cc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
probe() {   # probe FOLDER HEADER EXPECT(ok|fail)
    local flags; flags=$(make -s --no-print-directory print-inc DIR="$1")
    printf '#include "%s"\nint probe_%s;\n' "$2" "$1" > "$tmp/probe.c"
    if $CC -std=c11 -D_GNU_SOURCE -fsyntax-only $flags "$tmp/probe.c" 2>/dev/null; then got=ok; else got=fail; fi
    if [ "$got" = "$3" ]; then ok; else ko "a $1 file including \"$2\": expected to $3 to compile, did $got"; fi
}
probe core nc_common.h ok
for h in server.h nsstore.h proto.h cacheopts.h; do probe core $h fail; done
probe store nsstore.h ok
for h in server.h proto.h sessions.h; do probe store $h fail; done
probe proto proto.h ok
for h in server.h nsstore.h; do probe proto $h fail; done
probe tools cacheopts.h ok
for h in server.h nsstore.h; do probe tools $h fail; done
probe server server.h ok

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
