/* test_server_stream.c -- the API as its clients expect it (issue 19), on
 * the real daemon over loopback: streamed completions (server-sent events)
 * equal the whole answer, stop sequences, no unk_token unless asked, a
 * cancelled stream frees its worker, session generation advancing by the
 * words delivered, N-best rescoring equal to one feed per hypothesis from
 * exported copies of the session and leaving it unchanged, and lm-eval's
 * local-completions requests reproduced exactly, their sums checked against
 * `neurocache score`. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"
#include "rawhttp.h"
#include "tolerance.h"

static nc_daemon D;               /* fixture model */
static char fixture[512];

/* ---- raw HTTP for event streams -------------------------------------------
 * HTTP/1.0: the daemon sends the stream unchunked and closes at its end. */

/* More than *(int *)max_events "data:" events are in (never, for 0). */
static bool events_in(const char *b, size_t len, void *max_events)
{
    (void)len;
    int max = *(const int *)max_events;
    if (max <= 0)
        return false;
    int n = 0;
    for (const char *p = strstr(b, "\r\n\r\n"); p && (p = strstr(p, "\n\ndata: ")); p += 2) n++;
    /* the first event follows the head's blank line */
    if (strstr(b, "\r\n\r\ndata: ")) n++;
    return n > max;
}

/* Reads from fd until max_events "data:" events are in (0 = until the peer
 * closes) or timeout_s. Returns what came (malloc'd). */
static char *raw_read_events(int fd, int max_events, double timeout_s)
{
    return raw_read_until(fd, (int)(timeout_s * 1000), events_in, &max_events, NULL);
}

/* The events of a whole stream: [parsed JSON or the string "[DONE]"]. */
static json_t *sse_call(int port, const char *path, const char *body, char *ctype, size_t ctlen)
{
    int fd = raw_post_as(port, "1.0", path, body);
    if (fd < 0) return NULL;
    char *b = raw_read_events(fd, 0, 600);   /* a bound for a hung daemon, not a speed */
    close(fd);
    json_t *ev = json_array();
    const char *ct = strcasestr(b, "Content-Type: ");
    if (ctype) {
        ctype[0] = 0;
        if (ct) sscanf(ct + 14, "%127[^\r]", ctype);
        (void)ctlen;
    }
    const char *p = strstr(b, "\r\n\r\n");
    for (p = p ? p + 4 : b + strlen(b); (p = strstr(p, "data: ")); ) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (!strncmp(p, "[DONE]", 6))
            json_array_append_new(ev, json_string("[DONE]"));
        else
            json_array_append_new(ev, json_loadb(p, (size_t)(e - p), 0, NULL));
        p = e + 2;
    }
    free(b);
    return ev;
}

static json_t *post_ok(int port, const char *path, const char *body)
{
    http_resp r;
    json_t *j = NULL;
    if (http_json(port, "POST", path, body, &r) == 0 && r.status >= 200 && r.status < 300)
        j = json_incref(r.json);
    else
        fprintf(stderr, "POST %s: %ld %s\n", path, r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return j;
}

/* ---- completions ---------------------------------------------------------- */

/* The stream's chunks, concatenated per choice, are the whole answer:
 * same text, tokens, logprobs, top lists, offsets, finish reasons and
 * usage. One code path makes both (api_completions.c); this is the wire. */
static void check_stream_equals_whole(const char *req_fields)
{
    char body[2048];
    snprintf(body, sizeof body, "{%s}", req_fields);
    json_t *whole = post_ok(D.port, "/v1/completions", body);
    snprintf(body, sizeof body, "{%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", req_fields);
    char ctype[128];
    json_t *ev = sse_call(D.port, "/v1/completions", body, ctype, sizeof ctype);
    CHECK(whole && ev && json_array_size(ev) >= 3);
    if (!whole || !ev) {
        json_decref(whole);
        json_decref(ev);
        return;
    }
    CHECKF(strstr(ctype, "text/event-stream") != NULL, "content type %s", ctype);
    size_t n = json_array_size(ev);
    CHECK(json_is_string(json_array_get(ev, n - 1)));          /* data: [DONE] last */
    json_t *last = json_array_get(ev, n - 2);
    CHECK(json_equal(json_object_get(last, "usage"), json_object_get(whole, "usage")));
    CHECK(json_array_size(json_object_get(last, "choices")) == 0);
    json_t *choices = json_object_get(whole, "choices");
    for (size_t c = 0; c < json_array_size(choices); c++) {
        json_t *want = json_array_get(choices, c);
        json_t *acc = json_pack("{s:[],s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset",
                                "unk");
        char *text = calloc(1, 1);
        size_t tl = 0;
        const char *finish = NULL;
        int nfinish = 0;
        for (size_t i = 0; i + 2 < n; i++) {
            json_t *ch = json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0);
            CHECK(json_is_null(json_object_get(json_array_get(ev, i), "usage")));
            if ((size_t)json_integer_value(json_object_get(ch, "index")) != c) continue;
            const char *t = json_string_value(json_object_get(ch, "text"));
            text = realloc(text, tl + strlen(t) + 1);
            memcpy(text + tl, t, strlen(t) + 1);
            tl += strlen(t);
            json_t *lo = json_object_get(ch, "logprobs");
            const char *k;
            json_t *v;
            json_object_foreach(acc, k, v) json_array_extend(v, json_object_get(lo, k));
            if (json_is_string(json_object_get(ch, "finish_reason"))) {
                finish = json_string_value(json_object_get(ch, "finish_reason"));
                nfinish++;
            }
        }
        CHECKF(!strcmp(text, json_string_value(json_object_get(want, "text"))), "streamed '%s' vs whole '%s'", text,
               json_string_value(json_object_get(want, "text")));
        CHECKF(json_equal(acc, json_object_get(want, "logprobs")), "choice %zu: streamed logprobs differ", c);
        CHECK(nfinish == 1 && finish && !strcmp(finish, json_string_value(json_object_get(want, "finish_reason"))));
        free(text);
        json_decref(acc);
    }
    json_decref(whole);
    json_decref(ev);
}

TEST(stream_equals_whole)
{
    check_stream_equals_whole("\"prompt\":[\"w1 w2 w3\",[3,4,5,1]],\"max_tokens\":12,\"temperature\":0,"
                              "\"logprobs\":3,\"echo\":true");
    check_stream_equals_whole("\"prompt\":\"w7 w8\",\"max_tokens\":20,\"temperature\":1.3,\"seed\":7,\"logprobs\":0");
    /* with stop sequences that cut words and hold text back */
    check_stream_equals_whole("\"prompt\":\"w1 w2\",\"max_tokens\":30,\"temperature\":1.0,\"seed\":3,"
                              "\"logprobs\":2,\"stop\":[\"w1\",\"3 w\"]");
}

/* A stop sequence ends the text where it starts; finish_reason "stop". */
TEST(stop_sequences)
{
    const char *base = "\"prompt\":\"w5 w6\",\"max_tokens\":20,\"temperature\":1.2,\"seed\":11";
    char body[1024];
    snprintf(body, sizeof body, "{%s}", base);
    json_t *a = post_ok(D.port, "/v1/completions", body);
    const char *free_text = json_string_value(json_object_get(json_array_get(json_object_get(a, "choices"), 0), "text"));
    CHECK(free_text && strlen(free_text) > 12);
    if (!free_text) { json_decref(a); return; }
    /* the third word (with its space) as the stop sequence */
    const char *p = free_text;
    for (int i = 0; i < 3 && p; i++) p = strchr(p + 1, ' ');
    char stop[64] = "";
    if (p) sscanf(p, " %60s", stop + 1), stop[0] = ' ';
    CHECK(p && stop[1]);
    const char *at = strstr(free_text, stop);
    snprintf(body, sizeof body, "{%s,\"stop\":\"%s\",\"logprobs\":0}", base, stop);
    json_t *b = post_ok(D.port, "/v1/completions", body);
    json_t *ch = json_array_get(json_object_get(b, "choices"), 0);
    const char *t = json_string_value(json_object_get(ch, "text"));
    CHECKF(t && at && strlen(t) == (size_t)(at - free_text) && !strncmp(t, free_text, strlen(t)),
           "with stop '%s': '%s' (without: '%s')", stop, t ? t : "", free_text);
    CHECK(!strcmp(json_string_value(json_object_get(ch, "finish_reason")), "stop"));
    /* every token reported starts before the cut */
    json_t *offs = json_object_get(json_object_get(ch, "logprobs"), "text_offset");
    for (size_t i = 0; i < json_array_size(offs); i++)
        CHECK(json_integer_value(json_array_get(offs, i)) < 6 + (json_int_t)strlen(t ? t : ""));
    json_decref(a);
    json_decref(b);
}

/* Generation never draws unk_token unless allow_unk; the fixture's
 * distribution gives it about 1/50, so 300 sampled words with it allowed
 * contain some (a fixed seed: the same words every run). */
TEST(no_unk_unless_allowed)
{
    int counts[2] = {0, 0};
    for (int allow = 0; allow < 2; allow++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\":\"zzz w1 zzz\",\"max_tokens\":300,\"temperature\":1.5,\"seed\":5,"
                 "\"logprobs\":0%s}", allow ? ",\"allow_unk\":true" : "");
        json_t *a = post_ok(D.port, "/v1/completions", body);
        json_t *toks = json_object_get(json_object_get(json_array_get(json_object_get(a, "choices"), 0), "logprobs"),
                                       "tokens");
        CHECK(json_array_size(toks) == 300);
        for (size_t i = 0; i < json_array_size(toks); i++)
            counts[allow] += !strcmp(json_string_value(json_array_get(toks, i)), "<unk>");
        json_decref(a);
    }
    CHECKF(counts[0] == 0, "%d <unk> generated without allow_unk", counts[0]);
    CHECKF(counts[1] > 0, "allow_unk: no <unk> in 300 sampled words (the test would prove nothing)");
    /* greedy: the top list of a generated token holds no unk and its
     * probabilities are renormalised (they sum to at most 1) */
    json_t *a = post_ok(D.port, "/v1/completions",
                        "{\"prompt\":\"zzz zzz zzz\",\"max_tokens\":3,\"temperature\":0,\"logprobs\":50}");
    json_t *tops = json_object_get(json_object_get(json_array_get(json_object_get(a, "choices"), 0), "logprobs"),
                                   "top_logprobs");
    for (size_t i = 0; i < json_array_size(tops); i++) {
        json_t *o = json_array_get(tops, i);
        double s = 0;
        const char *k;
        json_t *v;
        json_object_foreach(o, k, v) s += exp(json_number_value(v));
        /* 49 probabilities summed in float: a few ulps */
        CHECKF(fabs(s - 1.0) < 1e-5 && (!json_object_get(o, "<unk>") ||
               json_number_value(json_object_get(o, "<unk>")) < -1e29),
               "position %zu: mass %.9g, unk %s", i, s, json_object_get(o, "<unk>") ? "listed" : "absent");
    }
    json_decref(a);
}

/* ---- session generation ----------------------------------------------------- */

/* The session advances by exactly the words delivered: after a whole
 * stream, a session fed the same words in one feed predicts bit for bit the
 * same (same code, same inputs); "advance": false changes nothing. */
TEST(generate_advances_by_delivered_words)
{
    const char *cache = "{\"neural_size\":40,\"neural_lambda\":0.3,\"unigram_size\":20,\"unigram_lambda\":0.2}";
    char body[512];
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, "{\"id\":\"g%d\",\"cache\":%s}", i, cache);
        json_decref(post_ok(D.port, "/v1/sessions", body));
        json_decref(post_ok(D.port, i ? "/v1/sessions/g1/feed" : "/v1/sessions/g0/feed",
                            "{\"text\":\"w3 w4 w5 w6 w3 w4\"}"));
    }
    json_t *ev = sse_call(D.port, "/v1/sessions/g0/generate", "{\"max_tokens\":7,\"stream\":true,\"logprobs\":2}",
                          NULL, 0);
    size_t n = json_array_size(ev);
    CHECK(n >= 3 && json_is_string(json_array_get(ev, n - 1)));
    char words[512] = "";
    size_t nw = 0;
    for (size_t i = 0; i + 2 < n; i++) {
        json_t *w = json_object_get(json_array_get(ev, i), "words");
        for (size_t k = 0; k < json_array_size(w); k++, nw++) {
            const char *s = json_string_value(json_array_get(w, k));
            snprintf(words + strlen(words), sizeof words - strlen(words), "%s%s", nw ? " " : "",
                     strcmp(s, "<eos>") ? s : "\n");
        }
    }
    json_t *fin = json_array_get(ev, n - 2);
    CHECK(nw == 7 && json_integer_value(json_object_get(fin, "advanced")) == 7 &&
          json_integer_value(json_object_get(fin, "position")) == 13);
    json_t *fb = json_pack("{s:s}", "text", words);
    char *fbs = json_dumps(fb, 0);
    json_decref(post_ok(D.port, "/v1/sessions/g1/feed", fbs));
    free(fbs);
    json_decref(fb);
    json_t *p0 = post_ok(D.port, "/v1/sessions/g0/predict", "{\"top_k\":50}");
    json_t *p1 = post_ok(D.port, "/v1/sessions/g1/predict", "{\"top_k\":50}");
    CHECKF(p0 && p1 && json_equal(p0, p1), "the generating session and one fed the same words predict differently");
    json_t *g = post_ok(D.port, "/v1/sessions/g0/generate", "{\"max_tokens\":3,\"advance\":false}");
    CHECK(json_integer_value(json_object_get(g, "advanced")) == 0 && json_integer_value(json_object_get(g, "position")) == 13);
    json_t *p2 = post_ok(D.port, "/v1/sessions/g0/predict", "{\"top_k\":50}");
    CHECK(p2 && json_equal(p0, p2));
    /* greedy whole answer = greedy stream's words */
    json_decref(g);
    json_decref(p0);
    json_decref(p1);
    json_decref(p2);
    json_decref(ev);
}

/* ---- rescoring ------------------------------------------------------------ */

static json_t *http_get_json(int port, const char *path)
{
    http_resp r;
    json_t *j = NULL;
    if (http_call(port, "GET", path, NULL, NULL, 0, &r) == 0 && r.status == 200)
        j = json_incref(r.json);
    http_resp_free(&r);
    return j;
}

/* Rescoring N hypotheses equals one feed per hypothesis into a copy of the
 * session (its exported state imported under another id), token by token
 * within TOL_FIXTURE_PATHS (the decoder products are batched across
 * hypotheses: GEMMs of other shapes, another summation order; the LSTM and
 * the caches' arithmetic are the feed's), and leaves the session as it was:
 * its next predict is identical, bit for bit. */
TEST(rescore_equals_feeds_and_leaves_session)
{
    const char *hyps[] = {"w5 w6 w7 w3", "w8 zzz w9 zzz", "w3 w3 w3", "w10\nw11 w12", "w4", ""};
    const size_t nh = sizeof hyps / sizeof hyps[0];
    int ok = 1;
    for (int ov = 0; ov < 2; ov++) {
        char body[1024], path[256];
        snprintf(body, sizeof body, "{\"id\":\"r%d\",\"cache\":{\"neural_size\":8,\"neural_lambda\":0.3,\"unigram_size\":6,"
                 "\"unigram_lambda\":0.2%s}}", ov, ov ? ",\"open_vocab\":true,\"uniform_mu\":0.01" : "");
        json_decref(post_ok(D.port, "/v1/sessions", body));
        snprintf(path, sizeof path, "/v1/sessions/r%d/feed", ov);
        json_decref(post_ok(D.port, path, "{\"text\":\"w3 w4 w5 qqq w6 w7 w3 w4 qqq\"}"));
        snprintf(path, sizeof path, "/v1/sessions/r%d/predict", ov);
        json_t *before = post_ok(D.port, path, "{\"full\":true}");
        json_t *hb = json_array();
        for (size_t i = 0; i < nh; i++) json_array_append_new(hb, json_string(hyps[i]));
        json_t *rb = json_pack("{s:o}", "hypotheses", hb);
        char *rbs = json_dumps(rb, 0);
        snprintf(path, sizeof path, "/v1/sessions/r%d/rescore", ov);
        json_t *res = post_ok(D.port, path, rbs);
        free(rbs);
        json_decref(rb);
        snprintf(path, sizeof path, "/v1/sessions/r%d/predict", ov);
        json_t *after = post_ok(D.port, path, "{\"full\":true}");
        CHECKF(before && after && json_equal(before, after), "open_vocab %d: rescoring changed the session", ov);
        json_t *items = json_object_get(res, "hypotheses");
        CHECK(json_array_size(items) == nh);
        /* the reference: the session's state into a new session, fed. With
         * open vocabulary a feed adds its new words to the namespace's word
         * table (|V_full| grows for everyone after it), so there each
         * hypothesis is rescored alone right before its reference feed. */
        http_resp st;
        snprintf(path, sizeof path, "/v1/sessions/r%d/state", ov);
        CHECK(http_call(D.port, "GET", path, NULL, NULL, 0, &st) == 0 && st.status == 200);
        double worst = 0;
        size_t ranks_seen = 0;
        for (size_t i = 0; i < nh && i < json_array_size(items); i++) {
            snprintf(path, sizeof path, "/v1/sessions/copy%d_%zu/state", ov, i);
            http_resp pr;
            CHECK(http_call(D.port, "PUT", path, "application/octet-stream", st.body, st.len, &pr) == 0 &&
                  pr.status / 100 == 2);
            http_resp_free(&pr);
            json_t *it = json_array_get(items, i), *alone = NULL;
            if (ov) {
                json_t *one = json_pack("{s:[s]}", "hypotheses", hyps[i]);
                char *os = json_dumps(one, 0);
                snprintf(path, sizeof path, "/v1/sessions/r%d/rescore", ov);
                alone = post_ok(D.port, path, os);
                free(os);
                json_decref(one);
                it = json_array_get(json_object_get(alone, "hypotheses"), 0);
            }
            snprintf(path, sizeof path, "/v1/sessions/copy%d_%zu/feed", ov, i);
            json_t *fb = json_pack("{s:s,s:b}", "text", hyps[i], "scores", 1);
            char *fbs = json_dumps(fb, 0);
            json_t *fed = hyps[i][0] ? post_ok(D.port, path, fbs) : json_pack("{s:[]}", "logprobs");
            free(fbs);
            json_decref(fb);
            json_t *a = json_object_get(it, "logprobs"), *b = json_object_get(fed, "logprobs");
            CHECKF(json_array_size(a) == json_array_size(b), "hypothesis %zu: %zu vs %zu tokens", i,
                   json_array_size(a), json_array_size(b));
            double sum = 0;
            for (size_t k = 0; k < json_array_size(a) && k < json_array_size(b); k++) {
                double x = json_number_value(json_array_get(a, k)), y = json_number_value(json_array_get(b, k));
                worst = fmax(worst, fabs(x - y));
                sum += x;
            }
            CHECK_NEAR(json_number_value(json_object_get(it, "logprob_sum")), sum, 1e-9 * (1 + fabs(sum)));
            ranks_seen |= (size_t)1 << (json_integer_value(json_object_get(json_array_get(items, i), "rank")) - 1);
            json_decref(fed);
            json_decref(alone);
        }
        CHECKF(worst <= TOL_FIXTURE_PATHS, "open_vocab %d: rescore vs feed differ by up to %g", ov, worst);
        CHECK(ranks_seen == ((size_t)1 << nh) - 1);
        fprintf(stderr, "    open_vocab %d: rescore vs feed up to %.3g\n", ov, worst);
        ok &= worst <= TOL_FIXTURE_PATHS;
        http_resp_free(&st);
        json_decref(before);
        json_decref(after);
        json_decref(res);
    }
    /* top_k: the k best, best first */
    json_t *top = post_ok(D.port, "/v1/sessions/r0/rescore", "{\"hypotheses\":[\"w1\",\"w3 w4\",\"w3\"],\"top_k\":2}");
    json_t *items = json_object_get(top, "hypotheses");
    CHECK(json_array_size(items) == 2 && json_integer_value(json_object_get(json_array_get(items, 0), "rank")) == 1 &&
          json_integer_value(json_object_get(json_array_get(items, 1), "rank")) == 2);
    json_decref(top);
    /* stateless: the hypothesis's tokens as /v1/score gives them after the context */
    json_t *sr = post_ok(D.port, "/v1/rescore", "{\"context\":\"w3 w4 w5\",\"hypotheses\":[\"w6 w7\",\"zzz w3\"],"
                                                "\"cache\":{\"neural_size\":10,\"neural_lambda\":0.25}}");
    const char *full[] = {"w3 w4 w5 w6 w7", "w3 w4 w5 zzz w3"};
    for (int i = 0; i < 2; i++) {
        json_t *b = json_pack("{s:s,s:b,s:{s:i,s:f}}", "text", full[i], "final_eos", 0, "cache", "neural_size", 10,
                              "neural_lambda", 0.25);
        char *bs = json_dumps(b, 0);
        json_t *sc = post_ok(D.port, "/v1/score", bs);
        free(bs);
        json_decref(b);
        json_t *a = json_object_get(json_array_get(json_object_get(sr, "hypotheses"), (size_t)i), "logprobs");
        json_t *w = json_object_get(sc, "logprobs");
        CHECK(json_array_size(a) == 2 && json_array_size(w) == 5);
        for (size_t k = 0; k < 2 && json_array_size(a) == 2; k++)
            CHECK_NEAR(json_number_value(json_array_get(a, k)), json_number_value(json_array_get(w, 3 + k)),
                       TOL_FIXTURE_PATHS);
        json_decref(sc);
    }
    json_decref(sr);
    (void)ok;
    http_resp r;
    http_json(D.port, "POST", "/v1/sessions/r0/rescore", "{\"hypotheses\":[]}", &r);
    CHECK(r.status == 400 && !strcmp(http_error_code(&r), "out_of_range"));
    http_resp_free(&r);
    http_json(D.port, "POST", "/v1/sessions/r0/rescore", "{\"hypotheses\":[\"a\"],\"context\":\"x\"}", &r);
    CHECK(r.status == 400 && !strcmp(http_error_code(&r), "unknown_field"));
    http_resp_free(&r);
}

/* ---- lm-eval's local-completions ------------------------------------------- */

/* `neurocache score` of text: its per-token logprobs (new reference). */
static json_t *cli_score(const char *text)
{
    char path[] = "/tmp/nc-lmeval-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        close(fd);
        return NULL;
    }
    close(fd);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s score --model %s --format json %s 2>/dev/null", daemon_bin_path("neurocache"),
             fixture, path);
    FILE *p = popen(cmd, "r");
    json_t *j = p ? json_loadf(p, 0, NULL) : NULL;
    if (p) pclose(p);
    unlink(path);
    json_t *lp = json_incref(json_object_get(j, "logprobs"));
    json_decref(j);
    return lp;
}

static json_t *lm_tokenize(const char *s)
{
    json_t *b = json_pack("{s:s,s:b}", "prompt", s, "add_special_tokens", 0);
    char *bs = json_dumps(b, 0);
    json_t *r = post_ok(D.port, "/tokenize", bs);
    free(bs);
    json_decref(b);
    json_t *t = json_incref(json_object_get(r, "tokens"));
    json_decref(r);
    return t;
}

/* lm-eval (lm_eval/models/openai_completions.py, api_models.py, utils.py's
 * RemoteTokenizer): GET /tokenizer_info (needs "eos_token"), POST /tokenize
 * {"prompt", "add_special_tokens": false} for the context and the
 * continuation separately, then POST /v1/completions with the token ids
 * (a batch), "echo": true, "logprobs": 1, "temperature": 0, "seed": 1234 and
 * "max_tokens": 1 (current: the sum is token_logprobs[ctxlen:-1]) or 0
 * (older releases: [ctxlen:]); is_greedy compares each token's logprob with
 * the max of its top list with !=. The sums must be `neurocache score`'s
 * (whose first line starts after eos as a completion does), each token
 * within TOL_FIXTURE_PATHS (the echo with top lists reads the full
 * distribution, the CLI the target-only path). */
TEST(lm_eval_loglikelihood)
{
    json_t *info = http_get_json(D.port, "/tokenizer_info");
    CHECK(info && json_is_string(json_object_get(info, "eos_token")));
    json_t *eos = lm_tokenize(json_string_value(json_object_get(info, "eos_token")));
    CHECK(json_array_size(eos) == 1);           /* eos_token_id = encode(eos)[0] */
    json_decref(info);
    const char *ctx[] = {"w1 w2 w3", "w5 zzz w6 w7"}, *cont[] = {" w4 w5", " w8"};
    json_t *prompts = json_array();
    size_t ctxlen[2];
    for (int i = 0; i < 2; i++) {
        json_t *a = lm_tokenize(ctx[i]), *b = lm_tokenize(cont[i]);
        ctxlen[i] = json_array_size(a);
        json_array_extend(a, b);
        json_array_append_new(prompts, a);
        json_decref(b);
    }
    for (int shape = 0; shape < 2; shape++) {
        json_t *req = json_pack("{s:s,s:O,s:i,s:i,s:i,s:i,s:b}", "model", "lstm-2layer", "prompt", prompts,
                                "temperature", 0, "max_tokens", shape ? 0 : 1, "logprobs", 1, "seed", 1234, "echo", 1);
        char *rs = json_dumps(req, 0);
        json_t *out = post_ok(D.port, "/v1/completions", rs);
        free(rs);
        json_decref(req);
        json_t *choices = json_object_get(out, "choices");
        CHECK(json_array_size(choices) == 2);
        for (size_t i = 0; i < json_array_size(choices); i++) {
            json_t *lo = json_object_get(json_array_get(choices, i), "logprobs");
            json_t *tl = json_object_get(lo, "token_logprobs"), *top = json_object_get(lo, "top_logprobs");
            size_t end = json_array_size(tl) - (shape ? 0 : 1);
            CHECK(json_array_size(tl) == json_array_size(json_array_get(prompts, i)) + (shape ? 0 : 1));
            double sum = 0;
            bool greedy = true, greedy_by_word = true;
            for (size_t k = ctxlen[i]; k < end; k++) {
                double v = json_number_value(json_array_get(tl, k)), best = -INFINITY;
                const char *key, *bestw = "";
                json_t *x;
                json_object_foreach(json_array_get(top, k), key, x)
                    if (json_number_value(x) > best) best = json_number_value(x), bestw = key;
                sum += v;
                greedy = greedy && v == best;
                greedy_by_word = greedy_by_word &&
                                 !strcmp(bestw, json_string_value(json_array_get(json_object_get(lo, "tokens"), k)));
            }
            /* the argmax's logprob is its top entry's exactly */
            CHECKF(greedy == greedy_by_word, "prompt %zu: is_greedy by value %d, by word %d", i, greedy, greedy_by_word);
            char text[256];
            snprintf(text, sizeof text, "%s%s", ctx[i], cont[i]);
            json_t *cli = cli_score(text);
            size_t nt = json_array_size(cli);
            double want = 0;
            /* the CLI ends the text's last line with eos: one more token */
            for (size_t k = ctxlen[i]; k < end && k < nt; k++) want += json_number_value(json_array_get(cli, k));
            CHECK(nt == end + 1);
            CHECK_NEAR(sum, want, (double)(end - ctxlen[i]) * TOL_FIXTURE_PATHS);
            json_decref(cli);
        }
        json_decref(out);
    }
    /* /detokenize gives the text back, as RemoteTokenizer.decode reads it */
    json_t *b = json_pack("{s:O}", "tokens", json_array_get(prompts, 0));
    char *bs = json_dumps(b, 0);
    json_t *d = post_ok(D.port, "/detokenize", bs);
    CHECK(d && !strcmp(json_string_value(json_object_get(d, "prompt")), "w1 w2 w3 w4 w5"));
    free(bs);
    json_decref(b);
    json_decref(d);
    /* generate_until: token-id prompt, a list of stops including eos_token */
    json_t *g = post_ok(D.port, "/v1/completions", "{\"prompt\":[[3,4,5]],\"model\":\"m\",\"max_tokens\":16,"
                                                   "\"temperature\":0,\"stop\":[\"\\n\\n\",\"<eos>\"],\"seed\":1234}");
    CHECK(g && json_array_size(json_object_get(g, "choices")) == 1);
    json_decref(g);
    json_decref(prompts);
    json_decref(eos);
}

/* ---- cancellation (demo model: tokens take long enough to watch) ---------- */

/* A client that closes its stream frees the worker at the next token: the
 * worker is busy while the stream runs, idle soon after the close (well
 * before the rest of the generation could have run: the whole request is
 * timed first on this machine), the stop is counted as client_gone, and a
 * session stream advances the session by at least the events read and
 * fewer words than were asked. */
TEST(cancel_frees_worker)
{
    const char *model = getenv("NC_DEMO_MODEL") ? getenv("NC_DEMO_MODEL") : "models/demo";
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "    %s absent: cancellation checked on the fixture only\n", model);
        model = fixture;
    }
    /* a request_timeout far past the whole stream: under ThreadSanitizer
     * (make tsan) the 4000 tokens outlast the default 30 s, and the timed
     * whole stream must be whole */
    const char *args[] = {"--model", model, "--threads", "1", "--max-completion-tokens", "4000",
                          "--max-generation-steps", "100000", "--max-tokens-per-request", "100000",
                          "--request-timeout", "900", NULL};
    nc_daemon d;
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    const char *body = "{\"prompt\":\"the company said\",\"max_tokens\":4000,\"temperature\":0,\"logprobs\":5,\"stream\":true}";
    double t0 = now_s();
    json_t *all = sse_call(d.port, "/v1/completions", body, NULL, 0);
    double whole = now_s() - t0;
    CHECK(json_array_size(all) > 4000);
    json_decref(all);
    double gone0 = -1;
    {
        http_resp r;
        if (http_call(d.port, "GET", "/metrics", NULL, NULL, 0, &r) == 0 && r.body) {
            const char *p = strstr(r.body, "neurocache_work_stopped_total{reason=\"client_gone\"} ");
            if (p) gone0 = strtod(p + strlen("neurocache_work_stopped_total{reason=\"client_gone\"} "), NULL);
        }
        http_resp_free(&r);
    }
    int fd = raw_post_as(d.port, "1.0", "/v1/completions", body);
    char *first = raw_read_events(fd, 2, 30);
    CHECK(strstr(first, "data: {") != NULL);
    free(first);
    CHECK(daemon_metric(d.port, "neurocache_work_running") == 1);
    double tc = now_s();
    close(fd);
    double freed = -1;
    while (now_s() - tc < 30) {
        if (daemon_metric(d.port, "neurocache_work_running") == 0) {
            freed = now_s() - tc;
            break;
        }
        sleep_ms(5);
    }
    fprintf(stderr, "    whole stream of 4000 tokens %.2f s; worker free %.0f ms after the close\n", whole, freed * 1e3);
    CHECKF(freed >= 0 && freed < whole / 4 && freed <= 1.0, "worker free %.3f s after the close (whole stream %.3f s)",
           freed, whole);
    http_resp r;
    CHECK(http_call(d.port, "GET", "/metrics", NULL, NULL, 0, &r) == 0 && r.body);
    const char *p = r.body ? strstr(r.body, "neurocache_work_stopped_total{reason=\"client_gone\"} ") : NULL;
    CHECK(p && strtod(p + strlen("neurocache_work_stopped_total{reason=\"client_gone\"} "), NULL) == gone0 + 1);
    http_resp_free(&r);
    /* a session's stream, cancelled after 3 events */
    json_decref(post_ok(d.port, "/v1/sessions", "{\"id\":\"c\"}"));
    fd = raw_post_as(d.port, "1.0", "/v1/sessions/c/generate", "{\"max_tokens\":4000,\"stream\":true,\"logprobs\":5}");
    char *got = raw_read_events(fd, 3, 30);
    close(fd);
    int events = 0;
    for (const char *q = got; (q = strstr(q, "data: {\"text\"")); q++) events++;
    free(got);
    CHECK(events >= 3);
    for (double t = now_s(); now_s() - t < 10 && daemon_metric(d.port, "neurocache_work_running") != 0;) sleep_ms(5);
    json_t *s = http_get_json(d.port, "/v1/sessions/c");
    json_int_t pos = json_integer_value(json_object_get(s, "tokens"));
    CHECKF(pos >= events && pos < 4000, "the session advanced by %lld words (%d events read, 4000 asked)",
           (long long)pos, events);
    json_decref(s);
    CHECK(daemon_stop(&d) == 0);
}

int main(void)
{
    snprintf(fixture, sizeof fixture, "%s/lstm-2layer", harness_fixtures());
    httpc_init();
    const char *args[] = {"--model", fixture, NULL};
    if (daemon_start(&D, args) != 0) {
        CHECK(!"daemon started");
        return harness_summary();
    }
    RUN(stream_equals_whole);
    RUN(stop_sequences);
    RUN(no_unk_unless_allowed);
    RUN(generate_advances_by_delivered_words);
    RUN(rescore_equals_feeds_and_leaves_session);
    RUN(lm_eval_loglikelihood);
    if (harness_failed)
        daemon_dump_log(&D);
    CHECK(daemon_stop(&D) == 0);
    RUN(cancel_frees_worker);
    httpc_cleanup();
    return harness_summary();
}
