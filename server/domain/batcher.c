/* batcher.c -- predict batching: concurrent sessions' decoder products in
 * one pass over the decoder (see batcher.h for the why). */
#include "batcher.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "lstm.h"

/* One batch thread and its scratch, allocated up front so a batch never
 * fails for memory. */
typedef struct {
    struct batcher *b;
    pthread_t th;
    float *X;                     /* [max_batch, H] gathered h_t */
    float *L;                     /* [max_batch, V] logits */
    batch_job **take, **run, **later;
    int *row;
} batch_worker;

struct batcher {
    const nc_model *m;
    int max_batch;
    int nworkers;                 /* workers allocated */
    int nthreads;                 /* threads running */
    batch_worker *w;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    batch_job *head, *tail;       /* FIFO of waiting jobs */
    bool stop;
    atomic_uint_fast64_t batches, jobs;
};

/* Puts jobs[0..n) back at the front of the queue, in order. Caller holds
 * b->lock. */
static void requeue_front(batcher *b, batch_job **jobs, int n)
{
    for (int i = n; i-- > 0;) {
        jobs[i]->next = b->head;
        b->head = jobs[i];
        if (!b->tail)
            b->tail = jobs[i];
    }
}

static void teardown(batcher *b, int n);

/* Takes up to max_batch jobs off the queue into take; their count.
 * Caller holds b->lock. */
static int take_jobs(batcher *b, batch_job **take)
{
    int n = 0;
    while (b->head && n < b->max_batch) {
        take[n++] = b->head;
        b->head = b->head->next;
    }
    if (!b->head)
        b->tail = NULL;
    return n;
}

/* Locks the sessions of what is free among w->take[0..n) into w->run
 * (their count returned; the caller unlocks them). A session busy
 * elsewhere (a long feed, or another of its requests in this or another
 * batch) waits for a later batch, back at the queue's front; if nothing is
 * free, blocks on the first one: no other session lock is held then, so no
 * lock-order cycle is possible. */
static int lock_free_sessions(batch_worker *w, int n)
{
    batcher *b = w->b;
    batch_job **take = w->take, **run = w->run, **later = w->later;
    int nrun = 0, nlater = 0;
    for (int i = 0; i < n; i++) {
        if (pthread_mutex_trylock(&take[i]->s->lock) == 0)
            run[nrun++] = take[i];
        else
            later[nlater++] = take[i];
    }
    if (nrun == 0 && nlater > 0) {
        pthread_mutex_lock(&later[0]->s->lock);
        run[nrun++] = later[0];
        nlater--;
        for (int i = 0; i < nlater; i++)
            later[i] = later[i + 1];
    }
    if (nlater > 0) {
        pthread_mutex_lock(&b->lock);
        requeue_front(b, later, nlater);
        pthread_cond_signal(&b->cv);
        pthread_mutex_unlock(&b->lock);
    }
    return nrun;
}

/* Gathers h_t of each running job's session into w->X (w->row[i]: its
 * row, -1 without h), the rows of the model's shared decoder first;
 * returns the number of those shared-weight rows. */
static size_t gather_rows(batch_worker *w, int nrun)
{
    const batcher *b = w->b;
    const size_t H = (size_t)b->m->cfg.hidden_size;
    batch_job **run = w->run;
    size_t nr = 0;
    for (int i = 0; i < nrun; i++) {
        const float *h = stream_h(run[i]->s->stream);
        w->row[i] = -1;
        /* a repeated predict: the session's memo holds them (stream.h) */
        if (h && stream_memo_logits(run[i]->s->stream))
            continue;
        if (h) {
            memcpy(w->X + nr * H, h, H * sizeof(float));
            w->row[i] = (int)nr++;
        }
    }
    /* A session with dynamic evaluation's adapted weights has its own
     * decoder: its rows go last, each through its own weights. */
    size_t ns = 0;
    for (int i = 0; i < nrun; i++)
        if (w->row[i] >= 0 && stream_model(run[i]->s->stream) == b->m)
            ns++;
    if (ns < nr) {
        /* reorder: shared-weight rows first (one pass), then the others */
        size_t a = 0, o = ns;
        for (int i = 0; i < nrun; i++) {
            if (w->row[i] < 0)
                continue;   /* no h, or the memo's */
            bool own = stream_model(run[i]->s->stream) != b->m;
            size_t to = own ? o++ : a++;
            memcpy(w->X + to * H, stream_h(run[i]->s->stream), H * sizeof(float));
            w->row[i] = (int)to;
        }
    }
    return ns;
}

/* The logits of the gathered rows (one pass over the shared decoder for
 * theirs), then each running job's mixture. */
static void run_jobs(batch_worker *w, int nrun)
{
    const batcher *b = w->b;
    const size_t H = (size_t)b->m->cfg.hidden_size, V = (size_t)b->m->cfg.vocab_size;
    batch_job **run = w->run;
    size_t nshared = gather_rows(w, nrun);
    /* The shared decoder read once for all rows (its binary16 copy for an
     * F16 model: vm_gemm_nt_f16), each row summed as lstm_logits sums it
     * alone -- so every row is the session's memo, the same bits its next
     * feed's score at h would make. */
    if (nshared > 0)
        lstm_logits_rows(b->m, w->X, nshared, w->L);
    for (int i = 0; i < nrun; i++)
        if (w->row[i] >= (int)nshared)
            lstm_logits(stream_model(run[i]->s->stream), w->X + (size_t)w->row[i] * H,
                        w->L + (size_t)w->row[i] * V);
    for (int i = 0; i < nrun; i++)
        if (w->row[i] >= 0)
            stream_keep_logits(run[i]->s->stream, w->L + (size_t)w->row[i] * V);
    for (int i = 0; i < nrun; i++)
        run[i]->run(run[i], w->row[i] >= 0 ? w->L + (size_t)w->row[i] * V : stream_memo_logits(run[i]->s->stream));
    /* (no h: NULL, and the job's own stream_predict reports it) */
}

/* j's prepare, if it has one (s->lock held): whether j is still to run. */
static bool job_prepared(batch_job *j)
{
    return !j->prepare || j->prepare(j);
}

/* Each running job's prepare (batch_job); those that answered already
 * move to the end of w->run (still to unlock and finish, not to run).
 * Returns the count of the others, in their order. */
static int prepare_jobs(batch_worker *w, int nrun)
{
    batch_job **run = w->run, **later = w->later;
    int nready = 0, nanswered = 0;
    for (int i = 0; i < nrun; i++) {
        if (job_prepared(run[i]))
            run[nready++] = run[i];
        else
            later[nanswered++] = run[i];
    }
    memcpy(run + nready, later, (size_t)nanswered * sizeof *run);
    return nready;
}

static void *batch_thread(void *arg)
{
    batch_worker *w = arg;
    batcher *b = w->b;
    batch_job **run = w->run;

    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!b->head && !b->stop)
            pthread_cond_wait(&b->cv, &b->lock);
        if (!b->head)
            break;                /* stopping and nothing left */
        int n = take_jobs(b, w->take);
        pthread_mutex_unlock(&b->lock);

        int nrun = lock_free_sessions(w, n);
        run_jobs(w, prepare_jobs(w, nrun));
        for (int i = 0; i < nrun; i++)
            pthread_mutex_unlock(&run[i]->s->lock);
        atomic_fetch_add(&b->batches, 1);
        atomic_fetch_add(&b->jobs, (uint64_t)nrun);
        metrics_add_predict_batch((uint64_t)nrun);
        for (int i = 0; i < nrun; i++)
            run[i]->done(run[i]);
        pthread_mutex_lock(&b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

batcher *batcher_new(const nc_model *m, int threads, int max_batch)
{
    NC_ASSERT(m, "batcher_new: no m");
    if (threads < 1 || max_batch < 1)
        return NULL;
    batcher *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->m = m;
    b->max_batch = max_batch;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->w = calloc((size_t)threads, sizeof *b->w);
    bool ok = b->w != NULL;
    b->nworkers = ok ? threads : 0;
    const size_t H = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size, B = (size_t)max_batch;
    for (int i = 0; ok && i < threads; i++) {
        batch_worker *w = &b->w[i];
        w->b = b;
        w->X = malloc(B * H * sizeof(float));
        w->L = malloc(B * V * sizeof(float));
        w->take = malloc(B * sizeof(batch_job *));
        w->run = malloc(B * sizeof(batch_job *));
        w->later = malloc(B * sizeof(batch_job *));
        w->row = malloc(B * sizeof(int));
        ok = w->X && w->L && w->take && w->run && w->later && w->row;
    }
    for (int i = 0; ok && i < threads; i++) {
        if (pthread_create(&b->w[i].th, NULL, batch_thread, &b->w[i]) != 0)
            break;
        b->nthreads++;
    }
    if (!ok || b->nthreads < threads) {
        teardown(b, b->nworkers);
        return NULL;
    }
    return b;
}

void batcher_submit(batcher *b, batch_job *j)
{
    NC_ASSERT(b, "batcher_submit: no b");
    j->next = NULL;
    pthread_mutex_lock(&b->lock);
    if (b->stop) {
        /* Stopped (shutting down): the job runs alone, here. */
        pthread_mutex_unlock(&b->lock);
        batch_job_run_alone(j);
        j->done(j);
        return;
    }
    if (b->tail)
        b->tail->next = j;
    else
        b->head = j;
    b->tail = j;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->lock);
}

void batch_job_run_alone(batch_job *j)
{
    NC_ASSERT(j, "batch_job_run_alone: no j");
    pthread_mutex_lock(&j->s->lock);
    if (job_prepared(j))
        j->run(j, NULL);
    pthread_mutex_unlock(&j->s->lock);
}

void batcher_stop(batcher *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->lock);
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->lock);
    for (int i = 0; i < b->nthreads; i++)
        pthread_join(b->w[i].th, NULL);
    b->nthreads = 0;
}

/* Stops and joins the threads started, frees the scratch of the first n
 * workers and b. */
static void teardown(batcher *b, int n)
{
    batcher_stop(b);
    for (int i = 0; b->w && i < n; i++) {
        batch_worker *w = &b->w[i];
        free(w->X), free(w->L), free(w->take), free(w->run), free(w->later), free(w->row);
    }
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cv);
    free(b->w);
    free(b);
}

void batcher_free(batcher *b)
{
    if (b)
        teardown(b, b->nworkers);
}

void batcher_stats(batcher *b, uint64_t *batches, uint64_t *jobs)
{
    if (batches)
        *batches = b ? atomic_load(&b->batches) : 0;
    if (jobs)
        *jobs = b ? atomic_load(&b->jobs) : 0;
}
