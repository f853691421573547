#!/usr/bin/env bash
# run_levels.sh -- runs the numeric suites once per kernel level this CPU
# supports, so one machine proves every path a user's CPU may take:
#   scalar  NEUROCACHE_SIMD=scalar, OpenBLAS's Nehalem kernels (SSE only)
#   avx2    NEUROCACHE_SIMD=avx2,   OpenBLAS's Haswell kernels (AVX2 + FMA)
#   avx512  NEUROCACHE_SIMD=avx512, OpenBLAS's SkylakeX kernels
# OpenBLAS picks its kernels from the CPU when it loads (an AMD Zen 4 gets
# Haswell's, an Intel Xeon SkylakeX's): OPENBLAS_CORETYPE pins the set that
# belongs with each level, so the runs do not depend on which vendor's CPU
# CI lands on. Which levels the CPU has is asked of the CLI itself (the one
# definition in core/numerics/vmath.c): NEUROCACHE_SIMD=L neurocache --version exits
# 2 on a level the CPU lacks.
#
# usage: NEUROCACHE_BIN=bin run_levels.sh TEST_BINARY...
set -u
here=$(cd "$(dirname "$0")" && pwd)
cli="${NEUROCACHE_BIN:-bin}/neurocache"
blas_for() {
    case $1 in
        scalar) echo Nehalem ;;
        avx2) echo Haswell ;;
        # SkylakeX's kernels use AVX-512 F, CD, BW, DQ and VL: a CPU with
        # AVX-512F alone (Knights Landing) keeps OpenBLAS's own choice
        avx512) local f
                for f in avx512f avx512cd avx512bw avx512dq avx512vl; do
                    grep -qw "$f" /proc/cpuinfo || { echo ""; return; }
                done
                echo SkylakeX ;;
    esac
}
status=0
for level in scalar avx2 avx512; do
    if ! NEUROCACHE_SIMD=$level "$cli" --version >/dev/null 2>&1; then
        echo "== level $level: not supported by this CPU, skipped"
        continue
    fi
    blas=$(blas_for "$level")
    echo "== level $level (NEUROCACHE_SIMD=$level OPENBLAS_CORETYPE=${blas:-auto})"
    if [ -n "$blas" ]; then
        NEUROCACHE_SIMD=$level OPENBLAS_CORETYPE=$blas bash "$here/run_tests.sh" "$@" || status=1
    else
        NEUROCACHE_SIMD=$level bash "$here/run_tests.sh" "$@" || status=1
    fi
done
exit $status
