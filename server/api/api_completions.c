/* api_completions.c -- OpenAI-compatible /v1/completions, answered whole or
 * as server-sent events ("stream": true, OpenAI's chunk format), and the
 * tokenizer endpoints as lm-eval's local-completions model calls them.
 *
 * One code path produces both forms: each choice is generated as a series
 * of pieces (the echoed prompt, then runs of generated words that no stop
 * sequence can still claim, then the last piece with its finish_reason);
 * a streamed request sends each piece as a chunk, a whole one concatenates
 * them. So a stream's concatenated text and logprobs are the whole
 * answer's, by construction. */
#include "api_completions.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api_errors.h"
#include "apiutil.h"
#include "generate.h"
#include "metrics.h"
#include "sse.h"
#include "workguard.h"

/* ---- tokenizer endpoints ----------------------------------------------- */

void api_h_tokenize(nc_server *srv, http_request *req, http_response *resp)
{
    static const char *const keys[] = {"prompt", "text", "final_eos", "model", "add_special_tokens", "normalize",
                                       NULL};
    api_status st;
    const char *text, *text2;
    size_t len, len2;
    bool final_eos, normalize;
    if (proto_check_keys(req->json, keys, &st) ||
        proto_get_string(req->json, "prompt", false, &text, &len, &st) ||
        proto_get_string(req->json, "text", false, &text2, &len2, &st) ||
        proto_get_bool(req->json, "final_eos", false, &final_eos, &st) ||
        proto_get_bool(req->json, "normalize", true, &normalize, &st)) {
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
    if (api_tokenize(srv, text, len, final_eos, normalize, &t, resp) == 0) {
        json_t *ids = json_array(), *words = json_array();
        for (size_t i = 0; i < t.n; i++) {
            json_array_append_new(ids, json_integer(t.ids[i]));
            json_array_append_new(words, json_string(t.words[i]));
        }
        json_t *o = json_pack("{s:o,s:o,s:I}", "tokens", ids, "words", words, "count", (json_int_t)t.n);
        api_token_info(o, srv->model, &t, text, len, true);   /* offsets, lengths, unk, unk_count */
        http_reply_json(resp, 200, o);
    }
    tokens_clear(&t);
}

void api_h_detokenize(nc_server *srv, http_request *req, http_response *resp)
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

/* What lm-eval's remote tokenizer reads before it trusts /tokenize
 * (lm_eval.utils.check_remote_tokenizer_support needs "eos_token"; its
 * RemoteTokenizer takes eos_token, bos_token, pad_token and chat_template
 * from here, and the eos id as /tokenize of eos_token). A sequence starts
 * after eos_token (design §3): it is the model's bos as well. */
void api_h_tokenizer_info(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    const nc_model_config *c = &srv->model->cfg;
    json_t *o = json_pack("{s:s,s:s,s:n,s:s,s:s,s:i,s:i,s:b,s:s,s:s}", "eos_token", c->eos_token, "bos_token",
                              c->eos_token, "pad_token", "unk_token", c->unk_token, "tokenizer_class",
                              "neurocache-words", "vocab_size", c->vocab_size, "model_max_length", 1 << 30,
                              "lowercase", c->lowercase, "word_separator", " ", "eos_text", "\n");
    if (o)
        json_object_set_new(o, "text", api_text_conventions(srv->model));
    http_reply_json(resp, 200, o);
}

void api_h_chat_completions(nc_server *srv, http_request *req, http_response *resp)
{
    (void)srv;
    (void)req;
    http_reply_error(resp, API_NOT_FOUND,
                     "/v1/chat/completions is not served: the model is a word-level language model without "
                     "chat messages; use /v1/completions with a \"prompt\" (OpenAI's completions API)");
}

/* ---- completions -------------------------------------------------------- */

/* Budgets of /v1/completions (before any work, from the request alone):
 * LSTM steps = prompt tokens + max_tokens, full-vocabulary distributions =
 * max_tokens (+ the prompt tokens with echo and logprobs, each of which gets
 * its top list), summed over the prompts. A string prompt counts as
 * api_tokens_at_least(); complete_one checks the exact count as it goes.
 * Returns 0 or answers 413 and returns -1. */
static int completions_budget(nc_server *srv, const proto_completions_req *r, http_response *resp)
{
    long long steps = 0, dists = 0;
    for (size_t i = 0; i < r->n_prompts; i++) {
        const json_t *p = r->prompts[i];
        long long np = json_is_string(p) ? (long long)api_tokens_at_least(json_string_value(p), json_string_length(p),
                                                                          r->normalize && srv->model->cfg.text.declared)
                                         : (long long)json_array_size(p);
        steps += np + r->max_tokens;
        dists += r->max_tokens + (r->echo && r->logprobs > 0 ? np : 0);
    }
    if (dists > srv->cfg.max_generation_steps) {
        http_reply_error(resp, API_OVER_BUDGET,
                         "%zu prompts x max_tokens %ld%s = %lld full-vocabulary distributions are over "
                         "max_generation_steps = %ld", r->n_prompts, r->max_tokens,
                         r->echo && r->logprobs > 0 ? " (+ prompt tokens, echo with logprobs)" : "", dists,
                         srv->cfg.max_generation_steps);
        return -1;
    }
    if (steps > srv->cfg.max_tokens_per_request) {
        http_reply_error(resp, API_TOO_MANY_TOKENS,
                         "%lld prompt and generated tokens are over max_tokens_per_request = %ld (LSTM steps per request)",
                         steps, srv->cfg.max_tokens_per_request);
        return -1;
    }
    return 0;
}

/* One completion request, answered whole or streamed. */
typedef struct {
    nc_server *srv;
    json_t *body;                 /* the request: prompts and stops are borrowed from it */
    proto_completions_req r;
    gen_params gp;
    nc_rng rng;
    char id[40];
    char model[256];
    json_int_t created;
    sse_stream *sse;              /* streamed: the chunks go here */
    json_t *choices;              /* whole: the choices done */
    strbuf text;                  /* whole: the choice being built */
    json_t *tokens, *lps, *tops, *offs, *unks;
    long long steps, dists;       /* budgets used so far */
    size_t tot_prompt, tot_gen;
    size_t tot_unk;               /* prompt tokens that were the model's unk */
    api_error api;                /* why it failed (API_INTERNAL: see rc) */
    char err[NC_ERRLEN];
} cmpl_job;

static void cmpl_free(void *arg)
{
    cmpl_job *j = arg;
    if (!j)
        return;
    proto_completions_free(&j->r);
    json_decref(j->body);
    json_decref(j->choices);
    json_decref(j->tokens);
    json_decref(j->lps);
    json_decref(j->tops);
    json_decref(j->offs);
    json_decref(j->unks);
    free(j->text.s);
    free(j);
}

/* A piece's tokens: the four parallel arrays of OpenAI's "logprobs", and
 * "unk" (each token is the model's unknown word: a field of ours, which
 * OpenAI's clients ignore). */
typedef struct {
    json_t *tokens, *lps, *tops, *offs, *unks;
} piece_lists;

static piece_lists piece_lists_new(void)
{
    return (piece_lists){json_array(), json_array(), json_array(), json_array(), json_array()};
}

static void piece_lists_free(piece_lists l)
{
    json_decref(l.tokens);
    json_decref(l.lps);
    json_decref(l.tops);
    json_decref(l.offs);
    json_decref(l.unks);
}

/* The "logprobs" object of l (stolen), null when none was asked. */
static json_t *logprobs_obj(const cmpl_job *j, piece_lists l)
{
    if (j->r.logprobs < 0) {
        piece_lists_free(l);
        return json_null();
    }
    return json_pack("{s:o,s:o,s:o,s:o,s:o}", "tokens", l.tokens, "token_logprobs", l.lps, "top_logprobs", l.tops,
                     "text_offset", l.offs, "unk", l.unks);
}

/* A piece of choice index: text[0..len) and its tokens l (arrays stolen);
 * finish != NULL ends the choice. Returns 0, or -1 when the client of a
 * stream is gone. */
static int piece(cmpl_job *j, size_t index, const char *text, size_t len, piece_lists l, const char *finish)
{
    if (j->sse) {
        json_t *ch = json_pack("{s:s%,s:I,s:o,s:s?}", "text", text, len, "index", (json_int_t)index, "logprobs",
                               logprobs_obj(j, l), "finish_reason", finish);
        json_t *chunk = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", j->id, "object", "text_completion", "created",
                                  j->created, "model", j->model, "choices", ch);
        if (chunk && j->r.include_usage)
            json_object_set_new(chunk, "usage", json_null());
        return sse_event(j->sse, chunk);
    }
    if (!j->tokens) {
        j->tokens = json_array();
        j->lps = json_array();
        j->tops = json_array();
        j->offs = json_array();
        j->unks = json_array();
    }
    sb_add(&j->text, text, len);
    json_array_extend(j->tokens, l.tokens);
    json_array_extend(j->lps, l.lps);
    json_array_extend(j->tops, l.tops);
    json_array_extend(j->offs, l.offs);
    json_array_extend(j->unks, l.unks);
    piece_lists_free(l);
    if (finish) {
        piece_lists whole = {j->tokens, j->lps, j->tops, j->offs, j->unks};
        json_t *ch = json_pack("{s:s,s:I,s:o,s:s}", "text", j->text.s ? j->text.s : "", "index", (json_int_t)index,
                               "logprobs", logprobs_obj(j, whole), "finish_reason", finish);
        j->tokens = j->lps = j->tops = j->offs = j->unks = NULL;
        free(j->text.s);
        memset(&j->text, 0, sizeof j->text);
        json_array_append_new(j->choices, ch);
    }
    return 0;
}

/* Hands out the generated words that are ready (gen_text_ready) as one
 * piece, their text_offset in characters of the text (at: the walk
 * through it so far). Returns 0 or -1 (client gone). */
static int send_ready(cmpl_job *j, gen_text *gt, api_charpos *at, size_t index, bool final, const char *finish)
{
    size_t end;
    size_t n = gen_text_ready(gt, &j->gp, final, &end);
    if (n == 0 && end == gt->sent && !finish)
        return 0;
    piece_lists l = piece_lists_new();
    json_t *tokens = l.tokens, *lps = l.lps, *tops = l.tops, *offs = l.offs;
    for (size_t i = 0; i < n; i++) {
        gen_word *w = &gt->pend[i];
        json_array_append_new(l.unks, json_boolean(w->id == j->srv->model->unk_id));
        json_array_append_new(tokens, json_string(w->word));
        json_array_append_new(lps, api_logprob(w->logprob));
        json_array_append_new(tops, w->top ? w->top : json_object());
        w->top = NULL;
        json_array_append_new(offs, json_integer((json_int_t)api_char_offset(at, gt->text.s, gt->text.len, w->start)));
    }
    const char *t = gt->text.s + gt->sent;
    size_t len = end - gt->sent;
    gen_text_consume(gt, n, end);
    return piece(j, index, t, len, l, finish);
}

/* The prompt as tokens, and its text (the original string, or the
 * detokenised ids). */
static int prompt_tokens(const nc_model *m, const json_t *prompt, bool normalize, nc_tokens *t, strbuf *text,
                         char *err, size_t errlen)
{
    int rc = NC_OK;
    if (json_is_string(prompt)) {
        rc = tokenize_ex(m, json_string_value(prompt), json_string_length(prompt), false, normalize, t, err,
                         errlen);
        sb_add(text, json_string_value(prompt), json_string_length(prompt));
        return rc;
    }
    sb_add(text, "", 0);
    size_t i;
    json_t *v;
    json_array_foreach(prompt, i, v) {
        int id = (int)json_integer_value(v);
        const char *w = vocab_word(m->vocab, id);
        size_t off = sb_add_word(text, w, id == m->eos_id);
        if (rc == NC_OK) rc = tokens_push(t, id, w, strlen(w), off);
    }
    if (rc == NC_OK && text->oom)
        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
    return rc;
}

/* One choice in the making: the prompt's tokens and text, the fresh
 * stream, the prompt's log-probabilities (and top lists when echoed with
 * logprobs), why the guard stopped it, the tokens generated. */
typedef struct {
    nc_tokens t;
    strbuf ptext;
    nc_stream *st;
    double *lp;                   /* [t.n] */
    json_t *ptops;                /* echo with logprobs: [t.n] top lists */
    wg_stop why;
    size_t gen;
} cmpl_choice;

static void choice_free(cmpl_choice *c)
{
    json_decref(c->ptops);
    stream_free(c->st);
    free(c->lp);
    free(c->ptext.s);
    tokens_clear(&c->t);
}

/* The prompt's tokens, checked against the request's budgets as they add
 * up (completions_budget counted at least), and the fresh stream started
 * like a document (design §3). */
static int choice_start(cmpl_job *j, cmpl_choice *c, const json_t *prompt)
{
    nc_server *srv = j->srv;
    const proto_completions_req *r = &j->r;
    char *err = j->err;
    const size_t errlen = sizeof j->err;
    int rc = prompt_tokens(srv->model, prompt, r->normalize, &c->t, &c->ptext, err, errlen);
    if (rc == NC_EFORMAT)
        j->api = API_INVALID_TEXT;
    if (rc == NC_OK) {
        j->steps += (long long)c->t.n + r->max_tokens;
        j->dists += r->max_tokens + (r->echo && r->logprobs > 0 ? (long long)c->t.n : 0);
        if (j->steps > srv->cfg.max_tokens_per_request) {
            rc = NC_EINVAL;
            j->api = API_TOO_MANY_TOKENS;
            snprintf(err, errlen, "prompt and generated tokens are over max_tokens_per_request = %ld (LSTM steps "
                     "per request)", srv->cfg.max_tokens_per_request);
        } else if (j->dists > srv->cfg.max_generation_steps) {
            rc = NC_EINVAL;
            j->api = API_OVER_BUDGET;
            snprintf(err, errlen, "full-vocabulary distributions are over max_generation_steps = %ld",
                     srv->cfg.max_generation_steps);
        }
    }
    if (rc == NC_OK)
        rc = stream_new(srv->model, &srv->cache_defaults, NULL, NULL, true, &c->st, err, errlen);
    c->lp = rc == NC_OK ? malloc((c->t.n ? c->t.n : 1) * sizeof *c->lp) : NULL;
    if (rc == NC_OK && !c->lp)
        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
    return rc;
}

/* The prompt fed token by token, each token's logprob read from the same
 * full distribution as its top list, so that a token that is the argmax
 * carries exactly the top entry's value (lm-eval's greedy check compares
 * them with !=); design §4's two paths agree only to float tolerance. */
static int choice_prompt_with_tops(cmpl_job *j, workguard *g, cmpl_choice *c)
{
    const nc_model *m = j->srv->model;
    char *err = j->err;
    const size_t errlen = sizeof j->err;
    c->ptops = json_array();
    nc_dist d;
    dist_init(&d);
    int *idx = NULL;
    size_t idx_cap = 0;
    int rc = NC_OK;
    for (size_t i = 0; i < c->t.n && rc == NC_OK; i++) {
        if ((c->why = workguard_check(g)) != WG_RUN)
            break;
        rc = stream_predict(c->st, false, &d, err, errlen);
        if (rc == NC_OK && idx_cap < d.n) {
            free(idx);
            idx_cap = d.n + 1024;
            idx = malloc(idx_cap * sizeof *idx);
            if (!idx) {
                idx_cap = 0;
                rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
            }
        }
        if (rc != NC_OK)
            break;
        json_array_append_new(c->ptops, i > 0 ? gen_top_json(c->st, &d, (int)j->r.logprobs, idx) : json_null());
        int x = api_stream_token_id(c->st, m, &c->t, i);
        double full = x >= 0 && (size_t)x < d.n ? log((double)d.p[x]) : NAN;
        rc = api_stream_feed_one(c->st, &c->t, i, &c->lp[i], err, errlen);
        if (!isnan(full))
            c->lp[i] = full;
    }
    free(idx);
    dist_free(&d);
    return rc;
}

/* The echoed prompt, the choice's first piece. OpenAI's convention: the
 * first prompt token has no logprob (null) and no top list. */
static void choice_echo(cmpl_job *j, const cmpl_choice *c, size_t index, bool *gone)
{
    bool want_top = j->r.logprobs > 0;
    const nc_tokens *t = &c->t;
    piece_lists l = piece_lists_new();
    json_t *tokens = l.tokens, *lps = l.lps, *tops = l.tops, *offs = l.offs;
    api_charpos at = {0, 0};
    for (size_t i = 0; i < t->n; i++) {
        json_array_append_new(l.unks, json_boolean(t->ids[i] == j->srv->model->unk_id));
        json_array_append_new(tokens, json_string(t->words[i]));
        json_array_append_new(lps, i == 0 ? json_null() : api_logprob(c->lp[i]));
        json_array_append_new(tops, want_top ? json_incref(json_array_get(c->ptops, i))
                                             : i == 0 && j->r.logprobs > 0 ? json_null() : json_object());
        json_array_append_new(offs, json_integer((json_int_t)api_char_offset(&at, c->ptext.s, c->ptext.len,
                                                                             t->offsets[i])));
    }
    if (piece(j, index, c->ptext.s ? c->ptext.s : "", c->ptext.len, l, NULL) != 0)
        *gone = true;
}

/* Generation. The text continues the prompt's string (OpenAI's
 * convention: a space first when the prompt does not end in white space;
 * text_offset counted from the start of the prompt). */
static int choice_generate(cmpl_job *j, workguard *g, cmpl_choice *c, size_t index, bool *gone)
{
    gen_text gtx;
    int rc = gen_text_init(&gtx, c->ptext.s ? c->ptext.s : "", c->ptext.len);
    if (rc != NC_OK)
        return rc;
    gen_state gs;
    gen_init(&gs, c->st, j->srv->model, &j->gp, &j->rng);
    api_charpos at = {0, 0};   /* text_offset in characters of the prompt and what follows */
    for (long k = 0; rc == NC_OK && !*gone && !gtx.stopped && k < j->r.max_tokens; k++) {
        /* one check a token: a stop frees the worker within one step */
        if ((c->why = workguard_check(g)) != WG_RUN)
            break;
        gen_token tk;
        rc = gen_next(&gs, &tk, j->err, sizeof j->err);
        if (rc != NC_OK)
            break;
        c->gen++;
        rc = gen_text_add(&gtx, &tk, &j->gp);
        if (rc == NC_OK && !gtx.stopped && send_ready(j, &gtx, &at, index, false, NULL) != 0)
            *gone = true;
    }
    gen_free(&gs);
    if (rc == NC_OK && c->why == WG_RUN && !*gone &&
        send_ready(j, &gtx, &at, index, true, gtx.stopped ? "stop" : "length") != 0)
        *gone = true;
    gen_text_free(&gtx);
    return rc;
}

/* One choice of /v1/completions, from a fresh stream started like a
 * document (design §3). Returns NC_OK, or an rc with j->err (j->api the
 * request error: a budget, a stop of the guard g); NC_ECANCELED-like
 * silence (rc NC_OK with *gone) when a stream's client left. */
static int complete_one(cmpl_job *j, workguard *g, const json_t *prompt, size_t index, bool *gone)
{
    cmpl_choice c = {.why = WG_RUN};
    tokens_init(&c.t);
    j->api = API_INTERNAL;
    int rc = choice_start(j, &c, prompt);
    /* The prompt: batched when no per-position top list is needed. */
    if (rc == NC_OK && c.t.n > 0) {
        if (j->r.echo && j->r.logprobs > 0)
            rc = choice_prompt_with_tops(j, g, &c);
        else
            rc = gen_feed(c.st, g, &c.t, c.lp, &c.why, j->err, sizeof j->err);
    }
    if (rc == NC_OK && c.why == WG_RUN && j->r.echo)
        choice_echo(j, &c, index, gone);
    if (rc == NC_OK && c.why == WG_RUN && !*gone)
        rc = choice_generate(j, g, &c, index, gone);
    if (rc == NC_OK && c.why != WG_RUN) {
        rc = NC_EINVAL;
        j->api = workguard_api(c.why);
        if (c.why == WG_CLIENT_GONE)
            *gone = true;
        snprintf(j->err, sizeof j->err, "stopped at prompt %zu: %s", index,
                 workguard_reason(c.why, j->srv->cfg.request_timeout_s));
    }
    if (rc == NC_OK) {
        j->tot_prompt += c.t.n;
        j->tot_unk += tokens_count_unk(j->srv->model, &c.t, 0);
        j->tot_gen += c.gen;
    }
    choice_free(&c);
    return rc;
}

/* Runs every choice; answers into j (whole) or its stream. Returns NC_OK
 * or an rc with j->api / j->err. */
static int run_choices(cmpl_job *j, workguard *g, bool *gone)
{
    int rc = NC_OK;
    for (size_t i = 0; i < j->r.n_prompts && rc == NC_OK && !*gone; i++)
        rc = complete_one(j, g, j->r.prompts[i], i, gone);
    if (rc == NC_OK) {
        metrics_add_tokens_scored(j->tot_prompt);
        metrics_add_predictions(j->tot_gen);
    }
    return rc;
}

static json_t *usage_json(const cmpl_job *j)
{
    /* unk_count: prompt words outside the vocabulary (docs/normalisation.md) */
    return json_pack("{s:I,s:I,s:I,s:I}", "prompt_tokens", (json_int_t)j->tot_prompt, "completion_tokens",
                     (json_int_t)j->tot_gen, "total_tokens", (json_int_t)(j->tot_prompt + j->tot_gen), "unk_count",
                     (json_int_t)j->tot_unk);
}

/* The producer of a streamed completion (sse.h), on a worker. An error
 * after the first byte can only travel in the stream: an event
 * {"error": {...}} and no [DONE] (what OpenAI's clients raise as an API
 * error). */
static void cmpl_produce(sse_stream *s, void *arg)
{
    cmpl_job *j = arg;
    bool gone = false;
    int rc = run_choices(j, sse_guard(s), &gone);
    if (gone)
        return;
    if (rc != NC_OK) {
        sse_event(s, proto_error_body(j->api == API_INTERNAL ? api_error_from_core(rc) : j->api, j->err));
        return;
    }
    if (j->r.include_usage) {
        json_t *last = json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", j->id, "object", "text_completion", "created",
                                 j->created, "model", j->model, "choices", "usage", usage_json(j));
        if (sse_event(s, last) != 0)
            return;
    }
    sse_event_raw(s, "[DONE]");
}

void api_h_completions(nc_server *srv, http_request *req, http_response *resp)
{
    cmpl_job *j = calloc(1, sizeof *j);
    if (!j) {
        http_reply_error(resp, API_INTERNAL, "out of memory");
        return;
    }
    j->srv = srv;
    j->body = json_incref(req->json);
    api_status st;
    if (proto_decode_completions(req->json, srv->model->cfg.vocab_size, srv->cfg.max_top_k,
                                 srv->cfg.max_completion_tokens, &j->r, &st)) {
        http_reply_status(resp, &st);
        cmpl_free(j);
        return;
    }
    if (completions_budget(srv, &j->r, resp)) {
        cmpl_free(j);
        return;
    }
    gen_setup(&j->gp, &j->rng, &GEN_REQUEST_OF(j->r));
    unsigned char rb[12];
    snprintf(j->id, sizeof j->id, "cmpl-");
    if (getrandom(rb, sizeof rb, 0) == (ssize_t)sizeof rb)
        for (size_t i = 0; i < sizeof rb; i++) snprintf(j->id + 5 + 2 * i, 3, "%02x", rb[i]);
    const char *mname = NULL;
    size_t mlen;
    if (proto_get_string(req->json, "model", false, &mname, &mlen, NULL) || !mname)
        mname = api_model_name(srv);
    snprintf(j->model, sizeof j->model, "%s", mname);
    j->created = (json_int_t)time(NULL);
    if (j->r.stream) {
        /* sent by http.c as the worker produces it (sse.h) */
        resp->sse = sse_new(cmpl_produce, j, cmpl_free);
        if (!resp->sse)
            http_reply_error(resp, API_INTERNAL, "out of memory");
        else
            j->sse = resp->sse;
        return;
    }
    j->choices = json_array();
    bool gone = false;
    int rc = run_choices(j, &req->guard, &gone);
    if (rc != NC_OK) {
        http_reply_error(resp, j->api == API_INTERNAL ? api_error_from_core(rc) : j->api, "completions: %s", j->err);
    } else {
        http_reply_json(resp, 200,
                        json_pack("{s:s,s:s,s:I,s:s,s:O,s:o}", "id", j->id, "object", "text_completion", "created",
                                  j->created, "model", j->model, "choices", j->choices, "usage", usage_json(j)));
    }
    cmpl_free(j);
}
