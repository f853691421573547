/* dist.c -- a next-word distribution and its components' shares. */
#include "dist.h"

#include <string.h>

#define NC_COMP_NAME_(ID, name, npre, npost) #name,
const char *const nc_comp_names[NC_NCOMP] = {NC_COMPONENT_TABLE(NC_COMP_NAME_)};
#undef NC_COMP_NAME_

void dist_init(nc_dist *d)
{
    memset(d, 0, sizeof *d);
}

void dist_free(nc_dist *d)
{
    if (!d)
        return;
    nc_free(d->p);
    for (int c = 0; c < NC_NCOMP; c++)
        nc_free(d->share[c]);
    memset(d, 0, sizeof *d);
}

int dist_reserve(nc_dist *d, size_t n, bool shares)
{
    if (n > d->cap) {
        nc_free(d->p);
        for (int c = 0; c < NC_NCOMP; c++) {
            nc_free(d->share[c]);
            d->share[c] = NULL;
        }
        d->cap = 0;
        d->p = nc_alloc(n * sizeof(float));
        if (!d->p)
            return NC_ENOMEM;
        d->cap = n;
    }
    for (int c = 0; c < NC_NCOMP; c++) {
        if (shares && !d->share[c]) {
            d->share[c] = nc_alloc(d->cap * sizeof(float));
            if (!d->share[c])
                return NC_ENOMEM;
        }
    }
    d->n = n;
    return NC_OK;
}

/* Indices of the k largest p, sorted by decreasing p (ties: lower id first).
 * A bounded min-heap: O(n log k). Returns the count written to out. */
static int heap_less(const float *p, int a, int b)
{
    return p[a] < p[b] || (p[a] == p[b] && a > b);
}

static void sift_down(const float *p, int *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(p, h[l], h[m])) m = l;
        if (r < n && heap_less(p, h[r], h[m])) m = r;
        if (m == i) return;
        int t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

size_t dist_top_k(const float *p, size_t n, size_t k, int *out)
{
    if (k > n) k = n;
    if (k == 0) return 0;
    for (size_t i = 0; i < k; i++) out[i] = (int)i;
    for (size_t i = k / 2; i-- > 0;) sift_down(p, out, k, i);
    for (size_t i = k; i < n; i++)
        if (heap_less(p, out[0], (int)i)) {
            out[0] = (int)i;
            sift_down(p, out, k, 0);
        }
    /* Heap sort: repeatedly move the minimum to the end -> descending. */
    for (size_t m = k; m > 1; m--) {
        int t = out[0]; out[0] = out[m - 1]; out[m - 1] = t;
        sift_down(p, out, m - 1, 0);
    }
    return k;
}
