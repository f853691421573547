/* faiss_shim.h -- what FAISS 1.7.3's C API lacks, in a few lines of C++ of
 * our own (core/index/faiss_shim.cpp) compiled with the build: a search with its
 * own nprobe (faiss::SearchParametersIVF), so that two readers of one index
 * with different nprobe need not change the shared index's field (and take
 * a write lock to do it); our IVFPQ scan; an add whose list assignment does
 * not depend on the batch and can reuse a search's coarse quantizer. */
#ifndef NC_FAISS_SHIM_H
#define NC_FAISS_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include <faiss/c_api/Index_c.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct faiss_shim_cq faiss_shim_cq;   /* the pruned exact coarse search, below */

/* idx->search(n, x, k, d, l) with nprobe lists probed when idx is an IVF
 * index (nprobe <= 0: the index's own field); any other index searches as
 * it is. Const on the index: safe beside other searches (not beside adds).
 * Returns 0, or -1 with FAISS's message in err. */
int faiss_shim_search(const FaissIndex *idx, int64_t n, const float *x, int64_t k, int nprobe, float *d,
                      int64_t *l, char *err, size_t errlen);

/* The k nearest neighbours of n queries [n, d] in an IVFPQ index with
 * precomputed residual tables (the trained IVF4096,PQ32 of the unbounded
 * cache, or a namespace's own PQ32x4; FAISS's use_precomputed_table == 1,
 * 8- or 4-bit codes, L2), scanning the
 * nprobe lists of each query the way FAISS's IVFPQ scanner does -- the same
 * look-up tables (Jegou et al. 2011, eq. 13-14: d = ||x - c||^2 +
 * Σ_m (T_c[m][code_m] - 2 <x_m, q_m(code_m)>)) summed in the same order --
 * but keeping every candidate the causal filter accepts (id < id_limit[q]
 * when id_limit is non-NULL) in an array (cut to its k best whenever it
 * passes 3k, later codes kept only below the k-th) and selecting the k
 * smallest (a radix select on the distance bits, then a radix sort of
 * those k) instead of pushing them through a heap of k: at k = 1,024 FAISS's heap
 * and its final reordering were half of the search (BENCHMARKS.md "Unbounded cache at 1M states"). Results as
 * FAISS's: d[n, k] ascending, l[n, k] ids, -1 (and d +inf) past the last
 * found; ties broken by id. *ndis (if non-NULL) += codes scanned.
 * Returns 0; 1 when idx is not such an index (the caller searches with
 * faiss_shim_search); -1 on a FAISS error (message in err). Const on the
 * index: safe beside other searches (not beside adds).
 *
 * One call: n queries x [n, d], k neighbours each into
 * d/l [n, k] (ascending; -1 ids and INFINITY pad), nprobe lists (<= 0: the
 * index's), id_limit [n] or NULL (query q accepts ids < id_limit[q] only,
 * before it selects its k), cdis/cids [n, nprobe] the queries' coarse search
 * made before (faiss_shim_coarse: the same nprobe, the same index) or NULL,
 * ndis (or NULL) += the codes scanned. */
typedef struct {
    int64_t n;
    const float *x;
    int64_t k;
    int nprobe;
    const int64_t *id_limit;
    const float *cdis;
    const int64_t *cids;
    const faiss_shim_cq *cq;   /* without cdis: the coarse search by cq (or FAISS's when NULL) */
    float *d;
    int64_t *l;
    uint64_t *ndis;
} faiss_shim_scan;

int faiss_shim_ivfpq_search(const FaissIndex *idx, const faiss_shim_scan *s, char *err, size_t errlen);

/* Bytes the calling thread keeps between faiss_shim_ivfpq_search calls
 * (its tables, distances and candidates): sized to the largest query of
 * its recent ones, given back after 256 queries that needed less than a
 * quarter of it (over 256 kB) */
size_t faiss_shim_scan_kept_bytes(void);

/* The scan's two kernels alone, for tests/test_scan.c. faiss_shim_pq_dists:
 * out[i] = sum over s = 0..M-1, in that order, in float, of table[s * ksub
 * + code_s] (FAISS's PQ distance from a look-up table), code_s the byte
 * codes[i * code_size + s] (code_size >= M), or with nbits 4 (ksub 16) the
 * nibble s % 2 (low first) of byte s / 2, for n codes. faiss_shim_top_k: the k best of n
 * candidates (distances d [n], ids [n], each id in [0, 2^32)), ascending by
 * distance then id, into od/ol [min(n, k)]; returns min(n, k). */
typedef struct {
    const float *table;           /* [M, ksub] */
    size_t M, ksub;
    const uint8_t *codes;         /* [n, code_size] */
    size_t code_size, n;
    int nbits;                    /* 4: ksub 16, two sub-quantizers a byte (low nibble first); else 8 */
} faiss_shim_pq_list;
void faiss_shim_pq_dists(const faiss_shim_pq_list *l, float *out);
size_t faiss_shim_top_k(const float *d, const int64_t *ids, size_t n, size_t k, float *od, int64_t *ol);

/* The coarse search of n queries x for nprobe lists (<= 0: the index's):
 * cdis/cids [n, np], as faiss_shim_ivfpq_search would make it. Returns np
 * (nprobe or the index's, at most its nlist; cdis/cids need room for n x
 * that), 0 when idx is not an index our scan reads (nothing written), -1 on
 * an error. */
int faiss_shim_coarse(const FaissIndex *idx, int64_t n, const float *x, int nprobe, float *cdis, int64_t *cids);

/* The coarse quantizer's exact search with far fewer products (faiss_shim_cq_search):
 * the centroids' top principal axes and what the pruning bound needs of
 * them, made once from a trained index (faiss_shim_cq_new) and read-only
 * after: safe to share between concurrent searches. Owned by the caller,
 * freed by faiss_shim_cq_free (NULL allowed); valid while idx is. */

/* The searcher of idx's coarse quantizer on dp principal axes (dp <= 0:
 * d / 2), or NULL when idx is not an index our scan reads (with
 * a flat L2 quantizer), when it has fewer centroids than d, or when the
 * principal axes come out not orthonormal to 1e-4 (the bound would not
 * hold): callers then use faiss_shim_coarse. */
faiss_shim_cq *faiss_shim_cq_new(const FaissIndex *idx, int dp);
void faiss_shim_cq_free(faiss_shim_cq *cq);

/* The coarse search of n queries x for nprobe lists (<= 0: the index's),
 * as faiss_shim_coarse returns it, but exact: the np centroids nearest to
 * each query by the sum of squared differences (within d 2^-24 of the true
 * distance; FAISS's BLAS path from 20 queries on rounds ||x||^2 + ||c||^2 -
 * 2<x, c> instead), ascending, ties to the lower list -- the same whatever
 * the batch. Returns np; -1 on an error. */
int faiss_shim_cq_search(const faiss_shim_cq *cq, int64_t n, const float *x, int nprobe, float *cdis, int64_t *cids);

/* Queries searched and exact centroid distances computed so far (the
 * pruning's cost: nlist a query without it); bytes the searcher holds. */
void faiss_shim_cq_stats(const faiss_shim_cq *cq, uint64_t *queries, uint64_t *exact);
size_t faiss_shim_cq_bytes(const faiss_shim_cq *cq);

/* An add to an IVFPQ index with a flat L2 quantizer, each key to the list
 * of its nearest centroid in exact arithmetic order (fvec_L2sqr), ties to
 * the lower list: the same list whatever the batch and whoever adds it (a
 * stream, an upload, a replay of the log, a replica), where FAISS's own
 * assignment rounds differently in batches of >= 20 (BLAS) and of fewer.
 * hint (or NULL): the coarse search of nearby vectors hint_x [n, d] (the
 * keys before their float16 rounding) for hint_np lists, which saves the
 * keys' own search wherever it provably holds the nearest centroid. */
typedef struct {
    int64_t n;
    const float *keys;
    const float *hint_x;
    const float *hint_d;
    const int64_t *hint_l;
    int hint_np;
    const faiss_shim_cq *cq;   /* or NULL: the keys' PQ codes by our encoder (faiss_shim_cq_new's index only) */
} faiss_shim_add_in;

/* 1: not such an index (nothing added: use faiss_Index_add), 0 added, -1
 * error */
int faiss_shim_add(FaissIndex *idx, const faiss_shim_add_in *a, char *err, size_t errlen);

/* Bytes idx holds whatever its size: an IVF index's coarse centroids, its
 * empty lists and, for IVFPQ, its PQ centroids and precomputed residual
 * tables (nlist x M x 256 floats: 128 MB for IVF4096,PQ32); 0 for other
 * indexes and for NULL. */
size_t faiss_shim_fixed_bytes(const FaissIndex *idx);

/* Bytes an IVF index's inverted lists hold for their pairs: each list's
 * codes and ids at their vectors' capacity, which grows by doubling as
 * pairs are added (40 to 80 bytes a pair of PQ32 rather than 40: the
 * lists are small heap blocks, their slack resident with their
 * neighbours); 0 for lists of another kind, other indexes and NULL. */
size_t faiss_shim_lists_bytes(const FaissIndex *idx);

/* Whether idx is an IVF index (any kind). */
int faiss_shim_is_ivf(const FaissIndex *idx);


/* ---- compact storage (a namespace that keeps no keys, docs/namespaces.md) --
 * What the index stores of each pair -- its list and its PQ code -- made
 * and added apart, so that a log of them rebuilds the very same lists. */

/* The lists (faiss_shim_add's exact assignment, from the hint where it
 * holds) and PQ codes [n, code_size] of a->keys, as faiss_shim_add would
 * store them; nothing added. 0, 1 when idx is not an IVFPQ index with a
 * flat quantizer (nothing written), -1 on an error. */
int faiss_shim_encode(const FaissIndex *idx, const faiss_shim_add_in *a, int64_t *lists, uint8_t *codes,
                      char *err, size_t errlen);
/* Appends n pairs of given lists and codes [n, code_size] to such an
 * index, with ids ntotal on (FAISS's own order). 0, or -1 (a list out of
 * range: nothing added; not such an index). */
int faiss_shim_add_codes(FaissIndex *idx, int64_t n, const int64_t *lists, const uint8_t *codes, char *err,
                         size_t errlen);
/* Bytes of a code, and (nlist non-NULL) the number of lists; 0 when idx is
 * not such an index. */
size_t faiss_shim_code_size(const FaissIndex *idx, int64_t *nlist);

/* What training fixed in such an index (borrowed from it): the coarse
 * centroids [ncoarse] and the PQ centroids [npq], for a fingerprint. 0, or
 * 1 when idx is not such an index. */
typedef struct {
    const float *coarse, *pq;
    size_t ncoarse, npq;
    int d, M, nbits;
} faiss_shim_trained;
int faiss_shim_trained_arrays(const FaissIndex *idx, faiss_shim_trained *t);

/* The precomputed residual table (use_precomputed_table == 1: nlist x M x
 * ksub floats, 128 MB for IVF4096,PQ32) depends on the trained quantizers
 * only, so indexes of the same training can read one copy. table_floats:
 * its size (0: not an index that has one). table_take: computes it if idx
 * has none and moves it out, the caller owning it (free()); NULL on an
 * error. table_lend: idx reads table (table_floats of them, owned by the
 * caller, read-only) as its own, freeing any it had; table_unlend before
 * faiss_Index_free, which would free it. */
size_t faiss_shim_table_floats(const FaissIndex *idx);
float *faiss_shim_table_take(FaissIndex *idx, char *err, size_t errlen);   /* NULL and err "" : FAISS keeps none */
void faiss_shim_table_lend(FaissIndex *idx, float *table);
void faiss_shim_table_unlend(FaissIndex *idx);


/* ---- a namespace's own training (docs/caches.md "A namespace trains its own index") ----
 * An IVFPQ index with a flat L2 quantizer, nlist lists and M sub-quantizers
 * of nbits (4 or 8), trained on n vectors x [n, d] (the caller's sample):
 * the coarse quantizer by k-means (niter iterations, FAISS's seeded
 * initialisation), then the PQ on the residuals; no polysemous training.
 * Deterministic for one sample, seed and thread count. *stop (if non-NULL)
 * is read at each k-means iteration: set, the training stops with -2.
 * Returns 0 with *out (empty, trained, owned by the caller), -1 on a FAISS
 * error (message in err). */
typedef struct {
    int d, M, niter, seed;
    int nbits;                    /* bits a sub-quantizer: 4, else 8 */
    int64_t nlist, n;
    const float *x;
    const volatile int *stop;
} faiss_shim_train_in;
int faiss_shim_train_ivfpq(const faiss_shim_train_in *in, FaissIndex **out, char *err, size_t errlen);
/* FAISS's imbalance factor of an IVF index's lists, nlist Σ n_i² / (Σ n_i)²
 * (1 when balanced); 0 for an empty or non-IVF index. */
double faiss_shim_imbalance(const FaissIndex *idx);
/* The same over the ids < limit only (the lists hold their ids in the
 * order added: ascending, so a binary search a list); what the index
 * looked like when it held limit pairs, whatever was added since. */
double faiss_shim_imbalance_below(const FaissIndex *idx, int64_t limit);
/* Lists of an IVF index, 0 for any other. */
int64_t faiss_shim_nlist(const FaissIndex *idx);

#ifdef __cplusplus
}
#endif

#endif
