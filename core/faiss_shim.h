/* faiss_shim.h -- what FAISS 1.7.3's C API lacks, in a few lines of C++ of
 * our own (core/faiss_shim.cpp) compiled with the build: a search with its
 * own nprobe (faiss::SearchParametersIVF), so that two readers of one index
 * with different nprobe need not change the shared index's field (and take
 * a write lock to do it). */
#ifndef NC_FAISS_SHIM_H
#define NC_FAISS_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include <faiss/c_api/Index_c.h>

#ifdef __cplusplus
extern "C" {
#endif

/* idx->search(n, x, k, d, l) with nprobe lists probed when idx is an IVF
 * index (nprobe <= 0: the index's own field); any other index searches as
 * it is. Const on the index: safe beside other searches (not beside adds).
 * Returns 0, or -1 with FAISS's message in err. */
int faiss_shim_search(const FaissIndex *idx, int64_t n, const float *x, int64_t k, int nprobe, float *d,
                      int64_t *l, char *err, size_t errlen);

/* Whether idx is an IVF index (any kind). */
int faiss_shim_is_ivf(const FaissIndex *idx);

#ifdef __cplusplus
}
#endif

#endif
