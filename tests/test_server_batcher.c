/* test_server_batcher.c -- the predict batcher (server/domain/batcher.c) in
 * process, with batches forced deterministically: a blocking job holds the
 * only batch thread while predictions queue, so the next batch takes them
 * all (one pass over the decoder). Each job checks the logits it is handed against the
 * stream's own unbatched prediction; a session queued twice waits for a
 * later batch; a stopped batcher runs jobs inline. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "harness.h"
#include "lstm.h"

#define NS 8

typedef struct {
    batch_job job;
    int batched;                  /* logits were handed (not NULL) */
    double worst;                 /* max |p_batched - p_alone| */
    int rc;
    int done;
    int order;                    /* completion order */
} pjob;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int blocker_in, blocker_release, completed;

static void predict_run(batch_job *j, const float *logits)
{
    pjob *p = (pjob *)j;
    char err[NC_ERRLEN];
    nc_dist a, b;
    dist_init(&a);
    dist_init(&b);
    p->batched = logits != NULL;
    p->rc = logits ? stream_predict_logits(j->s->stream, logits, true, &a, err, sizeof err)
                   : stream_predict(j->s->stream, true, &a, err, sizeof err);
    if (p->rc == NC_OK && stream_predict(j->s->stream, true, &b, err, sizeof err) == NC_OK && a.n == b.n) {
        for (size_t w = 0; w < a.n; w++)
            p->worst = fmax(p->worst, fabs((double)a.p[w] - (double)b.p[w]));
    } else {
        p->worst = 1;
    }
    dist_free(&a);
    dist_free(&b);
}

static void predict_done(batch_job *j)
{
    pjob *p = (pjob *)j;
    pthread_mutex_lock(&mu);
    p->done = 1;
    p->order = completed++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Holds the batch thread inside run until released. */
static void blocker_run(batch_job *j, const float *logits)
{
    (void)j, (void)logits;
    pthread_mutex_lock(&mu);
    blocker_in = 1;
    pthread_cond_broadcast(&cv);
    while (!blocker_release) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void wait_completed(int n)
{
    pthread_mutex_lock(&mu);
    while (completed < n) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* The fixture model and the sessions' settings (a neural window of 20,
 * a unigram one of 10). */
static nc_model *load_fixture(nc_cache_params *p)
{
    char dir[600], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/lstm-2layer", harness_fixtures());
    nc_model *m = NULL;
    CHECKF(model_load(dir, &m, err, sizeof err) == NC_OK, "%s", err);
    cache_params_default(p);
    p->neural_size = 20;
    p->neural_lambda = 0.3f;
    p->unigram_size = 10;
    return m;
}

/* A session on m with p, text fed (none when empty). */
static void session_fed(nc_session *s, nc_model *m, const nc_cache_params *p, const char *text)
{
    char err[NC_ERRLEN];
    pthread_mutex_init(&s->lock, NULL);
    CHECK(stream_new(m, p, NULL, NULL, true, &s->stream, err, sizeof err) == NC_OK);
    if (!*text)
        return;
    nc_tokens t;
    tokens_init(&t);
    CHECK(tokenize(m, text, strlen(text), false, &t, err, sizeof err) == NC_OK);
    CHECK(stream_feed(s->stream, &t, false, NULL, err, sizeof err) == NC_OK);
    tokens_clear(&t);
}

/* The blocker job on session s holds the only batch thread until
 * release_thread: the jobs submitted meanwhile form the next batch. */
static void hold_thread(batcher *b, pjob *blocker, nc_session *s)
{
    *blocker = (pjob){.job = {.s = s, .run = blocker_run, .done = predict_done}};
    batcher_submit(b, &blocker->job);
    pthread_mutex_lock(&mu);
    while (!blocker_in) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void release_thread(void)
{
    pthread_mutex_lock(&mu);
    blocker_release = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

TEST(batches_match_unbatched)
{
    char err[NC_ERRLEN];
    nc_cache_params p;
    nc_model *m = load_fixture(&p);
    if (!m) return;
    static const char *texts[NS] = {"w1 w2 w3", "w4 w5 w4 w5", "w7\nw8", "w10 w11 w12", "w1 w14 w15",
                                    "w15 w15", "w16 w17\n", "w18 w19 w20 w18"};
    nc_session s[NS + 1];
    memset(s, 0, sizeof s);
    for (int i = 0; i <= NS; i++)
        session_fed(&s[i], m, &p, i < NS ? texts[i] : "");
    batcher *b = batcher_new(m, 1, 64);
    CHECK(b != NULL);
    if (!b) return;

    /* 1. A blocker holds the thread (on session NS); eight predictions and a
     * second one on session 0 queue; then one batch takes them. */
    pjob blocker;
    hold_thread(b, &blocker, &s[NS]);
    pjob jobs[NS + 1];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i <= NS; i++) {
        jobs[i].job = (batch_job){.s = &s[i < NS ? i : 0], .run = predict_run, .done = predict_done};
        batcher_submit(b, &jobs[i].job);
    }
    release_thread();
    wait_completed(NS + 2);
    uint64_t batches = 0, njobs = 0;
    batcher_stats(b, &batches, &njobs);
    /* blocker alone, the eight sessions in one pass, session 0's second job
     * (its lock was taken in that batch) alone after it */
    CHECKF(batches == 3 && njobs == NS + 2, "%llu batches, %llu jobs", (unsigned long long)batches,
           (unsigned long long)njobs);
    for (int i = 0; i <= NS; i++) {
        CHECK(jobs[i].done && jobs[i].rc == NC_OK && jobs[i].batched);
        CHECKF(jobs[i].worst <= 1e-6, "job %d: batched differs by %g", i, jobs[i].worst);
    }
    CHECK(jobs[NS].order == NS + 1);   /* the duplicate ran last */

    /* 2. A stream with no h (bos false, nothing fed): NULL logits, and the
     * job's own stream_predict reports it. */
    nc_session empty;
    memset(&empty, 0, sizeof empty);
    pthread_mutex_init(&empty.lock, NULL);
    CHECK(stream_new(m, &p, NULL, NULL, false, &empty.stream, err, sizeof err) == NC_OK);
    pjob ej = {.job = {.s = &empty, .run = predict_run, .done = predict_done}};
    batcher_submit(b, &ej.job);
    wait_completed(NS + 3);
    CHECK(ej.done && !ej.batched && ej.rc == NC_ESTATE);

    /* 3. Stopped: a job runs inline in the submitting thread. */
    batcher_stop(b);
    pjob late = {.job = {.s = &s[1], .run = predict_run, .done = predict_done}};
    batcher_submit(b, &late.job);
    CHECK(late.done && late.rc == NC_OK && !late.batched && late.worst == 0);
    batcher_free(b);
    batcher_free(NULL);
    CHECK(batcher_new(m, 0, 4) == NULL && batcher_new(m, 1, 0) == NULL);

    for (int i = 0; i <= NS; i++) {
        stream_free(s[i].stream);
        pthread_mutex_destroy(&s[i].lock);
    }
    stream_free(empty.stream);
    pthread_mutex_destroy(&empty.lock);
    model_free(m);
}

/* A job that keeps its prediction (cjob.p, malloc'ed). */
typedef struct {
    batch_job job;
    float *p;
    size_t n;
    int rc;
} cjob;

static void capture_run(batch_job *j, const float *logits)
{
    cjob *c = (cjob *)j;
    char err[NC_ERRLEN];
    nc_dist d;
    dist_init(&d);
    c->rc = logits ? stream_predict_logits(j->s->stream, logits, false, &d, err, sizeof err)
                   : stream_predict(j->s->stream, false, &d, err, sizeof err);
    c->n = d.n;
    c->p = c->rc == NC_OK ? malloc(d.n * sizeof(float)) : NULL;
    if (c->p)
        memcpy(c->p, d.p, d.n * sizeof(float));
    dist_free(&d);
}

static void capture_done(batch_job *j)
{
    (void)j;
    pthread_mutex_lock(&mu);
    completed++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* One predict through the batcher (a batch of one row: a GEMV), the same
 * again, then a one-word feed: with the stream's memo on (the row kept as
 * the session's memo, the repeat handed the memo, the feed reading it) and
 * forced off, the same bits. */
static void memo_sequence(batcher *b, nc_session *s, float **p1, float **p2, size_t *n, double *lp)
{
    char err[NC_ERRLEN];
    cjob c[2];
    memset(c, 0, sizeof c);
    for (int r = 0; r < 2; r++) {
        c[r].job = (batch_job){.s = s, .run = capture_run, .done = capture_done};
        int before = completed;
        batcher_submit(b, &c[r].job);
        wait_completed(before + 1);
        CHECK(c[r].rc == NC_OK);
    }
    *p1 = c[0].p;
    *p2 = c[1].p;
    *n = c[0].n;
    nc_tokens t;
    tokens_init(&t);
    CHECK(tokenize(stream_model(s->stream), "w9", 2, false, &t, err, sizeof err) == NC_OK && t.n == 1);
    CHECK(stream_feed(s->stream, &t, false, lp, err, sizeof err) == NC_OK);
    tokens_clear(&t);
}

TEST(batched_memo_bit_identical)
{
    nc_cache_params p;
    nc_model *m = load_fixture(&p);
    if (!m) return;
    nc_session s[2];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 2; i++)
        session_fed(&s[i], m, &p, "w1 w2 w3 w4");
    batcher *b = batcher_new(m, 1, 64);
    CHECK(b != NULL);
    if (!b) return;
    float *a1, *a2, *b1, *b2;
    size_t na, nb;
    double la = 0, lb = 0;
    uint64_t r0 = stream_memo_reads();
    memo_sequence(b, &s[0], &a1, &a2, &na, &la);
    uint64_t r1 = stream_memo_reads();
    stream_memo_disable(true);
    memo_sequence(b, &s[1], &b1, &b2, &nb, &lb);
    stream_memo_disable(false);
    /* read by the repeat (its logits) and by the feed (its score) */
    CHECKF(r1 - r0 >= 1 && stream_memo_reads() == r1, "memo read %llu times on, %llu off",
           (unsigned long long)(r1 - r0), (unsigned long long)(stream_memo_reads() - r1));
    CHECK(na == nb && a1 && a2 && b1 && b2);
    if (a1 && a2 && b1 && b2 && na == nb) {
        CHECK(memcmp(a1, b1, na * sizeof(float)) == 0);
        CHECK(memcmp(a2, b2, na * sizeof(float)) == 0);
        CHECK(memcmp(a1, a2, na * sizeof(float)) == 0);
    }
    CHECKF(memcmp(&la, &lb, sizeof la) == 0, "feed after a batched predict: %.17g with the memo, %.17g without", la,
           lb);
    free(a1), free(a2), free(b1), free(b2);
    batcher_free(b);
    for (int i = 0; i < 2; i++) {
        stream_free(s[i].stream);
        pthread_mutex_destroy(&s[i].lock);
    }
    model_free(m);
}

/* One batch of NS sessions (a blocker holds the thread while they queue):
 * each row is kept as its session's memo, the same bits as lstm_logits of
 * that h alone (the batch-invariant decoder, vmath.h), and the memo's
 * prediction and next feed's score equal, to the bit, a twin session's
 * with the memo off -- on the F32 fixture (vm_gemm_nt) and the F16 one
 * (the binary16 decoder copy, vm_gemm_nt_f16). */
static void batch_rows_memo(const char *fixture)
{
    char dir[600], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/%s", harness_fixtures(), fixture);
    nc_model *m = NULL;
    CHECKF(model_load(dir, &m, err, sizeof err) == NC_OK, "%s", err);
    if (!m) return;
    nc_cache_params p;
    cache_params_default(&p);
    p.neural_size = 20;
    p.neural_lambda = 0.3f;
    static const char *texts[NS] = {"w1 w2 w3", "w4 w5 w4 w5", "w7\nw8", "w10 w11 w12", "w1 w14 w15",
                                    "w15 w15", "w16 w17\n", "w18 w19 w20 w18"};
    nc_session s[NS + 1], twin[NS];
    memset(s, 0, sizeof s), memset(twin, 0, sizeof twin);
    for (int i = 0; i <= NS; i++)
        session_fed(&s[i], m, &p, i < NS ? texts[i] : "");
    for (int i = 0; i < NS; i++)
        session_fed(&twin[i], m, &p, texts[i]);
    batcher *b = batcher_new(m, 1, 64);
    CHECK(b != NULL);
    if (!b) return;
    blocker_in = blocker_release = 0;
    completed = 0;
    pjob blocker;
    hold_thread(b, &blocker, &s[NS]);
    cjob c[NS];
    memset(c, 0, sizeof c);
    for (int i = 0; i < NS; i++) {
        c[i].job = (batch_job){.s = &s[i], .run = capture_run, .done = capture_done};
        batcher_submit(b, &c[i].job);
    }
    release_thread();
    wait_completed(NS + 1);
    uint64_t batches = 0, njobs = 0;
    batcher_stats(b, &batches, &njobs);
    CHECKF(batches == 2 && njobs == NS + 1, "%s: %llu batches, %llu jobs", fixture, (unsigned long long)batches,
           (unsigned long long)njobs);
    const size_t V = (size_t)m->cfg.vocab_size;
    float *alone = malloc(V * sizeof(float));
    for (int i = 0; i < NS; i++) {
        stream_memo_disable(false);
        const float *memo = stream_memo_logits(s[i].stream);
        CHECKF(memo != NULL, "%s: session %d's batched row not kept", fixture, i);
        lstm_logits(m, stream_h(twin[i].stream), alone);
        CHECKF(memo && memcmp(memo, alone, V * sizeof(float)) == 0, "%s: session %d: batch row != lone row", fixture,
               i);
        /* the twin predicts and feeds with the memo off */
        stream_memo_disable(true);
        nc_dist d;
        dist_init(&d);
        CHECK(stream_predict(twin[i].stream, false, &d, err, sizeof err) == NC_OK);
        CHECKF(c[i].rc == NC_OK && c[i].p && d.n == c[i].n && memcmp(d.p, c[i].p, d.n * sizeof(float)) == 0,
               "%s: session %d: batched prediction != lone one", fixture, i);
        dist_free(&d);
        nc_tokens t;
        tokens_init(&t);
        double l1 = 0, l2 = 0;
        CHECK(tokenize(m, "w9", 2, false, &t, err, sizeof err) == NC_OK && t.n == 1);
        CHECK(stream_feed(twin[i].stream, &t, false, &l2, err, sizeof err) == NC_OK);
        stream_memo_disable(false);
        uint64_t r0 = stream_memo_reads();
        CHECK(stream_feed(s[i].stream, &t, false, &l1, err, sizeof err) == NC_OK);
        CHECKF(stream_memo_reads() > r0, "%s: session %d's feed did not read the memo", fixture, i);
        CHECKF(memcmp(&l1, &l2, sizeof l1) == 0, "%s: session %d: feed %.17g with the batch's memo, %.17g without",
               fixture, i, l1, l2);
        tokens_clear(&t);
        free(c[i].p);
        stream_memo_disable(true);
    }
    stream_memo_disable(false);
    free(alone);
    batcher_free(b);
    for (int i = 0; i <= NS; i++) {
        stream_free(s[i].stream);
        pthread_mutex_destroy(&s[i].lock);
        if (i < NS) {
            stream_free(twin[i].stream);
            pthread_mutex_destroy(&twin[i].lock);
        }
    }
    model_free(m);
}

TEST(batched_rows_kept_as_memo)
{
    batch_rows_memo("lstm-2layer");
    batch_rows_memo("lstm-2layer-f16");
}

/* A job that feeds a word in prepare (as a predict's "text"), or answers
 * there (refuse): run must then not be called, done must. */
typedef struct {
    pjob p;                       /* first: the batcher's view */
    const char *word;             /* fed by prepare; NULL: prepare refuses */
    int prepared, ran;
    int64_t pos_at_run;
} tjob;

static bool text_prepare(batch_job *j)
{
    tjob *t = (tjob *)j;
    t->prepared++;
    if (!t->word)
        return false;
    char err[NC_ERRLEN];
    nc_tokens tk;
    tokens_init(&tk);
    bool ok = tokenize(stream_model(j->s->stream), t->word, strlen(t->word), false, &tk, err, sizeof err) == NC_OK &&
              stream_feed(j->s->stream, &tk, false, NULL, err, sizeof err) == NC_OK;
    tokens_clear(&tk);
    return ok;
}

static void text_run(batch_job *j, const float *logits)
{
    tjob *t = (tjob *)j;
    t->ran++;
    t->pos_at_run = stream_position(j->s->stream);
    predict_run(j, logits);       /* the handed logits against the stream's own predict */
}

/* Jobs with a prepare step in one batch: the fed words' new h_t are the
 * batch's rows (each checked against the stream's unbatched prediction at
 * its new position); a job whose prepare answers is finished without run,
 * its session unlocked; the batch's count still has every job. */
TEST(prepared_jobs_in_one_batch)
{
    nc_cache_params p;
    nc_model *m = load_fixture(&p);
    if (!m) return;
    static const char *texts[4] = {"w1 w2", "w3 w4 w5", "w6", "w7 w8"};
    static const char *words[4] = {"w9", NULL, "w10", "w2"};
    nc_session s[5];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 5; i++)
        session_fed(&s[i], m, &p, i < 4 ? texts[i] : "");
    batcher *b = batcher_new(m, 1, 64);
    CHECK(b != NULL);
    if (!b) return;
    completed = 0;
    blocker_in = blocker_release = 0;
    pjob blocker;
    hold_thread(b, &blocker, &s[4]);
    tjob jobs[4];
    memset(jobs, 0, sizeof jobs);
    int64_t pos0[4];
    for (int i = 0; i < 4; i++) {
        pos0[i] = stream_position(s[i].stream);
        jobs[i].word = words[i];
        jobs[i].p.job = (batch_job){.s = &s[i], .prepare = text_prepare, .run = text_run, .done = predict_done};
        batcher_submit(b, &jobs[i].p.job);
    }
    uint64_t batches0 = 0, jobs0 = 0;
    batcher_stats(b, &batches0, &jobs0);
    release_thread();
    wait_completed(5);
    uint64_t batches = 0, njobs = 0;
    batcher_stats(b, &batches, &njobs);
    CHECKF(batches - batches0 == 2 && njobs - jobs0 == 5, "%llu batches, %llu jobs",
           (unsigned long long)(batches - batches0), (unsigned long long)(njobs - jobs0));
    for (int i = 0; i < 4; i++) {
        CHECK(jobs[i].p.done && jobs[i].prepared == 1);
        if (words[i]) {
            CHECKF(jobs[i].ran == 1 && jobs[i].p.rc == NC_OK && jobs[i].p.batched, "job %d", i);
            CHECKF(jobs[i].p.worst <= 1e-6, "job %d: batched differs by %g", i, jobs[i].p.worst);
            CHECK(jobs[i].pos_at_run == pos0[i] + 1);
        } else {
            CHECK(jobs[i].ran == 0 && stream_position(s[i].stream) == pos0[i]);
        }
        CHECK(pthread_mutex_trylock(&s[i].lock) == 0);   /* unlocked, answered or not */
        pthread_mutex_unlock(&s[i].lock);
    }
    batcher_stop(b);
    /* stopped: prepare then run inline, or prepare alone */
    tjob late = {.word = "w3", .p.job = {.s = &s[0], .prepare = text_prepare, .run = text_run, .done = predict_done}};
    tjob refused = {.p.job = {.s = &s[1], .prepare = text_prepare, .run = text_run, .done = predict_done}};
    batcher_submit(b, &late.p.job);
    batcher_submit(b, &refused.p.job);
    CHECK(late.prepared == 1 && late.ran == 1 && late.p.done && late.p.rc == NC_OK && late.p.worst == 0);
    CHECK(refused.prepared == 1 && refused.ran == 0 && refused.p.done);
    batcher_free(b);
    for (int i = 0; i < 5; i++) {
        stream_free(s[i].stream);
        pthread_mutex_destroy(&s[i].lock);
    }
    model_free(m);
}

int main(void)
{
    RUN(batches_match_unbatched);
    RUN(batched_memo_bit_identical);
    RUN(batched_rows_kept_as_memo);
    RUN(prepared_jobs_in_one_batch);
    return harness_summary();
}
