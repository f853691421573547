/* handlers.c -- the HTTP API: the route table and one handler per endpoint.
 * Every handler validates its request through proto/, works on the core's
 * per-stream predictor (core/stream.h) and answers JSON. Sessions are held
 * (sessions_acquire) and locked for the duration of the work, so requests on
 * one session are serialised while different sessions run in parallel. */
#include "handlers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api_completions.h"
#include "api_errors.h"
#include "api_generate.h"
#include "api_rescore.h"
#include "apiutil.h"
#include "batcher.h"
#include "compute.h"
#include "metrics.h"
#include "namespaces.h"
#include "migrate.h"
#include "replication.h"
#include "rng.h"
#include "sessions.h"
#include "vmath.h"
#include "web.h"
#include "workguard.h"

/* ---- helpers ---------------------------------------------------------- */

/* ---- work budgets (config [limits]) -------------------------------------
 * Each is checked before the work starts, in the unit that costs: LSTM
 * steps (max_tokens_per_request), full-vocabulary distributions
 * (max_generation_steps), unbounded-cache neighbours
 * (max_neighbours_per_request). */

/* Feeds t into s (adapting the session's namespace when adapt_s) in slices
 * of WORKGUARD_SLICE tokens, checking the request's guard between slices.
 * *done = tokens fed; *why = why it stopped early (WG_RUN: it did not);
 * *seq = the last log record of the adapted pairs. Each slice is all or
 * nothing; the slices before a stop stay fed (the stream's results do not
 * depend on how the tokens are split, stream.h). */
static int feed_components(nc_stream *st, const nc_model *m, const nc_tokens *t, double *lp,
                           float (*shares)[NC_NCOMP], char *err, size_t errlen);

static int feed_slices(nc_server *srv, http_request *req, nc_stream *st, nc_session *adapt_s,
                       const nc_tokens *t, double *lp, float (*shares)[NC_NCOMP], size_t *done, wg_stop *why,
                       uint64_t *seq, char *err, size_t errlen)
{
    int rc = NC_OK;
    *done = 0;
    *why = WG_RUN;
    for (size_t i = 0; i < t->n && rc == NC_OK; i += WORKGUARD_SLICE) {
        if ((*why = workguard_check(&req->guard)) != WG_RUN)
            break;
        size_t nb = t->n - i < WORKGUARD_SLICE ? t->n - i : WORKGUARD_SLICE;
        nc_tokens v = {t->ids + i, t->words + i, t->offsets + i, nb, nb};
        uint64_t sq = 0;
        rc = adapt_s ? namespaces_feed_adapt(srv, adapt_s, &v, lp ? lp + i : NULL, &sq, err, errlen)
             : shares ? feed_components(st, srv->model, &v, lp + i, shares + i, err, errlen)
                      : stream_feed(st, &v, false, lp ? lp + i : NULL, err, errlen);
        if (sq)
            *seq = sq;
        if (rc == NC_OK)
            *done += nb;
    }
    return rc;
}

/* ---- health, readiness, metrics, model -------------------------------- */

static void h_health(nc_server *srv, http_request *req, http_response *resp)
{
    (void)srv, (void)req;
    http_reply_json(resp, 200, json_pack("{s:s}", "status", "ok"));
}

static void h_ready(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    if (atomic_load(&srv->draining))
        http_reply_error(resp, API_NOT_READY, "draining: the server is shutting down");
    else if (!atomic_load(&srv->ready))
        http_reply_error(resp, API_NOT_READY, "loading the model and recovering namespaces");
    else
        http_reply_json(resp, 200, json_pack("{s:s}", "status", "ready"));
}

static void h_metrics(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    long n = 0;
    size_t bytes = 0;
    if (srv->sessions)
        sessions_stats(srv->sessions, &n, &bytes);
    resp->text = workpool_metrics(srv->pool, replication_metrics(namespaces_metrics(
        srv, metrics_render(n, bytes, atomic_load(&srv->ready), atomic_load(&srv->draining)))));
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp->status = 200;
}

static void h_model(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    const nc_model_config *c = &srv->model->cfg;
    json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:b,s:b,s:s,s:s,s:I}",
                          "name", api_model_name(srv), "directory", srv->cfg.model,
                          "model_type", c->model_type, "vocab_size", c->vocab_size,
                          "embedding_size", c->embedding_size, "hidden_size", c->hidden_size,
                          "num_layers", c->num_layers, "tie_weights", c->tie_weights,
                          "lowercase", c->lowercase, "unk_token", c->unk_token,
                          "eos_token", c->eos_token,
                          "parameters", (json_int_t)model_num_params(srv->model));
    if (o) {
        json_object_set_new(o, "cache_defaults", proto_encode_cache(&srv->cache_defaults));
        json_object_set_new(o, "cache_knobs", proto_encode_cache_knobs());
        /* every option of the [limits] section, by its name (config.c's
         * table is where each is defined), then the sessions' */
        json_t *lim = json_object();
        for (const config_option *co = config_options(); lim && co->name; co++) {
            long long v;
            if (!strcmp(co->section, "limits") && config_get_integer(&srv->cfg, co, &v) == 0)
                json_object_set_new(lim, co->name, json_integer((json_int_t)v));
        }
        if (lim) {
            json_object_set_new(lim, "max_sessions", json_integer(srv->cfg.max_sessions));
            json_object_set_new(lim, "session_ttl", json_integer(srv->cfg.session_ttl_s));
            json_object_set_new(lim, "session_memory_bytes", json_integer((json_int_t)srv->cfg.session_memory_mb << 20));
            json_object_set_new(lim, "threads", json_integer(srv->cfg.threads));
        }
        json_object_set_new(o, "limits", lim);
        json_object_set_new(o, "compute",
                            json_pack("{s:s,s:s,s:s,s:s}", "version", NC_VERSION, "simd", vm_isa(),
                                      "simd_supported", vm_isa_supported(), "blas", nc_blas_core()));
    }
    http_reply_json(resp, 200, o);
}

static void h_models(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    http_reply_json(resp, 200,
                    json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id",
                              api_model_name(srv), "object", "model", "created", (json_int_t)0,
                              "owned_by", "neurocache"));
}

/* ---- sessions ---------------------------------------------------------- */

static json_t *session_json(nc_session *s, bool locked_stream)
{
    json_t *o = json_pack("{s:s,s:s?}", "id", s->id, "namespace", s->ns[0] ? s->ns : NULL);
    if (!o)
        return NULL;
    json_object_set_new(o, "cache", proto_encode_cache(&s->params));
    if (locked_stream) {
        json_object_set_new(o, "tokens", json_integer((json_int_t)stream_position(s->stream)));
        json_object_set_new(o, "memory_bytes", json_integer((json_int_t)stream_memory(s->stream)));
    }
    json_object_set_new(o, "reserved_bytes", json_integer((json_int_t)s->reserved));
    json_object_set_new(o, "created", json_real(s->created));
    return o;
}

static void h_session_create(nc_server *srv, http_request *req, http_response *resp)
{
    proto_session_req r;
    api_status st;
    if (proto_decode_session(req->json, &srv->cache_defaults, &r, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    nc_session *s;
    char err[NC_ERRLEN] = "";
    sessions_rc rc = sessions_create(srv->sessions, r.id, r.ns, &r.cache, &s, err, sizeof err);
    if (rc != SESS_OK) {
        http_reply_error(resp, api_error_from_sessions(rc), "%s", err);
        return;
    }
    pthread_mutex_lock(&s->lock);
    http_reply_json(resp, 201, session_json(s, true));
    pthread_mutex_unlock(&s->lock);
    sessions_release(srv->sessions, s);
}

/* The session of the path, pulled from the peers if it is not here;
 * answers session_not_here / session_not_found otherwise (migrate.h). */
static nc_session *acquire(nc_server *srv, http_request *req, http_response *resp)
{
    return migrate_acquire(srv, req, resp);
}

static void h_session_get(nc_server *srv, http_request *req, http_response *resp)
{
    nc_session *s = acquire(srv, req, resp);
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    json_t *o = session_json(s, true);
    pthread_mutex_unlock(&s->lock);
    if (o)
        json_object_set_new(o, "idle_ttl", json_integer(srv->cfg.session_ttl_s));
    http_reply_json(resp, 200, o);
    sessions_release(srv->sessions, s);
}

static void h_session_list(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    long n = 0;
    size_t bytes = 0;
    sessions_stats(srv->sessions, &n, &bytes);
    http_reply_json(resp, 200, json_pack("{s:i,s:I,s:i,s:I}", "count", (int)n, "reserved_bytes",
                                         (json_int_t)bytes, "max_sessions", srv->cfg.max_sessions,
                                         "memory_budget_bytes",
                                         (json_int_t)srv->cfg.session_memory_mb << 20));
}

static void h_session_delete(nc_server *srv, http_request *req, http_response *resp)
{
    if (sessions_delete(srv->sessions, req->params[0]) != SESS_OK) {
        http_reply_error(resp, API_SESSION_NOT_FOUND, "no session '%s'", req->params[0]);
        return;
    }
    resp->status = 204;
}

/* Feed with "components": token by token, the full distribution with each
 * component's share (stream_predict) read at the token, then the token fed
 * (stream_feed, which gives its logprob through the target-only path; the
 * two paths agree, design §4). shares[i][c] is NAN where there is no
 * prediction (no h yet) or the word has no id yet (a new open-vocabulary
 * word: only the uniform term gives it mass). One full softmax per token,
 * as predict: for the page's surprisal map, not for bulk scoring. Unlike
 * stream_feed, a failure midway (out of memory) leaves the tokens before it
 * fed. */
static int feed_components(nc_stream *st, const nc_model *m, const nc_tokens *t, double *lp,
                           float (*shares)[NC_NCOMP], char *err, size_t errlen)
{
    nc_dist d;
    dist_init(&d);
    nc_tokens one;
    tokens_init(&one);
    int rc = NC_OK;
    for (size_t i = 0; i < t->n && rc == NC_OK; i++) {
        /* an out-of-vocabulary word is the cache's own id with open
         * vocabulary (-1 while the word is new), else unk_token */
        int id = t->ids[i];
        if (id == m->unk_id && t->words[i] && stream_params(st)->open_vocab)
            id = stream_word_id(st, t->words[i], strlen(t->words[i]));
        for (int c = 0; c < NC_NCOMP; c++)
            shares[i][c] = NAN;
        if (stream_has_h(st)) {
            rc = stream_predict(st, true, &d, err, errlen);
            for (int c = 0; rc == NC_OK && id >= 0 && c < NC_NCOMP && (size_t)id < d.n; c++)
                shares[i][c] = d.share[c][id];
        }
        tokens_clear(&one);
        if (rc == NC_OK)
            rc = tokens_push(&one, t->ids[i], t->words[i], strlen(t->words[i]), t->offsets[i]);
        if (rc == NC_OK)
            rc = stream_feed(st, &one, false, &lp[i], err, errlen);
    }
    tokens_clear(&one);
    dist_free(&d);
    return rc;
}

static void h_feed(nc_server *srv, http_request *req, http_response *resp)
{
    proto_feed_req r;
    api_status st;
    if (proto_decode_feed(req->json, &r, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    nc_tokens t;
    tokens_init(&t);
    if (api_tokenize(srv, r.text, r.len, false, &t, resp)) {
        tokens_clear(&t);
        return;
    }
    nc_session *s = acquire(srv, req, resp);
    if (!s) {
        tokens_clear(&t);
        return;
    }
    double *lp = r.scores && t.n ? malloc(t.n * sizeof *lp) : NULL;
    float (*shares)[NC_NCOMP] = r.components && t.n ? malloc(t.n * sizeof *shares) : NULL;
    char err[NC_ERRLEN] = "";
    int rc = (r.scores && t.n && (!lp || (r.components && !shares))) ? NC_ENOMEM : NC_OK;
    int64_t pos = 0;
    /* A session handed over while this request waited must not take the
     * tokens (they would be lost): session_moved, the balancer retries. */
    if (migrate_lock(srv, s, resp) != 0) {
        sessions_release(srv->sessions, s);
        free(lp);
        free(shares);
        tokens_clear(&t);
        return;
    }
    /* every token read with the unbounded cache searches knn neighbours */
    long long neighbours = s->params.unbounded && stream_unbounded_cache(s->stream) ? (long long)t.n * s->params.knn : 0;
    if (neighbours > srv->cfg.max_neighbours_per_request) {
        pthread_mutex_unlock(&s->lock);
        sessions_release(srv->sessions, s);
        http_reply_error(resp, API_OVER_BUDGET,
                         "%zu tokens x knn %d = %lld unbounded-cache neighbours are over max_neighbours_per_request "
                         "= %ld: feed fewer tokens at a time", t.n, s->params.knn, neighbours,
                         srv->cfg.max_neighbours_per_request);
        free(lp);
        free(shares);
        tokens_clear(&t);
        return;
    }
    /* components: a full-vocabulary distribution per token, the unit of
     * generation's budget */
    if (shares && (long long)t.n > srv->cfg.max_generation_steps) {
        pthread_mutex_unlock(&s->lock);
        sessions_release(srv->sessions, s);
        http_reply_error(resp, API_OVER_BUDGET,
                         "%zu tokens with components are %zu full-vocabulary distributions, over "
                         "max_generation_steps = %ld: feed fewer tokens at a time", t.n, t.n,
                         srv->cfg.max_generation_steps);
        free(lp);
        free(shares);
        tokens_clear(&t);
        return;
    }
    uint64_t seq = 0;
    size_t done = 0;
    wg_stop why = WG_RUN;
    if (rc == NC_OK && t.n)
        rc = feed_slices(srv, req, s->stream, r.adapt ? s : NULL, &t, lp, shares, &done, &why, &seq, err,
                         sizeof err);
    pos = stream_position(s->stream);
    pthread_mutex_unlock(&s->lock);
    /* adapted pairs are durable before the answer (group commit), also
     * those of the slices fed before a stop */
    if (seq) {
        char serr[NC_ERRLEN] = "";
        int src = namespaces_sync(s, seq, serr, sizeof serr);
        if (rc == NC_OK && src != NC_OK) {
            rc = src;
            snprintf(err, sizeof err, "%s", serr);
        }
    }
    sessions_release(srv->sessions, s);
    if (rc != NC_OK) {
        http_reply_error(resp, api_error_from_core(rc), "feed: %s", err);
    } else if (why != WG_RUN) {
        metrics_add_tokens_fed(done);
        http_reply_error(resp, workguard_api(why),
                         "feed stopped: %s; the first %zu of %zu tokens were fed (the session is at position %lld)",
                         workguard_reason(why, srv->cfg.request_timeout_s), done, t.n, (long long)pos);
    } else {
        metrics_add_tokens_fed(t.n);
        json_t *o = json_pack("{s:I,s:I}", "consumed", (json_int_t)t.n, "position", (json_int_t)pos);
        if (o && r.scores) {
            json_t *words = json_array(), *lps = json_array();
            for (size_t i = 0; i < t.n; i++) {
                json_array_append_new(words, json_string(t.words[i]));
                json_array_append_new(lps, api_logprob(lp[i]));
            }
            json_object_set_new(o, "tokens", words);
            json_object_set_new(o, "logprobs", lps);
            metrics_add_tokens_scored(t.n);
        }
        if (o && shares) {
            json_t *comps = json_array();
            for (size_t i = 0; i < t.n; i++) {
                json_t *c = isnan(shares[i][0]) ? json_null() : json_object();
                for (int k = 0; json_is_object(c) && k < NC_NCOMP; k++)
                    json_object_set_new(c, nc_comp_names[k], json_real(shares[i][k]));
                json_array_append_new(comps, c);
            }
            json_object_set_new(o, "components", comps);
        }
        http_reply_json(resp, 200, o);
    }
    free(lp);
    free(shares);
    tokens_clear(&t);
}

/* The answer of a predict on s (locked): logits = the session's decoder
 * output when the batcher computed it, NULL to compute it here. */
static void predict_answer(nc_session *s, const proto_predict_req *r, const float *logits,
                           http_response *resp)
{
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
        if (idx) {
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
    if (rc != NC_OK) {
        json_decref(o);
        http_reply_error(resp, api_error_from_core(rc), "predict: %s", err);
    } else {
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
    http_response resp;
} predict_job;

static void predict_run(batch_job *j, const float *logits)
{
    predict_job *p = (predict_job *)j;
    predict_answer(j->s, &p->r, logits, &p->resp);
}

static void predict_done(batch_job *j)
{
    predict_job *p = (predict_job *)j;
    sessions_release(p->srv->sessions, j->s);
    http_resume(p->req, &p->resp);
    free(p);
}

static void h_predict(nc_server *srv, http_request *req, http_response *resp)
{
    proto_predict_req r;
    api_status st;
    if (proto_decode_predict(req->json, srv->cfg.max_top_k, &r, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    nc_session *s = acquire(srv, req, resp);
    if (!s)
        return;
    predict_job *p = srv->batcher ? calloc(1, sizeof *p) : NULL;
    if (p) {
        p->job.s = s;
        p->job.run = predict_run;
        p->job.done = predict_done;
        p->srv = srv;
        p->req = req;
        p->r = r;
        http_defer(req);
        batcher_submit(srv->batcher, &p->job);
        return;
    }
    pthread_mutex_lock(&s->lock);
    predict_answer(s, &r, NULL, resp);
    pthread_mutex_unlock(&s->lock);
    sessions_release(srv->sessions, s);
}

/* ---- stateless scoring ------------------------------------------------- */

static void h_score(nc_server *srv, http_request *req, http_response *resp)
{
    proto_score_req r;
    api_status st;
    if (proto_decode_score(req->json, &srv->cache_defaults, &r, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    nc_tokens t;
    tokens_init(&t);
    if (api_tokenize(srv, r.text, r.len, r.final_eos, &t, resp)) {
        tokens_clear(&t);
        return;
    }
    char err[NC_ERRLEN] = "";
    nc_stream *s = NULL;
    double *lp = malloc((t.n ? t.n : 1) * sizeof *lp);
    int rc = lp ? stream_new(srv->model, &r.cache, NULL, NULL, r.bos_eos, &s, err, sizeof err) : NC_ENOMEM;
    size_t done = 0;
    wg_stop why = WG_RUN;
    uint64_t seq = 0;
    if (rc == NC_OK && t.n)
        rc = feed_slices(srv, req, s, NULL, &t, lp, NULL, &done, &why, &seq, err, sizeof err);
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
            double ppl = counted ? exp(-sum / (double)counted) : 1.0;
            json_object_set_new(o, "ppl", isfinite(ppl) ? json_real(ppl) : json_null());
        }
        metrics_add_tokens_scored(counted);
        http_reply_json(resp, 200, o);
    }
    stream_free(s);
    free(lp);
    tokens_clear(&t);
}

/* ---- the route table ---------------------------------------------------- */

/* The last row: 405 with the methods the path allows, else 404. */
static void h_unmatched(nc_server *srv, http_request *req, http_response *resp)
{
    (void)srv;
    if (req->allow[0])
        http_reply_error(resp, API_METHOD_NOT_ALLOWED, "method %s is not allowed on %s (allowed: %s)",
                         req->method, req->url, req->allow);
    else
        http_reply_error(resp, API_NOT_FOUND, "no route for %s %s", req->method, req->url);
}


#define J ROUTE_JSON
#define M ROUTE_NEEDS_MODEL
#define H ROUTE_HEAVY
static const http_route route_table[] = {
    {"GET", "/health", h_health, "health", 0},
    {"GET", "/ready", h_ready, "ready", 0},
    {"GET", "/metrics", h_metrics, "metrics", 0},
    /* the page (web.h): static files only, no key needed, nothing served but them */
    {"GET", "/", web_h_page, "web_page", 0},
    {"GET", "/web/{file}", web_h_page, "web_asset", 0},
    {"GET", "/v1/model", h_model, "model", M},
    {"GET", "/v1/models", h_models, "models", M},
    {"POST", "/v1/sessions", h_session_create, "sessions_create", J | ROUTE_EMPTY_OK | M},
    {"GET", "/v1/sessions", h_session_list, "sessions_list", M},
    {"GET", "/v1/sessions/{id}", h_session_get, "sessions_get", M},
    {"DELETE", "/v1/sessions/{id}", h_session_delete, "sessions_delete", M},
    {"POST", "/v1/sessions/{id}/feed", h_feed, "feed", J | M | H},
    {"GET", "/v1/replication", h_replication, "replication", 0},
    {"GET", "/v1/sessions/{id}/state", migrate_h_state_get, "sessions_state_get", M},
    {"PUT", "/v1/sessions/{id}/state", migrate_h_state_put, "sessions_state_put", M},
    {"POST", "/v1/sessions/{id}/handoff", migrate_h_handoff, "sessions_handoff", M},
    {"POST", "/v1/sessions/{id}/predict", h_predict, "predict", J | ROUTE_EMPTY_OK | M},
    {"POST", "/v1/score", h_score, "score", J | M | H},
    {"POST", "/v1/sessions/{id}/generate", api_h_generate, "generate", J | M | H},
    {"POST", "/v1/sessions/{id}/rescore", api_h_rescore_session, "rescore_session", J | M | H},
    {"POST", "/v1/rescore", api_h_rescore, "rescore", J | M | H},
    {"POST", "/v1/completions", api_h_completions, "completions", J | M | H},
    {"POST", "/tokenize", api_h_tokenize, "tokenize", J | M},
    {"POST", "/detokenize", api_h_detokenize, "detokenize", J | M},
    {"GET", "/tokenizer_info", api_h_tokenizer_info, "tokenizer_info", M},
    {"GET", "/v1/namespaces", h_ns_list, "namespaces_list", M},
    {"GET", "/v1/namespaces/{ns}", h_ns_get, "namespaces_get", M},
    {"DELETE", "/v1/namespaces/{ns}", h_ns_delete, "namespaces_delete", M},
    {"GET", "/v1/namespaces/{ns}/documents", h_ns_docs_list, "documents_list", M},
    {"POST", "/v1/namespaces/{ns}/documents", h_ns_documents, "documents", ROUTE_STREAM | M | H},
    /* last: everything else is 404 or 405 */
    {NULL, NULL, h_unmatched, "unmatched", 0},
};
#undef J
#undef M
#undef H

const http_route *handlers_routes(int *n)
{
    *n = (int)(sizeof route_table / sizeof route_table[0]);
    return route_table;
}
