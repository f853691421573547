/* compute.h -- what numeric machinery this process runs on: the release,
 * the level of core/numerics/vmath.c's kernels and the kernel set OpenBLAS chose.
 * Figures from two machines compare only with these beside them. */
#ifndef NC_COMPUTE_H
#define NC_COMPUTE_H

#include <stddef.h>

#define NC_VERSION "0.6.0"

/* OpenBLAS's kernel set ("Haswell", "SkylakeX", ...): picked from the CPU
 * when the library loads, or from OPENBLAS_CORETYPE if set then. */
const char *nc_blas_core(void);

/* One line: "neurocache 0.6.0 (simd avx2 of scalar avx2 avx512; OpenBLAS
 * Haswell)". */
void nc_compute_describe(char *out, size_t outlen);

#endif
