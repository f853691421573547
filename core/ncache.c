/* ncache.c -- the neural cache's ring buffer of (h_i, x_{i+1}) pairs. */
#include "ncache.h"

#include <string.h>

int ncache_init(nc_ncache *c, int size, int dim, bool f16, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (size <= 0 || dim <= 0)
        return nc_error(err, errlen, NC_EINVAL, "neural cache window %d / dim %d must be positive",
                        size, dim);
    c->size = size;
    c->dim = dim;
    c->f16 = f16;
    c->keys = nc_alloc((size_t)size * dim * (f16 ? sizeof(uint16_t) : sizeof(float)));
    c->values = nc_alloc((size_t)size * sizeof(int));
    if (!c->keys || !c->values) {
        ncache_free(c);
        return nc_error(err, errlen, NC_ENOMEM, "neural cache of %d x %d keys", size, dim);
    }
    return NC_OK;
}

void ncache_free(nc_ncache *c)
{
    if (!c)
        return;
    nc_free(c->keys);
    nc_free(c->values);
    memset(c, 0, sizeof *c);
}

void ncache_clear(nc_ncache *c)
{
    c->count = c->head = 0;
}

void ncache_push(nc_ncache *c, const float *h, int w)
{
    size_t off = (size_t)c->head * c->dim;
    if (c->f16) {
        uint16_t *k = (uint16_t *)c->keys + off;
        for (int j = 0; j < c->dim; j++)
            k[j] = nc_float_to_half(h[j]);
    } else {
        memcpy((float *)c->keys + off, h, (size_t)c->dim * sizeof(float));
    }
    c->values[c->head] = w;
    c->head = (c->head + 1) % c->size;
    if (c->count < c->size)
        c->count++;
}

int ncache_export(const nc_ncache *c, float *out, int *vals)
{
    for (int i = 0; i < c->count; i++) {
        int s = ncache_slot(c, i);
        if (out) {
            float *o = out + (size_t)i * c->dim;
            if (c->f16) {
                const uint16_t *k = (const uint16_t *)c->keys + (size_t)s * c->dim;
                for (int j = 0; j < c->dim; j++)
                    o[j] = nc_half_to_float(k[j]);
            } else {
                memcpy(o, (const float *)c->keys + (size_t)s * c->dim, (size_t)c->dim * sizeof(float));
            }
        }
        if (vals)
            vals[i] = c->values[s];
    }
    return c->count;
}

int ncache_dots(const nc_ncache *c, const float *q, float *dots)
{
    for (int i = 0; i < c->count; i++) {
        int s = ncache_slot(c, i);
        float acc = 0.0f;
        if (c->f16) {
            const uint16_t *k = (const uint16_t *)c->keys + (size_t)s * c->dim;
            for (int j = 0; j < c->dim; j++)
                acc += q[j] * nc_half_to_float(k[j]);
        } else {
            const float *k = (const float *)c->keys + (size_t)s * c->dim;
            for (int j = 0; j < c->dim; j++)
                acc += q[j] * k[j];
        }
        dots[i] = acc;
    }
    return c->count;
}

int ncache_copy(nc_ncache *dst, const nc_ncache *src, char *err, size_t errlen)
{
    int rc = ncache_init(dst, src->size, src->dim, src->f16, err, errlen);
    if (rc)
        return rc;
    memcpy(dst->keys, src->keys,
           (size_t)src->size * src->dim * (src->f16 ? sizeof(uint16_t) : sizeof(float)));
    memcpy(dst->values, src->values, (size_t)src->size * sizeof(int));
    dst->count = src->count;
    dst->head = src->head;
    return NC_OK;
}

size_t ncache_memory(const nc_ncache *c)
{
    return sizeof *c + (size_t)c->size * c->dim * (c->f16 ? 2 : 4) + (size_t)c->size * sizeof(int);
}
