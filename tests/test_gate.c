/* test_gate.c -- the adaptive mixture (core/components/gate.h, issue 18): the gate's
 * gradient against central differences; a gate that outputs the constant
 * weights reproduces the constant-λ numbers (target and full paths); the
 * gate never reads the target; fitting is deterministic for a seed and
 * improves on the constant start; files round-trip and bad ones are
 * refused; adaptive retrieval skips all or nothing at the extremes with the
 * rest renormalised; the daemon (a real process over HTTP) and the CLI
 * agree, report the weights, count the searches and refuse "gate" on a
 * model without one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stream.h"
#include "doc.h"
#include "lstm.h"
#include "cache_params.h"
#include "unbounded_cache.h"
#include "tokenizer.h"
#include "model.h"
#include "daemon.h"
#include "gate.h"
#include "harness.h"
#include "rng.h"
#include "tolerance.h"

static uint64_t lcg = 4242;
/* gate_fit's options in these tests: L2 1e-4, a skip budget of +0.25% */
#define FIT(hidden_, seed_, iters_) \
    ((nc_gate_fit_opts){.hidden = (hidden_), .seed = (seed_), .iters = (iters_), .l2 = 1e-4, .max_loss = 0.0025})

static uint32_t rnd(void)
{
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg >> 33);
}
static double frand(void) { return (double)rnd() / 4294967296.0 * 2.0; }   /* [0, 1) */
static float gauss(void)
{
    double u = frand() + 1e-9, v = frand();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* The gated target path and the constant one compute the same p_c(x)
 * (mixture_components shares mixture_target's formulas) and combine them
 * differently -- Σ_c w_c p_c with w_c from a softmax of log w_c, against
 * nested (1-λ) p + λ q: a handful (< 20) of double operations, each
 * rounding by at most 2^-53 relative (4.4e-15 on log p). One more rounding
 * is the constant path's own: it forms λ_u p_uni in float (a float knob
 * times unigram_cache_prob's float), a term <= p, so log p moves by at most one
 * float unit roundoff F32_U = 6e-8. Anything the gate really changed (a
 * feature leaking in, a weight off by 1e-6) would be larger. */
#define TOL_DOUBLE_PATHS (F32_U + 1e-12)

static nc_model *load_fixture(void)
{
    char dir[1024], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/lstm-2layer", harness_fixtures());
    nc_model *m = NULL;
    int rc = model_load(dir, &m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return m;
}

/* A document of n tokens: mostly repeating phrases (so the caches matter). */
static void make_doc(const nc_model *m, size_t n, nc_tokens *t)
{
    tokens_init(t);
    int V = m->cfg.vocab_size, phrase[12];
    for (int i = 0; i < 12; i++)
        phrase[i] = 2 + (int)(rnd() % (uint32_t)(V - 2));
    for (size_t i = 0; i < n; i++) {
        int id = (rnd() % 3 == 0) ? (int)(rnd() % (uint32_t)V) : phrase[i % 12];
        const char *w = vocab_word(m->vocab, id);
        tokens_push(t, id, w, strlen(w), i);
    }
}

/* An exact unbounded cache holding nbase random pairs. */
static nc_unbounded_cache *ub_make(int dim, size_t nbase)
{
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, dim);
    o.exact = true;
    nc_unbounded_cache *u = NULL;
    char err[NC_ERRLEN];
    CHECKF(unbounded_cache_new(&o, NULL, &u, err, sizeof err) == NC_OK, "%s", err);
    float *base = malloc(nbase * (size_t)dim * sizeof(float));
    int *bw = malloc(nbase * sizeof(int));
    for (size_t i = 0; i < nbase * (size_t)dim; i++)
        base[i] = 0.3f * gauss();
    for (size_t i = 0; i < nbase; i++)
        bw[i] = 2 + (int)(rnd() % 48);
    CHECK(u && unbounded_cache_add(u, base, bw, nbase, NULL, err, sizeof err) == NC_OK);
    free(base);
    free(bw);
    return u;
}

static void cache_setup(nc_cache_params *p)
{
    cache_params_default(p);
    p->neural_size = 40;
    p->neural_theta = 0.7f;
    p->neural_lambda = 0.2f;
    p->unigram_size = 25;
    p->unigram_lambda = 0.1f;
    p->unbounded = true;
    p->knn = 16;
    p->unbounded_lambda = 0.3f;
}

/* The gate with W = U = V = 0 whose biases are the logs of p's constant
 * weights (all components present). */
static void constant_gate(const nc_cache_params *p, unsigned comps, nc_gate *g)
{
    memset(g, 0, sizeof *g);
    g->comps = comps;
    for (int i = 0; i < NC_GATE_NFEAT; i++)
        g->sd[i] = 1.0;
    double w[NC_NCOMP];
    gate_const_weights(p, comps, w);
    for (int c = 0; c < NC_NCOMP; c++)
        if ((comps >> c) & 1u)
            g->full.w[c][NC_GATE_NFEAT] = g->pre.w[c][NC_GATE_NFEAT] = log(w[c]);
}

/* Synthetic fitting data: the neural component is right when feature 0 is
 * positive, the unbounded one when feature 9 is; so a gate can learn. */
static void synth_data(nc_gate_data *d, size_t n)
{
    d->n = n;
    d->f = malloc(n * NC_GATE_NFEAT * sizeof(double));
    d->pc = malloc(n * NC_NCOMP * sizeof(double));
    for (size_t t = 0; t < n; t++) {
        double *f = d->f + t * NC_GATE_NFEAT, *pc = d->pc + t * NC_NCOMP;
        for (int i = 0; i < NC_GATE_NFEAT; i++)
            f[i] = gauss() + 0.5 * i;
        pc[NC_COMP_MODEL] = 0.01 + 0.2 * frand();
        pc[NC_COMP_NEURAL] = f[0] > 0 ? 0.3 + 0.5 * frand() : 0.01 * frand();
        pc[NC_COMP_UNIGRAM] = NAN;
        pc[NC_COMP_UNBOUNDED] = f[9] > 4.5 ? 0.4 * frand() : 0.02 * frand();
        pc[NC_COMP_UNIFORM] = 1e-4;
    }
}

TEST(gradient_matches_central_differences)
{
    nc_gate_data d;
    synth_data(&d, 400);
    nc_gate g;
    memset(&g, 0, sizeof g);
    g.comps = (1u << NC_COMP_MODEL) | (1u << NC_COMP_NEURAL) | (1u << NC_COMP_UNBOUNDED) | (1u << NC_COMP_UNIFORM);
    g.nh = 3;
    for (int i = 0; i < NC_GATE_NFEAT; i++) {
        g.mean[i] = 0.5 * i;
        g.sd[i] = 1.0 + 0.1 * i;
    }
    double *full = (double *)&g.full, *pre = (double *)&g.pre;
    for (int i = 0; i < NC_GATE_NP; i++) {
        full[i] = 0.3 * gauss();
        pre[i] = 0.3 * gauss();
    }
    const double l2 = 1e-3, h = 1e-5;
    for (int which = 0; which < 2; which++) {
        bool is_pre = which == 1;
        double *x = is_pre ? pre : full, grad[NC_GATE_NP];
        size_t used = 0;
        gate_objective(&g, is_pre, &d, l2, grad, &used);
        CHECK(used == d.n);
        int checked = 0;
        double worst = 0.0;
        for (int i = 0; i < NC_GATE_NP; i++) {
            double keep = x[i];
            x[i] = keep + h;
            double fp = gate_objective(&g, is_pre, &d, l2, NULL, NULL);
            x[i] = keep - h;
            double fm = gate_objective(&g, is_pre, &d, l2, NULL, NULL);
            x[i] = keep;
            double num = (fp - fm) / (2 * h);
            /* central difference: truncation h²/6 |f'''| (|f'''| of this
             * smooth objective is O(10) here: 2e-10) plus rounding
             * 2 ε |f| / (2h) with |f| ~ 3 (3e-11): 1e-8 is ten times both */
            double e = fabs(num - grad[i]);
            if (e > worst)
                worst = e;
            checked += grad[i] != 0.0;
            CHECKF(e <= 1e-8, "%s parameter %d: analytic %.12g, central difference %.12g", is_pre ? "pre" : "full",
                   i, grad[i], num);
        }
        /* the check covered the linear map, the hidden layer and its
         * output weights (3 hidden units x 16, 4 comps x 19 ...) */
        CHECKF(checked > 100, "only %d non-zero gradient entries", checked);
        fprintf(stderr, "   %s: largest |analytic - central| %.3g\n", is_pre ? "pre" : "full", worst);
    }
    free(d.f);
    free(d.pc);
}

TEST(fit_is_deterministic_and_learns)
{
    nc_gate_data d;
    synth_data(&d, 2000);
    nc_cache_params p;
    cache_params_default(&p);
    p.neural_size = 10;
    p.neural_lambda = 0.2f;
    p.unbounded = true;
    p.unbounded_lambda = 0.3f;
    p.open_vocab = true;
    p.uniform_mu = 0.01f;
    char err[NC_ERRLEN];
    nc_gate a, b, c;
    CHECKF(gate_fit(&a, &p, &d, &FIT(4, 7, 100), err, sizeof err) == NC_OK, "%s", err);
    CHECKF(gate_fit(&b, &p, &d, &FIT(4, 7, 100), err, sizeof err) == NC_OK, "%s", err);
    CHECKF(gate_fit(&c, &p, &d, &FIT(4, 8, 100), err, sizeof err) == NC_OK, "%s", err);
    CHECK(memcmp(&a, &b, sizeof a) == 0);            /* same seed: the same bytes */
    CHECK(memcmp(&a.full, &c.full, sizeof a.full) != 0);   /* another draw of U */
    CHECK(a.comps == ((1u << NC_COMP_MODEL) | (1u << NC_COMP_NEURAL) | (1u << NC_COMP_UNBOUNDED) |
                      (1u << NC_COMP_UNIFORM)));
    /* it learns what the data hold: far below the constant start */
    nc_gate k;
    constant_gate(&p, a.comps, &k);
    memcpy(k.mean, a.mean, sizeof k.mean);
    memcpy(k.sd, a.sd, sizeof k.sd);
    double nll_const = gate_objective(&k, false, &d, 0.0, NULL, NULL);
    double nll_fit = gate_objective(&a, false, &d, 0.0, NULL, NULL);
    double nll_pre = gate_objective(&a, true, &d, 0.0, NULL, NULL);
    CHECKF(nll_fit < nll_const - 0.3, "fitted %.4f, constant %.4f", nll_fit, nll_const);
    /* the pre-search gate cannot see feature 9 (an unbounded one): worse */
    CHECKF(nll_pre > nll_fit + 0.01 && nll_pre < nll_const, "pre %.4f full %.4f const %.4f", nll_pre, nll_fit,
           nll_const);
    /* the threshold costs at most what was allowed on the data */
    double sk, base = gate_data_ppl(&a, &d, -1, NULL), with = gate_data_ppl(&a, &d, a.skip, &sk);
    CHECKF(with <= base * 1.0025 * (1 + 1e-12), "skip %.4g: %.4f against %.4f", a.skip, with, base);
    CHECK(gate_fit(&a, &p, &d, &FIT(NC_GATE_MAXH + 1, 7, 10), err, sizeof err) == NC_EINVAL);
    free(d.f);
    free(d.pc);
}

TEST(files_round_trip_and_bad_ones_refused)
{
    nc_gate_data d;
    synth_data(&d, 500);
    nc_cache_params p;
    cache_params_default(&p);
    p.neural_size = 10;
    p.unbounded = true;
    char err[NC_ERRLEN], dir[] = "/tmp/nc_gate_XXXXXX", path[300], cmd[600];
    CHECK(mkdtemp(dir) != NULL);
    nc_gate a, *b = NULL;
    CHECK(gate_fit(&a, &p, &d, &FIT(2, 1, 30), err, sizeof err) == NC_OK);
    CHECK(gate_load(dir, &b, err, sizeof err) == NC_ENOTFOUND && b == NULL);   /* none: quietly */
    CHECKF(gate_save(&a, dir, "test", err, sizeof err) == NC_OK, "%s", err);
    CHECKF(gate_load(dir, &b, err, sizeof err) == NC_OK, "%s", err);
    CHECK(b && memcmp(&a, b, sizeof a) == 0);       /* F64: exact */
    gate_free(b);
    b = NULL;
    /* a feature list this program does not compute */
    snprintf(path, sizeof path, "%s/gate.json", dir);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"vocab_entropy\"/\"vocab_entropy2\"/' %s", path);
    CHECK(system(cmd) == 0);
    CHECK(gate_load(dir, &b, err, sizeof err) == NC_EFORMAT && strstr(err, "vocab_entropy2"));
    /* a truncated tensor file */
    CHECK(gate_save(&a, dir, NULL, err, sizeof err) == NC_OK);
    snprintf(path, sizeof path, "%s/gate.safetensors", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && truncate(path, st.st_size - 8) == 0);
    CHECK(gate_load(dir, &b, err, sizeof err) == NC_EFORMAT && strstr(err, "tensor"));
    /* a model directory with a bad gate does not load */
    nc_model *m = NULL;
    CHECK(model_load(dir, &m, err, sizeof err) != NC_OK && m == NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    free(d.f);
    free(d.pc);
}

/* Scores doc with p (gate on the model's gate g when p->gate); caches fresh. */
static void score_doc(nc_model *m, const nc_tokens *doc, const nc_cache_params *p, nc_unbounded_cache *ub, double *lp,
                      double *gf, size_t *searched, size_t *skipped)
{
    char err[NC_ERRLEN];
    nc_state *s = lstm_state_new(m);
    nc_doc *d = NULL;
    CHECKF(doc_prepare(&(nc_doc_prep){.m = m, .s = s, .has_h = false, .toks = doc, .vocab_stats = true},
                       &d, err, sizeof err) == NC_OK, "%s", err);
    double *pc = gf ? malloc(doc->n * NC_NCOMP * sizeof(double)) : NULL;
    nc_doc_caches dc = {.ub = ub, .adapt = ub != NULL, .gate_f = gf, .gate_pc = pc};
    CHECKF(doc_score(d, p, &dc, lp, err, sizeof err) == NC_OK, "%s", err);
    if (searched)
        *searched = dc.searched;
    if (skipped)
        *skipped = dc.skipped;
    free(pc);
    doc_free(d);
    lstm_state_free(s);
}

TEST(constant_gate_reproduces_constant_lambda)
{
    nc_model *m = load_fixture();
    if (!m)
        return;
    const int H = m->cfg.hidden_size;
    nc_tokens doc;
    make_doc(m, 300, &doc);
    nc_cache_params p;
    cache_setup(&p);
    nc_gate *g = calloc(1, sizeof *g);
    constant_gate(&p, (1u << NC_COMP_MODEL) | (1u << NC_COMP_NEURAL) | (1u << NC_COMP_UNIGRAM) |
                          (1u << NC_COMP_UNBOUNDED), g);
    m->gate = g;   /* the model "has" this gate (model_free frees it) */
    double *a = malloc(doc.n * sizeof(double)), *b = malloc(doc.n * sizeof(double));
    /* the same memory for both: 200 random pairs, then the document's own */
    lcg = 99;
    nc_unbounded_cache *u1 = ub_make(H, 200);
    lcg = 99;
    nc_unbounded_cache *u2 = ub_make(H, 200);
    score_doc(m, &doc, &p, u1, a, NULL, NULL, NULL);
    nc_cache_params pg = p;
    pg.gate = true;
    pg.gate_skip = 0.0f;
    score_doc(m, &doc, &pg, u2, b, NULL, NULL, NULL);
    double worst = 0.0;
    for (size_t t = 1; t < doc.n; t++) {
        double e = fabs(a[t] - b[t]);
        worst = e > worst ? e : worst;
        CHECKF(e <= TOL_DOUBLE_PATHS, "token %zu: constant %.17g, constant gate %.17g", t, a[t], b[t]);
    }
    fprintf(stderr, "   target path: largest difference %.3g\n", worst);
    unbounded_cache_free(u1);
    unbounded_cache_free(u2);

    /* the full distribution: two streams fed alike, predict with and
     * without the gate. The gated full path turns the weights back into
     * float λs (λ_c = w_c / Σ_{c'<=c} w_c'), which may land one float ulp
     * (2^-23 relative) from the given λ; each of the three steps then moves
     * p by at most 2 such ulps relative: 6 x 2^-23 = 7.2e-7, x4 margin. */
    nc_cache_params pn = p;
    pn.unbounded = false;   /* streams without a namespace cache */
    nc_cache_params pgn = pn;
    pgn.gate = true;
    char err[NC_ERRLEN];
    nc_stream *s1 = NULL, *s2 = NULL;
    CHECK(stream_new(m, &pn, NULL, NULL, true, &s1, err, sizeof err) == NC_OK);
    CHECK(stream_new(m, &pgn, NULL, NULL, true, &s2, err, sizeof err) == NC_OK);
    nc_tokens head;
    tokens_init(&head);
    for (size_t i = 0; i < 60; i++)
        tokens_push(&head, doc.ids[i], doc.words[i], strlen(doc.words[i]), i);
    CHECK(stream_feed(s1, &head, false, NULL, err, sizeof err) == NC_OK);
    CHECK(stream_feed(s2, &head, false, NULL, err, sizeof err) == NC_OK);
    nc_dist d1, d2;
    dist_init(&d1);
    dist_init(&d2);
    CHECK(stream_predict(s1, true, &d1, err, sizeof err) == NC_OK);
    CHECK(stream_predict(s2, true, &d2, err, sizeof err) == NC_OK);
    CHECK(d1.n == d2.n);
    for (size_t w = 0; w < d1.n && w < d2.n; w++)
        CHECKF(fabs(d1.p[w] - d2.p[w]) <= 2.9e-6 * d1.p[w] + 1e-12, "word %zu: %.9g vs %.9g", w, d1.p[w], d2.p[w]);
    double wsum = 0.0;
    for (int c = 0; c < NC_NCOMP; c++) {
        CHECK_NEAR(d1.weight[c], d2.weight[c], TOL_DOUBLE_PATHS);
        wsum += d2.weight[c];
    }
    CHECK_NEAR(wsum, 1.0, TOL_DOUBLE_PATHS);
    CHECK(d1.weight[NC_COMP_NEURAL] > 0.1 && d1.weight[NC_COMP_UNIGRAM] > 0.05);
    dist_free(&d1);
    dist_free(&d2);
    stream_free(s1);
    stream_free(s2);
    tokens_clear(&head);
    /* a model without a gate refuses "gate" */
    m->gate = NULL;
    gate_free(g);
    CHECK(stream_new(m, &pgn, NULL, NULL, true, &s1, err, sizeof err) == NC_EINVAL && strstr(err, "no gate"));
    free(a);
    free(b);
    tokens_clear(&doc);
    model_free(m);
}

TEST(gate_never_reads_the_target)
{
    nc_model *m = load_fixture();
    if (!m)
        return;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    nc_tokens doc, alt;
    make_doc(m, 200, &doc);
    nc_cache_params p;
    cache_setup(&p);
    /* a fitted gate with hidden units, so every feature matters */
    nc_gate_data gd;
    synth_data(&gd, 300);
    char err[NC_ERRLEN];
    nc_gate *g = calloc(1, sizeof *g);
    CHECK(gate_fit(g, &p, &gd, &FIT(4, 3, 20), err, sizeof err) == NC_OK);
    m->gate = g;
    p.gate = true;
    p.gate_skip = 0.0f;
    size_t n = doc.n;
    double *la = malloc(n * sizeof(double)), *lb = malloc(n * sizeof(double));
    double *fa = malloc(n * NC_GATE_NFEAT * sizeof(double)), *fb = malloc(n * NC_GATE_NFEAT * sizeof(double));
    for (size_t j = 50; j < n; j += 37) {
        tokens_init(&alt);
        for (size_t i = 0; i < n; i++) {
            int id = i == j ? (doc.ids[i] + 1 + (int)(rnd() % (uint32_t)(V - 3))) % V : doc.ids[i];
            const char *w = vocab_word(m->vocab, id);
            tokens_push(&alt, id, w, strlen(w), i);
        }
        lcg = 7;
        nc_unbounded_cache *u1 = ub_make(H, 100);
        lcg = 7;
        nc_unbounded_cache *u2 = ub_make(H, 100);
        score_doc(m, &doc, &p, u1, la, fa, NULL, NULL);
        score_doc(m, &alt, &p, u2, lb, fb, NULL, NULL);
        /* tokens before j: the same; token j: the same features, so the
         * same weights, whatever the target */
        for (size_t t = 1; t < j; t++)
            CHECKF(la[t] == lb[t], "j=%zu token %zu: %.17g vs %.17g", j, t, la[t], lb[t]);
        for (size_t t = 1; t <= j; t++)
            CHECKF(memcmp(fa + t * NC_GATE_NFEAT, fb + t * NC_GATE_NFEAT, NC_GATE_NFEAT * sizeof(double)) == 0,
                   "j=%zu: features of token %zu moved with token j", j, t);
        CHECK(la[j] != lb[j]);   /* the target did change */
        unbounded_cache_free(u1);
        unbounded_cache_free(u2);
        tokens_clear(&alt);
    }
    free(la);
    free(lb);
    free(fa);
    free(fb);
    free(gd.f);
    free(gd.pc);
    tokens_clear(&doc);
    model_free(m);
}

TEST(adaptive_retrieval_extremes)
{
    nc_model *m = load_fixture();
    if (!m)
        return;
    const int H = m->cfg.hidden_size;
    nc_tokens doc;
    make_doc(m, 250, &doc);
    nc_cache_params p;
    cache_setup(&p);
    nc_gate_data gd;
    synth_data(&gd, 300);
    char err[NC_ERRLEN];
    nc_gate *g = calloc(1, sizeof *g);
    CHECK(gate_fit(g, &p, &gd, &FIT(0, 1, 20), err, sizeof err) == NC_OK);
    m->gate = g;
    p.gate = true;
    size_t n = doc.n, searched, skipped;
    double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double)), *c = malloc(n * sizeof(double));
    /* threshold 1: every search skipped; the tokens then score as with the
     * unbounded cache off (its weight passed on to the others) */
    p.gate_skip = 1.0f;
    nc_unbounded_cache *u = ub_make(H, 100);
    score_doc(m, &doc, &p, u, a, NULL, &searched, &skipped);
    CHECKF(searched == 0 && skipped == n - 1, "searched %zu skipped %zu", searched, skipped);
    CHECK(unbounded_cache_count(u) == (int64_t)(100 + n - 1));   /* pairs still added */
    unbounded_cache_free(u);
    nc_cache_params off = p;
    off.unbounded = false;
    score_doc(m, &doc, &off, NULL, b, NULL, NULL, NULL);
    for (size_t t = 1; t < n; t++)
        CHECKF(fabs(a[t] - b[t]) <= TOL_DOUBLE_PATHS, "token %zu: skipped %.17g, off %.17g", t, a[t], b[t]);
    /* threshold 0: always searched (nothing counted: no adaptive retrieval) */
    p.gate_skip = 0.0f;
    u = ub_make(H, 100);
    score_doc(m, &doc, &p, u, c, NULL, &searched, &skipped);
    CHECK(searched == 0 && skipped == 0);
    double diff = 0;
    for (size_t t = 1; t < n; t++)
        diff += fabs(c[t] - a[t]);
    CHECK(diff > 1e-3);   /* the unbounded cache was read */
    unbounded_cache_free(u);
    /* the gate's own threshold (-1) between: counts add up */
    g->skip = 0.3;
    p.gate_skip = -1.0f;
    u = ub_make(H, 100);
    score_doc(m, &doc, &p, u, c, NULL, &searched, &skipped);
    CHECK(searched + skipped == n - 1);
    unbounded_cache_free(u);
    free(a);
    free(b);
    free(c);
    free(gd.f);
    free(gd.pc);
    tokens_clear(&doc);
    model_free(m);
}

/* Skipping part of a block's searches (the searched rows compacted into one
 * batch) gives what the precomputed neighbours give with the same tokens
 * dropped: the live search path against eval's. Exact search both ways; the
 * batches differ, so the distances may differ by a reordered float sum:
 * within the fixtures' path bound. */
TEST(partial_skip_equals_precomputed)
{
    nc_model *m = load_fixture();
    if (!m)
        return;
    const int H = m->cfg.hidden_size;
    nc_tokens doc;
    make_doc(m, 400, &doc);
    nc_cache_params p;
    cache_setup(&p);
    char err[NC_ERRLEN];
    size_t n = doc.n;
    /* a gate of moderate weights on this text's own feature scale: the
     * constant mixture's biases plus W ~ 0.3 N(0, 1) */
    double *f = malloc(n * NC_GATE_NFEAT * sizeof(double)), *lp = malloc(n * sizeof(double));
    double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double)), *wu = malloc(n * sizeof(double));
    lcg = 11;
    nc_unbounded_cache *u = ub_make(H, 150);
    score_doc(m, &doc, &p, u, lp, f, NULL, NULL);
    unbounded_cache_free(u);
    nc_gate *g = calloc(1, sizeof *g);
    constant_gate(&p, (1u << NC_COMP_MODEL) | (1u << NC_COMP_NEURAL) | (1u << NC_COMP_UNIGRAM) |
                          (1u << NC_COMP_UNBOUNDED), g);
    for (int i = 0; i < NC_GATE_NFEAT; i++) {
        double s1 = 0, s2 = 0;
        for (size_t t = 1; t < n; t++) {
            s1 += f[t * NC_GATE_NFEAT + i];
            s2 += f[t * NC_GATE_NFEAT + i] * f[t * NC_GATE_NFEAT + i];
        }
        g->mean[i] = s1 / (double)(n - 1);
        double var = s2 / (double)(n - 1) - g->mean[i] * g->mean[i];
        g->sd[i] = var > 1e-12 ? sqrt(var) : 1.0;
        for (int c = 1; c < NC_NCOMP; c++) {
            g->full.w[c][i] = 0.3 * gauss();
            g->pre.w[c][i] = i < NC_GATE_NPRE ? 0.3 * gauss() : 0.0;
        }
    }
    m->gate = g;
    /* the pre-search gate's unbounded weights on this text: threshold at their median */
    for (size_t t = 1; t < n; t++) {
        double w[NC_NCOMP];
        gate_weights(g, true, f + t * NC_GATE_NFEAT, g->comps, w);
        wu[t - 1] = w[NC_COMP_UNBOUNDED];
    }
    for (size_t i = 0; i + 1 < n - 1; i++)   /* sort (small n) */
        for (size_t j = i + 1; j < n - 1; j++)
            if (wu[j] < wu[i]) {
                double x = wu[i];
                wu[i] = wu[j];
                wu[j] = x;
            }
    p.gate = true;
    p.gate_skip = (float)wu[(n - 1) / 2];
    /* live: searches of the tokens kept, batched */
    size_t searched, skipped;
    lcg = 11;
    u = ub_make(H, 150);
    score_doc(m, &doc, &p, u, a, NULL, &searched, &skipped);
    unbounded_cache_free(u);
    CHECKF(skipped > n / 4 && searched > n / 4, "searched %zu, skipped %zu", searched, skipped);
    /* precomputed: every position searched, then the same ones dropped */
    lcg = 11;
    u = ub_make(H, 150);
    nc_state *s = lstm_state_new(m);
    nc_doc *d = NULL;
    CHECK(doc_prepare(&(nc_doc_prep){.m = m, .s = s, .has_h = false, .toks = &doc}, &d, err, sizeof err) == NC_OK);
    float *d2 = malloc(n * (size_t)p.knn * sizeof(float));
    int *ww = malloc(n * (size_t)p.knn * sizeof(int));
    const nc_doc_knn kn = {.ub = u, .adapt = true, .d2 = d2, .words = ww};
    CHECK(doc_neighbours(d, &p, &kn, err, sizeof err) == NC_OK);
    nc_doc_caches dc = {.ub = u, .pre_d2 = d2, .pre_words = ww};
    CHECK(doc_score(d, &p, &dc, b, err, sizeof err) == NC_OK);
    CHECK(dc.searched == searched && dc.skipped == skipped);
    for (size_t t = 1; t < n; t++)
        CHECKF(fabs(a[t] - b[t]) <= TOL_FIXTURE_PATHS, "token %zu: live %.9g, precomputed %.9g", t, a[t], b[t]);
    unbounded_cache_free(u);
    doc_free(d);
    lstm_state_free(s);
    free(d2);
    free(ww);
    free(f);
    free(lp);
    free(a);
    free(b);
    free(wu);
    tokens_clear(&doc);
    model_free(m);
}

/* ---- the daemon and the CLI ---- */

static const char *TEXT = "w1 w2 w3 w4 w5 w1 w2 w3\nw6 w7 w1 w2 w3 w4 zzz w8\nw1 w2 w3 w9 w1 w2\n";
#define CACHE_OPTS "--neural-cache 20 --theta 0.5 --lambda 0.2 --unigram-cache 10 --unigram-lambda 0.1"

TEST(server_and_cli_agree)
{
    char dir[] = "/tmp/nc_gate_model_XXXXXX", cmd[2048], out[65536], path[400];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "cp %s/lstm-2layer/config.json %s/lstm-2layer/vocab.txt %s/lstm-2layer/model.safetensors %s/",
             harness_fixtures(), harness_fixtures(), harness_fixtures(), dir);
    CHECK(system(cmd) == 0);
    /* fitting text: repeated phrases */
    snprintf(path, sizeof path, "%s/fit.txt", dir);
    FILE *f = fopen(path, "w");
    for (int l = 0; f && l < 60; l++) {
        for (int i = 0; i < 10; i++)
            fprintf(f, "%sw%d", i ? " " : "", rnd() % 3 ? (l * 3 + i) % 12 : (int)(rnd() % 40));
        fprintf(f, "\n");
    }
    if (f)
        fclose(f);
    char text_path[400];
    snprintf(text_path, sizeof text_path, "%s/text.txt", dir);
    f = fopen(text_path, "w");
    if (f) {
        fputs(TEXT, f);
        fclose(f);
    }
    /* a model without a gate: score --gate is an error naming the cure */
    snprintf(cmd, sizeof cmd, "%s score --model %s " CACHE_OPTS " --gate %s 2>&1", daemon_bin_path("neurocache"), dir,
             text_path);
    CHECK(harness_run_capture(cmd, out, sizeof out) == 1 && strstr(out, "fit-gate"));
    nc_daemon d0;
    const char *args0[] = {"--model", dir, NULL};
    if (daemon_start(&d0, args0) == 0) {
        http_resp r;
        CHECK(http_json(d0.port, "POST", "/v1/sessions", "{\"cache\": {\"neural_size\": 20, \"gate\": true}}", &r) == 0);
        json_t *msg = r.json ? json_object_get(json_object_get(r.json, "error"), "message") : NULL;
        CHECKF(r.status == 400 && msg && strstr(json_string_value(msg), "no gate"), "status %ld %s", r.status,
               r.body ? r.body : "");
        http_resp_free(&r);
        CHECK(daemon_stop(&d0) == 0);
    } else {
        CHECK(0);
    }
    /* fit */
    snprintf(cmd, sizeof cmd, "%s fit-gate --model %s --valid %s " CACHE_OPTS " --hidden 2 2>&1",
             daemon_bin_path("neurocache"), dir, path);
    CHECKF(harness_run_capture(cmd, out, sizeof out) == 0, "%s", out);
    CHECK(strstr(out, "gate: perplexity") != NULL);
    snprintf(path, sizeof path, "%s/gate-curve.csv", dir);
    CHECK(access(path, R_OK) == 0);
    /* the CLI with the gate */
    snprintf(cmd, sizeof cmd, "%s score --model %s --format json " CACHE_OPTS " --gate %s 2>/dev/null",
             daemon_bin_path("neurocache"), dir, text_path);
    CHECK(harness_run_capture(cmd, out, sizeof out) == 0);
    json_t *cli = json_loads(out, 0, NULL);
    json_t *want = cli ? json_object_get(cli, "logprobs") : NULL;
    CHECK(json_array_size(want) == 25);
    /* constant λ differs (the gate is really used) */
    snprintf(cmd, sizeof cmd, "%s score --model %s --format json " CACHE_OPTS " %s 2>/dev/null",
             daemon_bin_path("neurocache"), dir, text_path);
    CHECK(harness_run_capture(cmd, out, sizeof out) == 0);
    json_t *cst = json_loads(out, 0, NULL);
    double moved = 0;
    for (size_t i = 0; cst && i < json_array_size(want); i++)
        moved += fabs(json_number_value(json_array_get(json_object_get(cst, "logprobs"), i)) -
                      json_number_value(json_array_get(want, i)));
    CHECKF(moved > 1e-4, "gate and constant λ agree to %g", moved);
    json_decref(cst);

    nc_daemon d;
    const char *args[] = {"--model", dir, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        json_decref(cli);
        return;
    }
    http_resp r;
    CHECK(http_json(d.port, "POST", "/v1/sessions",
                    "{\"cache\": {\"neural_size\": 20, \"neural_theta\": 0.5, \"neural_lambda\": 0.2, "
                    "\"unigram_size\": 10, \"unigram_lambda\": 0.1, \"gate\": true}}",
                    &r) == 0 &&
          r.status == 201);
    const char *sid = r.json ? json_string_value(json_object_get(r.json, "id")) : NULL;
    char id[128] = "";
    if (sid)
        snprintf(id, sizeof id, "%s", sid);
    http_resp_free(&r);
    char feed[256], pred[256];
    snprintf(feed, sizeof feed, "/v1/sessions/%s/feed", id);
    snprintf(pred, sizeof pred, "/v1/sessions/%s/predict", id);
    /* feeding in two chunks scores as the CLI does (same float paths as
     * test_server's CLI comparison: within 1e-4) */
    const char *chunks[2] = {"w1 w2 w3 w4 w5 w1 w2 w3\nw6 w7 w1", " w2 w3 w4 zzz w8\nw1 w2 w3 w9 w1 w2\n"};
    size_t k = 0;
    double wprev[NC_NCOMP] = {0}, wchange = 0;
    for (int c = 0; c < 2; c++) {
        /* predict: weights present, adding up to 1 */
        json_t *b = json_pack("{s:i,s:b}", "top_k", 3, "components", 1);
        CHECK(http_post_json(d.port, pred, b, &r) == 0 && r.status == 200);
        json_decref(b);
        json_t *w = r.json ? json_object_get(r.json, "weights") : NULL;
        double sum = 0;
        for (int ci = 0; ci < NC_NCOMP; ci++) {
            double v = json_number_value(json_object_get(w, nc_comp_names[ci]));
            sum += v;
            wchange += fabs(v - wprev[ci]);
            wprev[ci] = v;
        }
        CHECK(json_is_object(w));
        CHECK_NEAR(sum, 1.0, 1e-9);
        http_resp_free(&r);
        b = json_pack("{s:s,s:b}", "text", chunks[c], "scores", 1);
        CHECK(http_post_json(d.port, feed, b, &r) == 0 && r.status == 200);
        json_decref(b);
        json_t *lp = r.json ? json_object_get(r.json, "logprobs") : NULL;
        for (size_t i = 0; i < json_array_size(lp); i++, k++)
            CHECKF(fabs(json_number_value(json_array_get(lp, i)) - json_number_value(json_array_get(want, k))) <= 1e-4,
                   "token %zu: server %.6f, CLI %.6f", k, json_number_value(json_array_get(lp, i)),
                   json_number_value(json_array_get(want, k)));
        http_resp_free(&r);
    }
    CHECK(k == 25);
    CHECK(wchange > 1e-3);   /* the weights moved between the two positions */
    CHECK(http_json(d.port, "GET", "/metrics", NULL, &r) == 0 && r.status == 200);
    CHECK(r.body && strstr(r.body, "neurocache_gate_skipped_total") && strstr(r.body, "neurocache_gate_searches_total"));
    http_resp_free(&r);
    CHECK(daemon_stop(&d) == 0);
    json_decref(cli);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    httpc_init();
    RUN(gradient_matches_central_differences);
    RUN(fit_is_deterministic_and_learns);
    RUN(files_round_trip_and_bad_ones_refused);
    RUN(constant_gate_reproduces_constant_lambda);
    RUN(gate_never_reads_the_target);
    RUN(adaptive_retrieval_extremes);
    RUN(partial_skip_equals_precomputed);
    RUN(server_and_cli_agree);
    return harness_summary();
}
