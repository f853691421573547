#!/usr/bin/env bash
# check_layering.sh -- the layering rules the compiler alone does not keep
# (issue 28, points 3 and 4), checked on the source:
#  1. core allocates, opens, reads, writes and syncs only through the fault
#     layer (core/base/fault.h, nc_common.h), so fault injection cannot be
#     bypassed by a call that forgot the wrapper: no raw call of the names
#     below in core/*.c outside core/base/fault.c (and nc_common.c's
#     posix_memalign, the aligned allocator behind nc_alloc). Formatted
#     output (fprintf) into a stream opened with nc_fopen is allowed: its
#     failure surfaces at fflush/fclose, which the writers check.
#  2. the per-folder include paths of the Makefile (INC_<folder>): a folder
#     sees its own headers and those of the folders below it. core's parts,
#     bottom up: base, numerics, text, knobs, index, components, model,
#     session; store and proto sit on core, tools on proto and core; the
#     server's tiers, bottom up: common, net, domain, replication, api, and
#     routes.c/main.c on top. Each rule is a probe compiled with the
#     folder's flags including a header of the folder just above (and of
#     the layers beside it) that must fail, beside one including the
#     folder's own header that must compile.
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
srcs=(core/*/*.c)
[ -e "${srcs[0]}" ] || ko "no core/*/*.c sources found (run from the checkout)"
for f in "${srcs[@]}"; do
    [ "$f" = core/base/fault.c ] && continue
    hits=$(strip_c "$f" | grep -nE "(^|[^A-Za-z0-9_.>])($RAW)[[:space:]]*\(" |
           { if [ "$f" = core/base/nc_common.c ]; then grep -v 'posix_memalign'; else cat; fi })
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
# rule FOLDER OWN_HEADER FORBIDDEN_HEADER...
rule() {
    local dir=$1 own=$2; shift 2
    probe "$dir" "$own" ok
    for h in "$@"; do probe "$dir" "$h" fail; done
}
rule core_base nc_common.h vmath.h normalize.h
rule core_numerics vmath.h normalize.h cache_knobs.h
rule core_text normalize.h cache_knobs.h faiss_shim.h
rule core_knobs cache_knobs.h faiss_shim.h components.h
rule core_index faiss_shim.h components.h model.h
rule core_components components.h model.h lstm.h
rule core_model lstm.h stream.h doc.h
rule core_session stream.h nsstore.h proto.h server.h cacheopts.h
rule store nsstore.h server.h proto.h sessions.h
rule proto proto.h server.h nsstore.h
rule tools cacheopts.h server.h nsstore.h
rule server_common server.h http.h auth.h sessions.h
rule server_net http.h sessions.h namespaces.h batcher.h
rule server_domain sessions.h replication.h apiutil.h routes.h
rule server_replication replication.h apiutil.h api_predict.h routes.h
rule server_api apiutil.h routes.h
rule server routes.h

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
