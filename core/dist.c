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
