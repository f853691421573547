/* bigram.c -- the test build's component with session state (issue 39;
 * component_table.h, under NC_COMPONENT_PROBE): a recent-bigram cache, a
 * ring of the session's last N (previous word, word) pairs, predicting
 *     p_bi(w) = |{i : prev_i = x_t, word_i = w}| / |{i : prev_i = x_t}|
 * from the word x_t fed last, mixed with its knobs bigram_size (N, 0 =
 * off) and bigram_lambda:  p <- (1 - λb) p + λb p_bi  where some pair
 * follows x_t. Everything it takes is this file and its line in the table:
 * its state's whole life (new, push, resize, clear, mark/rollback, memory,
 * export/import) is its row's, the stream and the document loop over rows.
 * tests/component/test_bigram.c is its acceptance. Not in the release build. */
#include "component.h"
#include "cache_knobs.h"
#include "components.h"
#include "fault.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The session state: the ring of pairs, oldest at head - count, and the
 * word pushed last (the next pair's previous word; -1 before any). */
typedef struct {
    int size, count, head;
    int *prev, *word;             /* [size] */
    int last;
} bigram_state;

static const bigram_state *state_of(const nc_mix_input *in)
{
    return in->state[NC_COMP_BIGRAM];
}

static int slot(const bigram_state *b, int i)
{
    return (b->head - b->count + i + 2 * b->size) % b->size;
}

/* The pairs that follow x_t, and (x >= 0) how many of them end in x. */
static int matches(const bigram_state *b, int x, int *hits)
{
    int m = 0, h = 0;
    for (int i = 0; b && b->last >= 0 && i < b->count; i++) {
        int s = slot(b, i);
        if (b->prev[s] == b->last) {
            m++;
            h += b->word[s] == x;
        }
    }
    if (hits)
        *hits = h;
    return m;
}

static bool bigram_on(const nc_cache_params *p)
{
    return p->bigram_size > 0;
}

static double bigram_lambda(const nc_cache_params *p)
{
    return p->bigram_lambda;
}

static bool bigram_available(const nc_cache_params *p, const nc_mix_input *in)
{
    return bigram_on(p) && matches(state_of(in), -1, NULL) > 0;
}

static double bigram_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    (void)p;
    int hits, m = matches(state_of(in), x, &hits);
    return m ? (double)hits / m : 0.0;
}

static int bigram_max_word(const nc_mix_input *in)
{
    const bigram_state *b = state_of(in);
    int mx = -1;
    for (int i = 0; b && b->last >= 0 && i < b->count; i++)
        if (b->prev[slot(b, i)] == b->last && b->word[slot(b, i)] > mx)
            mx = b->word[slot(b, i)];
    return mx;
}

/* Counts first, then divided once: q[w] is the same double as prob(w). */
static int bigram_dense(const nc_cache_params *p, const nc_mix_input *in, double *q, size_t n)
{
    (void)p;
    const bigram_state *b = state_of(in);
    int m = matches(b, -1, NULL);
    for (int i = 0; m && i < b->count; i++)
        if (b->prev[slot(b, i)] == b->last && (size_t)b->word[slot(b, i)] < n)
            q[b->word[slot(b, i)]] += 1.0;
    for (size_t w = 0; m && w < n; w++)
        q[w] /= m;
    return NC_OK;
}

/* log(1 + pairs that follow x_t): how much the ring knows here. */
static void bigram_features(const nc_cache_params *p, const nc_mix_input *in, nc_feat_ctx *ctx, double *pre,
                            double *post)
{
    (void)p, (void)ctx, (void)post;
    pre[0] = log1p((double)matches(state_of(in), -1, NULL));
}

/* ---- its session state's life (component.h) ---- */

static void bigram_free(void *state)
{
    bigram_state *b = state;
    if (!b)
        return;
    free(b->prev);
    free(b->word);
    free(b);
}

static int bigram_new(const nc_state_args *a, void **out, char *err, size_t errlen)
{
    bigram_state *b = nc_zalloc(1, sizeof *b);
    *out = NULL;
    if (!b)
        return nc_error(err, errlen, NC_ENOMEM, "bigram cache");
    b->size = a->p->bigram_size;
    b->last = -1;
    if (b->size > 0) {
        b->prev = nc_malloc((size_t)b->size * sizeof(int));
        b->word = nc_malloc((size_t)b->size * sizeof(int));
        if (!b->prev || !b->word) {
            bigram_free(b);
            return nc_error(err, errlen, NC_ENOMEM, "bigram cache of %d pairs", a->p->bigram_size);
        }
    }
    *out = b;
    return NC_OK;
}

static void bigram_clear(void *state)
{
    bigram_state *b = state;
    NC_ASSERT(b, "bigram: no state");
    b->count = b->head = 0;
    b->last = -1;
}

static void ring_put(bigram_state *b, int prev, int word)
{
    NC_ASSERT(b->size > 0 && b->head >= 0 && b->head < b->size, "bigram: head %d of %d", b->head, b->size);
    b->prev[b->head] = prev;
    b->word[b->head] = word;
    b->head = (b->head + 1) % b->size;
    if (b->count < b->size)
        b->count++;
}

static int bigram_push(void *state, const float *h, int word)
{
    bigram_state *b = state;
    (void)h;
    NC_ASSERT(b && word >= 0, "bigram: push of word %d", word);
    if (b->size == 0)
        return NC_OK;
    if (b->last >= 0)
        ring_put(b, b->last, word);
    b->last = word;
    return NC_OK;
}

static int bigram_resize(const void *old, const nc_state_args *a, void **out, char *err, size_t errlen)
{
    const bigram_state *o = old;
    int rc = bigram_new(a, out, err, errlen);
    bigram_state *b = *out;
    if (rc || b->size == 0)
        return rc;
    for (int i = o->count > b->size ? o->count - b->size : 0; i < o->count; i++)
        ring_put(b, o->prev[slot(o, i)], o->word[slot(o, i)]);
    b->last = o->last;
    return NC_OK;
}

/* What npush pushes overwrite: the slots from head on, head, count, last. */
typedef struct {
    int head, count, last, slots;
    int pw[];                     /* [2 * slots]: prev, word */
} bigram_mark;

static int bigram_mark_save(const void *state, size_t npush, void **out, char *err, size_t errlen)
{
    const bigram_state *b = state;
    int slots = b->size == 0 ? 0 : npush < (size_t)b->size ? (int)npush : b->size;
    bigram_mark *m = nc_malloc(sizeof *m + 2 * (size_t)slots * sizeof(int));
    *out = NULL;
    if (!m)
        return nc_error(err, errlen, NC_ENOMEM, "rescoring");
    *m = (bigram_mark){.head = b->head, .count = b->count, .last = b->last, .slots = slots};
    for (int k = 0; k < slots; k++) {
        m->pw[2 * k] = b->prev[(b->head + k) % b->size];
        m->pw[2 * k + 1] = b->word[(b->head + k) % b->size];
    }
    *out = m;
    return NC_OK;
}

static void bigram_rollback(void *state, void *mark)
{
    bigram_state *b = state;
    bigram_mark *m = mark;
    if (!m)
        return;
    NC_ASSERT(m->count <= b->size && (b->size == 0 || m->head < b->size), "bigram: mark not of this ring");
    for (int k = 0; k < m->slots; k++) {
        b->prev[(m->head + k) % b->size] = m->pw[2 * k];
        b->word[(m->head + k) % b->size] = m->pw[2 * k + 1];
    }
    b->head = m->head;
    b->count = m->count;
    b->last = m->last;
    free(m);
}

static size_t bigram_memory(const void *state)
{
    const bigram_state *b = state;
    return sizeof *b + 2 * (size_t)b->size * sizeof(int);
}

/* The session budget's estimate: the ring at full size. */
static size_t bigram_state_bytes(const nc_state_args *a)
{
    return (size_t)a->p->bigram_size * 2 * sizeof(int);
}

/* Its blob section: i32 size, count, last (ref, -1 none), then count x
 * (prev ref, word ref), oldest first. */
static int bigram_export(const void *state, binio_writer *w, nc_blob_words *x)
{
    const bigram_state *b = state;
    int last = b->last >= 0 ? blob_word_ref(x, b->last) : -1;
    binio_put_i32(w, b->size);
    binio_put_i32(w, b->count);
    binio_put_i32(w, last);
    for (int i = 0; i < b->count; i++) {
        int pr = blob_word_ref(x, b->prev[slot(b, i)]), wr = blob_word_ref(x, b->word[slot(b, i)]);
        if (pr < 0 || wr < 0)
            return NC_ENOMEM;
        binio_put_i32(w, pr);
        binio_put_i32(w, wr);
    }
    return b->last >= 0 && last < 0 ? NC_ENOMEM : NC_OK;
}

static int bigram_import(void *state, binio_reader *r, const nc_blob_words *x, char *err, size_t errlen)
{
    bigram_state *b = state;
    int32_t size = binio_get_i32(r), count = binio_get_i32(r), last = binio_get_i32(r);
    if (r->bad || size != b->size || count < 0 || count > size || (last != -1 && blob_word_id(x, last) < 0))
        return nc_error(err, errlen, NC_EFORMAT, "stream blob: bigram ring does not match its parameters");
    for (int i = 0; i < count; i++) {
        int pv = blob_word_id(x, binio_get_i32(r)), wd = blob_word_id(x, binio_get_i32(r));
        if (r->bad || pv < 0 || wd < 0)
            return nc_error(err, errlen, NC_EFORMAT, "stream blob: bad bigram pair %d", i);
        ring_put(b, pv, wd);
    }
    b->last = last == -1 ? -1 : blob_word_id(x, last);
    return NC_OK;
}

static const char *const bigram_knobs[] = {"bigram_size", "bigram_lambda", NULL};
static const char *const bigram_feature_names[] = {"bigram_log_matches", NULL};

const nc_component nc_component_bigram = {
    .name = "bigram",
    .knobs = bigram_knobs,
    .on = bigram_on,
    .lambda = bigram_lambda,
    .available = bigram_available,
    .prob = bigram_prob,
    .max_word = bigram_max_word,
    .dense = bigram_dense,
    .features = bigram_feature_names,
    .gate_features = bigram_features,
    .export_state = bigram_export,
    .import_state = bigram_import,
    .state_new = bigram_new,
    .state_free = bigram_free,
    .state_clear = bigram_clear,
    .state_resize = bigram_resize,
    .push = bigram_push,
    .mark = bigram_mark_save,
    .rollback = bigram_rollback,
    .memory = bigram_memory,
    .state_bytes = bigram_state_bytes,
};
