/* unigram_cache.h -- unigram cache (Kuhn & De Mori): word counts over the window of
 * the last N targets x_{i+1}. Design §4. */
#ifndef NC_UNIGRAM_CACHE_H
#define NC_UNIGRAM_CACHE_H

#include "nc_common.h"

/* Ring of the last `size` word ids plus a dense count per id (ids may be
 * >= V in open-vocabulary mode; the count array grows on demand). */
typedef struct {
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
/* p_uni(w) = count(w) / |W| (0 when empty). */
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
int unigram_cache_copy(nc_unigram_cache *dst, const nc_unigram_cache *src, char *err, size_t errlen);
size_t unigram_cache_memory(const nc_unigram_cache *u);

#endif
