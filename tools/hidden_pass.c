/* hidden_pass.c -- the model's hidden states over a text as a two-stage
 * pipeline (hidden_pass.h): the caller's thread runs the LSTM a chunk
 * ahead while a second thread hands the previous chunk to a callback (the
 * unbounded cache's adds for --memory, build-index's sample): the shape of
 * the daemon's upload worker. */
#include "hidden_pass.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "report.h"

/* One chunk of the hidden pass: rows h[0..n] (row 0 = h before the first
 * token) and the cache ids of the n tokens. */
typedef struct {
    float *h;
    int *ids;
    size_t n;
} hp_chunk;

/* The consumer side of co_hidden_pass: calls fn on the chunks in order, in
 * its own thread, while the caller's thread runs the LSTM over the next
 * chunk -- the two-stage pipeline an upload to the daemon runs (its upload
 * worker), so that --memory streams at upload speed: with the model's IVF
 * index the adds (coarse assignment + PQ encoding) cost as much as the LSTM. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    hp_chunk slot[2];
    int ready[2];                 /* slot filled, waiting for fn */
    bool done;                    /* producer finished (or failed) */
    int rc;                       /* fn's first failure */
    char err[NC_ERRLEN];
    co_hidden_fn fn;
    void *ctx;
} hp_pipe;

static void *hp_consumer(void *arg)
{
    hp_pipe *p = arg;
    for (int b = 0;; b ^= 1) {
        pthread_mutex_lock(&p->lock);
        while (!p->ready[b] && !p->done)
            pthread_cond_wait(&p->cond, &p->lock);
        bool have = p->ready[b];
        pthread_mutex_unlock(&p->lock);
        if (!have)
            return NULL;
        int rc = p->fn(p->slot[b].h, p->slot[b].ids, p->slot[b].n, p->ctx, p->err, sizeof p->err);
        pthread_mutex_lock(&p->lock);
        p->ready[b] = 0;
        if (rc && !p->rc)
            p->rc = rc;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        if (rc)
            return NULL;
    }
}

/* Waits until the consumer is done with slot b; the consumer's error, if any. */
static int hp_wait_slot(hp_pipe *p, int b)
{
    pthread_mutex_lock(&p->lock);
    while (p->ready[b] && !p->rc)
        pthread_cond_wait(&p->cond, &p->lock);   /* slot b still being added */
    int rc = p->rc;
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* Hands slot b, holding n tokens, to the consumer. */
static void hp_publish(hp_pipe *p, int b, size_t n)
{
    p->slot[b].n = n;
    pthread_mutex_lock(&p->lock);
    p->ready[b] = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

/* Tells the consumer no chunk follows and waits for it (after the last
 * chunk was consumed); the consumer's error if rc was fine. */
static int hp_stop_consumer(hp_pipe *p, pthread_t th, int rc, char *err, size_t errlen)
{
    pthread_mutex_lock(&p->lock);
    p->done = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(th, NULL);
    if (!rc && p->rc)
        rc = nc_error(err, errlen, p->rc, "%s", p->err);
    return rc;
}

/* The producer side: the model, its running state and the tokens. */
typedef struct {
    const nc_model *m;
    nc_state *s;
    const nc_tokens *toks;
    nc_wordtable *words;   /* open vocabulary: ids for the unk words (NULL: off) */
} hp_producer;

/* Runs the LSTM over tokens j0..j0+nb into chunk c: row 0 = h before the
 * chunk's first token, rows 1..nb = after each; the tokens' cache ids. */
static int hp_fill_chunk(const hp_producer *pr, size_t j0, size_t nb, hp_chunk *c, char *err, size_t errlen)
{
    const nc_model *m = pr->m;
    const nc_tokens *toks = pr->toks;
    const int H = m->cfg.hidden_size;
    memcpy(c->h, lstm_state_top(pr->s), (size_t)H * sizeof(float));
    int rc = lstm_forward_seq(m, pr->s, toks->ids + j0, nb, c->h + H, err, errlen);
    for (size_t r = 0; !rc && r < nb; r++) {
        int id = toks->ids[j0 + r];
        if (pr->words && id == m->unk_id && toks->words && toks->words[j0 + r]) {
            id = wordtable_id(pr->words, toks->words[j0 + r], strlen(toks->words[j0 + r]), true);
            if (id < 0)
                rc = nc_error(err, errlen, NC_ENOMEM, "word table");
        }
        c->ids[r] = id;
    }
    return rc;
}

/* The producer's loop: chunks of C tokens into the two slots in turn. */
static int hp_produce(hp_pipe *p, const hp_producer *pr, size_t C, bool progress, char *err, size_t errlen)
{
    const nc_tokens *toks = pr->toks;
    double t0 = nc_now_s(), last = t0;
    int rc = NC_OK, b = 0;
    for (size_t j0 = 0; !rc && j0 < toks->n; j0 += C, b ^= 1) {
        size_t nb = toks->n - j0 < C ? toks->n - j0 : C;
        rc = hp_wait_slot(p, b);
        if (!rc)
            rc = hp_fill_chunk(pr, j0, nb, &p->slot[b], err, errlen);
        if (rc)
            break;
        hp_publish(p, b, nb);
        double t = nc_now_s();
        if (progress && (t - last > 2.0 || j0 + nb == toks->n)) {
            fprintf(stderr, "  %zu/%zu tokens (%.0f%%), %.0f tokens/s\n", j0 + nb, toks->n,
                    100.0 * (double)(j0 + nb) / (double)toks->n, (double)(j0 + nb) / (t - t0 + 1e-9));
            last = t;
        }
    }
    return rc;
}

int co_hidden_pass(const co_text *x, co_hidden_fn fn, void *ctx, bool progress, char *err, size_t errlen)
{
    const nc_model *m = x->m;
    const nc_tokens *toks = x->toks;
    const size_t C = 4096;
    const int H = m->cfg.hidden_size;
    hp_producer pr = {.m = m, .s = lstm_state_new(m), .toks = toks, .words = x->words};
    nc_lstm_work *w = lstm_work_new(m);
    hp_pipe p = {.fn = fn, .ctx = ctx};
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    bool alloc_ok = pr.s && w;
    for (int b = 0; b < 2; b++) {
        p.slot[b].h = malloc((C + 1) * (size_t)H * sizeof(float));
        p.slot[b].ids = malloc(C * sizeof(int));
        alloc_ok = alloc_ok && p.slot[b].h && p.slot[b].ids;
    }
    int rc = alloc_ok ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "hidden pass buffers");
    pthread_t th;
    bool started = false;
    if (!rc) {
        lstm_step(m, pr.s, m->eos_id, w);
        started = pthread_create(&th, NULL, hp_consumer, &p) == 0;
        if (!started)
            rc = nc_error(err, errlen, NC_ENOMEM, "hidden pass thread");
    }
    /* the two stages share the cores: one BLAS thread for the LSTM, as the
     * daemon runs it (FAISS's OpenMP count is cacheopts_finish's) */
    int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    double t0 = nc_now_s();
    if (!rc)
        rc = hp_produce(&p, &pr, C, progress, err, errlen);
    if (started)
        rc = hp_stop_consumer(&p, th, rc, err, errlen);
    openblas_set_num_threads(blas);
    if (!rc && progress && toks->n)
        fprintf(stderr, "  stored in %.2f s (%.0f tokens/s)\n", nc_now_s() - t0,
                (double)toks->n / (nc_now_s() - t0 + 1e-9));
    for (int k = 0; k < 2; k++) {
        free(p.slot[k].h);
        free(p.slot[k].ids);
    }
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    lstm_state_free(pr.s);
    lstm_work_free(w);
    return rc;
}
