/* test_probe.c -- the acceptance of the component table (issue 28): a
 * component added in a test build (tests/component/probe.c, one line in
 * core/knobs/component_table.h) appears in the mixture's numbers, in predict's
 * "components" and "weights", in the gate's features, fit and files, in
 * the export blob and in /v1/model. Built and run only in the probe tree
 * (make test: build/probe, -DNC_COMPONENT_PROBE). */
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
#include "unigram_cache.h"

static uint32_t seed = 12345;
static double frand(void)
{
    seed = seed * 1664525u + 1013904223u;
    return (seed >> 8) / 16777216.0;
}

TEST(table_has_the_probe)
{
    /* the last row (another test component may come before it: the
     * probe tree builds them all) */
    CHECK(NC_NCOMP >= 6);
    CHECK(!strcmp(nc_comp_names[NC_COMP_PROBE], "probe") && NC_COMP_PROBE == NC_NCOMP - 1);
    CHECK(NC_GATE_NPRE >= 9 && NC_GATE_NFEAT == NC_GATE_NPRE + 7);
    /* its feature after the other rows' pre-search ones, before the
     * unbounded cache's post-search ones */
    const char *mine = components_feature_name(NC_GATE_NPRE - 1), *next = components_feature_name(NC_GATE_NPRE);
    CHECK(mine && !strcmp(mine, "probe_twice_log_max"));
    CHECK(next && !strcmp(next, "ub_nearest_d2"));
    CHECK(cache_knob_find("probe_mu") != NULL);
    nc_cache_params p;
    cache_params_default(&p);
    CHECK(!((components_on(&p) >> NC_COMP_PROBE) & 1u));
    p.probe_mu = 0.2f;
    CHECK((components_on(&p) >> NC_COMP_PROBE) & 1u);
}

enum { V = 40, NW = 60, NN = 10, NU = 8 };

/* One position: logits, a neural window (two of its words beyond V), a
 * unigram window, |V_full| = NW. */
typedef struct {
    float logits[V], ndots[NN];
    int nvals[NN];
    nc_unigram_cache uni;
} position;

static void make_position(position *s, nc_mix_input *in)
{
    for (int w = 0; w < V; w++)
        s->logits[w] = (float)(3.0 * frand() - 1.5);
    for (int i = 0; i < NN; i++) {
        s->ndots[i] = (float)(4.0 * frand() - 2.0);
        s->nvals[i] = i < 2 ? V + 3 + i : (int)(frand() * V);
    }
    char err[NC_ERRLEN];
    unigram_cache_init(&s->uni, NU, err, sizeof err);
    for (int i = 0; i < NU; i++)
        unigram_cache_push(&s->uni, i < 3 ? 7 : (int)(frand() * (V + 5)));
    *in = (nc_mix_input){.V = V, .logits = s->logits,
                         .pairs[NC_COMP_NEURAL] = {.score = s->ndots, .word = s->nvals, .n = NN},
                         .state[NC_COMP_UNIGRAM] = &s->uni, .vocab_full = NW};
}

/* The mixture naively, in double, step by step in the table's order
 * (mixture.h): model, neural (linear, eq. 2-3), unigram, uniform, probe. */
static void naive_mixture(const nc_cache_params *p, const position *s, double q[NW])
{
    double z = 0, zc = 0;
    for (int w = 0; w < V; w++)
        z += exp(s->logits[w]);
    for (int i = 0; i < NN; i++)
        zc += exp(p->neural_theta * s->ndots[i]);
    for (int w = 0; w < NW; w++) {
        double pv = w < V ? exp(s->logits[w]) / z : 0.0, pn = 0, pu = 0;
        for (int i = 0; i < NN; i++)
            pn += s->nvals[i] == w ? exp(p->neural_theta * s->ndots[i]) / zc : 0.0;
        for (int i = 0; i < NU; i++)
            pu += unigram_cache_at(&s->uni, i) == w ? 1.0 / NU : 0.0;
        double x = (1 - p->neural_lambda) * pv + p->neural_lambda * pn;
        x = (1 - p->unigram_lambda) * x + p->unigram_lambda * pu;
        x = (1 - p->uniform_mu) * x + p->uniform_mu / NW;
        q[w] = (1 - p->probe_mu) * x + p->probe_mu * (w < V ? 1.0 / V : 0.0);
    }
}

static void mixture_case(float probe_mu)
{
    position s;
    nc_mix_input in;
    make_position(&s, &in);
    nc_cache_params p;
    cache_params_default(&p);
    p.neural_size = NN;
    p.neural_theta = 0.7f;
    p.neural_lambda = 0.2f;
    p.unigram_size = NU;
    p.unigram_lambda = 0.15f;
    p.open_vocab = true;
    p.uniform_mu = 0.03f;
    p.probe_mu = probe_mu;
    char err[NC_ERRLEN];
    CHECKF(cache_params_validate(&p, err, sizeof err) == NC_OK, "%s", err);
    double want[NW];
    naive_mixture(&p, &s, want);
    nc_dist d;
    dist_init(&d);
    CHECKF(mixture_full(&p, &in, NW, true, &d, err, sizeof err) == NC_OK, "%s", err);
    /* float steps (five, each rounding p <= 1 by ~6e-8) against double:
     * 1e-6 absolute is ~3x their sum, and far below what the probe term
     * moves (μp / V = 1.25e-3 at μp 0.05) */
    double worst = 0, wshare = 0, total = 0;
    for (int w = 0; d.n == NW && w < NW; w++) {
        double sh = 0;
        for (int c = 0; c < NC_NCOMP; c++)
            sh += d.share[c][w];
        worst = fmax(worst, fabs(d.p[w] - want[w]));
        wshare = fmax(wshare, fabs(sh - d.p[w]));
        total += d.p[w];
        /* the last step: its share is μp p_probe(w) exactly (up to float) */
        CHECK(fabs(d.share[NC_COMP_PROBE][w] - probe_mu * (w < V ? 1.0 / V : 0.0)) < 1e-9);
    }
    CHECK(d.n == NW);
    CHECKF(worst < 1e-6, "probe_mu %g: full vs naive %g", probe_mu, worst);
    CHECKF(wshare < 1e-6, "shares vs p %g", wshare);
    CHECKF(fabs(total - 1.0) < 1e-5, "sum %.9f", total);   /* NW floats near 1/NW: 60 roundings of 6e-8 */
    CHECK(fabs(d.weight[NC_COMP_PROBE] - probe_mu) < 1e-7);
    /* the target path: log p(x) of the same steps, double throughout;
     * against the naive double sum to 1e-9 relative (the model's and
     * the neural cache's float exponentials aside: 1e-6) */
    double lz = 0;
    for (int w = 0; w < V; w++)
        lz += exp(s.logits[w]);
    in.logits = NULL;
    in.log_z = log(lz);
    for (int x = 0; x < NW; x += 7) {
        in.s_target = x < V ? s.logits[x] : -INFINITY;
        double lp = mixture_target(&p, &in, x);
        CHECKF(fabs(lp - log(want[x])) < 1e-6, "x %d: target %.9f naive %.9f", x, lp, log(want[x]));
    }
    dist_free(&d);
    unigram_cache_free(&s.uni);
}

TEST(mixture_sums_with_the_probe)
{
    mixture_case(0.05f);
    mixture_case(0.0f);   /* off: not a component, the rest unchanged */
}

/* The probe's feature, and a gate fitted where its term helps exactly when
 * its feature is high: the gate must weigh it by that feature. */
TEST(gate_sees_the_probe)
{
    position s;
    nc_mix_input in;
    make_position(&s, &in);
    in.v_logmax = -1.25f;
    nc_cache_params p;
    cache_params_default(&p);
    p.probe_mu = 0.1f;
    double f[NC_GATE_NFEAT];
    gate_features(&p, &in, false, f);
    CHECK(f[NC_GATE_NPRE - 1] == -2.5);
    size_t n = 600;
    nc_gate_data d = {.n = n, .f = calloc(n * NC_GATE_NFEAT, sizeof(double)), .pc = malloc(n * NC_NCOMP * sizeof(double))};
    for (size_t t = 0; t < n; t++) {
        double *ft = d.f + t * NC_GATE_NFEAT, *pc = d.pc + t * NC_NCOMP;
        for (int i = 0; i < NC_GATE_NFEAT; i++)
            ft[i] = frand() - 0.5;
        for (int c = 0; c < NC_NCOMP; c++)
            pc[c] = NAN;
        pc[NC_COMP_MODEL] = 0.1;
        pc[NC_COMP_PROBE] = ft[NC_GATE_NPRE - 1] > 0 ? 0.6 : 0.01;
    }
    nc_gate g;
    char err[NC_ERRLEN], dir[] = "/tmp/nc_probe_gateXXXXXX";
    nc_gate_fit_opts fit = {.hidden = 0, .seed = 1, .iters = 200, .l2 = 1e-4, .max_loss = 0.005};
    CHECKF(gate_fit(&g, &p, &d, &fit, err, sizeof err) == NC_OK, "%s", err);
    CHECK(g.comps == ((1u << NC_COMP_MODEL) | (1u << NC_COMP_PROBE)));
    /* the probe's row leans on its feature: a large positive weight */
    CHECKF(g.full.w[NC_COMP_PROBE][NC_GATE_NPRE - 1] > 1.0, "w %g", g.full.w[NC_COMP_PROBE][NC_GATE_NPRE - 1]);
    double fhi[NC_GATE_NFEAT] = {0}, flo[NC_GATE_NFEAT] = {0}, whi[NC_NCOMP], wlo[NC_NCOMP];
    fhi[NC_GATE_NPRE - 1] = 0.4;
    flo[NC_GATE_NPRE - 1] = -0.4;
    gate_weights(&g, false, fhi, g.comps, whi);
    gate_weights(&g, false, flo, g.comps, wlo);
    CHECKF(whi[NC_COMP_PROBE] > 0.6 && wlo[NC_COMP_PROBE] < 0.2, "%g %g", whi[NC_COMP_PROBE], wlo[NC_COMP_PROBE]);
    /* gate.json names it; the files read back */
    CHECK(mkdtemp(dir) != NULL);
    CHECKF(gate_save(&g, dir, "test", err, sizeof err) == NC_OK, "%s", err);
    char path[256];
    snprintf(path, sizeof path, "%s/gate.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    json_t *comps = json_object_get(j, "components"), *feats = json_object_get(j, "features");
    CHECK(json_array_size(comps) == 2 && !strcmp(json_string_value(json_array_get(comps, 1)), "probe"));
    CHECK(json_array_size(feats) == NC_GATE_NFEAT &&
          !strcmp(json_string_value(json_array_get(feats, NC_GATE_NPRE - 1)), "probe_twice_log_max"));
    json_decref(j);
    nc_gate *g2 = NULL;
    CHECKF(gate_load(dir, &g2, err, sizeof err) == NC_OK, "%s", err);
    CHECK(g2 && g2->comps == g.comps && memcmp(&g2->full.w, &g.full.w, sizeof g.full.w) == 0);
    gate_free(g2);
    unlink(path);
    snprintf(path, sizeof path, "%s/gate.safetensors", dir);
    unlink(path);
    rmdir(dir);
    free(d.f);
    free(d.pc);
    unigram_cache_free(&s.uni);
}

static nc_model *load_fixture(void)
{
    char dir[1024], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/lstm-2layer", harness_fixtures());
    nc_model *m = NULL;
    CHECKF(model_load(dir, &m, err, sizeof err) == NC_OK, "%s", err);
    return m;
}

/* The export blob carries the probe's knob; the session comes back the
 * same bit for bit. */
TEST(blob_carries_the_probe)
{
    nc_model *m = load_fixture();
    if (!m)
        return;
    char err[NC_ERRLEN];
    nc_tokens t;
    tokens_init(&t);
    for (int i = 0; i < 30; i++)
        tokens_push(&t, 2 + i % 13, vocab_word(m->vocab, 2 + i % 13), strlen(vocab_word(m->vocab, 2 + i % 13)), i);
    nc_cache_params p;
    cache_params_default(&p);
    p.neural_size = 10;
    p.probe_mu = 0.05f;
    nc_stream *s = NULL, *im = NULL;
    void *blob = NULL;
    size_t len = 0;
    CHECK(stream_new(m, &p, NULL, NULL, true, &s, err, sizeof err) == NC_OK);
    CHECK(s && stream_feed(s, &t, false, NULL, err, sizeof err) == NC_OK);
    CHECK(s && stream_export(s, &blob, &len, err, sizeof err) == NC_OK);
    CHECK(blob && memmem(blob, len, "probe_mu", 8) != NULL);
    CHECKF(blob && stream_import(m, NULL, NULL, blob, len, &im, err, sizeof err) == NC_OK, "%s", err);
    nc_dist a, b;
    dist_init(&a);
    dist_init(&b);
    if (im) {
        CHECK(stream_params(im)->probe_mu == 0.05f);
        CHECK(stream_predict(s, true, &a, err, sizeof err) == NC_OK);
        CHECK(stream_predict(im, true, &b, err, sizeof err) == NC_OK);
        CHECK(a.n == b.n && memcmp(a.p, b.p, a.n * sizeof(float)) == 0);
        CHECK(a.weight[NC_COMP_PROBE] > 0.04 && a.share[NC_COMP_PROBE][3] > 0);
    }
    dist_free(&a);
    dist_free(&b);
    free(blob);
    stream_free(s);
    stream_free(im);
    tokens_clear(&t);
    model_free(m);
}

/* The daemon built with the probe, over HTTP. */
TEST(daemon_shows_the_probe)
{
    char model[1024];
    snprintf(model, sizeof model, "%s/lstm-2layer", harness_fixtures());
    nc_daemon d;
    const char *args[] = {"--model", model, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        return;
    }
    http_resp r;
    CHECK(http_json(d.port, "GET", "/v1/model", NULL, &r) == 0 && r.status == 200);
    json_t *comps = r.json ? json_object_get(r.json, "components") : NULL;
    json_t *last = json_array_get(comps, NC_NCOMP - 1);
    CHECK(json_array_size(comps) == NC_NCOMP && last &&
          !strcmp(json_string_value(json_object_get(last, "name")), "probe"));
    CHECK(last && !strcmp(json_string_value(json_array_get(json_object_get(last, "knobs"), 0)), "probe_mu"));
    CHECK(last && !strcmp(json_string_value(json_array_get(json_object_get(last, "gate_features"), 0)),
                          "probe_twice_log_max"));
    int V = (int)json_integer_value(json_object_get(r.json, "vocab_size"));
    http_resp_free(&r);
    CHECK(http_json(d.port, "POST", "/v1/sessions", "{\"cache\": {\"neural_size\": 20, \"probe_mu\": 0.05}}", &r) == 0 &&
          r.status == 201);
    char sid[128] = "", path[256];
    if (r.json && json_string_value(json_object_get(r.json, "id")))
        snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(r.json, "id")));
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", sid);
    CHECK(http_json(d.port, "POST", path, "{\"text\": \"the cat sat on the mat . the cat\"}", &r) == 0 &&
          r.status == 200);
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", sid);
    CHECK(http_json(d.port, "POST", path, "{\"top_k\": 5, \"components\": true}", &r) == 0 && r.status == 200);
    json_t *preds = r.json ? json_object_get(r.json, "predictions") : NULL, *wt = r.json ? json_object_get(r.json, "weights") : NULL;
    CHECK(json_array_size(preds) == 5);
    /* the probe is the last step: its share of every in-vocabulary word is
     * μp / V (float: 1e-9); the shares add up to the probability (1e-6: a
     * handful of float roundings) */
    for (size_t i = 0; i < json_array_size(preds); i++) {
        json_t *it = json_array_get(preds, i), *c = json_object_get(it, "components");
        double sum = 0, prob = json_number_value(json_object_get(it, "prob"));
        const char *k;
        json_t *v;
        json_object_foreach(c, k, v) sum += json_number_value(v);
        CHECKF(json_object_size(c) == NC_NCOMP, "%zu components", json_object_size(c));
        CHECK(fabs(json_number_value(json_object_get(c, "probe")) - 0.05 / V) < 1e-9);
        CHECKF(fabs(sum - prob) < 1e-6, "%g vs %g", sum, prob);
    }
    CHECK(fabs(json_number_value(json_object_get(wt, "probe")) - 0.05) < 1e-7);
    http_resp_free(&r);
    /* the session's state names the knob and imports into a new session */
    snprintf(path, sizeof path, "/v1/sessions/%s/state", sid);
    http_resp st;
    CHECK(http_call(d.port, "GET", path, NULL, NULL, 0, &st) == 0 && st.status == 200);
    CHECK(st.body && memmem(st.body, st.len, "probe_mu", 8) != NULL);
    http_resp pr;
    CHECK(http_call(d.port, "PUT", "/v1/sessions/probecopy/state", "application/octet-stream", st.body, st.len,
                    &pr) == 0 && pr.status / 100 == 2);
    http_resp_free(&pr);
    http_resp_free(&st);
    CHECK(http_json(d.port, "GET", "/v1/sessions/probecopy", NULL, &r) == 0 && r.status == 200);
    CHECK(r.json && fabs(json_number_value(json_object_get(json_object_get(r.json, "cache"), "probe_mu")) - 0.05) < 1e-7);
    http_resp_free(&r);
    CHECK(daemon_stop(&d) == 0);
}

int main(void)
{
    httpc_init();
    RUN(table_has_the_probe);
    RUN(mixture_sums_with_the_probe);
    RUN(gate_sees_the_probe);
    RUN(blob_carries_the_probe);
    RUN(daemon_shows_the_probe);
    httpc_cleanup();
    return harness_summary();
}
