/* api_generate.c -- POST /v1/sessions/{id}/generate (api_generate.h).
 *
 * How far the session advances: by the words delivered, no more. The words
 * are drawn on a copy of the session's stream (its LSTM state and caches),
 * so drawing changes nothing; afterwards the words delivered are fed to the
 * session as a feed of their text would feed them (local caches, no
 * namespace adaptation). Delivered means: in a whole answer, every word of
 * it (fed before the answer is sent); in a stream, the words of every event
 * the server wrote to the connection before the stream ended or the client
 * went away -- a word drawn but held back (a stop sequence might still
 * begin in it) or still queued is not delivered, and a word cut by a stop
 * sequence never is. The last event reports the session's position after
 * that. "advance": false leaves the session as it was. */
#include "api_generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_errors.h"
#include "apiutil.h"
#include "generate.h"
#include "metrics.h"
#include "sse.h"

typedef struct {
    nc_server *srv;
    nc_session *s;                /* held (sessions_acquire) */
    json_t *body;
    proto_generate_req r;
    gen_params gp;
    nc_rng rng;
    sse_stream *sse;              /* streamed: events go here */
    /* words handed out, in order, and how many each event held */
    nc_tokens words;
    size_t *per_event;
    size_t nevents, cap_events;
    strbuf text;                  /* whole: the text */
    json_t *lps, *tops;           /* whole: per word */
} gen_job;

static void job_free(void *arg)
{
    gen_job *j = arg;
    if (!j)
        return;
    if (j->s)
        sessions_release(j->srv->sessions, j->s);
    json_decref(j->body);
    tokens_clear(&j->words);
    free(j->per_event);
    free(j->text.s);
    json_decref(j->lps);
    json_decref(j->tops);
    free(j);
}

/* Hands out the words ready (gen_text_ready) as one event (or, whole, into
 * the answer). Returns 0, or -1 when the client is gone. */
static int send_ready(gen_job *j, gen_text *gt, bool final)
{
    size_t end;
    size_t n = gen_text_ready(gt, &j->gp, final, &end);
    if (n == 0 && end == gt->sent)
        return 0;
    const int V = j->srv->model->cfg.vocab_size;
    json_t *ws = json_array(), *lps = json_array(), *tops = j->gp.logprobs > 0 ? json_array() : NULL;
    int rc = NC_OK;
    for (size_t i = 0; i < n; i++) {
        gen_word *w = &gt->pend[i];
        json_array_append_new(ws, json_string(w->word));
        json_array_append_new(lps, api_logprob(w->logprob));
        if (tops)
            json_array_append_new(tops, w->top ? w->top : json_object());
        else
            json_decref(w->top);
        w->top = NULL;
        /* as feed would take the word: an open-vocabulary word enters the
         * LSTM as unk, the caches by name */
        if (rc == NC_OK)
            rc = tokens_push(&j->words, w->id < V ? w->id : j->srv->model->unk_id, w->word, strlen(w->word), 0);
    }
    const char *t = gt->text.s + gt->sent;
    size_t len = end - gt->sent;
    gen_text_consume(gt, n, end);
    if (j->nevents == j->cap_events) {
        size_t cap = j->cap_events ? 2 * j->cap_events : 64;
        size_t *np = realloc(j->per_event, cap * sizeof *np);
        if (np) {
            j->per_event = np;
            j->cap_events = cap;
        }
    }
    if (j->nevents < j->cap_events)
        j->per_event[j->nevents++] = n;
    if (j->sse)
        return sse_event(j->sse, json_pack("{s:s%,s:o,s:o,s:o*}", "text", t, len, "words", ws, "logprobs", lps,
                                           "top_logprobs", tops));
    sb_add(&j->text, t, len);
    json_array_extend(j->lps, lps);
    if (tops)
        json_array_extend(j->tops, tops);
    json_decref(ws);
    json_decref(lps);
    json_decref(tops);
    return 0;
}

/* How a generation went: rc/err a failure, why a stop of the guard, gone
 * the stream's client left; drawn the tokens drawn, delivered the words
 * the client got, pos the session's position after it, finish the reason. */
typedef struct {
    int rc;
    char err[NC_ERRLEN];
    wg_stop why;
    bool gone;
    size_t drawn, delivered;
    int64_t pos;
    const char *finish;
} gen_outcome;

/* Draws up to max_tokens words from the session's copy, handing out the
 * pieces as they are ready, then the last. */
static void generate_words(gen_job *j, workguard *g, nc_stream *copy, gen_text *gt, gen_outcome *o)
{
    gen_state gs;
    gen_init(&gs, copy, j->srv->model, &j->gp, &j->rng);
    for (long k = 0; o->rc == NC_OK && !o->gone && !gt->stopped && k < j->r.max_tokens; k++) {
        if ((o->why = workguard_check(g)) != WG_RUN)
            break;
        gen_token tk;
        o->rc = gen_next(&gs, &tk, o->err, sizeof o->err);
        if (o->rc == NC_OK) {
            o->drawn++;
            o->rc = gen_text_add(gt, &tk, &j->gp);
        }
        if (o->rc == NC_OK && !gt->stopped && send_ready(j, gt, false) != 0)
            o->gone = true;
    }
    gen_free(&gs);
    if (o->rc == NC_OK && o->why == WG_RUN && !o->gone && send_ready(j, gt, true) != 0)
        o->gone = true;
}

/* The words delivered: all of a whole answer's; a stream's up to the last
 * event written to the connection. */
static size_t words_delivered(gen_job *j)
{
    size_t delivered = j->words.n;
    if (j->sse) {
        size_t handed = sse_flush(j->sse), w = 0;
        for (size_t e = 0; e < handed && e < j->nevents; e++)
            w += j->per_event[e];
        delivered = w < delivered ? w : delivered;
    }
    return delivered;
}

/* The answer: the stream's last events, or the whole JSON (an error
 * telling where the session stands). */
static void generate_answer(gen_job *j, gen_outcome *o, http_response *resp)
{
    json_t *e = NULL;
    if (o->rc != NC_OK)
        e = proto_error_body(api_error_from_core(o->rc), o->err);
    else if (o->why != WG_RUN)
        e = proto_error_body(workguard_api(o->why), workguard_reason(o->why, j->srv->cfg.request_timeout_s));
    json_int_t advanced = (json_int_t)(j->r.advance ? o->delivered : 0);
    if (j->sse) {
        if (o->gone || o->why == WG_CLIENT_GONE) {
            json_decref(e);   /* nobody to tell */
            return;
        }
        if (e) {
            sse_event(j->sse, e);
            return;
        }
        if (sse_event(j->sse, json_pack("{s:s,s:I,s:I}", "finish_reason", o->finish, "advanced", advanced,
                                        "position", (json_int_t)o->pos)) == 0)
            sse_event_raw(j->sse, "[DONE]");
        return;
    }
    if (e) {
        char msg[600];
        snprintf(msg, sizeof msg, "generate: %s (the session is at position %lld)",
                 json_string_value(json_object_get(json_object_get(e, "error"), "message")), (long long)o->pos);
        http_reply_error(resp, o->rc != NC_OK ? api_error_from_core(o->rc) : workguard_api(o->why), "%s", msg);
        json_decref(e);
        return;
    }
    json_t *ws = json_array();
    for (size_t i = 0; i < j->words.n; i++)
        json_array_append_new(ws, json_string(j->words.words[i]));
    json_t *r = json_pack("{s:s,s:o,s:O,s:s,s:I,s:I}", "text", j->text.s ? j->text.s : "", "words", ws, "logprobs",
                          j->lps, "finish_reason", o->finish, "advanced", advanced, "position", (json_int_t)o->pos);
    if (r && j->gp.logprobs > 0)
        json_object_set(r, "top_logprobs", j->tops);
    http_reply_json(resp, 200, r);
}

/* Draws from a copy of the session's stream under its lock, hands out,
 * then (with advance) feeds the delivered words into the session. Answers
 * into resp (whole) or the stream. */
static void run(gen_job *j, workguard *g, http_response *resp)
{
    nc_server *srv = j->srv;
    nc_session *s = j->s;
    http_response lockr = {0};
    if (api_session_lock(srv, s, &lockr) != 0) {
        if (j->sse)
            sse_event(j->sse, lockr.json);
        else
            *resp = lockr;
        return;
    }
    gen_outcome o = {.why = WG_RUN};
    nc_stream *copy = NULL;
    o.rc = stream_clone(s->stream, &copy, o.err, sizeof o.err);
    gen_text gt = {0};
    bool gt_ok = o.rc == NC_OK && gen_text_init(&gt, "", 0) == NC_OK;
    if (o.rc == NC_OK && !gt_ok)
        o.rc = nc_error(o.err, sizeof o.err, NC_ENOMEM, "out of memory");
    if (o.rc == NC_OK)
        generate_words(j, g, copy, &gt, &o);
    o.delivered = words_delivered(j);
    int frc = NC_OK;
    char ferr[NC_ERRLEN] = "";
    if (j->r.advance && o.delivered > 0) {
        nc_tokens v = {j->words.ids, j->words.words, j->words.offsets, o.delivered, o.delivered, j->words.lens};
        frc = stream_feed(s->stream, &v, false, NULL, ferr, sizeof ferr);
    }
    o.pos = stream_position(s->stream);
    pthread_mutex_unlock(&s->lock);
    stream_free(copy);
    metrics_add_predictions(o.drawn);
    o.finish = gt_ok && gt.stopped ? "stop" : "length";
    if (gt_ok)
        gen_text_free(&gt);
    if (o.rc == NC_OK && frc != NC_OK) {
        o.rc = frc;
        snprintf(o.err, sizeof o.err, "advancing the session: %s", ferr);
    }
    generate_answer(j, &o, resp);
}

static void produce(sse_stream *s, void *arg)
{
    (void)s;
    run(arg, sse_guard(s), NULL);
}

void api_h_generate(nc_server *srv, http_request *req, http_response *resp)
{
    gen_job *j = calloc(1, sizeof *j);
    if (!j) {
        http_reply_error(resp, API_INTERNAL, "out of memory");
        return;
    }
    j->srv = srv;
    j->body = json_incref(req->json);
    tokens_init(&j->words);
    api_status st;
    if (proto_decode_generate(req->json, srv->cfg.max_top_k, srv->cfg.max_completion_tokens, &j->r, &st)) {
        http_reply_status(resp, &st);
        job_free(j);
        return;
    }
    /* budgets: each word is one full-vocabulary distribution and two LSTM
     * steps (drawn on the copy, then fed to the session), and with the
     * unbounded cache two searches */
    if (j->r.max_tokens > srv->cfg.max_generation_steps) {
        http_reply_error(resp, API_OVER_BUDGET, "max_tokens %ld full-vocabulary distributions are over "
                         "max_generation_steps = %ld", j->r.max_tokens, srv->cfg.max_generation_steps);
        job_free(j);
        return;
    }
    if (api_over_token_budget(srv, 2 * (size_t)j->r.max_tokens, resp)) {
        job_free(j);
        return;
    }
    j->s = api_session_acquire(srv, req, resp);
    if (!j->s) {
        job_free(j);
        return;
    }
    long long nb = j->s->params.unbounded ? 2LL * j->r.max_tokens * j->s->params.knn : 0;
    if (nb > srv->cfg.max_neighbours_per_request) {
        http_reply_error(resp, API_OVER_BUDGET, "2 x max_tokens %ld x knn %d = %lld unbounded-cache neighbours are "
                         "over max_neighbours_per_request = %ld", j->r.max_tokens, j->s->params.knn, nb,
                         srv->cfg.max_neighbours_per_request);
        job_free(j);
        return;
    }
    gen_setup(&j->gp, &j->rng, &GEN_REQUEST_OF(j->r));
    if (j->r.stream) {
        resp->sse = sse_new(produce, j, job_free);
        if (!resp->sse)
            http_reply_error(resp, API_INTERNAL, "out of memory");
        else
            j->sse = resp->sse;
        return;
    }
    j->lps = json_array();
    j->tops = json_array();
    run(j, &req->guard, resp);
    job_free(j);
}
