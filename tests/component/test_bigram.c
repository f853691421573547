/* test_bigram.c -- the acceptance of a component with session state
 * (issue 39): the recent-bigram cache (tests/component/bigram.c, one line
 * in core/knobs/component_table.h) reaches the knob table's every reader (CLI,
 * JSON, config, /v1/model), the mixture (against a naive double sum), the
 * gate's features, the export blob (bit for bit), rescoring (the ring
 * rolled back), a resize, the memory gauge of /metrics, and the daemon
 * scores as the CLI does. Built and run only in the probe tree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "daemon.h"
#include "cache_params.h"
#include "components.h"
#include "gate.h"
#include "mixture.h"
#include "model.h"
#include "stream.h"
#include "tokenizer.h"

enum { V = 40 };

static const nc_component *row(void)
{
    return nc_component_rows[NC_COMP_BIGRAM];
}

/* Its index among the gate's pre-search features: after the rows before it. */
static int feature_index(void)
{
    int i = 0;
    for (int c = 0; c < NC_COMP_BIGRAM; c++)
        i += nc_component_npre[c];
    return i;
}

TEST(table_has_the_bigram)
{
    CHECK(!strcmp(nc_comp_names[NC_COMP_BIGRAM], "bigram") && row()->state_new && row()->mark);
    CHECK(cache_knob_find("bigram_size") && cache_knob_find("bigram_lambda"));
    const char *f = components_feature_name(feature_index());
    CHECK(f && !strcmp(f, "bigram_log_matches"));
    nc_cache_params p;
    cache_params_default(&p);
    CHECK(p.bigram_size == 0 && !((components_on(&p) >> NC_COMP_BIGRAM) & 1u));
    p.bigram_size = 8;
    CHECK((components_on(&p) >> NC_COMP_BIGRAM) & 1u);
}

/* p_bi(w | last) naively from the words pushed (pairs of consecutive
 * words, the newest n of them). */
static double naive_bigram(const int *words, int nw, int n, int w, int *matches)
{
    int m = 0, h = 0, npairs = nw - 1, from = npairs > n ? npairs - n : 0;
    for (int i = from; i < npairs; i++)
        if (words[i] == words[nw - 1]) {
            m++;
            h += words[i + 1] == w;
        }
    *matches = m;
    return m ? (double)h / m : 0.0;
}

static uint32_t seed = 777;
static int irand(int n)
{
    seed = seed * 1664525u + 1013904223u;
    return (int)((seed >> 8) % (uint32_t)n);
}

/* The row's state fed words (h unused by it), then the mixture of the model
 * and the bigram term against the naive double sum, the full path and the
 * target path, and its gate feature. */
TEST(mixture_against_naive_sum)
{
    nc_cache_params p;
    cache_params_default(&p);
    p.bigram_size = 12;
    p.bigram_lambda = 0.3f;
    const nc_state_args a = {.p = &p, .H = 4};
    void *st = NULL;
    char err[NC_ERRLEN];
    CHECK(row()->state_new(&a, &st, err, sizeof err) == NC_OK && st);
    if (!st)
        return;
    int words[40], nw = 0;
    for (; nw < 30; nw++) {
        words[nw] = nw % 5 == 4 ? V + 2 : irand(6);   /* small alphabet: repeats; one word beyond V */
        CHECK(row()->push(st, NULL, words[nw]) == NC_OK);
    }
    float logits[V];
    double z = 0;
    for (int w = 0; w < V; w++)
        z += exp(logits[w] = (float)(0.1 * irand(30) - 1.5));
    nc_mix_input in = {.V = V, .logits = logits, .vocab_full = V + 3};
    in.state[NC_COMP_BIGRAM] = st;
    const int NW = V + 3;
    nc_dist d;
    dist_init(&d);
    CHECKF(mixture_full(&p, &in, NW, true, &d, err, sizeof err) == NC_OK, "%s", err);
    int m = 0;
    double worst = 0, worst_t = 0;
    for (int w = 0; d.n >= (size_t)NW && w < NW; w++) {
        double pv = w < V ? exp(logits[w]) / z : 0.0, pb = naive_bigram(words, nw, 12, w, &m);
        double want = m ? (1 - p.bigram_lambda) * pv + p.bigram_lambda * pb : pv;
        worst = fmax(worst, fabs(d.p[w] - want));
        in.logits = NULL;
        in.s_target = w < V ? logits[w] : -INFINITY;
        in.log_z = (float)log(z);
        if (want > 0)
            worst_t = fmax(worst_t, fabs(mixture_target(&p, &in, w) - log(want)));
        in.logits = logits;
    }
    CHECK(m > 0 && d.n >= (size_t)NW);
    CHECKF(worst < 1e-6, "full vs naive %g", worst);
    CHECKF(worst_t < 1e-6, "target vs naive log %g", worst_t);
    CHECK(fabs(d.weight[NC_COMP_BIGRAM] - p.bigram_lambda) < 1e-7);
    /* its gate feature: log(1 + the pairs that follow the last word) */
    double f[NC_GATE_NFEAT];
    gate_features(&p, &in, false, f);
    CHECKF(fabs(f[feature_index()] - log1p(m)) < 1e-12, "feature %g, matches %d", f[feature_index()], m);
    dist_free(&d);
    row()->state_free(st);
}

static nc_model *load_fixture(void)
{
    char dir[1024], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/lstm-2layer", harness_fixtures());
    nc_model *m = NULL;
    CHECKF(model_load(dir, &m, err, sizeof err) == NC_OK, "%s", err);
    return m;
}

static void some_tokens(const nc_model *m, nc_tokens *t, int n, int salt)
{
    tokens_init(t);
    for (int i = 0; i < n; i++) {
        int id = 2 + (i * 7 + salt) % 11 % 6;
        tokens_push(t, id, vocab_word(m->vocab, id), strlen(vocab_word(m->vocab, id)), i);
    }
}

static size_t blob_of(const nc_stream *s, void **blob)
{
    size_t len = 0;
    char err[NC_ERRLEN];
    *blob = NULL;
    CHECKF(stream_export(s, blob, &len, err, sizeof err) == NC_OK, "%s", err);
    return len;
}

static bool same_prediction(nc_stream *a, nc_stream *b)
{
    nc_dist x, y;
    char err[NC_ERRLEN];
    dist_init(&x);
    dist_init(&y);
    bool same = stream_predict(a, true, &x, err, sizeof err) == NC_OK &&
                stream_predict(b, true, &y, err, sizeof err) == NC_OK && x.n == y.n &&
                !memcmp(x.p, y.p, x.n * sizeof(float)) &&
                !memcmp(x.share[NC_COMP_BIGRAM], y.share[NC_COMP_BIGRAM], x.n * sizeof(float));
    dist_free(&x);
    dist_free(&y);
    return same;
}

/* Export/import: the same blob again and the same predictions, bit for
 * bit; then rescoring leaves the session exactly as it was (its ring
 * rolled back: the blob unchanged), and scores a continuation as feeding
 * it would. */
TEST(blob_and_rescoring)
{
    nc_model *m = load_fixture();
    if (!m)
        return;
    char err[NC_ERRLEN];
    nc_cache_params p;
    cache_params_default(&p);
    p.bigram_size = 16;
    p.bigram_lambda = 0.25f;
    p.neural_size = 8;
    nc_tokens t, c[2];
    some_tokens(m, &t, 40, 0);
    some_tokens(m, &c[0], 9, 3);
    some_tokens(m, &c[1], 25, 5);   /* longer than the ring: every slot overwritten */
    nc_stream *s = NULL, *im = NULL, *fed = NULL;
    CHECK(stream_new(m, &p, NULL, NULL, true, &s, err, sizeof err) == NC_OK);
    CHECK(s && stream_feed(s, &t, false, NULL, err, sizeof err) == NC_OK);
    void *b0 = NULL, *b1 = NULL, *b2 = NULL;
    size_t l0 = s ? blob_of(s, &b0) : 0;
    CHECK(b0 && memmem(b0, l0, "bigram_size", 11));
    CHECKF(b0 && stream_import(m, NULL, NULL, b0, l0, &im, err, sizeof err) == NC_OK, "%s", err);
    size_t l1 = im ? blob_of(im, &b1) : 0;
    CHECK(l1 == l0 && b1 && !memcmp(b0, b1, l0));
    CHECK(im && same_prediction(s, im));
    /* rescoring: the session as it was; continuation 1 scored as a clone fed it */
    double lp0[9], lp1[25], want[25];
    double *lps[2] = {lp0, lp1};
    CHECKF(s && stream_rescore(s, c, 2, lps, err, sizeof err) == NC_OK, "%s", err);
    size_t l2 = s ? blob_of(s, &b2) : 0;
    CHECK(l2 == l0 && b2 && !memcmp(b0, b2, l0));
    CHECK(im && same_prediction(s, im));
    CHECK(stream_clone(im, &fed, err, sizeof err) == NC_OK);
    CHECK(fed && stream_feed(fed, &c[1], false, want, err, sizeof err) == NC_OK);
    /* rescoring's decoder runs as one GEMM over the continuations, a feed's
     * per block: the sums round apart (1e-8 seen), not the caches */
    for (int j = 0; fed && j < 25; j++)
        CHECKF(fabs(lp1[j] - want[j]) < 1e-6, "token %d: rescore %.17g feed %.17g", j, lp1[j], want[j]);
    free(b0);
    free(b1);
    free(b2);
    stream_free(s);
    stream_free(im);
    stream_free(fed);
    tokens_clear(&t);
    tokens_clear(&c[0]);
    tokens_clear(&c[1]);
    model_free(m);
}

/* A smaller ring keeps the newest pairs: the bigram's share is λ p_bi over
 * the last 4 pairs; a larger one after it keeps them all and their last word. */
TEST(resize_keeps_the_newest_pairs)
{
    nc_model *m = load_fixture();
    if (!m)
        return;
    char err[NC_ERRLEN];
    nc_cache_params p;
    cache_params_default(&p);
    p.bigram_size = 30;
    p.bigram_lambda = 0.5f;
    nc_tokens t;
    some_tokens(m, &t, 40, 1);
    int words[40];
    for (int i = 0; i < 40; i++)
        words[i] = t.ids[i];
    nc_stream *s = NULL;
    CHECK(stream_new(m, &p, NULL, NULL, true, &s, err, sizeof err) == NC_OK);
    CHECK(s && stream_feed(s, &t, false, NULL, err, sizeof err) == NC_OK);
    for (int size = 4; s && size <= 30; size += 26) {
        p.bigram_size = size;
        CHECKF(stream_set_params(s, &p, err, sizeof err) == NC_OK, "%s", err);
        nc_dist d;
        dist_init(&d);
        CHECK(stream_predict(s, true, &d, err, sizeof err) == NC_OK);
        int mt = 0;
        double worst = 0;
        for (int w = 0; w < (int)d.n; w++) {
            double pb = naive_bigram(words, 40, size == 4 ? 4 : 39, w, &mt);
            worst = fmax(worst, fabs(d.share[NC_COMP_BIGRAM][w] - p.bigram_lambda * pb));
        }
        CHECKF(mt > 0 && worst < 1e-6, "size %d: matches %d, share vs naive %g", size, mt, worst);
        dist_free(&d);
    }
    stream_free(s);
    tokens_clear(&t);
    model_free(m);
}

static double metric(int port, const char *name)
{
    http_resp r;
    double v = NAN;
    if (http_call(port, "GET", "/metrics", NULL, NULL, 0, &r) == 0 && r.body) {
        char line[128];
        snprintf(line, sizeof line, "\n%s ", name);   /* the sample, not its # HELP line */
        const char *at = strstr(r.body, line);
        if (at)
            v = atof(at + strlen(line));
    }
    http_resp_free(&r);
    return v;
}

static char *session(int port, const char *body)
{
    http_resp r;
    char *sid = NULL;
    CHECK(http_json(port, "POST", "/v1/sessions", body, &r) == 0 && r.status == 201);
    if (r.json && json_string_value(json_object_get(r.json, "id")))
        sid = strdup(json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    return sid;
}

/* The daemon with a [cache] default from its config file: /v1/model, the
 * JSON settings, the memory gauge, and a feed's scores equal to the CLI's. */
TEST(daemon_equals_cli)
{
    char model[1024], conf[] = "/tmp/nc_bigram_confXXXXXX", text[] = "/tmp/nc_bigram_textXXXXXX";
    snprintf(model, sizeof model, "%s/lstm-2layer", harness_fixtures());
    int fc = mkstemp(conf), ft = mkstemp(text);
    const char *words = "the cat sat on the mat . the cat sat on the hat . the dog sat on the cat";
    CHECK(fc >= 0 && ft >= 0 && dprintf(fc, "[cache]\nbigram_size = 20\nbigram_lambda = 0.2\n") > 0 &&
          dprintf(ft, "%s\n", words) > 0);
    close(fc);
    close(ft);
    nc_daemon d;
    const char *args[] = {"--model", model, "--config", conf, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        return;
    }
    http_resp r;
    CHECK(http_json(d.port, "GET", "/v1/model", NULL, &r) == 0 && r.status == 200);
    json_t *comp = r.json ? json_array_get(json_object_get(r.json, "components"), NC_COMP_BIGRAM) : NULL;
    CHECK(comp && !strcmp(json_string_value(json_object_get(comp, "name")), "bigram") &&
          !strcmp(json_string_value(json_array_get(json_object_get(comp, "knobs"), 0)), "bigram_size"));
    http_resp_free(&r);
    double mem0 = metric(d.port, "neurocache_session_memory_bytes");
    char *sid = session(d.port, "{}"), *big = session(d.port, "{\"cache\": {\"bigram_size\": 5000}}");
    double mem1 = metric(d.port, "neurocache_session_memory_bytes");
    /* the config's default, and 5000 pairs of two ints more than a session without it would hold */
    char path[256], body[512];
    snprintf(path, sizeof path, "/v1/sessions/%s", sid ? sid : "none");
    CHECK(http_json(d.port, "GET", path, NULL, &r) == 0 && r.status == 200);
    CHECK(r.json && json_integer_value(json_object_get(json_object_get(r.json, "cache"), "bigram_size")) == 20);
    http_resp_free(&r);
    CHECKF(mem1 - mem0 >= 2 * 5000 * sizeof(int), "session memory %g -> %g", mem0, mem1);
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid ? sid : "none");
    snprintf(body, sizeof body, "{\"text\": \"%s\\n\", \"scores\": true}", words);
    CHECK(http_json(d.port, "POST", path, body, &r) == 0 && r.status == 200);
    json_t *lps = r.json ? json_object_get(r.json, "logprobs") : NULL;
    /* the CLI with the same knobs as options */
    char cmd[2048], *out = malloc(1 << 16);
    snprintf(cmd, sizeof cmd, "%s score --model %s --format json --bigram-size 20 --bigram-lambda 0.2 %s 2>/dev/null",
             daemon_bin_path("neurocache"), model, text);
    CHECK(out && harness_run_capture(cmd, out, 1 << 16) == 0);
    json_t *cli = out ? json_loads(out, 0, NULL) : NULL, *clp = json_object_get(cli, "logprobs");
    CHECKF(json_array_size(lps) > 10 && json_array_size(lps) == json_array_size(clp), "%zu vs %zu tokens",
           json_array_size(lps), json_array_size(clp));
    for (size_t i = 0; i < json_array_size(lps) && i < json_array_size(clp); i++)
        /* the CLI prints 9 significant digits */
        CHECKF(fabs(json_number_value(json_array_get(lps, i)) - json_number_value(json_array_get(clp, i))) < 1e-6,
               "token %zu: daemon %.12g cli %.12g", i, json_number_value(json_array_get(lps, i)),
               json_number_value(json_array_get(clp, i)));
    /* the bigram term moved the scores: "the cat sat on the" -> the second "cat" after "the" */
    double plain = NAN;
    snprintf(cmd, sizeof cmd, "%s score --model %s --format json %s 2>/dev/null", daemon_bin_path("neurocache"), model,
             text);
    if (out && harness_run_capture(cmd, out, 1 << 16) == 0) {
        json_t *j = json_loads(out, 0, NULL);
        plain = json_number_value(json_object_get(j, "ppl"));
        json_decref(j);
    }
    CHECKF(plain > json_number_value(json_object_get(cli, "ppl")), "ppl without %g, with %g", plain,
           json_number_value(json_object_get(cli, "ppl")));
    json_decref(cli);
    free(out);
    http_resp_free(&r);
    free(sid);
    free(big);
    CHECK(daemon_stop(&d) == 0);
    unlink(conf);
    unlink(text);
}

int main(void)
{
    httpc_init();
    RUN(table_has_the_bigram);
    RUN(mixture_against_naive_sum);
    RUN(blob_and_rescoring);
    RUN(resize_keeps_the_newest_pairs);
    RUN(daemon_equals_cli);
    httpc_cleanup();
    return harness_summary();
}
