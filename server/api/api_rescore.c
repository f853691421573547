/* api_rescore.c -- N-best rescoring (api_rescore.h): speech recognisers'
 * and OCR's n-best lists scored by the adapted model, each hypothesis as a
 * continuation of the same state (stream_rescore: batched, the session
 * untouched). */
#include "api_rescore.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_errors.h"
#include "apiutil.h"
#include "generate.h"
#include "metrics.h"
#include "stream.h"

typedef struct {
    proto_rescore_req r;
    nc_tokens *toks;              /* [r.n] */
    double **lp;                  /* [r.n][toks[i].n] */
    size_t total;                 /* tokens of all hypotheses */
} rescore_work;

static void work_free(rescore_work *w)
{
    for (size_t i = 0; w->toks && i < w->r.n; i++)
        tokens_clear(&w->toks[i]);
    for (size_t i = 0; w->lp && i < w->r.n; i++)
        free(w->lp[i]);
    free(w->toks);
    free(w->lp);
    proto_rescore_free(&w->r);
}

/* Tokenises the hypotheses within the token budget (extra: tokens the
 * request costs besides them). Answers and returns -1 on failure. */
static int prepare(nc_server *srv, rescore_work *w, size_t extra, http_response *resp)
{
    size_t at_least = extra;
    for (size_t i = 0; i < w->r.n; i++)
        at_least += api_tokens_at_least(w->r.hyps[i], w->r.hyp_len[i],
                                        w->r.normalize && srv->model->cfg.text.declared);
    if (api_over_token_budget(srv, at_least, resp))
        return -1;
    w->toks = calloc(w->r.n, sizeof *w->toks);
    w->lp = calloc(w->r.n, sizeof *w->lp);
    if (!w->toks || !w->lp) {
        http_reply_error(resp, API_INTERNAL, "out of memory");
        return -1;
    }
    char err[NC_ERRLEN] = "";
    w->total = extra;
    for (size_t i = 0; i < w->r.n; i++) {
        tokens_init(&w->toks[i]);
        int rc = tokenize_ex(srv->model, w->r.hyps[i], w->r.hyp_len[i], false, w->r.normalize, &w->toks[i], err,
                             sizeof err);
        if (rc != NC_OK) {
            http_reply_error(resp, rc == NC_EFORMAT ? API_INVALID_TEXT : api_error_from_core(rc), "hypothesis %zu: %s", i, err);
            return -1;
        }
        w->total += w->toks[i].n;
        w->lp[i] = malloc((w->toks[i].n ? w->toks[i].n : 1) * sizeof **w->lp);
        if (!w->lp[i]) {
            http_reply_error(resp, API_INTERNAL, "out of memory");
            return -1;
        }
    }
    return api_over_token_budget(srv, w->total, resp);
}

/* Scores every hypothesis from st, in groups of about WORKGUARD_SLICE
 * tokens with the guard checked between groups. */
static int score_all(nc_stream *st, rescore_work *w, workguard *g, wg_stop *why, char *err, size_t errlen)
{
    int rc = NC_OK;
    *why = WG_RUN;
    for (size_t i = 0; i < w->r.n && rc == NC_OK;) {
        if ((*why = workguard_check(g)) != WG_RUN)
            break;
        size_t k = i, tok = 0;
        while (k < w->r.n && (k == i || tok + w->toks[k].n <= WORKGUARD_SLICE))
            tok += w->toks[k++].n;
        rc = stream_rescore(st, w->toks + i, k - i, w->lp + i, err, errlen);
        i = k;
    }
    return rc;
}

typedef struct {
    double sum;
    size_t i;
} ranked;

static int by_score(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->sum != y->sum)
        return x->sum > y->sum ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* The answer: each hypothesis with its tokens, logprobs, sum and rank (1 =
 * the likeliest); top_k: only the k best, best first. */
static json_t *answer(const nc_server *srv, const rescore_work *w)
{
    size_t n = w->r.n;
    ranked *rk = malloc(n * sizeof *rk);
    size_t *rank = malloc(n * sizeof *rank);
    json_t *items = json_array();
    if (!rk || !rank || !items) {
        free(rk);
        free(rank);
        json_decref(items);
        return NULL;
    }
    double *sums = malloc(n * sizeof *sums);
    size_t *counts = malloc(n * sizeof *counts);
    for (size_t i = 0; sums && counts && i < n; i++) {
        double s = 0;
        size_t c = 0;
        for (size_t j = 0; j < w->toks[i].n; j++)
            if (!isnan(w->lp[i][j])) {
                s += w->lp[i][j];
                c++;
            }
        sums[i] = s;
        counts[i] = c;
        rk[i] = (ranked){isinf(s) ? -1e30 : s, i};
    }
    qsort(rk, n, sizeof *rk, by_score);
    for (size_t r = 0; r < n; r++)
        rank[rk[r].i] = r + 1;
    size_t shown = w->r.top_k > 0 ? (size_t)w->r.top_k : n;
    for (size_t k = 0; sums && counts && k < shown; k++) {
        size_t i = w->r.top_k > 0 ? rk[k].i : k;
        json_t *words = json_array(), *lps = json_array();
        for (size_t j = 0; j < w->toks[i].n; j++) {
            json_array_append_new(words, json_string(w->toks[i].words[j]));
            json_array_append_new(lps, api_logprob(w->lp[i][j]));
        }
        json_t *it = json_pack("{s:I,s:s%,s:o,s:o,s:f,s:I,s:I}", "index", (json_int_t)i, "text", w->r.hyps[i],
                               w->r.hyp_len[i], "tokens", words, "logprobs", lps, "logprob_sum",
                               isinf(sums[i]) ? -1e30 : sums[i], "count", (json_int_t)counts[i], "rank",
                               (json_int_t)rank[i]);
        /* unknown words, offsets into the hypothesis */
        api_token_info(it, srv->model, &w->toks[i], w->r.hyps[i], w->r.hyp_len[i], true);
        json_array_append_new(items, it);
    }
    free(sums);
    free(counts);
    free(rk);
    free(rank);
    return json_pack("{s:o}", "hypotheses", items);
}

/* The answer of both routes: the failure, the stop, or the ranked
 * hypotheses (with the session's position when pos >= 0). */
static void reply(nc_server *srv, const rescore_work *w, int rc, wg_stop why, const char *err, int64_t pos,
                  http_response *resp)
{
    if (rc != NC_OK) {
        http_reply_error(resp, api_error_from_core(rc), "rescore: %s", err);
    } else if (why != WG_RUN) {
        http_reply_error(resp, workguard_api(why), "rescore stopped: %s",
                         workguard_reason(why, srv->cfg.request_timeout_s));
    } else {
        metrics_add_tokens_scored(w->total);
        json_t *o = answer(srv, w);
        if (o && pos >= 0)
            json_object_set_new(o, "position", json_integer((json_int_t)pos));
        http_reply_json(resp, 200, o);
    }
}

void api_h_rescore_session(nc_server *srv, http_request *req, http_response *resp)
{
    rescore_work w = {0};
    api_status st;
    if (proto_decode_rescore(req->json, false, NULL, RESCORE_MAX_HYPOTHESES, &w.r, &st)) {
        http_reply_status(resp, &st);
        work_free(&w);
        return;
    }
    if (prepare(srv, &w, 0, resp)) {
        work_free(&w);
        return;
    }
    nc_session *s = api_session_acquire(srv, req, resp);
    if (!s) {
        work_free(&w);
        return;
    }
    /* every token read with the unbounded cache searches knn neighbours */
    long long nb = s->params.unbounded ? (long long)w.total * s->params.knn : 0;
    if (nb > srv->cfg.max_neighbours_per_request) {
        http_reply_error(resp, API_OVER_BUDGET,
                         "%zu tokens x knn %d = %lld unbounded-cache neighbours are over max_neighbours_per_request "
                         "= %ld: rescore fewer hypotheses at a time", w.total, s->params.knn, nb,
                         srv->cfg.max_neighbours_per_request);
        sessions_release(srv->sessions, s);
        work_free(&w);
        return;
    }
    if (api_session_lock(srv, s, resp) != 0) {
        sessions_release(srv->sessions, s);
        work_free(&w);
        return;
    }
    char err[NC_ERRLEN] = "";
    wg_stop why;
    int rc = score_all(s->stream, &w, &req->guard, &why, err, sizeof err);
    int64_t pos = stream_position(s->stream);
    pthread_mutex_unlock(&s->lock);
    sessions_release(srv->sessions, s);
    reply(srv, &w, rc, why, err, pos, resp);
    work_free(&w);
}

void api_h_rescore(nc_server *srv, http_request *req, http_response *resp)
{
    rescore_work w = {0};
    api_status st;
    if (proto_decode_rescore(req->json, true, &srv->cache_defaults, RESCORE_MAX_HYPOTHESES, &w.r, &st)) {
        http_reply_status(resp, &st);
        work_free(&w);
        return;
    }
    if (api_dyneval_check(srv, &w.r.cache, resp)) {
        work_free(&w);
        return;
    }
    nc_tokens ctx;
    tokens_init(&ctx);
    if (api_tokenize(srv, w.r.context, w.r.context_len, false, w.r.normalize, &ctx, resp) || prepare(srv, &w, ctx.n, resp)) {
        tokens_clear(&ctx);
        work_free(&w);
        return;
    }
    char err[NC_ERRLEN] = "";
    nc_stream *s = NULL;
    wg_stop why = WG_RUN;
    int rc = stream_new(srv->model, &w.r.cache, NULL, NULL, w.r.bos_eos, &s, err, sizeof err);
    if (rc == NC_OK && ctx.n)
        rc = gen_feed(s, &req->guard, &ctx, NULL, &why, err, sizeof err);
    if (rc == NC_OK && why == WG_RUN)
        rc = score_all(s, &w, &req->guard, &why, err, sizeof err);
    reply(srv, &w, rc, why, err, -1, resp);
    stream_free(s);
    tokens_clear(&ctx);
    work_free(&w);
}
