/* test_normalize_server.c -- ordinary text through the real daemon on the
 * demo model (PTB conventions declared in models/demo/config.json): every
 * /v1/tokenize offset and completions' text_offset points at the first
 * character of its word in the original text (punctuation, quotes,
 * numbers, non-ASCII letters), the newcomer's sentence scores with its
 * words known and unk_count in the answer, "normalize": false and
 * ?normalize=false take text as already normalised, the conventions show
 * in GET /v1/model, and a model without them (the fixture) is unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "harness.h"

static const char *demo = "models/demo";
static const char *fixture = "tests/fixtures/lstm-2layer";

/* A raw paragraph and, per token, the word and the original characters it
 * was read from ("" for an eos at a sentence end is its stop). */
static const char PARA[] = "\xe2\x80\x9cWell, Prince\xe2\x80\x94Genoa\xe2\x80\x99s 1,805 roubles!\xe2\x80\x9d said Anna "
                           "P\xc3\xa1vlovna. She didn\xe2\x80\x99t (really) care; \xc2\xabN\xc3\xa4" "chstes Jahr\xc2\xbb, "
                           "3.5% of U.S. co-workers.";
static const struct { const char *word, *src; } WANT[] = {
    {"well", "Well"}, {"prince", "Prince"}, {"genoa", "Genoa"}, {"'s", "\xe2\x80\x99s"}, {"N", "1,805"},
    {"roubles", "roubles"}, {"said", "said"}, {"anna", "Anna"}, {"pavlovna", "P\xc3\xa1vlovna"}, {"<eos>", "."},
    {"she", "She"}, {"did", "did"}, {"n't", "n\xe2\x80\x99t"}, {"really", "really"}, {"care", "care"},
    {"<eos>", ";"}, {"nachstes", "N\xc3\xa4" "chstes"}, {"jahr", "Jahr"}, {"N", "3.5"}, {"of", "of"},
    {"u.s.", "U.S."}, {"co-workers", "co-workers"}, {"<eos>", "."},
};
#define NWANT (sizeof WANT / sizeof WANT[0])

static json_t *call(int port, const char *method, const char *path, json_t *body, long *status)
{
    char *b = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    http_resp r;
    json_t *j = NULL;
    *status = -1;
    if (http_json(port, method, path, b, &r) == 0) {
        *status = r.status;
        j = r.json ? json_incref(r.json) : NULL;
    }
    http_resp_free(&r);
    free(b);
    return j;
}

/* The byte where code point k of PARA starts (its length: past the end). */
static size_t cp_byte(json_int_t k)
{
    size_t b = 0;
    for (; b < sizeof PARA - 1; b++)
        if (((unsigned char)PARA[b] & 0xC0) != 0x80 && k-- == 0)
            break;
    return b;
}

/* The original characters [off, off + len) of PARA: the API counts code
 * points (docs/api.md), not bytes. */
static void span(json_int_t off, json_int_t len, char *out, size_t n)
{
    size_t chars = 0;
    for (size_t i = 0; i < sizeof PARA - 1; i++)
        chars += ((unsigned char)PARA[i] & 0xC0) != 0x80;
    if (off < 0 || len < 0 || (size_t)(off + len) > chars) {
        snprintf(out, n, "<outside: %lld+%lld>", (long long)off, (long long)len);
        return;
    }
    size_t a = cp_byte(off), b = cp_byte(off + len);
    snprintf(out, n, "%.*s", (int)(b - a), PARA + a);
}

TEST(tokenize_offsets)
{
    nc_daemon d;
    const char *args[] = {"--model", demo, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    long st;
    json_t *o = call(d.port, "POST", "/tokenize", json_pack("{s:s}", "text", PARA), &st);
    CHECK(st == 200 && o);
    json_t *words = json_object_get(o, "words"), *offs = json_object_get(o, "offsets"),
           *lens = json_object_get(o, "lengths"), *unk = json_object_get(o, "unk");
    CHECKF(json_array_size(words) == NWANT, "%zu tokens, want %zu", json_array_size(words), NWANT);
    size_t nunk = 0;
    for (size_t i = 0; i < NWANT && i < json_array_size(words); i++) {
        char got[64];
        span(json_integer_value(json_array_get(offs, i)), json_integer_value(json_array_get(lens, i)), got,
             sizeof got);
        const char *w = json_string_value(json_array_get(words, i));
        CHECKF(!strcmp(w, WANT[i].word) && !strcmp(got, WANT[i].src), "token %zu: '%s' from '%s', want '%s' from '%s'",
               i, w, got, WANT[i].word, WANT[i].src);
        nunk += json_is_true(json_array_get(unk, i));
    }
    CHECK(json_integer_value(json_object_get(o, "unk_count")) == (json_int_t)nunk && nunk > 0);

    /* completions: the echoed prompt's text_offset are the same offsets,
     * into the prompt the client sent */
    json_t *c = call(d.port, "POST", "/v1/completions",
                     json_pack("{s:s,s:b,s:i,s:i,s:f}", "prompt", PARA, "echo", 1, "logprobs", 0, "max_tokens", 1,
                               "temperature", 0.0), &st);
    CHECK(st == 200 && c);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    json_t *to = json_object_get(json_object_get(ch, "logprobs"), "text_offset");
    CHECKF(json_array_size(to) == NWANT + 1, "%zu text_offset entries", json_array_size(to));
    for (size_t i = 0; i < NWANT && i < json_array_size(to); i++)
        CHECKF(json_integer_value(json_array_get(to, i)) == json_integer_value(json_array_get(offs, i)),
               "text_offset[%zu] = %lld, /tokenize offset %lld", i, (long long)json_integer_value(json_array_get(to, i)),
               (long long)json_integer_value(json_array_get(offs, i)));
    CHECK(!strncmp(json_string_value(json_object_get(ch, "text")), PARA, sizeof PARA - 1));
    json_t *usage = json_object_get(c, "usage");
    CHECK(json_integer_value(json_object_get(usage, "unk_count")) == (json_int_t)nunk);
    json_decref(c);
    json_decref(o);

    /* the conventions are visible */
    o = call(d.port, "GET", "/v1/model", NULL, &st);
    json_t *t = json_object_get(o, "text");
    CHECK(st == 200 && json_is_object(t) && !strcmp(json_string_value(json_object_get(t, "lines")), "sentences") &&
          !strcmp(json_string_value(json_object_get(t, "number_token")), "N"));
    json_decref(o);
    daemon_stop(&d);
}

/* Every offset the API returns slices its token's characters with
 * Python's str and (through Array.from, the UTF-16 difference checked)
 * JavaScript's strings, on accents, CJK and an emoji; each token says
 * whether it is unk (tests/offsets/slice.py, slice.mjs). */
TEST(offsets_slice_in_python_and_javascript)
{
    nc_daemon d;
    const char *args[] = {"--model", demo, "--data-dir", NULL, NULL};
    char data[] = "/tmp/nc-normsrv-XXXXXX";
    CHECK(mkdtemp(data) != NULL);
    args[3] = data;
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "python3 tests/offsets/slice.py %d", d.port);
    harness_run_external(cmd, "python");
    snprintf(cmd, sizeof cmd, "node tests/offsets/slice.mjs %d", d.port);
    harness_run_external(cmd, "node");
    if (harness_failed)
        daemon_dump_log(&d);
    CHECK(daemon_stop(&d) == 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", data);
    CHECK(system(cmd) == 0);
}

TEST(newcomer_and_off_switch)
{
    nc_daemon d;
    const char *args[] = {"--model", demo, "--data-dir", NULL, NULL};
    char data[] = "/tmp/nc-normsrv-XXXXXX";
    CHECK(mkdtemp(data) != NULL);
    args[3] = data;
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    long st;
    const char *text = "The Company said, \"Hello!\"";
    json_t *o = call(d.port, "POST", "/v1/score", json_pack("{s:s}", "text", text), &st);
    CHECK(st == 200 && o);
    /* "hello" is not among the demo model's 10,000 PTB words: the answer says so */
    const char *want[] = {"the", "company", "said", "hello", "<eos>"};
    json_t *toks = json_object_get(o, "tokens"), *unk = json_object_get(o, "unk");
    CHECK(json_array_size(toks) == 5);
    for (size_t i = 0; i < 5 && i < json_array_size(toks); i++)
        CHECKF(!strcmp(json_string_value(json_array_get(toks, i)), want[i]), "token %zu '%s'", i,
               json_string_value(json_array_get(toks, i)));
    CHECK(json_integer_value(json_object_get(o, "unk_count")) == 1 && json_is_true(json_array_get(unk, 3)) &&
          json_is_false(json_array_get(unk, 1)));
    double ppl_norm = json_real_value(json_object_get(o, "ppl"));
    json_decref(o);
    /* taken as already normalised: the capitalised, punctuated words are
     * all unknown, and the perplexity of <unk>s flatters (issue 23) */
    o = call(d.port, "POST", "/v1/score", json_pack("{s:s,s:b}", "text", text, "normalize", 0), &st);
    CHECK(st == 200 && json_array_size(json_object_get(o, "tokens")) == 5 &&
          json_integer_value(json_object_get(o, "unk_count")) == 4);
    CHECKF(json_real_value(json_object_get(o, "ppl")) < ppl_norm, "unk-heavy ppl %g, normalised %g",
           json_real_value(json_object_get(o, "ppl")), ppl_norm);
    json_decref(o);
    o = call(d.port, "POST", "/v1/score", json_pack("{s:s,s:s}", "text", text, "normalize", "yes"), &st);
    CHECK(st == 400);
    json_decref(o);
    /* no token to score: no perplexity of nothing, a 400 naming the text
     * (empty, or punctuation normalisation drops: with final_eos false,
     * for a line end would give it an eos; one token without bos) */
    const char *empty[][2] = {{"", "eos"}, {" , \" ", "eos"}, {"the", "none"}};
    for (size_t i = 0; i < 3; i++) {
        o = call(d.port, "POST", "/v1/score",
                 json_pack("{s:s,s:s,s:b}", "text", empty[i][0], "bos", empty[i][1], "final_eos", 0), &st);
        json_t *e = json_object_get(o, "error");
        CHECKF(st == 400 && !strcmp(json_string_value(json_object_get(e, "code")), "invalid_text") &&
               strstr(json_string_value(json_object_get(e, "message")), "field 'text' has no tokens to score"),
               "score of '%s': %ld", empty[i][0], st);
        json_decref(o);
    }
    o = call(d.port, "POST", "/v1/score",
             json_pack("{s:s,s:s,s:b}", "text", "the company", "bos", "none", "final_eos", 0), &st);
    CHECK(st == 200 && json_integer_value(json_object_get(o, "count")) == 1);
    json_decref(o);

    /* feed lists unk flags and offsets with scores, unk_count always */
    o = call(d.port, "POST", "/v1/sessions", json_pack("{s:s}", "id", "s1"), &st);
    json_decref(o);
    o = call(d.port, "POST", "/v1/sessions/s1/feed", json_pack("{s:s}", "text", "Mr. Dólokhov's horse. "), &st);
    CHECK(st == 200 && json_integer_value(json_object_get(o, "unk_count")) == 1 && !json_object_get(o, "unk"));
    json_decref(o);
    o = call(d.port, "POST", "/v1/sessions/s1/feed", json_pack("{s:s,s:b}", "text", "The horse's rider ", "scores", 1),
             &st);
    json_t *offs = json_object_get(o, "offsets");
    CHECK(st == 200 && json_array_size(offs) == 4 && json_integer_value(json_array_get(offs, 2)) == 9 &&
          json_integer_value(json_array_get(json_object_get(o, "lengths"), 2)) == 2);
    json_decref(o);

    /* rescore: hypotheses normalised as the model reads text */
    o = call(d.port, "POST", "/v1/rescore",
             json_pack("{s:[s,s]}", "hypotheses", "The company said.", "the company said"), &st);
    json_t *r = json_object_get(o, "hypotheses");
    CHECK(st == 200 && json_array_size(r) == 2);
    /* both read as "the company said"; only the first ends a sentence */
    for (size_t i = 0; i < json_array_size(r); i++) {
        json_t *h = json_array_get(r, i);
        json_int_t n = (json_int_t)json_array_size(json_object_get(h, "tokens"));
        CHECKF(n == (json_integer_value(json_object_get(h, "index")) == 0 ? 4 : 3), "hypothesis %lld: %lld tokens",
               (long long)json_integer_value(json_object_get(h, "index")), (long long)n);
    }
    json_decref(o);

    /* namespace uploads: normalised unless ?normalize=false */
    http_resp hr;
    const char *doc = "Hello, World! The U.S. economy grew 3.5% in 1999.\n";
    CHECK(http_call(d.port, "POST", "/v1/namespaces/n1/documents?id=a", "text/plain", doc, strlen(doc), &hr) == 0);
    json_int_t added_norm = hr.json ? json_integer_value(json_object_get(hr.json, "tokens_added")) : -1;
    CHECK(hr.status == 200);
    http_resp_free(&hr);
    CHECK(http_call(d.port, "POST", "/v1/namespaces/n2/documents?id=a&normalize=false", "text/plain", doc, strlen(doc),
                    &hr) == 0);
    json_int_t added_raw = hr.json ? json_integer_value(json_object_get(hr.json, "tokens_added")) : -1;
    CHECK(hr.status == 200);
    http_resp_free(&hr);
    /* hello world <eos> the u.s. economy grew N in N <eos>: 11 tokens;
     * white space: 9 words and one eos */
    CHECKF(added_norm == 11 && added_raw == 10, "tokens added: normalised %lld, raw %lld", (long long)added_norm,
           (long long)added_raw);
    CHECK(http_call(d.port, "POST", "/v1/namespaces/n3/documents?normalize=maybe", "text/plain", doc, strlen(doc),
                    &hr) == 0);
    CHECK(hr.status == 400);
    http_resp_free(&hr);
    daemon_stop(&d);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", data);
    CHECK(system(cmd) == 0);
}

TEST(fixture_without_conventions)
{
    /* no "text" object: "normalize" changes nothing, punctuation stays */
    nc_daemon d;
    const char *args[] = {"--model", fixture, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    long st;
    const char *text = "w1 w2, W3\nw4 \"w5\"";
    json_t *a = call(d.port, "POST", "/v1/score", json_pack("{s:s}", "text", text), &st);
    json_t *b = call(d.port, "POST", "/v1/score", json_pack("{s:s,s:b}", "text", text, "normalize", 0), &st);
    CHECK(a && b && json_equal(a, b) && json_array_size(json_object_get(a, "tokens")) == 7);
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(a, "tokens"), 1)), "w2,"));
    json_decref(a);
    json_decref(b);
    a = call(d.port, "GET", "/v1/model", NULL, &st);
    CHECK(st == 200 && json_is_null(json_object_get(a, "text")));
    json_decref(a);
    daemon_stop(&d);
}

/* The CLI's stderr (and stdout) of a command line. */
static char *run_cli(const char *args)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", daemon_bin_path("neurocache"), args);
    FILE *p = popen(cmd, "r");
    static char out[8192];
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    if (p)
        pclose(p);
    return out;
}

TEST(cli_unknown_rate_and_switch)
{
    char path[] = "/tmp/nc-normcli-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *text = "The Company said, \"Hello!\"\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    char args[600];
    snprintf(args, sizeof args, "score --model %s %s", demo, path);
    /* the unknown-word rate beside the perplexity: "hello" only */
    CHECK_STR_CONTAINS(run_cli(args), "5 tokens scored");
    CHECK_STR_CONTAINS(run_cli(args), "unknown words 1 (20.00%)");
    snprintf(args, sizeof args, "score --model %s --no-normalize %s", demo, path);
    CHECK_STR_CONTAINS(run_cli(args), "unknown words 4 (80.00%)");
    snprintf(args, sizeof args, "score --model %s --format json %s", demo, path);
    CHECK_STR_CONTAINS(run_cli(args), "\"unk_count\":1}");
    snprintf(args, sizeof args, "eval --model %s --row '--no-normalize' %s", demo, path);
    CHECK_STR_CONTAINS(run_cli(args), "not a per-row cache option");
    unlink(path);
    CHECK_STR_CONTAINS(run_cli("train --train x --out y --text lines=paragraphs"),
                       "--text: text.lines is 'paragraphs', expected one of eos, sentences");
}

int main(void)
{
    httpc_init();
    if (access(demo, R_OK) != 0) {
        fprintf(stderr, "%s absent: the demo model's conventions are not checked\n", demo);
        RUN(fixture_without_conventions);
        return harness_summary();
    }
    RUN(cli_unknown_rate_and_switch);
    RUN(tokenize_offsets);
    RUN(offsets_slice_in_python_and_javascript);
    RUN(newcomer_and_off_switch);
    RUN(fixture_without_conventions);
    httpc_cleanup();
    return harness_summary();
}
