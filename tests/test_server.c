/* test_server.c -- integration tests of neurocached: the real daemon on an
 * ephemeral loopback port, driven with libcurl, checked against the PyTorch
 * reference vectors, the CLI (neurocache score) and itself (score = feed =
 * completions echo; top-k = full distribution; concurrent = sequential). */
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "rawhttp.h"
#include "harness.h"

static nc_daemon D;
static char model_dir[512];
static json_t *ref;              /* reference.json of the fixture */
static char ref_text[4096];      /* its token strings joined by spaces */

/* A text with sentences and an unknown word, used by several tests. */
static const char *TEXT = "w1 w2 w3 w4\nw5 w6 zzz w7 w8 w9\nw10 w11 w1 w2 w3\n";

/* Arrays as pointers, so the harness's NULL check compiles. */
static const char *str(const char *s) { return s; }

static double jnum(const json_t *v)
{
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* POST path with a JSON body built by json_pack-like caller; returns the
 * response (caller frees) and checks the status. */
static int post(const char *path, json_t *body, long want, http_resp *r)
{
    int rc = http_post_json(D.port, path, body, r);
    json_decref(body);
    if (rc != 0 || r->status != want) {
        fprintf(stderr, "POST %s: status %ld (want %ld): %s\n", path, r->status, want,
                r->body ? r->body : "");
        return -1;
    }
    return 0;
}

static char *create_session(json_t *body)
{
    http_resp r;
    char *id = NULL;
    if (post("/v1/sessions", body ? body : json_object(), 201, &r) == 0)
        id = strdup(json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    return id;
}

/* /v1/score of text; returns the logprobs array (new reference) or NULL. */
static json_t *score(const char *text, json_t *extra)
{
    json_t *b = json_pack("{s:s}", "text", text);
    if (extra) {
        json_object_update(b, extra);
        json_decref(extra);
    }
    http_resp r;
    json_t *lp = NULL;
    if (post("/v1/score", b, 200, &r) == 0)
        lp = json_incref(json_object_get(r.json, "logprobs"));
    http_resp_free(&r);
    return lp;
}

TEST(health_ready_model)
{
    http_resp r;
    CHECK(http_json(D.port, "GET", "/health", NULL, &r) == 0 && r.status == 200);
    CHECK(r.json && strcmp(json_string_value(json_object_get(r.json, "status")), "ok") == 0);
    http_resp_free(&r);
    CHECK(http_json(D.port, "GET", "/ready", NULL, &r) == 0 && r.status == 200);
    http_resp_free(&r);
    CHECK(http_json(D.port, "GET", "/v1/model", NULL, &r) == 0 && r.status == 200);
    CHECK(json_integer_value(json_object_get(r.json, "vocab_size")) == 50);
    CHECK(json_integer_value(json_object_get(r.json, "hidden_size")) == 16);
    CHECK(json_integer_value(json_object_get(r.json, "num_layers")) == 2);
    CHECK(json_is_object(json_object_get(r.json, "cache_defaults")));
    http_resp_free(&r);
    CHECK(http_json(D.port, "GET", "/v1/models", NULL, &r) == 0 && r.status == 200);
    json_t *data = json_object_get(r.json, "data");
    CHECK(json_array_size(data) == 1);
    CHECK_STR_CONTAINS(json_string_value(json_object_get(json_array_get(data, 0), "id")), "lstm-2layer");
    http_resp_free(&r);
}

/* --bos none scoring reproduces PyTorch's static log-probabilities. */
TEST(score_matches_reference)
{
    json_t *lp = score(ref_text, json_pack("{s:s,s:b}", "bos", "none", "final_eos", 0));
    json_t *want = json_object_get(json_object_get(ref, "target_logprobs"), "static");
    CHECK(lp && json_array_size(lp) == json_array_size(want) + 1);
    CHECK(lp && json_is_null(json_array_get(lp, 0)));
    for (size_t t = 0; lp && t < json_array_size(want) && t + 1 < json_array_size(lp); t++)
        CHECK_NEAR(jnum(json_array_get(lp, t + 1)), jnum(json_array_get(want, t)), 1e-4);
    json_decref(lp);
}

/* Cache settings sent with /v1/score reproduce the reference mixtures. */
TEST(score_caches_match_reference)
{
    json_t *cp = json_object_get(ref, "cache_params");
    int N = (int)json_integer_value(json_object_get(cp, "window"));
    double theta = jnum(json_object_get(cp, "theta")), lambda = jnum(json_object_get(cp, "lambda"));
    double alpha = jnum(json_object_get(cp, "alpha")), ul = jnum(json_object_get(cp, "unigram_lambda"));
    struct { const char *name; json_t *cache; } cases[] = {
        {"neural_linear", json_pack("{s:i,s:f,s:f}", "neural_size", N, "neural_theta", theta, "neural_lambda", lambda)},
        {"neural_global", json_pack("{s:i,s:f,s:b,s:f}", "neural_size", N, "neural_theta", theta, "global_norm", 1,
                                    "neural_alpha", alpha)},
        {"unigram", json_pack("{s:i,s:f}", "unigram_size", N, "unigram_lambda", ul)},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        json_t *lp = score(ref_text, json_pack("{s:s,s:b,s:o}", "bos", "none", "final_eos", 0, "cache", cases[c].cache));
        json_t *want = json_object_get(json_object_get(ref, "target_logprobs"), cases[c].name);
        CHECKF(lp && want && json_array_size(lp) == json_array_size(want) + 1, "%s", cases[c].name);
        size_t bad = 0;
        for (size_t t = 0; lp && want && t < json_array_size(want) && t + 1 < json_array_size(lp); t++)
            if (fabs(jnum(json_array_get(lp, t + 1)) - jnum(json_array_get(want, t))) > 1e-4) bad++;
        CHECKF(bad == 0, "%s: %zu positions differ by more than 1e-4", cases[c].name, bad);
        json_decref(lp);
    }
}

/* /v1/score agrees with `neurocache score --format json` on a file. */
TEST(score_matches_cli)
{
    char path[] = "/tmp/nc-score-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, TEXT, strlen(TEXT)) == (ssize_t)strlen(TEXT));
    close(fd);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s score --model %s --format json %s 2>/dev/null",
             daemon_bin_path("neurocache"), model_dir, path);
    FILE *p = popen(cmd, "r");
    char *out = NULL;
    size_t cap = 0, len = 0;
    if (p) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, p)) > 0) {
            char *no = realloc(out, cap = len + n + 1);
            if (!no) break;
            out = no;
            memcpy(out + len, buf, n);
            len += n;
            out[len] = 0;
        }
        CHECK(pclose(p) == 0);
    }
    unlink(path);
    json_t *cli = out ? json_loads(out, 0, NULL) : NULL;
    free(out);
    CHECKF(cli != NULL, "CLI output is not JSON (%s)", cmd);
    json_t *lp = score(TEXT, NULL);
    json_t *want = cli ? json_object_get(cli, "logprobs") : NULL;
    CHECK(lp && want && json_array_size(lp) == json_array_size(want) && json_array_size(lp) == 18);
    for (size_t i = 0; lp && want && i < json_array_size(lp) && i < json_array_size(want); i++)
        CHECK_NEAR(jnum(json_array_get(lp, i)), jnum(json_array_get(want, i)), 1e-4);
    json_decref(lp);
    json_decref(cli);
}

/* Feeding the text through a session, in uneven chunks, gives the same
 * log-probabilities as /v1/score; predict is read-only and agrees. */
TEST(feed_matches_score)
{
    json_t *want = score(TEXT, NULL);
    CHECK(want != NULL);
    char *id = create_session(NULL);
    CHECK(id != NULL);
    if (!id || !want) { free(id); json_decref(want); return; }
    const char *chunks[] = {"w1 w2 w3 w4\nw5", " w6 zzz", " w7 w8 w9\n", "w10 w11 w1 w2 w3\n"};
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    char ppath[256];
    snprintf(ppath, sizeof ppath, "/v1/sessions/%s/predict", id);
    size_t k = 0;
    for (size_t c = 0; c < 4; c++) {
        /* Before each chunk: the full distribution gives the next token the
         * probability the scorer gave it. Twice, to show predict is
         * read-only. */
        double p1 = -1, p2 = -2;
        for (int rep = 0; rep < 2; rep++) {
            http_resp r;
            if (post(ppath, json_pack("{s:b}", "full", 1), 200, &r) == 0) {
                json_t *preds = json_object_get(r.json, "predictions");
                CHECK(json_array_size(preds) == 50);
                double sum = 0;
                size_t i;
                json_t *it;
                json_array_foreach(preds, i, it) {
                    sum += jnum(json_object_get(it, "prob"));
                    if (json_integer_value(json_object_get(it, "id")) == (json_int_t)(c == 0 ? 3 : -1)) {}
                }
                CHECK_NEAR(sum, 1.0, 1e-4);
                /* the first word of the chunk, by name */
                char first[16];
                sscanf(chunks[c], " %15s", first);
                double p = 0;
                json_array_foreach(preds, i, it)
                    if (strcmp(json_string_value(json_object_get(it, "word")), strcmp(first, "zzz") ? first : "<unk>") == 0)
                        p = jnum(json_object_get(it, "prob"));
                if (rep == 0) p1 = p; else p2 = p;
            }
            http_resp_free(&r);
        }
        CHECK_NEAR(p1, p2, 1e-7);
        CHECK_NEAR(log(p1), jnum(json_array_get(want, k)), 1e-4);
        http_resp r;
        if (post(path, json_pack("{s:s,s:b}", "text", chunks[c], "scores", 1), 200, &r) == 0) {
            json_t *lp = json_object_get(r.json, "logprobs");
            for (size_t i = 0; i < json_array_size(lp); i++, k++)
                CHECK_NEAR(jnum(json_array_get(lp, i)), jnum(json_array_get(want, k)), 1e-4);
        }
        http_resp_free(&r);
    }
    CHECK(k == json_array_size(want));
    /* The session reports what it consumed. */
    http_resp r;
    char gpath[256];
    snprintf(gpath, sizeof gpath, "/v1/sessions/%s", id);
    CHECK(http_json(D.port, "GET", gpath, NULL, &r) == 0 && r.status == 200);
    CHECK(json_integer_value(json_object_get(r.json, "tokens")) == (json_int_t)k);
    CHECK(json_integer_value(json_object_get(r.json, "memory_bytes")) > 0);
    http_resp_free(&r);
    CHECK(http_json(D.port, "DELETE", gpath, NULL, &r) == 0 && r.status == 204);
    http_resp_free(&r);
    CHECK(http_json(D.port, "GET", gpath, NULL, &r) == 0 && r.status == 404);
    CHECK(strcmp(http_error_code(&r), "session_not_found") == 0);
    http_resp_free(&r);
    free(id);
    json_decref(want);
}

/* top_k is the head of the full distribution; components add up. */
TEST(predict_topk_and_components)
{
    char *id = create_session(json_pack("{s:{s:i,s:f,s:i}}", "cache", "neural_size", 20, "neural_lambda", 0.3,
                                        "unigram_size", 20));
    CHECK(id != NULL);
    if (!id) return;
    char path[256];
    http_resp r;
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    CHECK(post(path, json_pack("{s:s}", "text", "w1 w2 w3 w1 w2 w3 w1 w2"), 200, &r) == 0);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    json_t *full = NULL, *top = NULL;
    if (post(path, json_pack("{s:b,s:b}", "full", 1, "components", 1), 200, &r) == 0)
        full = json_incref(json_object_get(r.json, "predictions"));
    http_resp_free(&r);
    if (post(path, json_pack("{s:i}", "top_k", 7), 200, &r) == 0)
        top = json_incref(json_object_get(r.json, "predictions"));
    http_resp_free(&r);
    CHECK(full && top && json_array_size(top) == 7 && json_array_size(full) == 50);
    double sum = 0, prev = 2;
    for (size_t i = 0; full && i < json_array_size(full); i++) {
        json_t *it = json_array_get(full, i);
        double p = jnum(json_object_get(it, "prob"));
        CHECK(p <= prev + 1e-12);
        prev = p;
        sum += p;
        json_t *comp = json_object_get(it, "components");
        double cs = 0;
        const char *k;
        json_t *v;
        json_object_foreach(comp, k, v) cs += jnum(v);
        CHECK_NEAR(cs, p, 1e-5);
        if (i < 7 && top) {
            json_t *t = json_array_get(top, i);
            CHECK(json_integer_value(json_object_get(t, "id")) == json_integer_value(json_object_get(it, "id")));
            CHECK_NEAR(jnum(json_object_get(t, "prob")), p, 1e-7);
        }
    }
    CHECK_NEAR(sum, 1.0, 1e-4);
    /* The caches matter: the top word is one of the window's (w1 w2 w3). */
    const char *w0 = full ? json_string_value(json_object_get(json_array_get(full, 0), "word")) : "";
    CHECKF(w0 && (!strcmp(w0, "w1") || !strcmp(w0, "w2") || !strcmp(w0, "w3")), "top word %s", w0);
    CHECK(full && jnum(json_object_get(json_object_get(json_array_get(full, 0), "components"), "neural")) > 0);
    json_decref(full);
    json_decref(top);
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    CHECK(http_json(D.port, "DELETE", path, NULL, &r) == 0 && r.status == 204);
    http_resp_free(&r);
    free(id);
}

/* /v1/completions echo: the prompt's own log-probabilities, the first null. */
TEST(completions_echo_matches_score)
{
    json_t *want = score(TEXT, json_pack("{s:b}", "final_eos", 0));
    http_resp r;
    json_t *b = json_pack("{s:s,s:s,s:i,s:b,s:i}", "model", "x", "prompt", TEXT, "max_tokens", 0, "echo", 1,
                          "logprobs", 1);
    if (post("/v1/completions", b, 200, &r) == 0) {
        json_t *ch = json_array_get(json_object_get(r.json, "choices"), 0);
        CHECK(strcmp(json_string_value(json_object_get(ch, "text")), TEXT) == 0);
        json_t *lo = json_object_get(ch, "logprobs");
        json_t *tl = json_object_get(lo, "token_logprobs");
        json_t *top = json_object_get(lo, "top_logprobs");
        json_t *off = json_object_get(lo, "text_offset");
        CHECK(want && json_array_size(tl) == json_array_size(want));
        CHECK(json_is_null(json_array_get(tl, 0)));
        for (size_t i = 1; want && i < json_array_size(tl); i++)
            CHECK_NEAR(jnum(json_array_get(tl, i)), jnum(json_array_get(want, i)), 1e-4);
        CHECK(json_array_size(top) == json_array_size(tl));
        CHECK(json_array_size(json_object_get(lo, "tokens")) == json_array_size(tl));
        /* text_offset points at each token in the text */
        CHECK(json_integer_value(json_array_get(off, 1)) == 3);
        CHECK(json_integer_value(json_array_get(off, 4)) == 11);     /* the first eos (newline) */
        CHECK(json_integer_value(json_object_get(json_object_get(r.json, "usage"), "prompt_tokens")) == 18);
    }
    http_resp_free(&r);
    /* Token-id prompts (a batch of two) give the same numbers. */
    b = json_pack("{s:[[i,i,i],s],s:i,s:b,s:i}", "prompt", 3, 4, 5, "w1 w2 w3", "max_tokens", 2, "echo", 1,
                  "temperature", 0);
    if (post("/v1/completions", b, 200, &r) == 0) {
        json_t *chs = json_object_get(r.json, "choices");
        CHECK(json_array_size(chs) == 2);
        json_t *a = json_object_get(json_object_get(json_array_get(chs, 0), "logprobs"), "token_logprobs");
        json_t *c = json_object_get(json_object_get(json_array_get(chs, 1), "logprobs"), "token_logprobs");
        CHECK(json_is_null(json_object_get(json_array_get(chs, 0), "logprobs")) || a == NULL);
        (void)c;
        /* greedy: the same prompt gives the same text */
        CHECK(strcmp(json_string_value(json_object_get(json_array_get(chs, 0), "text")),
                     json_string_value(json_object_get(json_array_get(chs, 1), "text"))) == 0);
        CHECK(json_integer_value(json_object_get(json_object_get(r.json, "usage"), "completion_tokens")) == 4);
    }
    http_resp_free(&r);
    /* Greedy continuation = argmax of predict; sampled with a seed repeats. */
    char *id = create_session(NULL);
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id ? id : "x");
    CHECK(post(path, json_pack("{s:s}", "text", "w1 w2 w3"), 200, &r) == 0);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id ? id : "x");
    char best[64] = "";
    if (post(path, json_pack("{s:i}", "top_k", 1), 200, &r) == 0)
        snprintf(best, sizeof best, "%s", json_string_value(json_object_get(json_array_get(json_object_get(r.json, "predictions"), 0), "word")));
    http_resp_free(&r);
    if (post("/v1/completions", json_pack("{s:s,s:i,s:f,s:i}", "prompt", "w1 w2 w3", "max_tokens", 1, "temperature", 0.0, "logprobs", 3), 200, &r) == 0) {
        json_t *ch = json_array_get(json_object_get(r.json, "choices"), 0);
        /* the completion continues the prompt's string: a space first */
        char want_text[80];
        snprintf(want_text, sizeof want_text, " %s", best);
        CHECKF(strcmp(json_string_value(json_object_get(ch, "text")), want_text) == 0, "text '%s' vs '%s'",
               json_string_value(json_object_get(ch, "text")), want_text);
        json_t *top = json_array_get(json_object_get(json_object_get(ch, "logprobs"), "top_logprobs"), 0);
        CHECK(json_object_size(top) == 3);
        /* text_offset counts from the start of the prompt: "w1 w2 w3" + " " */
        CHECK(json_integer_value(json_array_get(json_object_get(json_object_get(ch, "logprobs"), "text_offset"), 0)) == 9);
    }
    http_resp_free(&r);
    char *texts[2] = {NULL, NULL};
    for (int rep = 0; rep < 2; rep++) {
        if (post("/v1/completions", json_pack("{s:s,s:i,s:f,s:f,s:i}", "prompt", "w1", "max_tokens", 12,
                                              "temperature", 1.5, "top_p", 0.9, "seed", 42), 200, &r) == 0)
            texts[rep] = strdup(json_string_value(json_object_get(json_array_get(json_object_get(r.json, "choices"), 0), "text")));
        http_resp_free(&r);
    }
    CHECK(texts[0] && texts[1] && strcmp(texts[0], texts[1]) == 0);
    free(texts[0]);
    free(texts[1]);
    free(id);
    json_decref(want);
}

TEST(tokenize_detokenize)
{
    http_resp r;
    json_t *ids = NULL;
    if (post("/tokenize", json_pack("{s:s}", "prompt", "w1 w2 zzz\nw3"), 200, &r) == 0) {
        ids = json_incref(json_object_get(r.json, "tokens"));
        CHECK(json_integer_value(json_object_get(r.json, "count")) == 5);
        CHECK(json_integer_value(json_array_get(ids, 2)) == 0);   /* <unk> is id 0 in the fixture */
    }
    http_resp_free(&r);
    if (ids && post("/detokenize", json_pack("{s:O}", "tokens", ids), 200, &r) == 0)
        CHECK(strcmp(json_string_value(json_object_get(r.json, "prompt")), "w1 w2 <unk>\nw3") == 0);
    http_resp_free(&r);
    json_decref(ids);
}

/* Several sessions fed and queried at once from threads give exactly the
 * answers they give one at a time. */
#define NTHREADS 6
static const char *conc_texts[NTHREADS] = {
    "w1 w2 w3 w4 w5", "w9 w8 w7\nw6", "w30 w31 w32 w30 w31", "w1 w1 w1 w1", "w40 w41\nw42 w43\n", "zzz w5 zzz w6"};
typedef struct { int idx; double lp_sum; char top[64]; double top_p; int ok; } conc_job;

static void *conc_run(void *arg)
{
    conc_job *j = arg;
    j->ok = 0;
    http_resp r;
    json_t *b = json_pack("{s:{s:i,s:i}}", "cache", "neural_size", 10, "unigram_size", 10);
    char *bs = json_dumps(b, 0);
    json_decref(b);
    char id[128] = "";
    if (http_json(D.port, "POST", "/v1/sessions", bs, &r) == 0 && r.status == 201)
        snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    free(bs);
    http_resp_free(&r);
    if (!id[0]) return NULL;
    char path[256];
    j->lp_sum = 0;
    for (int rep = 0; rep < 5; rep++) {
        snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
        json_t *fb = json_pack("{s:s,s:b}", "text", conc_texts[j->idx], "scores", 1);
        if (http_post_json(D.port, path, fb, &r) == 0 && r.status == 200) {
            json_t *lp = json_object_get(r.json, "logprobs");
            for (size_t i = 0; i < json_array_size(lp); i++) j->lp_sum += jnum(json_array_get(lp, i));
        } else {
            j->lp_sum = NAN;
        }
        json_decref(fb);
        http_resp_free(&r);
    }
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    if (http_json(D.port, "POST", path, "{\"top_k\":1}", &r) == 0 && r.status == 200) {
        json_t *it = json_array_get(json_object_get(r.json, "predictions"), 0);
        snprintf(j->top, sizeof j->top, "%s", json_string_value(json_object_get(it, "word")));
        j->top_p = jnum(json_object_get(it, "prob"));
        j->ok = 1;
    }
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    http_json(D.port, "DELETE", path, NULL, &r);
    http_resp_free(&r);
    return NULL;
}

TEST(concurrent_equals_sequential)
{
    conc_job seq[NTHREADS], par[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        seq[i].idx = par[i].idx = i;
        conc_run(&seq[i]);
    }
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        pthread_create(&th[i], NULL, conc_run, &par[i]);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++) {
        CHECK(seq[i].ok && par[i].ok);
        CHECK_NEAR(seq[i].lp_sum, par[i].lp_sum, 1e-6);
        CHECK(strcmp(seq[i].top, par[i].top) == 0);
        CHECK_NEAR(seq[i].top_p, par[i].top_p, 1e-7);
    }
}

/* Predict batching: concurrent sessions' predictions share one decoder
 * GEMM (server/domain/batcher.c). Each session's full distribution asked by many
 * threads at once equals the one asked alone, and equals what a daemon
 * without batching (one matrix-vector product per predict) answers. */
#define NBATCH 8
static const char *batch_texts[NBATCH] = {"w1 w2 w3", "w4 w5 w6 w4 w5", "w7\nw8 w9", "w10 w11 w12 w13",
                                          "zzz w1 w14", "w15 w15 w15", "w16 w17\n", "w18 w19 w20 w18"};
typedef struct { int port; char id[128]; json_t *want; int reps, mismatches, errors; } batch_job_t;

/* Full distribution of a session as {word: prob} (new reference) or NULL. */
static json_t *full_dist(int port, const char *id)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    http_resp r;
    json_t *out = NULL;
    if (http_json(port, "POST", path, "{\"full\":true}", &r) == 0 && r.status == 200) {
        out = json_object();
        size_t i;
        json_t *it;
        json_array_foreach(json_object_get(r.json, "predictions"), i, it)
            json_object_set(out, json_string_value(json_object_get(it, "word")), json_object_get(it, "prob"));
    }
    http_resp_free(&r);
    return out;
}

/* Largest |p - q| over the words of p (q missing a word counts as 1). */
static double dist_diff(const json_t *p, const json_t *q)
{
    if (!p || !q || json_object_size(p) != json_object_size(q))
        return 1;
    double worst = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)p, k, v) {
        json_t *w = json_object_get(q, k);
        double d = w ? fabs(jnum(v) - jnum(w)) : 1;
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

static void *batch_hammer(void *arg)
{
    batch_job_t *j = arg;
    for (int i = 0; i < j->reps; i++) {
        json_t *got = full_dist(j->port, j->id);
        if (!got) j->errors++;
        else if (dist_diff(j->want, got) > 1e-6) j->mismatches++;
        json_decref(got);
    }
    return NULL;
}

static int open_fed_session(int port, const char *text, char *id, size_t cap)
{
    http_resp r;
    id[0] = 0;
    if (http_json(port, "POST", "/v1/sessions", "{\"cache\":{\"neural_size\":50,\"neural_lambda\":0.2}}", &r) == 0 &&
        r.status == 201)
        snprintf(id, cap, "%s", json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    if (!id[0]) return -1;
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    json_t *b = json_pack("{s:s}", "text", text);
    int rc = http_post_json(port, path, b, &r) == 0 && r.status == 200 ? 0 : -1;
    json_decref(b);
    http_resp_free(&r);
    return rc;
}

/* An integer counter of the daemon's /metrics, -1 if absent. */
static long metric_value(int port, const char *name)
{
    return (long)daemon_metric(port, name);
}

TEST(batched_predict_matches_alone)
{
    batch_job_t jobs[NBATCH];
    long batched0 = metric_value(D.port, "neurocache_predict_batched_total");
    long memo0 = metric_value(D.port, "neurocache_predict_memo_total");
    for (int i = 0; i < NBATCH; i++) {
        jobs[i] = (batch_job_t){.port = D.port, .reps = 15};
        CHECK(open_fed_session(D.port, batch_texts[i], jobs[i].id, sizeof jobs[i].id) == 0);
        jobs[i].want = full_dist(D.port, jobs[i].id);
        CHECK(jobs[i].want && json_object_size(jobs[i].want) == 50);
    }
    pthread_t th[NBATCH];
    for (int i = 0; i < NBATCH; i++) pthread_create(&th[i], NULL, batch_hammer, &jobs[i]);
    for (int i = 0; i < NBATCH; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NBATCH; i++) {
        CHECKF(jobs[i].errors == 0 && jobs[i].mismatches == 0, "session %d: %d errors, %d mismatches", i,
               jobs[i].errors, jobs[i].mismatches);
    }
    /* Every predict went through the batcher, in fewer GEMMs than predicts
     * or as many (batches never exceed their jobs), or was a repeat of its
     * session's state answered from the memo without it (api_predict.c):
     * the first of each session made its logits in a batch. */
    long batched = metric_value(D.port, "neurocache_predict_batched_total");
    long batches = metric_value(D.port, "neurocache_predict_batches_total");
    long memo = metric_value(D.port, "neurocache_predict_memo_total");
    CHECKF(batched - batched0 >= NBATCH && (batched - batched0) + (memo - memo0) >= NBATCH * 16,
           "batched %ld -> %ld, from the memo %ld -> %ld", batched0, batched, memo0, memo);
    CHECK(batches > 0 && batches <= batched);
    /* A daemon without batching gives the same distributions. */
    nc_daemon d2;
    const char *args[] = {"--model", model_dir, "--batch-predict", "false", NULL};
    CHECK(daemon_start(&d2, args) == 0);
    if (d2.pid) {
        for (int i = 0; i < NBATCH; i++) {
            char id[128];
            CHECK(open_fed_session(d2.port, batch_texts[i], id, sizeof id) == 0);
            json_t *got = full_dist(d2.port, id);
            CHECKF(dist_diff(jobs[i].want, got) <= 1e-6, "session %d differs without batching", i);
            json_decref(got);
        }
        CHECK(metric_value(d2.port, "neurocache_predict_batches_total") == 0);
        CHECK(daemon_stop(&d2) == 0);
    }
    for (int i = 0; i < NBATCH; i++) {
        char path[256];
        snprintf(path, sizeof path, "/v1/sessions/%s", jobs[i].id);
        http_resp r;
        http_json(D.port, "DELETE", path, NULL, &r);
        http_resp_free(&r);
        json_decref(jobs[i].want);
    }
}

/* predict {"text": text, "full": true} on session id: {word: prob} (new
 * reference) or NULL; *consumed and *position from the answer. */
static json_t *predict_text_dist(int port, const char *id, const char *text, long *consumed, long *position)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    json_t *b = json_pack("{s:s,s:b}", "text", text, "full", 1);
    http_resp r;
    json_t *out = NULL;
    *consumed = *position = -1;
    if (http_post_json(port, path, b, &r) == 0 && r.status == 200) {
        out = json_object();
        size_t i;
        json_t *it;
        json_array_foreach(json_object_get(r.json, "predictions"), i, it)
            json_object_set(out, json_string_value(json_object_get(it, "word")), json_object_get(it, "prob"));
        *consumed = json_is_integer(json_object_get(r.json, "consumed")) ?
                        (long)json_integer_value(json_object_get(r.json, "consumed")) : -1;
        *position = (long)json_integer_value(json_object_get(r.json, "position"));
    }
    json_decref(b);
    http_resp_free(&r);
    return out;
}

/* A predict's "text" is fed first, in the predict's batch: the same
 * distribution, to the bit (the same arithmetic: stream_feed, then the
 * decoder row), as a feed followed by a predict on a twin session; twice in
 * a row (the second feed reads the first predict's memo); without batching
 * too. Over max_predict_text_tokens: 413 over_budget and nothing fed. */
TEST(predict_text_equals_feed_then_predict)
{
    static const char *steps[] = {"w1 w2 w3 w1", "w2", "zzz w3\nw4"};
    char a[128], b[128];
    CHECK(open_fed_session(D.port, "w5 w6", a, sizeof a) == 0);
    CHECK(open_fed_session(D.port, "w5 w6", b, sizeof b) == 0);
    long pos = 2;
    for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
        long consumed, position;
        json_t *got = predict_text_dist(D.port, a, steps[k], &consumed, &position);
        char path[256];
        snprintf(path, sizeof path, "/v1/sessions/%s/feed", b);
        http_resp r;
        json_t *fb = json_pack("{s:s}", "text", steps[k]);
        CHECK(http_post_json(D.port, path, fb, &r) == 0 && r.status == 200);
        long fed = (long)json_integer_value(json_object_get(r.json, "consumed"));
        json_decref(fb);
        http_resp_free(&r);
        json_t *want = full_dist(D.port, b);
        pos += fed;
        CHECKF(got && want && dist_diff(want, got) == 0, "step %zu: differs by %g", k, dist_diff(want, got));
        CHECKF(consumed == fed && position == pos, "step %zu: consumed %ld (fed %ld), position %ld (want %ld)", k,
               consumed, fed, position, pos);
        json_decref(got);
        json_decref(want);
    }
    /* an empty text feeds nothing */
    long consumed, position;
    json_t *same = predict_text_dist(D.port, a, "", &consumed, &position);
    json_t *want = full_dist(D.port, b);
    CHECK(same && dist_diff(want, same) == 0 && consumed == 0 && position == pos);
    json_decref(same);
    /* over the limit (64 by default): 413, the session where it was */
    char big[65 * 4 + 1] = "";
    for (int i = 0; i < 65; i++) strcat(big, "w1 ");
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", a);
    json_t *bb = json_pack("{s:s}", "text", big);
    http_resp r;
    CHECK(http_post_json(D.port, path, bb, &r) == 0 && r.status == 413 &&
          !strcmp(json_string_value(json_object_get(json_object_get(r.json, "error"), "code")) ?: "", "over_budget"));
    json_decref(bb);
    http_resp_free(&r);
    CHECK(http_json(D.port, "POST", path, "{\"text\":7}", &r) == 0 && r.status == 400);
    http_resp_free(&r);
    json_t *after = full_dist(D.port, a);
    CHECK(after && dist_diff(want, after) == 0);
    json_decref(after);
    /* A daemon without batching feeds the text the same way. */
    nc_daemon d2;
    const char *args[] = {"--model", model_dir, "--batch-predict", "false", NULL};
    CHECK(daemon_start(&d2, args) == 0);
    if (d2.pid) {
        char c[128];
        CHECK(open_fed_session(d2.port, "w5 w6", c, sizeof c) == 0);
        json_t *got = NULL;
        for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
            json_decref(got);
            got = predict_text_dist(d2.port, c, steps[k], &consumed, &position);
        }
        CHECK(got && dist_diff(want, got) == 0 && position == pos);
        json_decref(got);
        CHECK(daemon_stop(&d2) == 0);
    }
    json_decref(want);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/v1/sessions/%s", i ? b : a);
        CHECK(http_json(D.port, "DELETE", path, NULL, &r) == 0 && r.status == 204);
        http_resp_free(&r);
    }
}

/* A predict waiting for a session busy with a long feed answers after it,
 * from the state the feed left (requests on one session are serialised,
 * batched or not). */
static char busy_id[128];
static void *long_feed(void *arg)
{
    (void)arg;
    size_t n = 40000;
    char *text = malloc(n * 5 + 64);
    size_t len = (size_t)sprintf(text, "{\"text\":\"");
    for (size_t i = 0; i < n; i++) len += (size_t)sprintf(text + len, "w%zu ", (i % 40) + 1);
    len += (size_t)sprintf(text + len, "\"}");
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", busy_id);
    http_resp r;
    http_call(D.port, "POST", path, "application/json", text, len, &r);
    http_resp_free(&r);
    free(text);
    return NULL;
}

TEST(predict_waits_for_feed)
{
    char *id = create_session(NULL);
    CHECK(id != NULL);
    if (!id) return;
    snprintf(busy_id, sizeof busy_id, "%s", id);
    pthread_t th;
    pthread_create(&th, NULL, long_feed, NULL);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    http_resp r;
    CHECK(http_json(D.port, "POST", path, "{\"top_k\":3}", &r) == 0 && r.status == 200);
    long pos = (long)json_integer_value(json_object_get(r.json, "position"));
    /* Before the feed or after it, never in the middle of it. */
    CHECKF(pos == 0 || pos == 40000, "position %ld", pos);
    http_resp_free(&r);
    pthread_join(th, NULL);
    CHECK(http_json(D.port, "POST", path, "{\"top_k\":3}", &r) == 0 && r.status == 200);
    CHECK(json_integer_value(json_object_get(r.json, "position")) == 40000);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    CHECK(http_json(D.port, "DELETE", path, NULL, &r) == 0 && r.status == 204);
    http_resp_free(&r);
    free(id);
}

static void *feed_same(void *arg)
{
    const char *id = arg;
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    for (int i = 0; i < 10; i++) {
        http_resp r;
        http_json(D.port, "POST", path, "{\"text\":\"w1 w2 w3 w4 w5\"}", &r);
        http_resp_free(&r);
    }
    return NULL;
}

TEST(one_session_serialised)
{
    char *id = create_session(json_pack("{s:{s:i}}", "cache", "neural_size", 5));
    CHECK(id != NULL);
    if (!id) return;
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, feed_same, id);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    http_resp r;
    CHECK(http_json(D.port, "GET", path, NULL, &r) == 0 && r.status == 200);
    CHECK(json_integer_value(json_object_get(r.json, "tokens")) == 4 * 10 * 5);
    http_resp_free(&r);
    http_json(D.port, "DELETE", path, NULL, &r);
    http_resp_free(&r);
    free(id);
}

TEST(metrics_exposed)
{
    http_resp r;
    /* the route table's last row answers what no route takes */
    CHECK(http_json(D.port, "GET", "/no/such/path", NULL, &r) == 0 && r.status == 404);
    CHECK(strcmp(http_error_code(&r), "not_found") == 0);
    http_resp_free(&r);
    CHECK(http_json(D.port, "DELETE", "/v1/score", NULL, &r) == 0 && r.status == 405);
    CHECK_STR_CONTAINS(str(r.allow), "POST");
    http_resp_free(&r);
    /* Requests are counted when libmicrohttpd reports them completed, just
     * after the answer went out: the client can ask for /metrics first, and
     * with a thread per connection the 404's completion may come after the
     * 405's. */
    for (int tries = 0;; tries++) {
        CHECK(http_json(D.port, "GET", "/metrics", NULL, &r) == 0 && r.status == 200);
        if (tries == 100 ||
            (r.body && strstr(r.body, "neurocache_requests_total{endpoint=\"unmatched\",status=\"405\"} ") &&
             strstr(r.body, "neurocache_requests_total{endpoint=\"unmatched\",status=\"404\"} ")))
            break;
        http_resp_free(&r);
        usleep(10000);
    }
    CHECK_STR_CONTAINS(str(r.content_type), "text/plain");
    CHECK_STR_CONTAINS(r.body, "neurocache_requests_total{endpoint=\"score\",status=\"200\"}");
    CHECK_STR_CONTAINS(r.body, "neurocache_request_duration_seconds_bucket{endpoint=\"predict\",le=\"+Inf\"}");
    CHECK_STR_CONTAINS(r.body, "neurocache_requests_total{endpoint=\"unmatched\",status=\"404\"} ");
    CHECK_STR_CONTAINS(r.body, "neurocache_requests_total{endpoint=\"unmatched\",status=\"405\"} ");
    CHECK_STR_CONTAINS(r.body, "neurocache_tokens_fed_total");
    CHECK_STR_CONTAINS(r.body, "neurocache_tokens_scored_total");
    CHECK_STR_CONTAINS(r.body, "neurocache_sessions_active");
    CHECK_STR_CONTAINS(r.body, "neurocache_session_memory_bytes");
    http_resp_free(&r);
}

/* The sum of the series named name (any labels) in an exposition, or -1. */
static double exposition_value(const char *text, const char *name, const char *labels)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s%s ", name, labels ? labels : "");
    const char *p = text ? strstr(text, key) : NULL;
    return p ? strtod(p + strlen(key), NULL) : -1;
}

/* Where the memory is (memstats.h): gauges that agree with the kernel's and
 * malloc's own accounting, a series count that counts the exposition, and
 * SIGUSR1's malloc_info in the log while the daemon keeps serving. */
TEST(memory_gauges_and_report)
{
    http_resp r;
    CHECK(http_json(D.port, "GET", "/metrics", NULL, &r) == 0 && r.status == 200);
    double anon = exposition_value(r.body, "neurocache_process_resident_bytes", "{kind=\"anon\"}");
    double used = exposition_value(r.body, "neurocache_malloc_bytes", "{state=\"arena_in_use\"}");
    double mmapped = exposition_value(r.body, "neurocache_malloc_bytes", "{state=\"mmapped\"}");
    double freeb = exposition_value(r.body, "neurocache_malloc_bytes", "{state=\"arena_free\"}");
    double arenas = exposition_value(r.body, "neurocache_malloc_arenas", NULL);
    double threads = exposition_value(r.body, "neurocache_process_threads", NULL);
    double series = exposition_value(r.body, "neurocache_metrics_series", NULL);
    /* the model's weights are heap; a daemon has at least its main and
     * listening threads */
    /* under ASan (NEUROCACHE_SANITIZED) its allocator, not glibc's, serves
     * malloc: glibc's statistics read 0 and only the others are checked */
    bool glibc_malloc = !getenv("NEUROCACHE_SANITIZED");
    CHECKF(mmapped >= 0 && freeb >= 0 && (!glibc_malloc || (used > 0 && arenas >= 1)),
           "in use %g, mmapped %g, free %g, arenas %g", used, mmapped, freeb, arenas);
    CHECKF(anon > 0 && threads >= 2, "anon %g, threads %g", anon, threads);
    long lines = 0;
    for (const char *p = r.body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (*p != '#' && *p != '\n')
            lines++;
    CHECKF(series == (double)lines, "metrics_series %g, the exposition has %ld", series, lines);
    http_resp_free(&r);
    /* the report: twice, the daemon serves on */
    for (int i = 0; i < 2; i++) {
        CHECK(kill(D.pid, SIGUSR1) == 0);
        usleep(300000);
    }
    bool found = false;
    for (int tries = 0; tries < 50 && !found; tries++) {
        FILE *f = fopen(D.log, "r");
        char line[512];
        int n = 0;
        while (f && fgets(line, sizeof line, f))
            if (strstr(line, "\"memory report (SIGUSR1)\"") && strstr(line, "<malloc version="))
                n++;
        if (f) fclose(f);
        found = n == 2;
        if (!found) usleep(100000);
    }
    CHECK(found);
    CHECK(http_json(D.port, "GET", "/health", NULL, &r) == 0 && r.status == 200);
    http_resp_free(&r);
}

/* A second daemon with tiny limits: TTL eviction, max sessions, budget. */
TEST(limits_and_ttl)
{
    nc_daemon d2;
    const char *args[] = {"--model", model_dir, "--ttl", "1", "--max-sessions", "2", "--memory-mb", "1", NULL};
    CHECK(daemon_start(&d2, args) == 0);
    if (!d2.pid) return;
    nc_daemon saved = D;
    D = d2;
    char *a = create_session(NULL), *b = create_session(NULL);
    CHECK(a && b);
    http_resp r;
    CHECK(http_json(D.port, "POST", "/v1/sessions", NULL, &r) == 0 && r.status == 429);
    CHECK(strcmp(http_error_code(&r), "too_many_sessions") == 0);
    http_resp_free(&r);
    /* Over the 1 MiB budget: a 100,000-pair neural cache of H=16 floats. */
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s", b ? b : "x");
    CHECK(http_json(D.port, "DELETE", path, NULL, &r) == 0 && r.status == 204);
    http_resp_free(&r);
    CHECK(http_json(D.port, "POST", "/v1/sessions", "{\"cache\":{\"neural_size\":100000}}", &r) == 0 &&
          r.status == 429);
    CHECK(strcmp(http_error_code(&r), "memory_budget_exceeded") == 0);
    http_resp_free(&r);
    /* Client-chosen ids: a duplicate is a conflict. */
    CHECK(http_json(D.port, "POST", "/v1/sessions", "{\"id\":\"mine\"}", &r) == 0 && r.status == 201);
    http_resp_free(&r);
    CHECK(http_json(D.port, "DELETE", "/v1/sessions/mine", NULL, &r) == 0 && r.status == 204);
    http_resp_free(&r);
    CHECK(http_json(D.port, "POST", "/v1/sessions", "{\"id\":\"mine\"}", &r) == 0 && r.status == 201);
    http_resp_free(&r);
    CHECK(http_json(D.port, "POST", "/v1/sessions", "{\"id\":\"mine\"}", &r) == 0 && r.status == 429);
    http_resp_free(&r);
    /* Idle sessions expire after the TTL (1 s; the janitor ticks each s). */
    struct timespec ts = {3, 0};
    nanosleep(&ts, NULL);
    snprintf(path, sizeof path, "/v1/sessions/%s", a ? a : "x");
    CHECK(http_json(D.port, "GET", path, NULL, &r) == 0 && r.status == 404);
    CHECK(strcmp(http_error_code(&r), "session_not_found") == 0);
    http_resp_free(&r);
    CHECK(http_json(D.port, "POST", "/v1/sessions", "{\"id\":\"mine\"}", &r) == 0 && r.status == 201);
    http_resp_free(&r);
    CHECK(http_json(D.port, "POST", "/v1/sessions", "{\"id\":\"mine\"}", &r) == 0 && r.status == 409);
    CHECK(strcmp(http_error_code(&r), "conflict") == 0);
    http_resp_free(&r);
    CHECK(http_json(D.port, "GET", "/metrics", NULL, &r) == 0 && r.status == 200);
    CHECK_STR_CONTAINS(r.body, "neurocache_sessions_evicted_total 2");
    http_resp_free(&r);
    D = saved;
    CHECK(daemon_stop(&d2) == 0);
    free(a);
    free(b);
}

/* Start-up refuses bad configuration, naming the option. */
static int run_capture(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(bad_config_names_option)
{
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "%s --port 99999 2>&1", daemon_bin_path("neurocached"));
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECK_STR_CONTAINS(str(out), "'port'");
    snprintf(cmd, sizeof cmd, "%s --log-format xml 2>&1", daemon_bin_path("neurocached"));
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECK_STR_CONTAINS(str(out), "'log_format'");
    snprintf(cmd, sizeof cmd, "%s --no-such-option 1 2>&1", daemon_bin_path("neurocached"));
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECK_STR_CONTAINS(str(out), "unknown option '--no-such-option'");   /* the flag as typed */
    char path[] = "/tmp/nc-conf-XXXXXX";
    int fd = mkstemp(path);
    const char *conf = "[sessions]\nttl = -5\n";
    CHECK(fd >= 0 && write(fd, conf, strlen(conf)) == (ssize_t)strlen(conf));
    if (fd >= 0) close(fd);
    snprintf(cmd, sizeof cmd, "%s --config %s 2>&1", daemon_bin_path("neurocached"), path);
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECK_STR_CONTAINS(str(out), "'ttl'");
    unlink(path);
    /* The shipped config file parses and documents every option. */
    snprintf(cmd, sizeof cmd, "%s --config config/neurocached.conf --model /nonexistent --port 0 --allow-root 2>&1",
             daemon_bin_path("neurocached"));
    CHECK(run_capture(cmd, out, sizeof out) == 1);   /* gets as far as loading the model */
    CHECK_STR_CONTAINS(str(out), "startup failed");
    /* a model directory that is not there fails before the port is
     * announced: no "listening" line ahead of "startup failed" */
    CHECKF(!strstr(out, "listening"), "a missing model logged 'listening': %s", out);
    CHECK_STR_CONTAINS(str(out), "/nonexistent: not a model directory");
    char dir[] = "/tmp/nc-nomodel-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "%s --model %s --port 0 --allow-root 2>&1", daemon_bin_path("neurocached"), dir);
    CHECK(run_capture(cmd, out, sizeof out) == 1);
    CHECKF(!strstr(out, "listening") && strstr(out, "startup failed") && strstr(out, "config.json"),
           "an empty model directory: %s", out);
    rmdir(dir);
    /* a misspelt flag and a missing value: one line each, naming the help */
    snprintf(cmd, sizeof cmd, "%s --prot 8080 2>&1", daemon_bin_path("neurocached"));
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECKF(!strcmp(out, "neurocached: unknown option '--prot' (did you mean '--port'?); see 'neurocached --help'\n"),
           "said '%s'", out);
    snprintf(cmd, sizeof cmd, "%s --model 2>&1", daemon_bin_path("neurocached"));
    CHECK(run_capture(cmd, out, sizeof out) == 2);
    CHECKF(!strcmp(out, "neurocached: option '--model' needs a value; see 'neurocached --help'\n"), "said '%s'", out);
}

/* config/neurocached.conf sets every option of the table, in its section,
 * to its default (the file is the documentation of the defaults). */
TEST(shipped_config_documents_every_option)
{
    FILE *f = fopen("config/neurocached.conf", "r");
    CHECK(f != NULL);
    if (!f) return;
    static char lines[256][3][256]; /* section, key, value */
    int n = 0;
    char line[1024], section[256] = "";
    while (fgets(line, sizeof line, f) && n < 256) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        p[strcspn(p, "\r\n")] = 0;
        if (*p == ';' || *p == '#' || !*p) continue;
        if (*p == '[') {
            snprintf(section, sizeof section, "%.*s", (int)strcspn(p + 1, "]"), p + 1);
            continue;
        }
        char *eq = strchr(p, '=');
        if (!eq) continue;
        char *ke = eq;
        while (ke > p && ke[-1] == ' ') ke--;
        char *v = eq + 1;
        while (*v == ' ') v++;
        snprintf(lines[n][0], 256, "%s", section);
        snprintf(lines[n][1], 256, "%.*s", (int)(ke - p), p);
        snprintf(lines[n][2], 256, "%s", v);
        n++;
    }
    fclose(f);
    int opts = 0;
    for (const config_option *o = config_options(); o->name; o++, opts++) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(lines[i][0], o->section) && !strcmp(lines[i][1], o->name)) {
                found = 1;
                CHECKF(!strcmp(lines[i][2], o->defval), "[%s] %s = '%s' in the file, default '%s'", o->section,
                       o->name, lines[i][2], o->defval);
            }
        CHECKF(found, "option [%s] %s is not in config/neurocached.conf", o->section, o->name);
    }
    CHECKF(n == opts, "%d settings in the file, %d options", n, opts);
}

/* SIGTERM while a request is in flight: /ready turns 503 (other endpoints
 * still answer), the request finishes with 200, then the daemon exits 0.
 * The request is held in flight deterministically: its body is sent in two
 * parts and the second only after the daemon logged "draining". */
typedef struct {
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int first_sent, release;
    long status;
    char *answer;
    size_t answer_len;
} slow_post;

static const char SLOW_A[] = "{\"text\":\"w1 w2 w3 ", SLOW_B[] = "w4 w5\\n\"}";

static size_t slow_read(char *buf, size_t size, size_t nmemb, void *user)
{
    slow_post *sp = user;
    pthread_mutex_lock(&sp->mu);
    size_t n = 0;
    if (sp->first_sent == 0) {
        n = sizeof SLOW_A - 1;
        memcpy(buf, SLOW_A, n);
        sp->first_sent = 1;
        pthread_cond_broadcast(&sp->cv);
    } else if (sp->first_sent == 1) {
        while (!sp->release) pthread_cond_wait(&sp->cv, &sp->mu);
        n = sizeof SLOW_B - 1;
        memcpy(buf, SLOW_B, n);
        sp->first_sent = 2;
    }
    pthread_mutex_unlock(&sp->mu);
    (void)size, (void)nmemb;
    return n;
}

static size_t slow_write(char *p, size_t size, size_t nmemb, void *user)
{
    slow_post *sp = user;
    size_t n = size * nmemb;
    char *a = realloc(sp->answer, sp->answer_len + n + 1);
    if (!a) return 0;
    memcpy(a + sp->answer_len, p, n);
    sp->answer = a;
    sp->answer_len += n;
    a[sp->answer_len] = 0;
    return n;
}

static void *slow_post_run(void *arg)
{
    slow_post *sp = arg;
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/score", sp->port);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, slow_read);
    curl_easy_setopt(c, CURLOPT_READDATA, sp);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)(sizeof SLOW_A - 1 + sizeof SLOW_B - 1));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, slow_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, sp);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &sp->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return NULL;
}

/* Waits up to timeout_s for needle in the daemon's log; 1 if found. */
static int log_has(const nc_daemon *d, const char *needle, int timeout_s, char *line, size_t cap)
{
    for (int i = 0; i < timeout_s * 100; i++) {
        FILE *f = fopen(d->log, "r");
        char buf[4096];
        while (f && fgets(buf, sizeof buf, f))
            if (strstr(buf, needle)) {
                if (line) snprintf(line, cap, "%s", buf);
                fclose(f);
                return 1;
            }
        if (f) fclose(f);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

TEST(sigterm_drains)
{
    nc_daemon d2;
    const char *args[] = {"--model", model_dir, NULL};
    CHECK(daemon_start(&d2, args) == 0);
    if (!d2.pid) return;
    slow_post sp = {.port = d2.port};
    pthread_mutex_init(&sp.mu, NULL);
    pthread_cond_init(&sp.cv, NULL);
    pthread_t th;
    pthread_create(&th, NULL, slow_post_run, &sp);
    pthread_mutex_lock(&sp.mu);
    while (!sp.first_sent) pthread_cond_wait(&sp.cv, &sp.mu);
    pthread_mutex_unlock(&sp.mu);
    struct timespec ts = {0, 100 * 1000 * 1000};   /* headers and first part reach the daemon */
    nanosleep(&ts, NULL);
    daemon_signal_term(&d2);
    char line[4096] = "";
    CHECK(log_has(&d2, "\"msg\":\"draining\"", 10, line, sizeof line));
    CHECKF(strstr(line, "\"inflight\":1") != NULL, "draining line: %s", line);
    http_resp r;
    CHECK(http_json(d2.port, "GET", "/ready", NULL, &r) == 0 && r.status == 503);
    CHECK(strcmp(http_error_code(&r), "not_ready") == 0);
    http_resp_free(&r);
    CHECK(http_json(d2.port, "GET", "/health", NULL, &r) == 0 && r.status == 200);
    http_resp_free(&r);
    pthread_mutex_lock(&sp.mu);
    sp.release = 1;
    pthread_cond_broadcast(&sp.cv);
    pthread_mutex_unlock(&sp.mu);
    pthread_join(th, NULL);
    CHECKF(sp.status == 200, "in-flight request answered %ld: %s", sp.status, sp.answer ? sp.answer : "");
    json_t *j = sp.answer ? json_loads(sp.answer, 0, NULL) : NULL;
    CHECK(json_array_size(json_object_get(j, "logprobs")) == 6);   /* w1..w5 + eos */
    json_decref(j);
    free(sp.answer);
    CHECK(log_has(&d2, "\"msg\":\"stopped\"", 30, NULL, 0));
    CHECK(daemon_wait(&d2, 60) == 0);
    pthread_mutex_destroy(&sp.mu);
    pthread_cond_destroy(&sp.cv);
}

int main(void)
{
    httpc_init();
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    char refpath[600];
    snprintf(refpath, sizeof refpath, "%s/reference.json", model_dir);
    ref = json_load_file(refpath, 0, NULL);
    if (!ref) {
        fprintf(stderr, "cannot read %s\n", refpath);
        return 1;
    }
    json_t *ts = json_object_get(ref, "token_strings");
    size_t i;
    json_t *w;
    size_t len = 0;
    json_array_foreach(ts, i, w) len += (size_t)snprintf(ref_text + len, sizeof ref_text - len, "%s%s",
                                                         i ? " " : "", json_string_value(w));
    const char *args[] = {"--model", model_dir, NULL};
    if (daemon_start(&D, args) != 0) {
        CHECK(0);
        return harness_summary();
    }
    RUN(health_ready_model);
    RUN(score_matches_reference);
    RUN(score_caches_match_reference);
    RUN(score_matches_cli);
    RUN(feed_matches_score);
    RUN(predict_topk_and_components);
    RUN(completions_echo_matches_score);
    RUN(tokenize_detokenize);
    RUN(concurrent_equals_sequential);
    RUN(batched_predict_matches_alone);
    RUN(predict_text_equals_feed_then_predict);
    RUN(predict_waits_for_feed);
    RUN(one_session_serialised);
    RUN(metrics_exposed);
    RUN(memory_gauges_and_report);
    RUN(limits_and_ttl);
    RUN(bad_config_names_option);
    RUN(shipped_config_documents_every_option);
    RUN(sigterm_drains);
    CHECK(daemon_stop(&D) == 0);
    json_decref(ref);
    httpc_cleanup();
    return harness_summary();
}
