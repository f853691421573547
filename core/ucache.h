/* ucache.h -- unigram cache (Kuhn & De Mori): word counts over the window of
 * the last N targets x_{i+1}. Design §4. */
#ifndef NC_UCACHE_H
#define NC_UCACHE_H

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
} nc_ucache;

int ucache_init(nc_ucache *u, int size, char *err, size_t errlen);
void ucache_free(nc_ucache *u);   /* releases contents; zeroed u allowed */
void ucache_clear(nc_ucache *u);
/* Pushes word id w (>= 0), evicting the oldest when full. NC_ENOMEM only
 * when the count array cannot grow. */
int ucache_push(nc_ucache *u, int w);
/* p_uni(w) = count(w) / |W| (0 when empty). */
static inline float ucache_prob(const nc_ucache *u, int w)
{
    if (u->count == 0 || w < 0 || w >= u->ncounts)
        return 0.0f;
    return (float)u->counts[w] / (float)u->count;
}
/* Word id of the i-th oldest entry, 0 <= i < count. */
static inline int ucache_at(const nc_ucache *u, int i)
{
    int start = (u->head - u->count + u->size) % u->size;
    return u->ring[(start + i) % u->size];
}
int ucache_copy(nc_ucache *dst, const nc_ucache *src, char *err, size_t errlen);
size_t ucache_memory(const nc_ucache *u);

#endif
