/* test_http_badinput.c -- malformed, wrong and hostile requests against the
 * real daemon: each must get its documented status and error code, and
 * afterwards the daemon and the session they aimed at must answer exactly as
 * before. Under `make asan` this also checks that no error path leaks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "harness.h"

static nc_daemon D;

typedef struct {
    const char *method, *path, *ctype;
    const char *body;
    long len;                     /* -1 = strlen(body) */
    long status;
    const char *code;
} bad_case;

/* "{S}" in a path is replaced by a live session id. */
static const bad_case cases[] = {
    /* malformed JSON and bodies */
    {"POST", "/v1/score", "application/json", "{", -1, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "not json at all", -1, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "{\"text\": \"a\",}", -1, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "[1, 2, 3]", -1, 400, "invalid_type"},
    {"POST", "/v1/score", "application/json", "\"just a string\"", -1, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "", -1, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "{\"text\": NaN}", -1, 400, "invalid_json"},
    {"POST", "/v1/sessions/{S}/predict", "application/json", "{\"top_k\": 99999999999999999999999}", -1, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"a\\u0000b\"}", -1, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"a\0b\"}", 13, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"w1\"}\0garbage", 21, 400, "invalid_json"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"\\ud800\"}", -1, 400, "invalid_json"},
    /* invalid UTF-8 */
    {"POST", "/v1/score", "application/json", "{\"text\":\"w1 \xff\xfe w2\"}", -1, 400, "invalid_utf8"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"\xc0\xaf\"}", -1, 400, "invalid_utf8"},
    {"POST", "/v1/sessions/{S}/feed", "application/json", "{\"text\":\"\xed\xa0\x80\"}", -1, 400, "invalid_utf8"},
    /* wrong types, missing and unknown fields */
    {"POST", "/v1/score", "application/json", "{\"text\": 5}", -1, 400, "invalid_type"},
    {"POST", "/v1/score", "application/json", "{\"text\": [\"w1\"]}", -1, 400, "invalid_type"},
    {"POST", "/v1/score", "application/json", "{}", -1, 400, "missing_field"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"w1\",\"colour\":1}", -1, 400, "unknown_field"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"w1\",\"bos\":\"maybe\"}", -1, 400, "out_of_range"},
    {"POST", "/v1/score", "application/json", "{\"text\":\"w1\",\"cache\":{\"global_norm\":\"x\"}}", -1, 400, "invalid_type"},
    {"POST", "/v1/sessions/{S}/predict", "application/json", "{\"top_k\": 0}", -1, 400, "out_of_range"},
    {"POST", "/v1/sessions/{S}/predict", "application/json", "{\"top_k\": 1000000000}", -1, 400, "out_of_range"},
    {"POST", "/v1/sessions/{S}/predict", "application/json", "{\"top_k\": \"5\"}", -1, 400, "invalid_type"},
    {"POST", "/v1/sessions/{S}/predict", "application/json", "{\"top_k\": 2.5}", -1, 400, "invalid_type"},
    {"POST", "/v1/sessions/{S}/predict", "application/json", "{\"full\": \"yes\"}", -1, 400, "invalid_type"},
    {"POST", "/v1/sessions/{S}/feed", "application/json", "{\"text\":\"w1\",\"scores\":1}", -1, 400, "invalid_type"},
    {"POST", "/v1/sessions/{S}/feed", "application/json", "{\"scores\":true}", -1, 400, "missing_field"},
    {"POST", "/v1/sessions", "application/json", "{\"cache\":{\"neural_lambda\":2}}", -1, 400, "out_of_range"},
    {"POST", "/v1/sessions", "application/json", "{\"cache\":{\"neural_size\":-1}}", -1, 400, "out_of_range"},
    {"POST", "/v1/sessions", "application/json", "{\"cache\":\"big\"}", -1, 400, "invalid_type"},
    {"POST", "/v1/sessions", "application/json", "{\"cache\":{\"size\":3}}", -1, 400, "unknown_field"},
    {"POST", "/v1/sessions", "application/json", "{\"id\":\"bad id!\"}", -1, 400, "out_of_range"},
    {"POST", "/v1/sessions", "application/json", "{\"id\":\"{S}\"}", -1, 409, "conflict"},
    {"POST", "/v1/completions", "application/json", "{\"max_tokens\":1}", -1, 400, "missing_field"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":5}", -1, 400, "invalid_type"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":[99999]}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":[-1]}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":[[1,2],[\"x\"]]}", -1, 400, "invalid_type"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"max_tokens\":-1}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"max_tokens\":100000000}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"temperature\":-1}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"top_p\":0}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"logprobs\":1000000}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"n\":2}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"echo\":\"yes\"}", -1, 400, "invalid_type"},
    /* completions reads a list of fields too: a misspelt one is an error, not ignored */
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"max_token\":5}", -1, 400, "unknown_field"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"stream\":true,\"stream_options\":{\"usage\":true}}",
     -1, 400, "unknown_field"},
    /* OpenAI's fields it does not use: accepted only at values asking for nothing */
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"frequency_penalty\":0.5}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"presence_penalty\":1}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"best_of\":3}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"logit_bias\":{\"5\":10}}", -1, 400, "out_of_range"},
    {"POST", "/v1/completions", "application/json", "{\"prompt\":\"w1\",\"suffix\":\"end\"}", -1, 400, "out_of_range"},
    {"POST", "/v1/chat/completions", "application/json", "{\"messages\":[]}", -1, 404, "not_found"},
    {"POST", "/detokenize", "application/json", "{\"tokens\":\"abc\"}", -1, 400, "invalid_type"},
    {"POST", "/detokenize", "application/json", "{\"tokens\":[1.5]}", -1, 400, "invalid_type"},
    {"POST", "/detokenize", "application/json", "{\"tokens\":[1000]}", -1, 400, "out_of_range"},
    {"POST", "/tokenize", "application/json", "{\"prompt\":{}}", -1, 400, "invalid_type"},
    /* content type */
    {"POST", "/v1/score", "text/plain", "{\"text\":\"w1\"}", -1, 415, "unsupported_media_type"},
    {"POST", "/v1/score", NULL, "{\"text\":\"w1\"}", -1, 415, "unsupported_media_type"},
    {"POST", "/v1/score", "application/x-www-form-urlencoded", "text=w1", -1, 415, "unsupported_media_type"},
    {"POST", "/v1/score", "application/jsonx", "{\"text\":\"w1\"}", -1, 415, "unsupported_media_type"},
    /* routes, methods, sessions */
    {"GET", "/nonexistent", NULL, NULL, 0, 404, "not_found"},
    {"GET", "/v1", NULL, NULL, 0, 404, "not_found"},
    {"GET", "/v1/sessions/{S}/feed/extra", NULL, NULL, 0, 404, "not_found"},
    {"GET", "/v1/sessions/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", NULL, NULL, 0, 404, "not_found"},
    {"PUT", "/v1/score", "application/json", "{\"text\":\"w1\"}", -1, 405, "method_not_allowed"},
    {"GET", "/v1/score", NULL, NULL, 0, 405, "method_not_allowed"},
    {"DELETE", "/health", NULL, NULL, 0, 405, "method_not_allowed"},
    {"PATCH", "/v1/sessions/{S}", "application/json", "{}", -1, 405, "method_not_allowed"},
    {"GET", "/v1/sessions/no-such-session", NULL, NULL, 0, 404, "session_not_found"},
    {"DELETE", "/v1/sessions/no-such-session", NULL, NULL, 0, 404, "session_not_found"},
    {"POST", "/v1/sessions/no-such-session/feed", "application/json", "{\"text\":\"w1\"}", -1, 404, "session_not_found"},
    {"POST", "/v1/sessions/no-such-session/predict", "application/json", "{}", -1, 404, "session_not_found"},
};

/* Replaces "{S}" with sid. */
static void subst(const char *in, const char *sid, char *out, size_t cap)
{
    const char *p = strstr(in, "{S}");
    if (!p) {
        snprintf(out, cap, "%s", in);
        return;
    }
    snprintf(out, cap, "%.*s%s%s", (int)(p - in), in, sid, p + 3);
}

static char sid[128];
static double before_lp[64];
static size_t before_n;
static char before_top[64];
static double before_top_p;

/* The session's next-word answer and a fixed score: what must not change. */
static int snapshot(char *top, double *top_p, double *lp, size_t *n, long *position)
{
    http_resp r;
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
    int ok = http_json(D.port, "POST", path, "{\"top_k\":1}", &r) == 0 && r.status == 200;
    if (ok) {
        json_t *it = json_array_get(json_object_get(r.json, "predictions"), 0);
        snprintf(top, 64, "%s", json_string_value(json_object_get(it, "word")));
        *top_p = json_number_value(json_object_get(it, "prob"));
        *position = (long)json_integer_value(json_object_get(r.json, "position"));
    }
    http_resp_free(&r);
    ok = ok && http_json(D.port, "POST", "/v1/score", "{\"text\":\"w1 w2 w3\\nw4 zzz w5\\n\"}", &r) == 0 &&
         r.status == 200;
    if (ok) {
        json_t *a = json_object_get(r.json, "logprobs");
        *n = json_array_size(a);
        for (size_t i = 0; i < *n && i < 64; i++) lp[i] = json_number_value(json_array_get(a, i));
    }
    http_resp_free(&r);
    return ok ? 0 : -1;
}

TEST(malformed_requests)
{
    size_t n = sizeof cases / sizeof cases[0];
    CHECK(n >= 30);
    for (size_t i = 0; i < n; i++) {
        const bad_case *c = &cases[i];
        char path[512], body[512];
        subst(c->path, sid, path, sizeof path);
        const char *b = c->body;
        size_t len = c->body ? (c->len < 0 ? strlen(c->body) : (size_t)c->len) : 0;
        if (c->body && c->len < 0 && strstr(c->body, "{S}")) {
            subst(c->body, sid, body, sizeof body);
            b = body;
            len = strlen(body);
        }
        http_resp r;
        int rc = http_call(D.port, c->method, path, c->ctype, b, len, &r);
        CHECKF(rc == 0 && r.status == c->status && strcmp(http_error_code(&r), c->code) == 0,
               "case %zu: %s %.60s: got %ld %s, want %ld %s (%s)", i, c->method, path, r.status,
               http_error_code(&r), c->status, c->code, r.body ? r.body : "");
        CHECKF(r.json && json_is_string(json_object_get(json_object_get(r.json, "error"), "message")),
               "case %zu: no error message", i);
        if (c->status == 405)
            CHECKF(r.allow[0] != 0, "case %zu: 405 without Allow", i);
        CHECKF(r.len > 0 && r.body[r.len - 1] == '\n', "case %zu: the answer does not end with a newline", i);
        http_resp_free(&r);
    }
}

/* An unknown field names the nearest field of its request kind (one list
 * each), or the knob it was meant to be: one line, the exact message. */
TEST(unknown_fields_name_the_nearest)
{
    static const struct {
        const char *path, *body, *message;
    } cases[] = {
        {"/v1/sessions", "{\"cache\":{\"neural_sise\":5}}", "unknown field 'neural_sise' (did you mean 'neural_size'?)"},
        /* a command-line name inside "cache": its knob */
        {"/v1/sessions", "{\"cache\":{\"theta\":0.5}}", "unknown field 'theta' (did you mean 'neural_theta'?)"},
        {"/v1/sessions", "{\"cache\":{\"neural-size\":5}}", "unknown field 'neural-size' (did you mean 'neural_size'?)"},
        {"/v1/sessions", "{\"namepsace\":\"x\"}", "unknown field 'namepsace' (did you mean 'namespace'?)"},
        /* a knob outside "cache" */
        {"/v1/sessions", "{\"neural_size\":5}",
         "unknown field 'neural_size' (did you mean \"cache\": {\"neural_size\": ...}? knobs go in the cache object)"},
        {"/v1/score", "{\"txt\":\"w1\"}", "unknown field 'txt' (did you mean 'text'?)"},
        {"/v1/score", "{\"text\":\"w1\",\"unigram_lambda\":0.2}",
         "unknown field 'unigram_lambda' (did you mean \"cache\": {\"unigram_lambda\": ...}? knobs go in the cache object)"},
        {"/v1/sessions/{S}/predict", "{\"topk\":3}", "unknown field 'topk' (did you mean 'top_k'?)"},
        {"/v1/sessions/{S}/feed", "{\"text\":\"w1\",\"score\":true}", "unknown field 'score' (did you mean 'scores'?)"},
        {"/v1/sessions/{S}/generate", "{\"max_token\":2}", "unknown field 'max_token' (did you mean 'max_tokens'?)"},
        {"/v1/sessions/{S}/rescore", "{\"hypothesis\":[\"w1\"]}", "unknown field 'hypothesis' (did you mean 'hypotheses'?)"},
        {"/v1/rescore", "{\"hypotheses\":[\"w1\"],\"contxt\":\"w2\"}", "unknown field 'contxt' (did you mean 'context'?)"},
        {"/v1/completions", "{\"prompt\":\"w1\",\"max_token\":5}", "unknown field 'max_token' (did you mean 'max_tokens'?)"},
        {"/v1/completions", "{\"prompt\":\"w1\",\"temprature\":0}", "unknown field 'temprature' (did you mean 'temperature'?)"},
        {"/tokenize", "{\"promt\":\"w1\"}", "unknown field 'promt' (did you mean 'prompt'?)"},
        {"/detokenize", "{\"token\":[1]}", "unknown field 'token' (did you mean 'tokens'?)"},
        /* nothing near: the field alone */
        {"/v1/score", "{\"text\":\"w1\",\"colour\":1}", "unknown field 'colour'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[256];
        subst(cases[i].path, sid, path, sizeof path);
        http_resp r;
        CHECK(http_json(D.port, "POST", path, cases[i].body, &r) == 0);
        json_t *m = json_object_get(json_object_get(r.json, "error"), "message");
        CHECKF(r.status == 400 && !strcmp(http_error_code(&r), "unknown_field") && json_is_string(m) &&
                   !strcmp(json_string_value(m), cases[i].message),
               "%s %s: %ld %s, want '%s'", path, cases[i].body, r.status, r.body, cases[i].message);
        http_resp_free(&r);
    }
    /* the fields OpenAI clients send and this server ignores still pass */
    http_resp r;
    CHECK(http_json(D.port, "POST", "/v1/completions",
                    "{\"prompt\":\"w1\",\"max_tokens\":1,\"model\":\"x\",\"user\":\"u\",\"n\":1,\"best_of\":1,"
                    "\"presence_penalty\":0,\"frequency_penalty\":0,\"logit_bias\":{},\"suffix\":\"\",\"stop\":[\"\\n\"]}",
                    &r) == 0);
    CHECKF(r.status == 200, "OpenAI's defaults: %ld %s", r.status, r.body);
    http_resp_free(&r);
    /* /v1/chat/completions: a 404 that says where to go */
    CHECK(http_json(D.port, "POST", "/v1/chat/completions", "{\"model\":\"x\",\"messages\":[]}", &r) == 0);
    json_t *m = json_object_get(json_object_get(r.json, "error"), "message");
    CHECKF(r.status == 404 && json_is_string(m) && strstr(json_string_value(m), "use /v1/completions"), "chat: %ld %s",
           r.status, r.body);
    http_resp_free(&r);
}

/* Every JSON answer is one line ending with a newline, successes and errors
 * (the socket gate's 400 for bytes that are not HTTP: test_server_guard). */
TEST(json_answers_end_with_a_newline)
{
    char predict[256];
    snprintf(predict, sizeof predict, "/v1/sessions/%s/predict", sid);
    const struct {
        const char *method, *path, *body;
    } ok[] = {
        {"GET", "/health", NULL},
        {"GET", "/ready", NULL},
        {"GET", "/v1/model", NULL},
        {"GET", "/v1/sessions", NULL},
        {"POST", predict, "{\"top_k\":2}"},
        {"POST", "/v1/score", "{\"text\":\"w1 w2\"}"},
        {"POST", "/tokenize", "{\"prompt\":\"w1 w2\"}"},
        {"POST", "/v1/completions", "{\"prompt\":\"w1\",\"max_tokens\":2}"},
        {"GET", "/nonexistent", NULL},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        http_resp r;
        CHECK(http_json(D.port, ok[i].method, ok[i].path, ok[i].body, &r) == 0);
        CHECKF(r.json && r.len > 1 && r.body[r.len - 1] == '\n' && !memchr(r.body, '\n', r.len - 1),
               "%s %s: '%s' is not one line ending with a newline", ok[i].method, ok[i].path, r.body ? r.body : "");
        http_resp_free(&r);
    }
}

/* Deeply nested JSON (past jansson's depth limit) and a huge body. */
TEST(hostile_bodies)
{
    size_t depth = 20000;   /* 40 KB: under the body limit, past jansson's depth limit */
    char *deep = malloc(2 * depth + 32);
    size_t len = (size_t)sprintf(deep, "{\"text\":\"w1\",\"cache\":");
    for (size_t i = 0; i < depth; i++) deep[len++] = '[';
    for (size_t i = 0; i < depth; i++) deep[len++] = ']';
    deep[len++] = '}';
    http_resp r;
    CHECK(http_call(D.port, "POST", "/v1/score", "application/json", deep, len, &r) == 0);
    CHECKF(r.status == 400 && strcmp(http_error_code(&r), "invalid_json") == 0, "deep: %ld %s", r.status, r.body);
    http_resp_free(&r);
    /* Nested objects within the limit but of the wrong type. */
    len = (size_t)sprintf(deep, "{\"text\":\"w1\",\"cache\":{\"neural_size\":");
    for (size_t i = 0; i < 1000; i++) len += (size_t)sprintf(deep + len, "{\"a\":");
    len += (size_t)sprintf(deep + len, "1");
    for (size_t i = 0; i < 1000; i++) deep[len++] = '}';
    len += (size_t)sprintf(deep + len, "}}");
    CHECK(http_call(D.port, "POST", "/v1/score", "application/json", deep, len, &r) == 0);
    CHECKF(r.status == 400 && strcmp(http_error_code(&r), "invalid_type") == 0, "nested: %ld %s", r.status, r.body);
    http_resp_free(&r);
    free(deep);
    /* The daemon runs with --max-body-bytes 65536. */
    size_t big = 300000;
    char *huge = malloc(big + 32);
    len = (size_t)sprintf(huge, "{\"text\":\"");
    while (len < big) { memcpy(huge + len, "w1 w2 ", 6); len += 6; }
    len += (size_t)sprintf(huge + len, "\"}");
    CHECK(http_call(D.port, "POST", "/v1/score", "application/json", huge, len, &r) == 0);
    CHECKF(r.status == 413 && strcmp(http_error_code(&r), "body_too_large") == 0, "huge: %ld %s", r.status, r.body);
    http_resp_free(&r);
    /* Under the body limit but over --max-tokens-per-request 2000. */
    len = (size_t)sprintf(huge, "{\"text\":\"");
    for (int i = 0; i < 3000; i++) len += (size_t)sprintf(huge + len, "w1 ");
    len += (size_t)sprintf(huge + len, "\"}");
    CHECK(http_call(D.port, "POST", "/v1/score", "application/json", huge, len, &r) == 0);
    CHECKF(r.status == 413 && strcmp(http_error_code(&r), "too_many_tokens") == 0, "tokens: %ld %s", r.status, r.body);
    http_resp_free(&r);
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
    CHECK(http_call(D.port, "POST", path, "application/json", huge, len, &r) == 0);
    CHECKF(r.status == 413 && strcmp(http_error_code(&r), "too_many_tokens") == 0, "feed tokens: %ld %s", r.status, r.body);
    http_resp_free(&r);
    /* Completions: prompt + max_tokens over the token limit. */
    CHECK(http_json(D.port, "POST", "/v1/completions", "{\"prompt\":\"w1\",\"max_tokens\":1024}", &r) == 0);
    CHECK(r.status == 200);   /* 1025 <= 2000 */
    http_resp_free(&r);
    free(huge);
}

TEST(still_healthy_and_unchanged)
{
    char top[64];
    double top_p, lp[64];
    size_t n;
    long pos;
    CHECK(snapshot(top, &top_p, lp, &n, &pos) == 0);
    CHECK(strcmp(top, before_top) == 0);
    CHECK_NEAR(top_p, before_top_p, 1e-9);
    CHECK(pos == 6);
    CHECK(n == before_n);
    for (size_t i = 0; i < n && i < before_n; i++)
        CHECK_NEAR(lp[i], before_lp[i], 1e-9);
    http_resp r;
    CHECK(http_json(D.port, "GET", "/health", NULL, &r) == 0 && r.status == 200);
    http_resp_free(&r);
    CHECK(http_json(D.port, "GET", "/ready", NULL, &r) == 0 && r.status == 200);
    http_resp_free(&r);
    CHECK(http_json(D.port, "GET", "/metrics", NULL, &r) == 0 && r.status == 200);
    CHECK_STR_CONTAINS(r.body, "status=\"400\"");
    CHECK_STR_CONTAINS(r.body, "status=\"413\"");
    CHECK_STR_CONTAINS(r.body, "endpoint=\"unmatched\",status=\"404\"");
    http_resp_free(&r);
}

int main(void)
{
    httpc_init();
    char model_dir[512];
    snprintf(model_dir, sizeof model_dir, "%s/lstm-2layer", harness_fixtures());
    const char *args[] = {"--model", model_dir, "--max-body-bytes", "65536",
                          "--max-tokens-per-request", "2000", NULL};
    if (daemon_start(&D, args) != 0) {
        CHECK(0);
        return harness_summary();
    }
    http_resp r;
    if (http_json(D.port, "POST", "/v1/sessions", "{\"cache\":{\"neural_size\":50}}", &r) == 0 && r.status == 201)
        snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
    CHECK(http_json(D.port, "POST", path, "{\"text\":\"w1 w2 w3 w4 w5 w6\"}", &r) == 0 && r.status == 200);
    http_resp_free(&r);
    long pos = 0;
    CHECK(snapshot(before_top, &before_top_p, before_lp, &before_n, &pos) == 0 && pos == 6);
    RUN(malformed_requests);
    RUN(unknown_fields_name_the_nearest);
    RUN(json_answers_end_with_a_newline);
    RUN(hostile_bodies);
    RUN(still_healthy_and_unchanged);
    CHECK(daemon_stop(&D) == 0);
    httpc_cleanup();
    return harness_summary();
}
