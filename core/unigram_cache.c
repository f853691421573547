/* unigram_cache.c -- the unigram cache: counts over a ring of the last N word
 * ids, and its term p_uni (Kuhn & De Mori 1990). */
#include "unigram_cache.h"
#include "cache_knobs.h"
#include "components.h"
#include "fault.h"

#include <stdlib.h>
#include <string.h>

int unigram_cache_init(nc_unigram_cache *u, int size, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    if (size <= 0)
        return nc_error(err, errlen, NC_EINVAL, "unigram window %d must be positive", size);
    u->size = size;
    u->ring = nc_malloc((size_t)size * sizeof(int));
    if (!u->ring)
        return nc_error(err, errlen, NC_ENOMEM, "unigram window of %d entries", size);
    return NC_OK;
}

void unigram_cache_free(nc_unigram_cache *u)
{
    if (!u)
        return;
    free(u->ring);
    free(u->counts);
    memset(u, 0, sizeof *u);
}

void unigram_cache_clear(nc_unigram_cache *u)
{
    u->count = u->head = 0;
    if (u->counts)
        memset(u->counts, 0, (size_t)u->ncounts * sizeof(int));
}

int unigram_cache_push(nc_unigram_cache *u, int w)
{
    if (w < 0)
        return NC_EINVAL;
    if (w >= u->ncounts) {
        int n = u->ncounts ? u->ncounts : 1024;
        while (n <= w)
            n *= 2;
        int *c = nc_realloc(u->counts, (size_t)n * sizeof(int));
        if (!c)
            return NC_ENOMEM;
        memset(c + u->ncounts, 0, (size_t)(n - u->ncounts) * sizeof(int));
        u->counts = c;
        u->ncounts = n;
    }
    if (u->count == u->size)
        u->counts[u->ring[u->head]]--;
    else
        u->count++;
    u->ring[u->head] = w;
    u->counts[w]++;
    u->head = (u->head + 1) % u->size;
    return NC_OK;
}

int unigram_cache_copy(nc_unigram_cache *dst, const nc_unigram_cache *src, char *err, size_t errlen)
{
    int rc = unigram_cache_init(dst, src->size, err, errlen);
    if (rc)
        return rc;
    memcpy(dst->ring, src->ring, (size_t)src->size * sizeof(int));
    dst->count = src->count;
    dst->head = src->head;
    if (src->ncounts) {
        dst->counts = nc_malloc((size_t)src->ncounts * sizeof(int));
        if (!dst->counts) {
            unigram_cache_free(dst);
            return nc_error(err, errlen, NC_ENOMEM, "unigram counts");
        }
        memcpy(dst->counts, src->counts, (size_t)src->ncounts * sizeof(int));
        dst->ncounts = src->ncounts;
    }
    return NC_OK;
}

size_t unigram_cache_memory(const nc_unigram_cache *u)
{
    return sizeof *u + ((size_t)u->size + (size_t)u->ncounts) * sizeof(int);
}

void unigram_cache_add_dist(const nc_unigram_cache *u, double *q)
{
    for (int i = 0; i < u->count; i++)
        q[unigram_cache_at(u, i)] += 1.0 / u->count;
}

/* ---- the mixture's row (component.h): (1-λu) p + λu p_uni ---- */

static bool unigram_on(const nc_cache_params *p)
{
    return p->unigram_size > 0;
}

static double unigram_lambda(const nc_cache_params *p)
{
    return p->unigram_lambda;
}

static bool unigram_available(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->unigram_size > 0 && in->uni && in->uni->count > 0;
}

static double unigram_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    (void)p;
    return unigram_cache_prob(in->uni, x);
}

/* λu p_uni(x) as the constant mixture has always computed it: a float
 * product (both are floats), so that its numbers stay the same bit for bit */
static double unigram_lambda_prob(const nc_cache_params *p, const nc_mix_input *in, int x, double lambda)
{
    (void)p;
    return (float)lambda * unigram_cache_prob(in->uni, x);
}

static int unigram_max_word(const nc_mix_input *in)
{
    int m = -1;
    for (int i = 0; in->uni && i < in->uni->count; i++)
        if (unigram_cache_at(in->uni, i) > m)
            m = unigram_cache_at(in->uni, i);
    return m;
}

static int unigram_dense(const nc_cache_params *p, const nc_mix_input *in, double *q, size_t n)
{
    (void)p, (void)n;
    unigram_cache_add_dist(in->uni, q);
    return NC_OK;
}

/* The window in the export blob (component.h export_state): i32 size,
 * count, then count x i32 word ref, oldest first. */
static int unigram_export_state(const void *state, binio_writer *w, nc_blob_words *x)
{
    const nc_unigram_cache *u = state;
    int nu = u->size ? u->count : 0;
    binio_put_i32(w, u->size);
    binio_put_i32(w, nu);
    for (int i = 0; i < nu; i++) {
        int ref = blob_word_ref(x, unigram_cache_at(u, i));
        if (ref < 0)
            return NC_ENOMEM;
        binio_put_i32(w, ref);
    }
    return NC_OK;
}

static int unigram_import_state(void *state, binio_reader *r, const nc_blob_words *x, char *err, size_t errlen)
{
    nc_unigram_cache *u = state;
    int32_t usize = binio_get_i32(r), ucount = binio_get_i32(r);
    if (r->bad || usize != u->size || ucount < 0 || ucount > usize)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob: unigram window does not match its parameters");
    for (int i = 0; i < ucount; i++) {
        int32_t ref = binio_get_i32(r);
        int id = blob_word_id(x, ref);
        if (r->bad || id < 0)
            return nc_error(err, errlen, NC_EFORMAT, "stream blob: bad word reference %d", ref);
        if (unigram_cache_push(u, id))
            return nc_error(err, errlen, NC_ENOMEM, "unigram cache");
    }
    return NC_OK;
}

static const char *const unigram_knobs[] = {"unigram_size", "unigram_lambda", NULL};
static const char *const unigram_feature_names[] = {NULL};

const nc_component nc_component_unigram = {
    .name = "unigram",
    .knobs = unigram_knobs,
    .on = unigram_on,
    .lambda = unigram_lambda,
    .available = unigram_available,
    .prob = unigram_prob,
    .lambda_prob = unigram_lambda_prob,
    .max_word = unigram_max_word,
    .dense = unigram_dense,
    .features = unigram_feature_names,
    .export_state = unigram_export_state,
    .import_state = unigram_import_state,
};
