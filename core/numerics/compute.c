/* compute.c -- the release and the numeric back-ends in use (compute.h). */
#include "compute.h"

#include <stdio.h>

#include "vmath.h"

/* OpenBLAS's own entry point; Debian's cblas.h declares it only for the
 * OpenBLAS flavour of the header, so it is declared here. */
extern char *openblas_get_corename(void);

const char *nc_blas_core(void)
{
    const char *c = openblas_get_corename();
    return c ? c : "unknown";
}

void nc_compute_describe(char *out, size_t outlen)
{
    snprintf(out, outlen, "neurocache %s (simd %s of %s; OpenBLAS %s)", NC_VERSION, vm_isa(),
             vm_isa_supported(), nc_blas_core());
}
