/* api_predict.c -- a session's feed and predict, and stateless scoring
 * (api_predict.h). Sessions are held (api_session_acquire) and locked for
 * the work, so requests on one session are serialised while different
 * sessions run in parallel. */
#include "api_predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_errors.h"
#include "apiutil.h"
#include "batcher.h"
#include "metrics.h"
#include "namespaces.h"
#include "workguard.h"

/* A feed's work: the tokens, where they go and what comes back. */
typedef struct {
    nc_stream *st;             /* fed */
    nc_session *adapt_s;       /* non-NULL: its namespace adapted too (namespaces_feed_adapt) */
    const nc_tokens *t;
    double *lp;                /* [t->n] log-probabilities, or NULL */
    float (*shares)[NC_NCOMP]; /* [t->n] components' shares, or NULL */
    size_t done;               /* out: tokens fed */
    wg_stop why;               /* out: why it stopped early (WG_RUN: it did not) */
    uint64_t seq;              /* out: the last log record of the adapted pairs */
} feed_job;

/* Feed with "components": token by token, the full distribution with each
 * component's share (stream_predict) read at the token, then the token fed
 * (stream_feed, which gives its logprob through the target-only path; the
 * two paths agree, design §4). shares[i][c] is NAN where there is no
 * prediction (no h yet) or the word has no id yet (a new open-vocabulary
 * word: only the uniform term gives it mass). One full softmax per token,
 * as predict: for the page's surprisal map, not for bulk scoring. Unlike
 * stream_feed, a failure midway (out of memory) leaves the tokens before it
 * fed. */
static int feed_components(const nc_model *m, const feed_job *j, size_t i0, const nc_tokens *t, char *err,
                           size_t errlen)
{
    nc_stream *st = j->st;
    double *lp = j->lp + i0;
    float (*shares)[NC_NCOMP] = j->shares + i0;
    nc_dist d;
    dist_init(&d);
    int rc = NC_OK;
    for (size_t i = 0; i < t->n && rc == NC_OK; i++) {
        int id = api_stream_token_id(st, m, t, i);
        for (int c = 0; c < NC_NCOMP; c++)
            shares[i][c] = NAN;
        if (stream_has_h(st)) {
            rc = stream_predict(st, true, &d, err, errlen);
            for (int c = 0; rc == NC_OK && id >= 0 && c < NC_NCOMP && (size_t)id < d.n; c++)
                shares[i][c] = d.share[c][id];
        }
        if (rc == NC_OK)
            rc = api_stream_feed_one(st, t, i, &lp[i], err, errlen);
    }
    dist_free(&d);
    return rc;
}

/* ---- work budgets (config [limits]) -------------------------------------
 * Each is checked before the work starts, in the unit that costs: LSTM
 * steps (max_tokens_per_request), full-vocabulary distributions
 * (max_generation_steps), unbounded-cache neighbours
 * (max_neighbours_per_request). */

/* Feeds j->t into j->st (adapting the session's namespace when
 * j->adapt_s) in slices of WORKGUARD_SLICE tokens, checking the request's
 * guard between slices; fills j's outputs. Each slice is all or nothing; the slices before a stop stay fed (the stream's results do not
 * depend on how the tokens are split, stream.h). */
static int feed_slices(nc_server *srv, http_request *req, feed_job *j, char *err, size_t errlen)
{
    const nc_tokens *t = j->t;
    int rc = NC_OK;
    j->done = 0;
    j->why = WG_RUN;
    for (size_t i = 0; i < t->n && rc == NC_OK; i += WORKGUARD_SLICE) {
        if ((j->why = workguard_check(&req->guard)) != WG_RUN)
            break;
        size_t nb = t->n - i < WORKGUARD_SLICE ? t->n - i : WORKGUARD_SLICE;
        nc_tokens v = {t->ids + i, t->words + i, t->offsets + i, nb, nb, t->lens ? t->lens + i : NULL};
        uint64_t sq = 0;
        rc = j->adapt_s ? namespaces_feed_adapt(srv, j->adapt_s, &v, j->lp ? j->lp + i : NULL, &sq, err, errlen)
             : j->shares ? feed_components(srv->model, j, i, &v, err, errlen)
                         : stream_feed(j->st, &v, false, j->lp ? j->lp + i : NULL, err, errlen);
        if (sq)
            j->seq = sq;
        if (rc == NC_OK)
            j->done += nb;
    }
    return rc;
}

/* A feed request, decoded and tokenised, with the buffers of its answer. */
typedef struct {
    proto_feed_req r;
    nc_tokens t;
    double *lp;                   /* [t.n] log-probabilities ("scores") */
    float (*shares)[NC_NCOMP];    /* [t.n] components' shares ("components") */
} feed_work;

static void feed_work_free(feed_work *w)
{
    free(w->lp);
    free(w->shares);
    tokens_clear(&w->t);
}

/* The work budgets of a feed on s (locked): 0, or answers over_budget and
 * returns -1. */
static int feed_over_budget(nc_server *srv, const nc_session *s, size_t n, bool components, http_response *resp)
{
    /* every token read with the unbounded cache searches knn neighbours */
    long long neighbours = s->params.unbounded && stream_unbounded_cache(s->stream) ? (long long)n * s->params.knn : 0;
    if (neighbours > srv->cfg.max_neighbours_per_request) {
        http_reply_error(resp, API_OVER_BUDGET,
                         "%zu tokens x knn %d = %lld unbounded-cache neighbours are over max_neighbours_per_request "
                         "= %ld: feed fewer tokens at a time", n, s->params.knn, neighbours,
                         srv->cfg.max_neighbours_per_request);
        return -1;
    }
    /* components: a full-vocabulary distribution per token, the unit of
     * generation's budget */
    if (components && (long long)n > srv->cfg.max_generation_steps) {
        http_reply_error(resp, API_OVER_BUDGET,
                         "%zu tokens with components are %zu full-vocabulary distributions, over "
                         "max_generation_steps = %ld: feed fewer tokens at a time", n, n,
                         srv->cfg.max_generation_steps);
        return -1;
    }
    return 0;
}

/* The answer of a feed that took every token: consumed, position, and the
 * tokens' log-probabilities and components when asked. */
static json_t *feed_json(nc_server *srv, const feed_work *w, int64_t pos)
{
    const nc_tokens *t = &w->t;
    json_t *o = json_pack("{s:I,s:I}", "consumed", (json_int_t)t->n, "position", (json_int_t)pos);
    if (o && w->r.scores) {
        json_t *words = json_array(), *lps = json_array();
        for (size_t i = 0; i < t->n; i++) {
            json_array_append_new(words, json_string(t->words[i]));
            json_array_append_new(lps, api_logprob(w->lp[i]));
        }
        json_object_set_new(o, "tokens", words);
        json_object_set_new(o, "logprobs", lps);
    }
    api_token_info(o, srv->model, t, w->r.text, w->r.len, w->r.scores);
    if (o && w->shares) {
        json_t *comps = json_array();
        for (size_t i = 0; i < t->n; i++) {
            json_t *c = isnan(w->shares[i][0]) ? json_null() : json_object();
            for (int k = 0; json_is_object(c) && k < NC_NCOMP; k++)
                json_object_set_new(c, nc_comp_names[k], json_real(w->shares[i][k]));
            json_array_append_new(comps, c);
        }
        json_object_set_new(o, "components", comps);
    }
    return o;
}

/* Adapted pairs are durable before the answer (group commit), also those
 * of the slices fed before a stop: waits for s's writes up to seq (0: none)
 * and returns rc, or the sync's error (in err) when rc was NC_OK. */
static int feed_sync(nc_session *s, uint64_t seq, int rc, char *err, size_t errlen)
{
    if (!seq)
        return rc;
    char serr[NC_ERRLEN] = "";
    int src = namespaces_sync(s, seq, serr, sizeof serr);
    if (rc == NC_OK && src != NC_OK) {
        snprintf(err, errlen, "%s", serr);
        return src;
    }
    return rc;
}

bool api_feed_is_light(const nc_server *srv, const http_request *req)
{
    proto_feed_req r;
    api_status st;
    if (proto_decode_feed(req->json, &r, &st) != 0)
        return true;              /* refused at once (400): no model work */
    return r.len < (size_t)srv->cfg.max_predict_text_tokens && !r.adapt && !r.components;
}

void api_h_feed(nc_server *srv, http_request *req, http_response *resp)
{
    feed_work w = {0};
    api_status st;
    if (proto_decode_feed(req->json, &w.r, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    /* feed_components writes a log-probability beside each token's shares,
     * and feed_json reads them: proto_parse_feed turns "scores" on with
     * "components" */
    NC_ASSERT(!w.r.components || w.r.scores, "a feed with components but no scores from proto");
    tokens_init(&w.t);
    nc_session *s = NULL;
    if (api_tokenize(srv, w.r.text, w.r.len, false, w.r.normalize, &w.t, resp) || !(s = api_session_acquire(srv, req, resp))) {
        feed_work_free(&w);
        return;
    }
    const nc_tokens *t = &w.t;
    w.lp = w.r.scores && t->n ? malloc(t->n * sizeof *w.lp) : NULL;
    w.shares = w.r.components && t->n ? malloc(t->n * sizeof *w.shares) : NULL;
    char err[NC_ERRLEN] = "";
    int rc = (w.r.scores && t->n && (!w.lp || (w.r.components && !w.shares))) ? NC_ENOMEM : NC_OK;
    /* A session handed over while this request waited must not take the
     * tokens (they would be lost): session_moved, the balancer retries. */
    if (api_session_lock(srv, s, resp) != 0) {
        sessions_release(srv->sessions, s);
        feed_work_free(&w);
        return;
    }
    if ((w.r.adapt && api_session_namespace_check(s, true, resp) != 0) ||
        feed_over_budget(srv, s, t->n, w.shares != NULL, resp) != 0) {
        pthread_mutex_unlock(&s->lock);
        sessions_release(srv->sessions, s);
        feed_work_free(&w);
        return;
    }
    feed_job j = {.st = s->stream, .adapt_s = w.r.adapt ? s : NULL, .t = t, .lp = w.lp, .shares = w.shares};
    if (rc == NC_OK && t->n)
        rc = feed_slices(srv, req, &j, err, sizeof err);
    uint64_t seq = j.seq;
    size_t done = j.done;
    wg_stop why = j.why;
    int64_t pos = stream_position(s->stream);
    pthread_mutex_unlock(&s->lock);
    rc = feed_sync(s, seq, rc, err, sizeof err);
    /* An adapted pair is acknowledged only if its incarnation was live
     * after it was durable: a deletion that raced with the write (the
     * retired store refused it, or took it just before) is answered 410,
     * never 200 for a pair that went with the deleted namespace. */
    bool gone = w.r.adapt && namespaces_session_deleted(s);
    uint64_t inc = s->ns_ref ? namespaces_incarnation(s->ns_ref) : 0;   /* s may go with its release */
    if (gone) {
        pthread_mutex_lock(&s->lock);
        api_session_namespace_check(s, true, resp);
        pthread_mutex_unlock(&s->lock);
    }
    sessions_release(srv->sessions, s);
    if (gone) {
        /* answered */
    } else if (rc != NC_OK) {
        http_reply_error(resp, api_error_from_core(rc), "feed: %s", err);
    } else if (why != WG_RUN) {
        metrics_add_tokens_fed(done);
        http_reply_error(resp, workguard_api(why),
                         "feed stopped: %s; the first %zu of %zu tokens were fed (the session is at position %lld)",
                         workguard_reason(why, srv->cfg.request_timeout_s), done, t->n, (long long)pos);
    } else {
        metrics_add_tokens_fed(t->n);
        json_t *o = feed_json(srv, &w, pos);
        if (o && w.r.adapt && inc)   /* the incarnation the pairs went into */
            json_object_set_new(o, "namespace_incarnation", json_integer((json_int_t)inc));
        if (o && w.r.scores)
            metrics_add_tokens_scored(t->n);
        http_reply_json(resp, 200, o);
    }
    feed_work_free(&w);
}

/* The answer of a predict without components or explain: the top k of d
 * (idx) written straight into the body (proto_predict_body), "consumed"
 * when >= 0. Whether it answered (else out of memory). */
static bool predict_text_answer(nc_session *s, const nc_dist *d, const int *idx, size_t k, long long consumed,
                                http_response *resp)
{
    proto_prediction *pred = malloc((k ? k : 1) * sizeof *pred);
    if (!pred)
        return false;
    for (size_t i = 0; i < k; i++) {
        const char *word = stream_word(s->stream, idx[i]);
        pred[i] = (proto_prediction){word ? word : "", idx[i], (double)d->p[idx[i]]};
    }
    size_t len = 0;
    char *body = proto_predict_body(pred, k, (long long)d->n, (long long)stream_position(s->stream), consumed,
                                    &len);
    free(pred);
    if (!body)
        return false;
    http_reply_json(resp, 200, NULL);
    resp->text = body;
    resp->text_len = len;
    resp->content_type = "application/json";
    resp->text_tokens = consumed > 0 ? consumed : 0;
    return true;
}

/* The answer of a predict on s (locked): logits = the session's decoder
 * output when the batcher computed it, NULL to compute it here; consumed:
 * the tokens of its "text" (-1 without). */
static void predict_answer(nc_session *s, const proto_predict_req *r, const float *logits, long long consumed,
                           http_response *resp)
{
    /* a session reading a deleted incarnation's cache answers 410 */
    if (api_session_namespace_check(s, false, resp) != 0)
        return;
    nc_dist d;
    dist_init(&d);
    char err[NC_ERRLEN] = "";
    json_t *o = NULL;
    int *idx = NULL;
    int rc = logits ? stream_predict_logits(s->stream, logits, r->components, &d, err, sizeof err)
                    : stream_predict(s->stream, r->components, &d, err, sizeof err);
    if (rc == NC_OK) {
        size_t k = r->full ? d.n : (size_t)r->top_k;
        if (k > d.n) k = d.n;
        idx = malloc((k ? k : 1) * sizeof *idx);
        if (!idx) {
            rc = NC_ENOMEM;
            snprintf(err, sizeof err, "out of memory");
        }
        if (idx && !r->components && !r->explain) {
            k = api_top_k(d.p, d.n, k, idx);
            if (predict_text_answer(s, &d, idx, k, consumed, resp)) {
                metrics_add_predictions(1);
            } else {
                rc = NC_ENOMEM;
                snprintf(err, sizeof err, "out of memory");
            }
        } else if (idx) {
            k = api_top_k(d.p, d.n, k, idx);
            json_t *preds = json_array();
            for (size_t i = 0; i < k; i++) {
                int w = idx[i];
                const char *word = stream_word(s->stream, w);
                json_t *it = json_pack("{s:s,s:i,s:f}", "word", word ? word : "", "id", w, "prob",
                                       (double)d.p[w]);
                if (r->components && it) {
                    json_t *c = json_object();
                    for (int ci = 0; ci < NC_NCOMP; ci++)
                        if (d.share[ci])
                            json_object_set_new(c, nc_comp_names[ci], json_real(d.share[ci][w]));
                    json_object_set_new(it, "components", c);
                }
                json_array_append_new(preds, it);
            }
            if (r->explain && preds) {
                /* which stored text each word comes from (namespaces.h) */
                json_t *ex = namespaces_explain(s, idx, k);
                for (size_t i = 0; ex && i < k; i++)
                    json_object_set(json_array_get(preds, i), "explain", json_array_get(ex, i));
                json_decref(ex);
            }
            o = json_pack("{s:o,s:I,s:I}", "predictions", preds, "vocab_size", (json_int_t)d.n,
                          "position", (json_int_t)stream_position(s->stream));
            if (o && r->components) {
                /* the components' weights at this position (per token with the gate) */
                json_t *wt = json_object();
                for (int ci = 0; ci < NC_NCOMP; ci++)
                    json_object_set_new(wt, nc_comp_names[ci], json_real(d.weight[ci]));
                json_object_set_new(o, "weights", wt);
            }
        }
    }
    if (o && consumed >= 0)
        json_object_set_new(o, "consumed", json_integer((json_int_t)consumed));
    if (rc != NC_OK) {
        json_decref(o);
        http_reply_error(resp, api_error_from_core(rc), "predict: %s", err);
    } else if (o) {
        metrics_add_predictions(1);
        http_reply_json(resp, 200, o);
    }
    free(idx);
    dist_free(&d);
}

/* A predict handed to the batcher (batcher.h): the connection is suspended
 * until done. */
typedef struct {
    batch_job job;                /* first: the batcher's view */
    nc_server *srv;
    http_request *req;
    proto_predict_req r;
    nc_tokens t;                  /* the request's "text", fed by predict_prepare */
    http_response resp;
} predict_job;

/* A predict's "text", fed in the batch (s locked) as a feed without adapt:
 * a feed's checks (the session moved or deleted while the request waited,
 * its namespace deleted, the neighbours' budget), then stream_feed. */
static bool predict_prepare(batch_job *j)
{
    predict_job *p = (predict_job *)j;
    nc_session *s = j->s;
    nc_server *srv = p->srv;
    if (api_session_live(srv, s, &p->resp) != 0 || feed_over_budget(srv, s, p->t.n, false, &p->resp) != 0)
        return false;
    char err[NC_ERRLEN] = "";
    int rc = stream_feed(s->stream, &p->t, false, NULL, err, sizeof err);
    if (rc != NC_OK) {
        http_reply_error(&p->resp, api_error_from_core(rc), "predict's text: %s", err);
        return false;
    }
    metrics_add_tokens_fed(p->t.n);
    return true;
}

static void predict_run(batch_job *j, const float *logits)
{
    predict_job *p = (predict_job *)j;
    predict_answer(j->s, &p->r, logits, p->r.text ? (long long)p->t.n : -1, &p->resp);
}

static void predict_job_free(predict_job *p)
{
    tokens_clear(&p->t);
    free(p);
}

static void predict_done(batch_job *j)
{
    predict_job *p = (predict_job *)j;
    sessions_release(p->srv->sessions, j->s);
    http_resume(p->req, &p->resp);
    predict_job_free(p);
}

/* A predict without "text" whose logits are its session's memo (a
 * repeated predict at the same state: stream.h) has no decoder product to
 * share with a batch: answered here, on its connection's thread, when its
 * session is free, without the two thread hand-offs of the batcher (issue
 * 36: their wake-ups and context switches were a fifth of such a predict's
 * CPU). A busy session, or logits to compute, go to the batcher. The
 * answer is the batch's to the bit (the same memo, the same mixture).
 * Whether it answered. */
static bool predict_from_memo(predict_job *p)
{
    nc_session *s = p->job.s;
    if (p->r.text || pthread_mutex_trylock(&s->lock) != 0)
        return false;
    const float *logits = stream_memo_logits(s->stream);
    if (logits) {
        predict_run(&p->job, logits);
        metrics_add_predict_memo();
    }
    pthread_mutex_unlock(&s->lock);
    return logits != NULL;
}

/* POST /v1/sessions/{id}/predict: the next word's distribution, after
 * feeding "text" first when given (one request a new word). The work runs
 * in a batch (batcher.h); without a batcher, here, the same way. */
void api_h_predict(nc_server *srv, http_request *req, http_response *resp)
{
    predict_job *p = calloc(1, sizeof *p);
    if (!p) {
        http_reply_error(resp, API_INTERNAL, "out of memory");
        return;
    }
    api_status st;
    tokens_init(&p->t);
    nc_session *s = NULL;
    if (proto_decode_predict(req->json, srv->cfg.max_top_k, &p->r, &st)) {
        http_reply_status(resp, &st);
    } else if (p->r.text && api_tokenize(srv, p->r.text, p->r.len, false, p->r.normalize, &p->t, resp)) {
        /* answered */
    } else if ((long)p->t.n > srv->cfg.max_predict_text_tokens) {
        http_reply_error(resp, API_OVER_BUDGET,
                         "predict's text is %zu tokens, over max_predict_text_tokens = %d (it is fed in the "
                         "predict batch, which waits for it): feed longer text with POST /v1/sessions/{id}/feed",
                         p->t.n, srv->cfg.max_predict_text_tokens);
    } else {
        s = api_session_acquire(srv, req, resp);
    }
    if (!s) {
        predict_job_free(p);
        return;
    }
    p->job.s = s;
    p->job.prepare = p->r.text ? predict_prepare : NULL;
    p->job.run = predict_run;
    p->job.done = predict_done;
    p->srv = srv;
    p->req = req;
    p->resp.status = 500;
    if (srv->batcher && !predict_from_memo(p)) {
        http_defer(req);
        batcher_submit(srv->batcher, &p->job);
        return;
    }
    if (!srv->batcher)
        batch_job_run_alone(&p->job);
    sessions_release(srv->sessions, s);
    *resp = p->resp;
    predict_job_free(p);
}

/* A score needs a token to predict (a perplexity of nothing is no
 * number): else answers 400 invalid_text naming the empty text, -1. */
static int score_has_tokens(const proto_score_req *r, const nc_tokens *t, http_response *resp)
{
    if (t->n > (r->bos_eos ? 0u : 1u))
        return 0;
    http_reply_error(resp, API_INVALID_TEXT, "field 'text' has no tokens to score: %s",
                     t->n ? "its one token has no context to be predicted from (\"bos\": \"none\")"
                          : "it is empty, or normalisation left nothing of it (white space, punctuation)");
    return -1;
}

void api_h_score(nc_server *srv, http_request *req, http_response *resp)
{
    proto_score_req r;
    api_status st;
    if (proto_decode_score(req->json, &srv->cache_defaults, &r, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    if (api_dyneval_check(srv, &r.cache, resp))
        return;
    nc_tokens t;
    tokens_init(&t);
    if (api_tokenize(srv, r.text, r.len, r.final_eos, r.normalize, &t, resp) || score_has_tokens(&r, &t, resp)) {
        tokens_clear(&t);
        return;
    }
    char err[NC_ERRLEN] = "";
    nc_stream *s = NULL;
    double *lp = malloc(t.n * sizeof *lp);
    int rc = lp ? stream_new(srv->model, &r.cache, NULL, NULL, r.bos_eos, &s, err, sizeof err) : NC_ENOMEM;
    feed_job j = {.st = s, .t = &t, .lp = lp};
    if (rc == NC_OK && t.n)
        rc = feed_slices(srv, req, &j, err, sizeof err);
    size_t done = j.done;
    wg_stop why = j.why;
    if (rc != NC_OK) {
        http_reply_error(resp, api_error_from_core(rc), "score: %s", err);
    } else if (why != WG_RUN) {
        http_reply_error(resp, workguard_api(why), "score stopped after %zu of %zu tokens: %s", done, t.n,
                         workguard_reason(why, srv->cfg.request_timeout_s));
    } else {
        json_t *words = json_array(), *lps = json_array();
        double sum = 0;
        size_t counted = 0;
        for (size_t i = 0; i < t.n; i++) {
            json_array_append_new(words, json_string(t.words[i]));
            json_array_append_new(lps, api_logprob(lp[i]));
            if (!isnan(lp[i])) {
                sum += lp[i];
                counted++;
            }
        }
        json_t *o = json_pack("{s:o,s:o,s:f,s:I}", "tokens", words, "logprobs", lps, "logprob_sum",
                              isinf(sum) ? -1e30 : sum, "count", (json_int_t)counted);
        if (o) {
            double ppl = exp(-sum / (double)counted);
            json_object_set_new(o, "ppl", isfinite(ppl) ? json_real(ppl) : json_null());
        }
        api_token_info(o, srv->model, &t, r.text, r.len, true);
        metrics_add_tokens_scored(counted);
        http_reply_json(resp, 200, o);
    }
    stream_free(s);
    free(lp);
    tokens_clear(&t);
}
