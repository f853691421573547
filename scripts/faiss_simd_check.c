/* faiss_simd_check.c -- linked in with FAISS's kernels that scripts/deps.sh
 * recompiled with -mavx2 -mfma -mf16c: a binary built on one machine and
 * copied to an older CPU would otherwise die of SIGILL in the middle of a
 * search. This stops it at start-up with a message saying what to do. */
#include <stdio.h>
#include <unistd.h>

__attribute__((constructor)) static void faiss_simd_check(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return;
    static const char msg[] =
        "neurocache: this build uses FAISS kernels compiled for AVX2 + FMA, which this CPU lacks;\n"
        "rebuild here (rm -rf build/faiss_c && make), or with FAISS_SIMD=none for Debian's generic kernels\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(70);
}
