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

#include "batcher.h"
#include "compute.h"
#include "metrics.h"
#include "namespaces.h"
#include "migrate.h"
#include "replication.h"
#include "rng.h"
#include "sessions.h"
#include "vmath.h"

/* ---- helpers ---------------------------------------------------------- */

api_error sessions_rc_api(sessions_rc rc)
{
    static const api_error map[] = {
        [SESS_OK] = API_OK, [SESS_ENOTFOUND] = API_SESSION_NOT_FOUND, [SESS_EEXIST] = API_CONFLICT,
        [SESS_ELIMIT] = API_TOO_MANY_SESSIONS, [SESS_EMEMORY] = API_MEMORY_BUDGET,
        [SESS_EINVAL] = API_OUT_OF_RANGE, [SESS_ENOMEM] = API_INTERNAL,
        [SESS_ESTORAGE] = API_STORAGE_UNAVAILABLE, [SESS_ENOSPACE] = API_STORAGE_FULL};
    return (unsigned)rc < sizeof map / sizeof map[0] ? map[rc] : API_INTERNAL;
}

api_error core_rc_api(int rc)
{
    switch (rc) {
    case NC_EINVAL: return API_OUT_OF_RANGE;
    case NC_EFORMAT: return API_INVALID_TEXT;
    case NC_ENOTFOUND: return API_NOT_FOUND;
    case NC_ESTATE: return API_CONFLICT;
    case NC_ENOSPACE: return API_STORAGE_FULL;
    /* in a request, only durable storage (the log, a snapshot) does I/O */
    case NC_EIO: return API_STORAGE_UNAVAILABLE;
    default: return API_INTERNAL;
    }
}

/* Tokenises text and enforces max_tokens_per_request; on failure answers
 * and returns -1 (t is cleared either way by the caller). */
static int tokenize_req(nc_server *srv, const char *text, size_t len, bool final_eos,
                        nc_tokens *t, http_response *resp)
{
    char err[NC_ERRLEN] = "";
    int rc = tokenize(srv->model, text, len, final_eos, t, err, sizeof err);
    if (rc != NC_OK) {
        http_reply_error(resp, rc == NC_EFORMAT ? API_INVALID_TEXT : core_rc_api(rc), "text: %s", err);
        return -1;
    }
    if ((long)t->n > srv->cfg.max_tokens_per_request) {
        http_reply_error(resp, API_TOO_MANY_TOKENS, "%zu tokens, the limit is %ld per request", t->n,
                         srv->cfg.max_tokens_per_request);
        return -1;
    }
    return 0;
}

/* A log-probability as JSON: NaN (no prediction) is null, -inf is a large
 * negative number (JSON has no infinity). */
static json_t *json_logprob(double lp)
{
    if (isnan(lp))
        return json_null();
    if (isinf(lp))
        return json_real(-1e30);
    return json_real(lp);
}

/* Indices of the k largest p, sorted by decreasing p (ties: lower id first).
 * A bounded min-heap: O(n log k). Returns the count written to out. */
static int heap_less(const float *p, int a, int b)
{
    return p[a] < p[b] || (p[a] == p[b] && a > b);
}

static void sift_down(const float *p, int *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(p, h[l], h[m])) m = l;
        if (r < n && heap_less(p, h[r], h[m])) m = r;
        if (m == i) return;
        int t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

static size_t top_k(const float *p, size_t n, size_t k, int *out)
{
    if (k > n) k = n;
    if (k == 0) return 0;
    for (size_t i = 0; i < k; i++) out[i] = (int)i;
    for (size_t i = k / 2; i-- > 0;) sift_down(p, out, k, i);
    for (size_t i = k; i < n; i++)
        if (heap_less(p, out[0], (int)i)) {
            out[0] = (int)i;
            sift_down(p, out, k, 0);
        }
    /* Heap sort: repeatedly move the minimum to the end -> descending. */
    for (size_t m = k; m > 1; m--) {
        int t = out[0]; out[0] = out[m - 1]; out[m - 1] = t;
        sift_down(p, out, m - 1, 0);
    }
    return k;
}

static const char *model_name(nc_server *srv)
{
    const char *d = srv->cfg.model;
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/') n--;
    const char *slash = NULL;
    for (size_t i = 0; i < n; i++)
        if (d[i] == '/') slash = d + i;
    static __thread char name[256];
    const char *b = slash ? slash + 1 : d;
    snprintf(name, sizeof name, "%.*s", (int)(n - (size_t)(b - d)), b);
    return name;
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
    resp->text = replication_metrics(
        namespaces_metrics(srv, metrics_render(n, bytes, atomic_load(&srv->ready), atomic_load(&srv->draining))));
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp->status = 200;
}

static void h_model(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    const nc_model_config *c = &srv->model->cfg;
    json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:b,s:b,s:s,s:s,s:I}",
                          "name", model_name(srv), "directory", srv->cfg.model,
                          "model_type", c->model_type, "vocab_size", c->vocab_size,
                          "embedding_size", c->embedding_size, "hidden_size", c->hidden_size,
                          "num_layers", c->num_layers, "tie_weights", c->tie_weights,
                          "lowercase", c->lowercase, "unk_token", c->unk_token,
                          "eos_token", c->eos_token,
                          "parameters", (json_int_t)model_num_params(srv->model));
    if (o) {
        json_object_set_new(o, "cache_defaults", proto_encode_cache(&srv->cache_defaults));
        json_object_set_new(o, "cache_knobs", proto_encode_cache_knobs());
        json_object_set_new(o, "limits",
                            json_pack("{s:I,s:I,s:i,s:i,s:i,s:i,s:I}",
                                      "max_body_bytes", (json_int_t)srv->cfg.max_body_bytes,
                                      "max_tokens_per_request", (json_int_t)srv->cfg.max_tokens_per_request,
                                      "max_top_k", srv->cfg.max_top_k,
                                      "max_completion_tokens", srv->cfg.max_completion_tokens,
                                      "max_sessions", srv->cfg.max_sessions,
                                      "session_ttl", srv->cfg.session_ttl_s,
                                      "session_memory_bytes", (json_int_t)srv->cfg.session_memory_mb << 20));
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
                              model_name(srv), "object", "model", "created", (json_int_t)0,
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
        http_reply_error(resp, sessions_rc_api(rc), "%s", err);
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
    if (tokenize_req(srv, r.text, r.len, false, &t, resp)) {
        tokens_clear(&t);
        return;
    }
    nc_session *s = acquire(srv, req, resp);
    if (!s) {
        tokens_clear(&t);
        return;
    }
    double *lp = r.scores && t.n ? malloc(t.n * sizeof *lp) : NULL;
    char err[NC_ERRLEN] = "";
    int rc = (r.scores && t.n && !lp) ? NC_ENOMEM : NC_OK;
    int64_t pos = 0;
    /* A session handed over while this request waited must not take the
     * tokens (they would be lost): session_moved, the balancer retries. */
    if (migrate_lock(srv, s, resp) != 0) {
        sessions_release(srv->sessions, s);
        free(lp);
        tokens_clear(&t);
        return;
    }
    uint64_t seq = 0;
    if (rc == NC_OK && t.n)
        rc = r.adapt ? namespaces_feed_adapt(srv, s, &t, lp, &seq, err, sizeof err)
                     : stream_feed(s->stream, &t, false, lp, err, sizeof err);
    pos = stream_position(s->stream);
    pthread_mutex_unlock(&s->lock);
    /* adapted pairs are durable before the answer (group commit) */
    if (rc == NC_OK && seq)
        rc = namespaces_sync(s, seq, err, sizeof err);
    sessions_release(srv->sessions, s);
    if (rc != NC_OK) {
        http_reply_error(resp, core_rc_api(rc), "feed: %s", err);
    } else {
        metrics_add_tokens_fed(t.n);
        json_t *o = json_pack("{s:I,s:I}", "consumed", (json_int_t)t.n, "position", (json_int_t)pos);
        if (o && r.scores) {
            json_t *words = json_array(), *lps = json_array();
            for (size_t i = 0; i < t.n; i++) {
                json_array_append_new(words, json_string(t.words[i]));
                json_array_append_new(lps, json_logprob(lp[i]));
            }
            json_object_set_new(o, "tokens", words);
            json_object_set_new(o, "logprobs", lps);
            metrics_add_tokens_scored(t.n);
        }
        http_reply_json(resp, 200, o);
    }
    free(lp);
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
            k = top_k(d.p, d.n, k, idx);
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
        http_reply_error(resp, core_rc_api(rc), "predict: %s", err);
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
    if (tokenize_req(srv, r.text, r.len, r.final_eos, &t, resp)) {
        tokens_clear(&t);
        return;
    }
    char err[NC_ERRLEN] = "";
    nc_stream *s = NULL;
    double *lp = malloc((t.n ? t.n : 1) * sizeof *lp);
    int rc = lp ? stream_new(srv->model, &r.cache, NULL, NULL, r.bos_eos, &s, err, sizeof err) : NC_ENOMEM;
    if (rc == NC_OK && t.n)
        rc = stream_feed(s, &t, false, lp, err, sizeof err);
    if (rc != NC_OK) {
        http_reply_error(resp, core_rc_api(rc), "score: %s", err);
    } else {
        json_t *words = json_array(), *lps = json_array();
        double sum = 0;
        size_t counted = 0;
        for (size_t i = 0; i < t.n; i++) {
            json_array_append_new(words, json_string(t.words[i]));
            json_array_append_new(lps, json_logprob(lp[i]));
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

/* ---- tokenizer endpoints ----------------------------------------------- */

static void h_tokenize(nc_server *srv, http_request *req, http_response *resp)
{
    static const char *const keys[] = {"prompt", "text", "final_eos", "model", "add_special_tokens", NULL};
    api_status st;
    const char *text, *text2;
    size_t len, len2;
    bool final_eos;
    if (proto_check_keys(req->json, keys, &st) ||
        proto_get_string(req->json, "prompt", false, &text, &len, &st) ||
        proto_get_string(req->json, "text", false, &text2, &len2, &st) ||
        proto_get_bool(req->json, "final_eos", false, &final_eos, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    if (!text) { text = text2; len = len2; }
    if (!text) {
        http_reply_error(resp, API_MISSING_FIELD, "field 'prompt' (or 'text') is required");
        return;
    }
    nc_tokens t;
    tokens_init(&t);
    if (tokenize_req(srv, text, len, final_eos, &t, resp) == 0) {
        json_t *ids = json_array(), *words = json_array(), *offs = json_array();
        for (size_t i = 0; i < t.n; i++) {
            json_array_append_new(ids, json_integer(t.ids[i]));
            json_array_append_new(words, json_string(t.words[i]));
            json_array_append_new(offs, json_integer((json_int_t)t.offsets[i]));
        }
        http_reply_json(resp, 200, json_pack("{s:o,s:o,s:o,s:I}", "tokens", ids, "words", words,
                                             "offsets", offs, "count", (json_int_t)t.n));
    }
    tokens_clear(&t);
}

/* Text of model ids: words separated by spaces, eos as a newline. Appends
 * to a growable buffer; offsets[i] (optional) = start of word i. */
typedef struct { char *s; size_t len, cap; } strbuf;

static int sb_add(strbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return -1;
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
    return 0;
}

/* Appends one word as detokenised text; returns the offset it starts at. */
static size_t sb_add_word(strbuf *b, const char *word, bool is_eos)
{
    if (is_eos) {
        size_t off = b->len;
        sb_add(b, "\n", 1);
        return off;
    }
    if (b->len > 0 && b->s[b->len - 1] != '\n' && b->s[b->len - 1] != ' ')
        sb_add(b, " ", 1);
    size_t off = b->len;
    sb_add(b, word, strlen(word));
    return off;
}

static void h_detokenize(nc_server *srv, http_request *req, http_response *resp)
{
    static const char *const keys[] = {"tokens", "model", NULL};
    api_status st;
    if (proto_check_keys(req->json, keys, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    json_t *toks = json_object_get(req->json, "tokens");
    if (!toks) {
        http_reply_error(resp, API_MISSING_FIELD, "field 'tokens' is required");
        return;
    }
    if (!json_is_array(toks)) {
        http_reply_error(resp, API_INVALID_TYPE, "field 'tokens' must be a list of token ids");
        return;
    }
    int V = srv->model->cfg.vocab_size;
    strbuf b = {0};
    sb_add(&b, "", 0);
    size_t i;
    json_t *v;
    json_array_foreach(toks, i, v) {
        if (!json_is_integer(v)) {
            free(b.s);
            http_reply_error(resp, API_INVALID_TYPE, "token %zu must be an integer id", i);
            return;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= V) {
            free(b.s);
            http_reply_error(resp, API_OUT_OF_RANGE, "token %zu = %lld is outside [0, %d)", i, (long long)id, V);
            return;
        }
        sb_add_word(&b, vocab_word(srv->model->vocab, (int)id), id == srv->model->eos_id);
    }
    http_reply_json(resp, 200, b.s ? json_pack("{s:s,s:s}", "prompt", b.s, "text", b.s) : NULL);
    free(b.s);
}

/* ---- OpenAI-compatible completions ------------------------------------- */

/* top_logprobs entry: {word: logprob} of the n most probable next words. */
static json_t *top_logprobs_json(nc_stream *st, const nc_dist *d, int n, int *idx)
{
    json_t *o = json_object();
    size_t k = top_k(d->p, d->n, (size_t)n, idx);
    for (size_t i = 0; i < k; i++) {
        const char *w = stream_word(st, idx[i]);
        json_object_set_new(o, w ? w : "", json_logprob(log((double)d->p[idx[i]])));
    }
    return o;
}

/* Picks the next token: greedy at temperature 0, else sampled from
 * p^(1/T) restricted to the smallest set of words whose mass reaches top_p
 * (nucleus sampling). order is scratch of d->n ints. */
static int choose(const nc_dist *d, double temperature, double top_p, nc_rng *rng, int *order)
{
    size_t n = d->n;
    if (temperature <= 0) {
        int best = 0;
        for (size_t i = 1; i < n; i++)
            if (d->p[i] > d->p[best]) best = (int)i;
        return best;
    }
    size_t k = n;
    if (top_p < 1.0) {
        k = top_k(d->p, n, n, order);
        double cum = 0;
        size_t m = 0;
        while (m < k && cum < top_p) cum += d->p[order[m++]];
        k = m ? m : 1;
    } else {
        for (size_t i = 0; i < n; i++) order[i] = (int)i;
    }
    /* Weights p^(1/T), scaled by the largest to stay finite. */
    double maxlog = -INFINITY;
    for (size_t i = 0; i < k; i++)
        if (d->p[order[i]] > 0) {
            double l = log((double)d->p[order[i]]) / temperature;
            if (l > maxlog) maxlog = l;
        }
    double total = 0;
    for (size_t i = 0; i < k; i++)
        if (d->p[order[i]] > 0) total += exp(log((double)d->p[order[i]]) / temperature - maxlog);
    double u = (double)rng_uniform(rng) * total, acc = 0;
    int last = order[0];
    for (size_t i = 0; i < k; i++) {
        if (d->p[order[i]] <= 0) continue;
        acc += exp(log((double)d->p[order[i]]) / temperature - maxlog);
        last = order[i];
        if (u < acc) break;
    }
    return last;
}

/* One choice of /v1/completions. Returns NC_OK and *choice, or an rc with
 * err (and *api for request errors). */
static int complete_one(nc_server *srv, const proto_completions_req *r, const json_t *prompt,
                        size_t index, nc_rng *rng, json_t **choice, size_t *n_prompt,
                        size_t *n_gen, api_error *api, char *err, size_t errlen)
{
    const nc_model *m = srv->model;
    nc_tokens t;
    tokens_init(&t);
    strbuf text = {0};
    sb_add(&text, "", 0);
    int rc = NC_OK;
    *api = API_INTERNAL;
    /* The prompt as tokens, and its text (the original string, or the
     * detokenised ids). */
    if (json_is_string(prompt)) {
        rc = tokenize(m, json_string_value(prompt), json_string_length(prompt), false, &t, err, errlen);
        if (rc != NC_OK) *api = API_INVALID_TEXT;
        else sb_add(&text, json_string_value(prompt), json_string_length(prompt));
    } else {
        size_t i;
        json_t *v;
        json_array_foreach(prompt, i, v) {
            int id = (int)json_integer_value(v);
            const char *w = vocab_word(m->vocab, id);
            size_t off = sb_add_word(&text, w, id == m->eos_id);
            if (rc == NC_OK) rc = tokens_push(&t, id, w, strlen(w), off);
        }
    }
    if (rc == NC_OK && (long)(t.n + (size_t)r->max_tokens) > srv->cfg.max_tokens_per_request) {
        rc = NC_EINVAL;
        *api = API_TOO_MANY_TOKENS;
        snprintf(err, errlen, "%zu prompt tokens + max_tokens %ld is over the limit of %ld", t.n,
                 r->max_tokens, srv->cfg.max_tokens_per_request);
    }
    nc_stream *st = NULL;
    if (rc == NC_OK)
        rc = stream_new(m, &srv->cache_defaults, NULL, NULL, true, &st, err, errlen);
    size_t V = (size_t)m->cfg.vocab_size;
    int *idx = malloc((V + 1024) * sizeof *idx);
    double *lp = malloc((t.n ? t.n : 1) * sizeof *lp);
    if (rc == NC_OK && (!idx || !lp)) {
        rc = NC_ENOMEM;
        snprintf(err, errlen, "out of memory");
    }
    json_t *tokens = json_array(), *token_lps = json_array(), *tops = json_array(), *offs = json_array();
    bool want_top = r->logprobs > 0;
    nc_dist d;
    dist_init(&d);
    /* The prompt: batched when no per-position top list is needed. */
    if (rc == NC_OK && t.n > 0) {
        if (r->echo && want_top) {
            nc_tokens one;
            tokens_init(&one);
            for (size_t i = 0; i < t.n && rc == NC_OK; i++) {
                rc = stream_predict(st, false, &d, err, errlen);
                if (rc == NC_OK && i > 0) {
                    int *scratch = d.n > V + 1024 ? malloc(d.n * sizeof(int)) : idx;
                    json_array_append_new(tops, scratch ? top_logprobs_json(st, &d, (int)r->logprobs, scratch) : json_null());
                    if (scratch != idx) free(scratch);
                } else if (rc == NC_OK) {
                    json_array_append_new(tops, json_null());
                }
                tokens_clear(&one);
                if (rc == NC_OK) rc = tokens_push(&one, t.ids[i], t.words[i], strlen(t.words[i]), t.offsets[i]);
                if (rc == NC_OK) rc = stream_feed(st, &one, false, &lp[i], err, errlen);
            }
            tokens_clear(&one);
        } else {
            rc = stream_feed(st, &t, false, lp, err, errlen);
            if (r->echo)
                for (size_t i = 0; i < t.n; i++) json_array_append_new(tops, json_null());
        }
        if (rc == NC_OK && r->echo)
            for (size_t i = 0; i < t.n; i++) {
                json_array_append_new(tokens, json_string(t.words[i]));
                /* OpenAI's convention: the first prompt token has no logprob. */
                json_array_append_new(token_lps, i == 0 ? json_null() : json_logprob(lp[i]));
                json_array_append_new(offs, json_integer((json_int_t)t.offsets[i]));
            }
    }
    /* Without echo the returned text holds only the completion, which
     * (OpenAI's convention) continues the prompt's string: a space first
     * when the prompt does not end in white space, and text_offset counted
     * from the start of the prompt. */
    size_t off_base = 0;
    if (rc == NC_OK && !r->echo) {
        off_base = text.len;
        bool space = text.len > 0 && !strchr(" \t\n\r", text.s[text.len - 1]);
        text.len = 0;
        text.s[0] = 0;
        if (space && r->max_tokens > 0)
            sb_add(&text, " ", 1);
    }
    /* Generation. */
    size_t gen = 0;
    nc_tokens one;
    tokens_init(&one);
    for (long j = 0; rc == NC_OK && j < r->max_tokens; j++) {
        rc = stream_predict(st, false, &d, err, errlen);
        if (rc != NC_OK) break;
        int *order = d.n > V + 1024 ? malloc(d.n * sizeof(int)) : idx;
        if (!order) { rc = NC_ENOMEM; snprintf(err, errlen, "out of memory"); break; }
        int w = choose(&d, r->temperature, r->top_p, rng, order);
        if (want_top)
            json_array_append_new(tops, top_logprobs_json(st, &d, (int)r->logprobs, order));
        else
            json_array_append_new(tops, json_null());
        if (order != idx) free(order);
        const char *word = stream_word(st, w);
        if (!word) word = m->cfg.unk_token;
        bool is_eos = w == m->eos_id;
        size_t off = sb_add_word(&text, word, is_eos);
        json_array_append_new(tokens, json_string(word));
        json_array_append_new(token_lps, json_logprob(log((double)d.p[w])));
        json_array_append_new(offs, json_integer((json_int_t)(off_base + off)));
        tokens_clear(&one);
        /* Open-vocabulary words enter the LSTM as unk, the caches by name. */
        rc = tokens_push(&one, w < (int)V ? w : m->unk_id, word, strlen(word), off);
        if (rc == NC_OK) rc = stream_feed(st, &one, false, NULL, err, errlen);
        gen++;
    }
    tokens_clear(&one);
    if (rc == NC_OK) {
        json_t *lpo = json_null();
        if (r->logprobs >= 0) {
            lpo = json_pack("{s:O,s:O,s:O,s:O}", "tokens", tokens, "token_logprobs", token_lps,
                            "top_logprobs", want_top ? tops : json_null(), "text_offset", offs);
            if (!want_top) {
                /* logprobs = 0: no alternatives, one empty object per token. */
                json_t *empty = json_array();
                for (size_t i = 0; i < json_array_size(tokens); i++)
                    json_array_append_new(empty, json_object());
                json_object_set_new(lpo, "top_logprobs", empty);
            }
        }
        *choice = json_pack("{s:s,s:I,s:o,s:s}", "text", text.s ? text.s : "", "index",
                            (json_int_t)index, "logprobs", lpo, "finish_reason", "length");
        *n_prompt = t.n;
        *n_gen = gen;
    }
    json_decref(tokens);
    json_decref(token_lps);
    json_decref(tops);
    json_decref(offs);
    dist_free(&d);
    stream_free(st);
    free(idx);
    free(lp);
    free(text.s);
    tokens_clear(&t);
    return rc;
}

static void h_completions(nc_server *srv, http_request *req, http_response *resp)
{
    proto_completions_req r;
    api_status st;
    if (proto_decode_completions(req->json, srv->model->cfg.vocab_size, srv->cfg.max_top_k,
                                 srv->cfg.max_completion_tokens, &r, &st)) {
        proto_completions_free(&r);
        http_reply_status(resp, &st);
        return;
    }
    nc_rng rng;
    uint64_t seed = (uint64_t)r.seed;
    if (!r.has_seed && getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (uint64_t)time(NULL);
    rng_seed(&rng, seed);
    json_t *choices = json_array();
    size_t tot_prompt = 0, tot_gen = 0;
    char err[NC_ERRLEN] = "";
    int rc = NC_OK;
    api_error api = API_INTERNAL;
    for (size_t i = 0; i < r.n_prompts && rc == NC_OK; i++) {
        json_t *choice = NULL;
        size_t np = 0, ng = 0;
        rc = complete_one(srv, &r, r.prompts[i], i, &rng, &choice, &np, &ng, &api, err, sizeof err);
        if (rc == NC_OK) {
            json_array_append_new(choices, choice);
            tot_prompt += np;
            tot_gen += ng;
        }
    }
    if (rc != NC_OK) {
        json_decref(choices);
        http_reply_error(resp, api == API_INTERNAL ? core_rc_api(rc) : api, "completions: %s", err);
    } else {
        unsigned char rb[12];
        char id[40] = "cmpl-";
        if (getrandom(rb, sizeof rb, 0) == (ssize_t)sizeof rb)
            for (size_t i = 0; i < sizeof rb; i++) snprintf(id + 5 + 2 * i, 3, "%02x", rb[i]);
        const char *mname = NULL;
        size_t mlen;
        if (proto_get_string(req->json, "model", false, &mname, &mlen, NULL) || !mname)
            mname = model_name(srv);
        metrics_add_tokens_scored(tot_prompt);
        metrics_add_predictions(tot_gen);
        http_reply_json(resp, 200,
                        json_pack("{s:s,s:s,s:I,s:s,s:o,s:{s:I,s:I,s:I}}", "id", id, "object",
                                  "text_completion", "created", (json_int_t)time(NULL), "model", mname,
                                  "choices", choices, "usage", "prompt_tokens", (json_int_t)tot_prompt,
                                  "completion_tokens", (json_int_t)tot_gen, "total_tokens",
                                  (json_int_t)(tot_prompt + tot_gen)));
    }
    proto_completions_free(&r);
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
static const http_route route_table[] = {
    {"GET", "/health", h_health, "health", 0},
    {"GET", "/ready", h_ready, "ready", 0},
    {"GET", "/metrics", h_metrics, "metrics", 0},
    {"GET", "/v1/model", h_model, "model", M},
    {"GET", "/v1/models", h_models, "models", M},
    {"POST", "/v1/sessions", h_session_create, "sessions_create", J | ROUTE_EMPTY_OK | M},
    {"GET", "/v1/sessions", h_session_list, "sessions_list", M},
    {"GET", "/v1/sessions/{id}", h_session_get, "sessions_get", M},
    {"DELETE", "/v1/sessions/{id}", h_session_delete, "sessions_delete", M},
    {"POST", "/v1/sessions/{id}/feed", h_feed, "feed", J | M},
    {"GET", "/v1/replication", h_replication, "replication", 0},
    {"GET", "/v1/sessions/{id}/state", migrate_h_state_get, "sessions_state_get", M},
    {"PUT", "/v1/sessions/{id}/state", migrate_h_state_put, "sessions_state_put", M},
    {"POST", "/v1/sessions/{id}/handoff", migrate_h_handoff, "sessions_handoff", M},
    {"POST", "/v1/sessions/{id}/predict", h_predict, "predict", J | ROUTE_EMPTY_OK | M},
    {"POST", "/v1/score", h_score, "score", J | M},
    {"POST", "/v1/completions", h_completions, "completions", J | M},
    {"POST", "/tokenize", h_tokenize, "tokenize", J | M},
    {"POST", "/detokenize", h_detokenize, "detokenize", J | M},
    {"GET", "/v1/namespaces", h_ns_list, "namespaces_list", M},
    {"GET", "/v1/namespaces/{ns}", h_ns_get, "namespaces_get", M},
    {"DELETE", "/v1/namespaces/{ns}", h_ns_delete, "namespaces_delete", M},
    {"GET", "/v1/namespaces/{ns}/documents", h_ns_docs_list, "documents_list", M},
    {"POST", "/v1/namespaces/{ns}/documents", h_ns_documents, "documents", ROUTE_STREAM | M},
    /* last: everything else is 404 or 405 */
    {NULL, NULL, h_unmatched, "unmatched", 0},
};
#undef J
#undef M

const http_route *handlers_routes(int *n)
{
    *n = (int)(sizeof route_table / sizeof route_table[0]);
    return route_table;
}
