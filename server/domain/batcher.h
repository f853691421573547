/* batcher.h -- predict batching: the next-word predictions of concurrent
 * sessions share one pass over the decoder instead of one matrix-vector
 * product each.
 *
 * The decoder (W [V,H] times h_t) is most of a prediction's cost and is
 * bound by reading W; one pass over B sessions' h_t reads W once for all B.
 * Requests hand a job to the batcher (the HTTP connection is suspended
 * meanwhile); a few batch threads each take every job waiting, lock the
 * jobs' sessions, let each job prepare (a predict with "text" feeds it:
 * one request a new word, its LSTM step in the batch), run
 * lstm_logits_rows on their h_t (batch-invariant: each
 * row the bits of a lone lstm_logits, kept as the session's memo) and let
 * each job finish with its row of logits. Batches form by themselves under
 * load (jobs queue while a batch runs) and are of size 1 when idle, so a
 * lone client pays no waiting time. */
#ifndef NC_SERVER_BATCHER_H
#define NC_SERVER_BATCHER_H

#include "sessions.h"

typedef struct batch_job batch_job;

/* A job, owned by the submitter until done is called. The submitter holds
 * the session (sessions_acquire); the batcher locks s->lock around run. */
struct batch_job {
    nc_session *s;
    /* NULL, or called with s->lock held before the batch's decoder pass,
     * to move the session first (a predict's text, fed here so that its
     * new h_t joins the batch's rows): false when the job has answered
     * already (an error), and then run is not called, only done. */
    bool (*prepare)(batch_job *j);
    /* Called with s->lock held: logits = W h_t + b for the session's
     * current h_t ([V]), or NULL when not batched (the stream has no h yet,
     * or the batcher is stopped): the job then calls stream_predict. */
    void (*run)(batch_job *j, const float *logits);
    /* Called once after run with no lock held (release the session, answer,
     * free the job). */
    void (*done)(batch_job *j);
    batch_job *next;              /* queue link, the batcher's */
};

typedef struct batcher batcher;

/* Starts threads (>= 1) batch threads on model m (borrowed), each running
 * batches of at most max_batch (>= 1) jobs. NULL on failure. */
batcher *batcher_new(const nc_model *m, int threads, int max_batch);

/* Queues a job; run and done are called later on a batch thread. */
void batcher_submit(batcher *b, batch_job *j);

/* Runs j unbatched in the calling thread, under s->lock: prepare, then
 * run with NULL logits (the job's own stream_predict); not done, which the
 * caller calls or replaces. For a server without a batcher, and a stopped
 * one's submits. */
void batch_job_run_alone(batch_job *j);

/* Finishes every queued job and joins the threads; jobs submitted from then
 * on run at once in the submitting thread. NULL allowed. */
void batcher_stop(batcher *b);
/* Stops if not yet, and frees. NULL allowed. */
void batcher_free(batcher *b);

/* Batches run and jobs done so far (for metrics and benchmarks). */
void batcher_stats(batcher *b, uint64_t *batches, uint64_t *jobs);

#endif
