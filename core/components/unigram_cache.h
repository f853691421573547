/* unigram_cache.h -- the unigram cache (Kuhn & De Mori 1990): word counts
 * over the window W_t of the last N targets x_{i+1}, and its term p_uni that
 * the mixture (mixture.h) interpolates. Design §4. */
#ifndef NC_UNIGRAM_CACHE_H
#define NC_UNIGRAM_CACHE_H

#include "nc_common.h"

/* Ring of the last `size` word ids plus a dense count per id (ids may be
 * >= V in open-vocabulary mode; the count array grows on demand). */
typedef struct nc_unigram_cache {
    int size;                     /* window N (> 0) */
    int count;                    /* ids held, <= size */
    int head;                     /* next slot to write */
    int *ring;                    /* [size] */
    int *counts;                  /* [ncounts] occurrences of each id in the window */
    int ncounts;
} nc_unigram_cache;

int unigram_cache_init(nc_unigram_cache *u, int size, char *err, size_t errlen);
void unigram_cache_free(nc_unigram_cache *u);   /* releases contents; zeroed u allowed */
void unigram_cache_clear(nc_unigram_cache *u);
/* Pushes word id w (>= 0), evicting the oldest when full. NC_ENOMEM only
 * when the count array cannot grow. */
int unigram_cache_push(nc_unigram_cache *u, int w);
/* The unigram cache's term (Kuhn & De Mori 1990; design §4):
 * p_uni(w) = |{i ∈ W_t : x_{i+1} = w}| / |W_t| (0 when empty). */
static inline float unigram_cache_prob(const nc_unigram_cache *u, int w)
{
    if (u->count == 0 || w < 0 || w >= u->ncounts)
        return 0.0f;
    return (float)u->counts[w] / (float)u->count;
}
/* Word id of the i-th oldest entry, 0 <= i < count. */
static inline int unigram_cache_at(const nc_unigram_cache *u, int i)
{
    int start = (u->head - u->count + u->size) % u->size;
    return u->ring[(start + i) % u->size];
}
/* p_uni as a dense vector, for the full distribution: q[x_{i+1}] += 1/|W_t|
 * for every pair of the window (q has room for every id held). */
void unigram_cache_add_dist(const nc_unigram_cache *u, double *q);
int unigram_cache_copy(nc_unigram_cache *dst, const nc_unigram_cache *src, char *err, size_t errlen);
size_t unigram_cache_memory(const nc_unigram_cache *u);

#endif
