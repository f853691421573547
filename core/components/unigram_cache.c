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
    NC_ASSERT(u, "unigram_cache_clear: no u");
    u->count = u->head = 0;
    if (u->counts)
        memset(u->counts, 0, (size_t)u->ncounts * sizeof(int));
}

int unigram_cache_push(nc_unigram_cache *u, int w)
{
    NC_ASSERT(u && u->size > 0 && u->head >= 0 && u->head < u->size && u->count <= u->size,
              "unigram_cache_push: window head %d count %d of size %d", u ? u->head : -1, u ? u->count : -1,
              u ? u->size : -1);
    NC_ASSERT(u, "unigram_cache_push: no u");
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
    if (u->count == u->size) {
        NC_ASSERT(u->counts[u->ring[u->head]] > 0, "unigram_cache_push: evicted word %d has count 0",
                  u->ring[u->head]);
        u->counts[u->ring[u->head]]--;
    }
    else
        u->count++;
    u->ring[u->head] = w;
    u->counts[w]++;
    u->head = (u->head + 1) % u->size;
    return NC_OK;
}

int unigram_cache_copy(nc_unigram_cache *dst, const nc_unigram_cache *src, char *err, size_t errlen)
{
    NC_ASSERT(src, "unigram_cache_copy: no src");
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
    NC_ASSERT(u, "unigram_cache_memory: no u");
    return sizeof *u + ((size_t)u->size + (size_t)u->ncounts) * sizeof(int);
}

void unigram_cache_add_dist(const nc_unigram_cache *u, double *q)
{
    NC_ASSERT(u, "unigram_cache_add_dist: no u");
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

/* The window at this position: the row's state (mix_input.h). */
static const nc_unigram_cache *window(const nc_mix_input *in)
{
    return in->state[NC_COMP_UNIGRAM];
}

static bool unigram_available(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->unigram_size > 0 && window(in) && window(in)->count > 0;
}

static double unigram_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    (void)p;
    return unigram_cache_prob(window(in), x);
}

/* λu p_uni(x) as the constant mixture has always computed it: a float
 * product (both are floats), so that its numbers stay the same bit for bit */
static double unigram_lambda_prob(const nc_cache_params *p, const nc_mix_input *in, int x, double lambda)
{
    (void)p;
    return (float)lambda * unigram_cache_prob(window(in), x);
}

static int unigram_max_word(const nc_mix_input *in)
{
    const nc_unigram_cache *u = window(in);
    int m = -1;
    for (int i = 0; u && i < u->count; i++)
        if (unigram_cache_at(u, i) > m)
            m = unigram_cache_at(u, i);
    return m;
}

static int unigram_dense(const nc_cache_params *p, const nc_mix_input *in, double *q, size_t n)
{
    (void)p, (void)n;
    unigram_cache_add_dist(window(in), q);
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

/* ---- its session state (component.h state_new ...): the window itself,
 * size 0 while off ---- */

static void unigram_state_free(void *state)
{
    unigram_cache_free(state);
    free(state);
}

static int unigram_state_new(const nc_state_args *a, void **out, char *err, size_t errlen)
{
    *out = NULL;
    nc_unigram_cache *u = nc_zalloc(1, sizeof *u);
    if (!u)
        return nc_error(err, errlen, NC_ENOMEM, "unigram cache");
    int rc = a->p->unigram_size > 0 ? unigram_cache_init(u, a->p->unigram_size, err, errlen) : NC_OK;
    if (rc) {
        free(u);
        return rc;
    }
    *out = u;
    return NC_OK;
}

static void unigram_state_clear(void *state)
{
    nc_unigram_cache *u = state;
    NC_ASSERT(u, "unigram: no state");
    if (u->size)
        unigram_cache_clear(u);
}

/* A window of a->p's size holding the newest words of old's. */
static int unigram_state_resize(const void *old, const nc_state_args *a, void **out, char *err, size_t errlen)
{
    const nc_unigram_cache *o = old;
    int rc = unigram_state_new(a, out, err, errlen);
    if (rc || a->p->unigram_size <= 0)
        return rc;
    int cnt = o->count;
    for (int i = cnt > a->p->unigram_size ? cnt - a->p->unigram_size : 0; i < cnt; i++)
        if (unigram_cache_push(*out, unigram_cache_at(o, i))) {
            unigram_state_free(*out);
            *out = NULL;
            return nc_error(err, errlen, NC_ENOMEM, "unigram cache");
        }
    return NC_OK;
}

static int unigram_push(void *state, const float *h, int word)
{
    nc_unigram_cache *u = state;
    (void)h;
    NC_ASSERT(u && word >= 0, "unigram: push of word %d", word);
    return u->size ? unigram_cache_push(u, word) : NC_OK;
}

/* What npush pushes overwrite: the ring slots from head on, head and
 * count (the counts are rebuilt from the ring). */
typedef struct {
    int head, count, slots;
    int *ring;
} unigram_mark;

static int unigram_mark_save(const void *state, size_t npush, void **out, char *err, size_t errlen)
{
    const nc_unigram_cache *c = state;
    *out = NULL;
    if (!c->size)
        return NC_OK;
    unigram_mark *m = nc_zalloc(1, sizeof *m);
    if (m) {
        m->head = c->head;
        m->count = c->count;
        m->slots = npush < (size_t)c->size ? (int)npush : c->size;
        m->ring = nc_malloc((size_t)(m->slots ? m->slots : 1) * sizeof(int));
    }
    if (!m || !m->ring) {
        free(m);
        return nc_error(err, errlen, NC_ENOMEM, "rescoring");
    }
    for (int k = 0; k < m->slots; k++)
        m->ring[k] = c->ring[(c->head + k) % c->size];
    *out = m;
    return NC_OK;
}

static void unigram_rollback(void *state, void *mark)
{
    nc_unigram_cache *c = state;
    unigram_mark *m = mark;
    if (!m)
        return;
    NC_ASSERT(c->size && m->head >= 0 && m->head < c->size && m->count <= c->size,
              "unigram: mark (head %d, count %d) not of this window (size %d)", m->head, m->count, c->size);
    NC_ASSERT(m->slots <= c->size, "unigram: mark of %d slots, window of %d", m->slots, c->size);
    for (int k = 0; k < m->slots; k++)
        c->ring[(m->head + k) % c->size] = m->ring[k];
    c->head = m->head;
    c->count = m->count;
    /* the counts are the window's histogram: rebuilt from it */
    memset(c->counts, 0, (size_t)c->ncounts * sizeof(int));
    for (int i = 0; i < c->count; i++)
        c->counts[unigram_cache_at(c, i)]++;
    free(m->ring);
    free(m);
}

static size_t unigram_state_memory(const void *state)
{
    const nc_unigram_cache *u = state;
    return u->size ? unigram_cache_memory(u) : 0;
}

/* The ring at full size and counts of as many words. */
static size_t unigram_state_bytes(const nc_state_args *a)
{
    return a->p->unigram_size > 0 ? (size_t)a->p->unigram_size * 3 * sizeof(int) : 0;
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
    .state_new = unigram_state_new,
    .state_free = unigram_state_free,
    .state_clear = unigram_state_clear,
    .state_resize = unigram_state_resize,
    .push = unigram_push,
    .mark = unigram_mark_save,
    .rollback = unigram_rollback,
    .memory = unigram_state_memory,
    .state_bytes = unigram_state_bytes,
};
