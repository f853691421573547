/* ncache.h -- the continuous (neural) cache's memory (Grave et al. 2017):
 * a ring buffer of the last N pairs (h_i, x_{i+1}), keys float32 or float16.
 * The formulas that read it live in mixture.h. Design §4. */
#ifndef NC_NCACHE_H
#define NC_NCACHE_H

#include "nc_common.h"

typedef struct {
    int size;                     /* window N (> 0) */
    int dim;                      /* H */
    bool f16;                     /* keys stored as IEEE half */
    int count;                    /* pairs held, <= size */
    int head;                     /* next slot to write */
    void *keys;                   /* [size, dim] float or uint16_t */
    int *values;                  /* [size] word ids x_{i+1} */
} nc_ncache;

int ncache_init(nc_ncache *c, int size, int dim, bool f16, char *err, size_t errlen);
void ncache_free(nc_ncache *c);   /* zeroed c allowed */
void ncache_clear(nc_ncache *c);
/* Appends (h[dim], w), evicting the oldest pair when full. */
void ncache_push(nc_ncache *c, const float *h, int w);
/* Slot of the i-th oldest pair (0 <= i < count). */
static inline int ncache_slot(const nc_ncache *c, int i)
{
    return (c->head - c->count + i + 2 * c->size) % c->size;
}
/* Copies the keys oldest-first into out[count, dim] (float32) and the values
 * into vals[count] (either may be NULL). Returns count. */
int ncache_export(const nc_ncache *c, float *out, int *vals);
/* dots[i] = q . key_i for the pairs oldest-first; returns count. */
int ncache_dots(const nc_ncache *c, const float *q, float *dots);
size_t ncache_memory(const nc_ncache *c);

#endif
