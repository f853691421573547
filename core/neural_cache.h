/* neural_cache.h -- the continuous (neural) cache's memory (Grave et al. 2017):
 * a ring buffer of the last N pairs (h_i, x_{i+1}), keys float32 or float16.
 * The formulas that read it live in mixture.h. Design §4. */
#ifndef NC_NEURAL_CACHE_H
#define NC_NEURAL_CACHE_H

#include "nc_common.h"

typedef struct {
    int size;                     /* window N (> 0) */
    int dim;                      /* H */
    bool f16;                     /* keys stored as IEEE half */
    int count;                    /* pairs held, <= size */
    int head;                     /* next slot to write */
    void *keys;                   /* [size, dim] float or uint16_t */
    int *values;                  /* [size] word ids x_{i+1} */
} nc_neural_cache;

int neural_cache_init(nc_neural_cache *c, int size, int dim, bool f16, char *err, size_t errlen);
void neural_cache_free(nc_neural_cache *c);   /* zeroed c allowed */
void neural_cache_clear(nc_neural_cache *c);
/* Appends (h[dim], w), evicting the oldest pair when full. */
void neural_cache_push(nc_neural_cache *c, const float *h, int w);
/* Slot of the i-th oldest pair (0 <= i < count). */
static inline int neural_cache_slot(const nc_neural_cache *c, int i)
{
    return (c->head - c->count + i + 2 * c->size) % c->size;
}
/* Copies the keys oldest-first into out[count, dim] (float32) and the values
 * into vals[count] (either may be NULL). Returns count. */
int neural_cache_export(const nc_neural_cache *c, float *out, int *vals);
/* dots[i] = q . key_i for the pairs oldest-first; returns count. */
int neural_cache_dots(const nc_neural_cache *c, const float *q, float *dots);
size_t neural_cache_memory(const nc_neural_cache *c);

#endif
