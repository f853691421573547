/* test_dyneval.c -- dynamic evaluation (core/model/dyneval.h, issue 27): the
 * segment gradient of every adapted subset against central differences of
 * the loss; one step of the update against a naive double-precision
 * implementation (the gradient by central differences, the paper's rule
 * written out); decay alone brings the weights back to the trained ones
 * exactly and the stream back to the model's weights; dyn_lr 0 gives
 * today's answers bit for bit; causality (a later token moves no earlier
 * probability); export/import and clone reproduce the next predictions
 * bit for bit; rescoring leaves the session's blob unchanged; bad blobs
 * and a model without statistics are refused; the CLI's dyn-stats writes
 * statistics model_load reads, and score with --dyn-lr equals a stream
 * fed the file; the daemon (a real process over HTTP) scores a session as
 * the CLI does, shows the knobs and the statistics in /v1/model, and its
 * session export/import reproduces the next predictions exactly and is
 * left unchanged by rescoring. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stream.h"
#include "model.h"
#include "doc.h"
#include "mixture.h"
#include "daemon.h"
#include "dyneval.h"
#include "harness.h"
#include "tolerance.h"

static uint64_t lcg = 2718;
static uint32_t rnd(void)
{
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg >> 33);
}

static nc_model *load(const char *name)
{
    char dir[1024], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/%s", harness_fixtures(), name);
    nc_model *m = NULL;
    int rc = model_load(dir, &m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return m;
}

/* dyneval.h's calls with their parts as separate arguments, as the tests
 * build them. */
static int dyn_new(const nc_model *m, int subset, const nc_state *s0, bool has_h, nc_dyneval **out, char *err,
                   size_t errlen)
{
    const nc_dyn_segment start = {.s0 = s0, .has_h = has_h};
    return dyneval_new(m, subset, &start, out, err, errlen);
}

static int dyn_loss(nc_dyneval *d, const nc_state *s0, bool has_h, const int *y, int T, bool grad, double *sum,
                    int *nscored, char *err, size_t errlen)
{
    const nc_dyn_segment seg = {.s0 = s0, .has_h = has_h, .y = y, .T = T};
    nc_dyn_loss l = {0};
    int rc = dyneval_loss(d, &seg, grad, &l, err, errlen);
    *sum = l.sum, *nscored = l.nscored;
    return rc;
}

static int dyn_push(nc_dyneval *d, const int *ids, size_t k, int segment, float lr, float decay,
                    const nc_state *st, char *err, size_t errlen)
{
    const nc_dyn_fed fed = {.ids = ids, .k = k, .st = st, .has_h = true};
    const nc_dyn_rule rule = {.segment = segment, .lr = lr, .decay = decay};
    return dyneval_push(d, &fed, &rule, err, errlen);
}

/* n tokens: a few phrases repeated with noise, so adaptation has something
 * to learn. */
static void make_ids(const nc_model *m, int *ids, size_t n)
{
    const int V = m->cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        ids[i] = (rnd() % 4 == 0) ? (int)(rnd() % (uint32_t)V) : (int)((i * 7) % 11 + 3) % V;
}

static void make_toks(const nc_model *m, size_t n, nc_tokens *t)
{
    tokens_init(t);
    int *ids = malloc(n * sizeof(int));
    make_ids(m, ids, n);
    for (size_t i = 0; i < n; i++) {
        const char *w = vocab_word(m->vocab, ids[i]);
        tokens_push(t, ids[i], w, strlen(w), i);
    }
    free(ids);
}

/* Gradient statistics for m measured on a made-up text, attached as
 * model_load attaches them (MS_g as measured). */
static void attach_stats(nc_model *m)
{
    char err[NC_ERRLEN];
    int ids[400];
    make_ids(m, ids, 400);
    nc_model *ms = NULL;
    double loss;
    const nc_dyn_stats_text text = {.toks = ids, .ntok = 400, .segment = 10, .max_tokens = 0};
    int rc = dyneval_stats(m, &text, &ms, &loss, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    if (rc)
        return;
    m->dyn_ms = ms;
}

/* The two-layer fixture with its statistics attached, or NULL. */
static nc_model *load_with_stats(void)
{
    nc_model *m = load("lstm-2layer");
    if (m)
        attach_stats(m);
    return m;
}

/* State after a few tokens (bos eos first). */
static nc_state *state_after(const nc_model *m, int k)
{
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    lstm_step(m, s, m->eos_id, w);
    for (int i = 0; i < k; i++)
        lstm_step(m, s, (int)(rnd() % (uint32_t)m->cfg.vocab_size), w);
    lstm_work_free(w);
    return s;
}

static double mean_loss(nc_dyneval *d, const nc_state *s0, bool has_h, const int *y, int T)
{
    double l;
    int ns;
    char err[NC_ERRLEN];
    int rc = dyn_loss(d, s0, has_h, y, T, false, &l, &ns, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return ns ? l / ns : 0.0;
}

/* Central difference of the mean loss in weight j of tensor k. */
static double numeric_grad(nc_dyneval *d, int k, size_t j, const nc_state *s0, bool has_h, const int *y, int T,
                           double eps)
{
    float *w, *g;
    size_t n;
    dyneval_tensor(d, k, &w, &g, &n);
    float keep = w[j];
    w[j] = keep + (float)eps;
    double hi = (double)w[j] - keep;   /* the step float really took */
    dyneval_refresh(d);
    double lp = mean_loss(d, s0, has_h, y, T);
    w[j] = keep - (float)eps;
    double lo = keep - (double)w[j];
    dyneval_refresh(d);
    double lm = mean_loss(d, s0, has_h, y, T);
    w[j] = keep;
    dyneval_refresh(d);
    return (lp - lm) / (hi + lo);
}

/* Tolerance of a central difference against the exact gradient. The loss
 * is a mean of T float log-softmax terms, each off by at most a few
 * hundred float roundings of its O(1) logits (REORDER over the H + E terms
 * of each product, times the layers): |delta L| <= 1e-5 at this model's
 * size; divided by 2 eps = 2e-2 that is 5e-4. The truncation error eps^2/6
 * |L'''| with |L'''| <= 10 adds < 2e-4. A missing or wrong term of the
 * gradient is of the size of the gradient itself (1e-3 .. 1e-1 here). */
#define DIFF_EPS 1e-2
#define TOL_GRAD(g) (7e-4 + 0.02 * fabs(g))

TEST(gradient_matches_central_differences)
{
    static const char *fx[] = {"lstm-2layer", "lstm-1layer-tied"};
    char err[NC_ERRLEN];
    for (int f = 0; f < 2; f++) {
        nc_model *m = load(fx[f]);
        if (!m)
            continue;
        attach_stats(m);
        for (int subset = NC_DYN_BIAS; subset <= NC_DYN_ALL; subset++) {
            for (int hh = 0; hh < 2; hh++) {
                nc_state *s0 = state_after(m, 5);
                nc_dyneval *d = NULL;
                int rc = dyn_new(m, subset, s0, hh, &d, err, sizeof err);
                CHECKF(rc == NC_OK, "%s", err);
                if (rc) {
                    lstm_state_free(s0);
                    continue;
                }
                int y[7];
                make_ids(m, y, 7);
                double l;
                int ns;
                rc = dyn_loss(d, s0, hh, y, 7, true, &l, &ns, err, sizeof err);
                CHECKF(rc == NC_OK && ns == (hh ? 7 : 6), "%s ns=%d", err, ns);
                double worst = 0, gmax = 0;
                int checked = 0;
                for (int k = 0; k < dyneval_ntensors(d); k++) {
                    float *w, *g;
                    size_t n;
                    dyneval_tensor(d, k, &w, &g, &n);
                    /* a copy: the central differences overwrite nothing but
                     * the next dyneval_loss with grad would */
                    for (int q = 0; q < 6; q++) {
                        size_t j = q == 0 ? 0 : rnd() % n;
                        double num = numeric_grad(d, k, j, s0, hh, y, 7, DIFF_EPS);
                        double err_ = fabs(num - g[j]) - TOL_GRAD(g[j]);
                        if (err_ > worst)
                            worst = err_;
                        if (fabs(g[j]) > gmax)
                            gmax = fabs(g[j]);
                        CHECKF(fabs(num - g[j]) <= TOL_GRAD(g[j]), "%s subset %d has_h %d tensor %d [%zu]: "
                               "analytic %.6g numeric %.6g", fx[f], subset, hh, k, j, (double)g[j], num);
                        checked++;
                    }
                }
                CHECKF(checked > 0 && gmax > 1e-3, "%s subset %d: gradients checked %d, largest %g", fx[f], subset,
                       checked, gmax);
                dyneval_free(d);
                lstm_state_free(s0);
            }
        }
        model_free(m);
    }
}

/* One step of the rule in dyneval.h, in double, with the gradient taken by
 * central differences: the new weight against the stream's. The difference
 * is the gradient's (TOL_GRAD) times lr / (r + eps). */
static void update_check(const char *fixture)
{
    char err[NC_ERRLEN];
    nc_model *m = load(fixture);
    if (!m)
        return;
    attach_stats(m);
    const float lr = 0.01f, decay = 0.1f;
    for (int subset = NC_DYN_BIAS; subset <= NC_DYN_ALL; subset++) {
        nc_state *s0 = state_after(m, 3), *s1 = state_after(m, 4);
        nc_dyneval *d = NULL, *ref = NULL;
        int rc = dyn_new(m, subset, s0, true, &d, err, sizeof err);
        if (!rc)
            rc = dyn_new(m, subset, s0, true, &ref, err, sizeof err);
        CHECKF(rc == NC_OK, "%s", err);
        if (rc)
            break;
        int y[6];
        make_ids(m, y, 6);
        /* the whole mean over every weight of sqrt(MS_g) (the rule's RMS_norm) */
        double rs = 0;
        size_t rc_n = 0;
        {
            nc_dyneval *all = NULL;
            dyn_new(m, NC_DYN_ALL, s0, true, &all, err, sizeof err);
            /* sqrt(MS_g) of each weight: the statistics model's tensors,
             * found through an ALL adaptation's layout */
            const nc_model *ms = m->dyn_ms;
            size_t nl = (size_t)ms->cfg.num_layers;
            for (size_t l = 0; l < nl; l++) {
                size_t G = 4 * (size_t)ms->cfg.hidden_size, in = (size_t)ms->layers[l].input_size;
                for (size_t j = 0; j < G * in; j++)
                    rs += sqrt((double)ms->layers[l].w_ih[j]);
                for (size_t j = 0; j < G * (size_t)ms->cfg.hidden_size; j++)
                    rs += sqrt((double)ms->layers[l].w_hh[j]);
                for (size_t j = 0; j < G; j++)
                    rs += sqrt((double)ms->layers[l].b_ih[j]) + sqrt((double)ms->layers[l].b_hh[j]);
                rc_n += G * in + G * (size_t)ms->cfg.hidden_size + 2 * G;
            }
            size_t V = (size_t)ms->cfg.vocab_size, E = (size_t)ms->cfg.embedding_size, H = (size_t)ms->cfg.hidden_size;
            for (size_t j = 0; j < V; j++)
                rs += sqrt((double)ms->decoder_b[j]);
            for (size_t j = 0; j < V * E; j++)
                rs += sqrt((double)ms->encoder[j]);
            rc_n += V + V * E;
            if (ms->decoder_w != ms->encoder) {
                for (size_t j = 0; j < V * H; j++)
                    rs += sqrt((double)ms->decoder_w[j]);
                rc_n += V * H;
            }
            dyneval_free(all);
        }
        double mean_r = rs / (double)rc_n, eps = NC_DYN_EPS_REL * mean_r;
        rc = dyn_push(d, y, 6, 6, lr, decay, s1, err, sizeof err);
        CHECKF(rc == NC_OK && dyneval_pending(d) == 0, "%s", err);
        /* the sqrt(MS_g) of a weight of tensor k: the statistics of the same
         * tensor, reached as the implementation does not (by kind order) --
         * here by the weight's own tensor pointer difference in the ref's
         * model against the model's tensors */
        for (int k = 0; k < dyneval_ntensors(d); k++) {
            float *w, *g, *w0, *g0;
            size_t n, n0;
            dyneval_tensor(d, k, &w, &g, &n);
            dyneval_tensor(ref, k, &w0, &g0, &n0);
            const nc_model *rm = dyneval_model(ref);
            /* find which model tensor w0 is, to read its statistics */
            const float *msv = NULL;
            const nc_model *ms = m->dyn_ms;
            for (int l = 0; l < m->cfg.num_layers && !msv; l++) {
                if (w0 == rm->layers[l].w_ih)
                    msv = ms->layers[l].w_ih;
                else if (w0 == rm->layers[l].w_hh)
                    msv = ms->layers[l].w_hh;
                else if (w0 == rm->layers[l].b_ih)
                    msv = ms->layers[l].b_ih;
                else if (w0 == rm->layers[l].b_hh)
                    msv = ms->layers[l].b_hh;
            }
            if (!msv)
                msv = w0 == rm->decoder_b ? ms->decoder_b : w0 == rm->encoder ? ms->encoder : ms->decoder_w;
            for (int q = 0; q < 4; q++) {
                size_t j = rnd() % n;
                double gnum = numeric_grad(ref, k, j, s0, true, y, 6, DIFF_EPS);
                double r = sqrt((double)msv[j]), f = decay * (r + eps) / mean_r;
                if (f > 1)
                    f = 1;
                double u = gnum / (r + eps);
                u = u > NC_DYN_CLIP ? NC_DYN_CLIP : u < -NC_DYN_CLIP ? -NC_DYN_CLIP : u;
                /* the embedding / decoder matrix at its fraction of the rate */
                double lk = w0 == rm->encoder || w0 == rm->decoder_w ? lr * NC_DYN_EMBED_SCALE : lr;
                double want = (double)w0[j] + 0.0 * (1 - f) - lk * u;
                double tol = TOL_GRAD(gnum) * lk / (r + eps) + 4 * F32_U * fabs(want) + 1e-30;
                CHECKF(fabs(w[j] - want) <= tol, "subset %d tensor %d [%zu]: %.9g, naive %.9g (tol %.3g)", subset, k,
                       j, (double)w[j], want, tol);
            }
        }
        /* a second segment with lr 0: decay only, w0 + (w - w0)(1 - f) */
        float *snap[64];
        int nt = dyneval_ntensors(d);
        for (int k = 0; k < nt; k++) {
            float *w, *g;
            size_t n;
            dyneval_tensor(d, k, &w, &g, &n);
            snap[k] = malloc(n * sizeof(float));
            memcpy(snap[k], w, n * sizeof(float));
        }
        rc = dyn_push(d, y, 6, 6, 0.0f, decay, s1, err, sizeof err);
        CHECK(rc == NC_OK);
        int bad = 0;
        for (int k = 0; k < nt; k++) {
            float *w, *g, *w0, *g0;
            size_t n;
            dyneval_tensor(d, k, &w, &g, &n);
            dyneval_tensor(ref, k, &w0, &g0, &n);
            for (size_t j = 0; j < n; j++) {
                /* w0 + (w - w0)(1 - f): three float operations */
                double dl = (double)snap[k][j] - w0[j];
                if (fabs(w[j] - w0[j]) > fabs(dl) + 4 * F32_U * fabs(w0[j]))
                    bad++;   /* decay never moves a weight away from the trained one */
            }
            free(snap[k]);
        }
        CHECKF(bad == 0, "subset %d: %d weights moved away from the trained ones under decay", subset, bad);
        dyneval_free(d);
        dyneval_free(ref);
        lstm_state_free(s0);
        lstm_state_free(s1);
    }
    model_free(m);
}

/* untied (the decoder matrix its own tensor) and tied */
TEST(update_matches_naive_rule)
{
    update_check("lstm-2layer");
    update_check("lstm-1layer-tied");
}

static nc_cache_params dyn_params(float lr, int subset)
{
    nc_cache_params p;
    cache_params_default(&p);
    p.dyn_lr = lr;
    p.dyn_decay = 0.05f;
    p.dyn_segment = 7;
    p.dyn_params = subset;
    return p;
}

static int feed(nc_stream *s, const nc_tokens *t, size_t a, size_t b, double *lp)
{
    char err[NC_ERRLEN];
    nc_tokens part = {.ids = t->ids + a, .words = t->words + a, .offsets = t->offsets + a, .n = b - a};
    int rc = stream_feed(s, &part, false, lp, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return rc;
}

TEST(lr_zero_is_today_and_decay_returns)
{
    char err[NC_ERRLEN];
    nc_model *m = load_with_stats();
    if (!m)
        return;
    nc_tokens t;
    make_toks(m, 300, &t);
    nc_cache_params p0, p1 = dyn_params(0.0f, NC_DYN_LSTM);
    cache_params_default(&p0);
    p0.neural_size = p1.neural_size = 50;
    nc_stream *a = NULL, *b = NULL;
    stream_new(m, &p0, NULL, NULL, true, &a, err, sizeof err);
    stream_new(m, &p1, NULL, NULL, true, &b, err, sizeof err);
    double *la = malloc(300 * sizeof(double)), *lb = malloc(300 * sizeof(double));
    feed(a, &t, 0, 300, la);
    feed(b, &t, 0, 300, lb);
    CHECK(memcmp(la, lb, 300 * sizeof(double)) == 0);
    CHECK(stream_model(b) == m);
    /* adapt, then lr 0: decay brings the weights back and the stream
     * returns to the model's own */
    nc_stream *c = NULL;
    nc_cache_params p2 = dyn_params(0.05f, NC_DYN_LSTM);
    p2.dyn_decay = 0.5f;
    stream_new(m, &p2, NULL, NULL, true, &c, err, sizeof err);
    feed(c, &t, 0, 100, lb);
    CHECK(stream_model(c) != m);
    size_t mem_adapted = stream_memory(c);
    p2.dyn_lr = 0.0f;
    CHECK(stream_set_params(c, &p2, err, sizeof err) == NC_OK);
    CHECK(stream_model(c) != m);   /* still adapted: decays as it is fed */
    int rounds = 0;
    while (stream_model(c) != m && rounds < 200) {
        feed(c, &t, 100, 170, lb);
        rounds++;
    }
    CHECKF(stream_model(c) == m, "still adapted after %d rounds of decay", rounds);

    CHECK(stream_memory(c) < mem_adapted);
    /* from there on, the stream predicts as a stream that never adapted
     * with the same LSTM state: compare with a clone of the state */
    nc_stream *d = NULL;
    CHECK(stream_clone(c, &d, err, sizeof err) == NC_OK);
    nc_dist x, y;
    memset(&x, 0, sizeof x);
    memset(&y, 0, sizeof y);
    CHECK(stream_predict(c, false, &x, err, sizeof err) == NC_OK);
    CHECK(stream_predict(d, false, &y, err, sizeof err) == NC_OK);
    CHECK(x.n == y.n && memcmp(x.p, y.p, x.n * sizeof *x.p) == 0);
    dist_free(&x);
    dist_free(&y);
    stream_free(a);
    stream_free(b);
    stream_free(c);
    stream_free(d);
    free(la);
    free(lb);
    tokens_clear(&t);
    model_free(m);
}

/* The step on the scoring pass's recorded activations (a segment fed in
 * one piece) against the step after a forward pass of its own (the same
 * segment fed token by token: no recorded pass covers it). The two differ
 * only in float rounding of the forward pass (summation orders of the
 * recurrence: the F16-exact GEMV against sgemv), ~1e-6 relative through a
 * 7-step chain; the bound, 1e-3 of the largest update, leaves 100x. */
TEST(recorded_forward_matches_own_forward)
{
    char err[NC_ERRLEN];
    nc_model *m = load_with_stats();
    if (!m)
        return;
    for (int subset = NC_DYN_BIAS; subset <= NC_DYN_ALL; subset++) {
        nc_tokens t;
        lcg = 7;
        make_toks(m, 14, &t);
        nc_cache_params p = dyn_params(0.2f, subset);
        nc_stream *a = NULL, *b = NULL;
        stream_new(m, &p, NULL, NULL, true, &a, err, sizeof err);
        stream_new(m, &p, NULL, NULL, true, &b, err, sizeof err);
        if (!a || !b)
            break;
        unsigned long u0 = dyneval_trace_uses();
        feed(a, &t, 0, 7, NULL);
        feed(a, &t, 7, 14, NULL);
        unsigned long u1 = dyneval_trace_uses();
        for (size_t i = 0; i < 14; i++)
            feed(b, &t, i, i + 1, NULL);
        CHECKF(u1 - u0 == 2 && dyneval_trace_uses() == u1, "subset %d: %lu steps on the recorded pass, "
               "%lu token by token", subset, u1 - u0, dyneval_trace_uses() - u1);
        const nc_model *ma = stream_model(a), *mb = stream_model(b);
        const int L = m->cfg.num_layers;
        const size_t V = (size_t)m->cfg.vocab_size, H = (size_t)m->cfg.hidden_size, G = 4 * H;
        for (int k = 0; k <= 2 * L + 1; k++) {
            const float *wa, *wb, *w0;
            size_t n;
            if (k < 2 * L) {
                int l = k / 2;
                wa = k % 2 ? ma->layers[l].w_hh : ma->layers[l].b_ih;
                wb = k % 2 ? mb->layers[l].w_hh : mb->layers[l].b_ih;
                w0 = k % 2 ? m->layers[l].w_hh : m->layers[l].b_ih;
                n = k % 2 ? G * H : G;
            } else {
                wa = k == 2 * L ? ma->decoder_b : ma->encoder;
                wb = k == 2 * L ? mb->decoder_b : mb->encoder;
                w0 = k == 2 * L ? m->decoder_b : m->encoder;
                n = k == 2 * L ? V : V * (size_t)m->cfg.embedding_size;
            }
            double big = 0, diff = 0, ulp = 0;
            for (size_t j = 0; j < n; j++) {
                big = fmax(big, fabs((double)wb[j] - w0[j]));
                diff = fmax(diff, fabs((double)wa[j] - wb[j]));
                ulp = fmax(ulp, 4 * F32_U * fabs(w0[j]));
            }
            CHECKF(diff <= 1e-3 * big + ulp, "subset %d tensor %d: recorded vs own forward differ by %.3g "
                   "(largest update %.3g)", subset, k, diff, big);
            if (wa != w0)
                CHECKF(big > 0, "subset %d tensor %d: adapted but not moved", subset, k);
        }
        stream_free(a);
        stream_free(b);
        tokens_clear(&t);
    }
    model_free(m);
}

TEST(causal)
{
    char err[NC_ERRLEN];
    nc_model *m = load_with_stats();
    if (!m)
        return;
    for (int subset = NC_DYN_BIAS; subset <= NC_DYN_ALL; subset++) {
        nc_tokens t, u;
        lcg = 99;
        make_toks(m, 120, &t);
        lcg = 99;
        make_toks(m, 120, &u);
        size_t j = 50;
        u.ids[j] = (t.ids[j] + 1) % m->cfg.vocab_size;
        nc_cache_params p = dyn_params(0.2f, subset);
        p.neural_size = 30;
        nc_stream *a = NULL, *b = NULL;
        stream_new(m, &p, NULL, NULL, true, &a, err, sizeof err);
        stream_new(m, &p, NULL, NULL, true, &b, err, sizeof err);
        double la[120], lb[120];
        /* fed in different pieces: the answer is the same causal one */
        feed(a, &t, 0, 120, la);
        feed(b, &u, 0, 33, lb);
        feed(b, &u, 33, 120, lb + 33);
        size_t same = 0, later_diff = 0;
        for (size_t i = 0; i < j; i++)
            same += fabs(la[i] - lb[i]) <= 2e-5;   /* split vs whole: reordered float sums (TOL as doc) */
        for (size_t i = 63; i < 120; i++)
            later_diff += fabs(la[i] - lb[i]) > 1e-4;
        CHECKF(same == j, "subset %d: %zu of %zu probabilities before the change moved", subset, j - same, j);
        CHECKF(later_diff > 0, "subset %d: nothing after the change moved", subset);
        /* bit for bit when fed the same way */
        nc_stream *c = NULL;
        stream_new(m, &p, NULL, NULL, true, &c, err, sizeof err);
        double lc[120];
        feed(c, &u, 0, 120, lc);
        size_t bits = 0;
        for (size_t i = 0; i < j; i++)
            bits += la[i] == lc[i];
        CHECKF(bits == j, "subset %d: %zu earlier probabilities differ bitwise", subset, j - bits);
        stream_free(a);
        stream_free(b);
        stream_free(c);
        tokens_clear(&t);
        tokens_clear(&u);
    }
    model_free(m);
}

/* stream_gate_sink (fit-gate with dynamic evaluation): each fed token's
 * row holds the adapted model's probability of it. With no cache the
 * stream's log-probability is that of the model component, so
 * exp(lp) = pc[model] up to one rounding of exp and the float softmax's
 * own (~1e-7 relative; bound 1e-6). Fed in two pieces that split a segment,
 * the rows follow the positions; the scores with the sink on equal those
 * without within the recorded-vs-own forward pass's rounding (the sink
 * turns the kept logits off; ~1e-6 relative through a 7-step chain, as in
 * recorded_forward_matches_own_forward; bound 2e-5). And the features are
 * written (finite) for every scored token. */
TEST(gate_sink_rows_are_the_adapted_model)
{
    char err[NC_ERRLEN];
    nc_model *m = load_with_stats();
    if (!m)
        return;
    nc_tokens t;
    lcg = 7;
    make_toks(m, 100, &t);
    nc_cache_params p = dyn_params(0.2f, NC_DYN_LSTM);
    nc_stream *a = NULL, *b = NULL;
    stream_new(m, &p, NULL, NULL, true, &a, err, sizeof err);
    stream_new(m, &p, NULL, NULL, true, &b, err, sizeof err);
    double *f = malloc(100 * NC_GATE_NFEAT * sizeof(double)), *pc = malloc(100 * NC_NCOMP * sizeof(double));
    double la[100], lb[100];
    for (size_t i = 0; i < 100 * NC_NCOMP; i++)
        pc[i] = NAN;
    stream_gate_sink(a, f, pc);
    feed(a, &t, 0, 38, la);
    feed(a, &t, 38, 100, la + 38);
    feed(b, &t, 0, 100, lb);
    size_t bad = 0, off = 0, nonfinite = 0;
    for (size_t i = 0; i < 100; i++) {
        double pm = pc[i * NC_NCOMP + NC_COMP_MODEL];
        bad += !(fabs(exp(la[i]) - pm) <= 1e-6 * pm);
        off += !(fabs(la[i] - lb[i]) <= 2e-5);
        for (int k = 0; k < NC_GATE_NFEAT; k++)
            nonfinite += !isfinite(f[i * NC_GATE_NFEAT + k]) && k < NC_GATE_NPRE;
    }
    CHECKF(bad == 0, "%zu of 100 rows are not the adapted model's probability", bad);
    CHECKF(off == 0, "%zu of 100 scores moved with the sink on", off);
    CHECKF(nonfinite == 0, "%zu pre-search features not written", nonfinite);
    CHECK(stream_model(a) != m);   /* it adapted */
    free(f);
    free(pc);
    stream_free(a);
    stream_free(b);
    tokens_clear(&t);
    model_free(m);
}

TEST(export_import_and_rescore)
{
    char err[NC_ERRLEN];
    nc_model *m = load("lstm-1layer-tied");
    if (!m)
        return;
    attach_stats(m);
    for (int subset = NC_DYN_BIAS; subset <= NC_DYN_ALL; subset++) {
        nc_tokens t;
        make_toks(m, 100, &t);
        nc_cache_params p = dyn_params(0.1f, subset);
        p.unigram_size = 20;
        nc_stream *a = NULL, *b = NULL, *c = NULL;
        stream_new(m, &p, NULL, NULL, true, &a, err, sizeof err);
        feed(a, &t, 0, 53, NULL);   /* mid-segment: 53 = 7 * 7 + 4 */
        void *blob = NULL, *blob2 = NULL;
        size_t len = 0, len2 = 0;
        CHECK(stream_export(a, &blob, &len, err, sizeof err) == NC_OK);
        int rc = stream_import(m, NULL, NULL, blob, len, &b, err, sizeof err);
        CHECKF(rc == NC_OK, "%s", err);
        CHECK(stream_clone(a, &c, err, sizeof err) == NC_OK);
        if (rc || !c)
            break;
        CHECK(stream_export(b, &blob2, &len2, err, sizeof err) == NC_OK);
        CHECK(len == len2 && memcmp(blob, blob2, len) == 0);
        free(blob2);
        /* rescoring leaves the session bit for bit */
        nc_tokens conts[2];
        make_toks(m, 9, &conts[0]);
        make_toks(m, 4, &conts[1]);
        double r0[9], r1[4], *rl[2] = {r0, r1};
        CHECK(stream_rescore(a, conts, 2, rl, err, sizeof err) == NC_OK);
        CHECK(stream_export(a, &blob2, &len2, err, sizeof err) == NC_OK);
        CHECKF(len == len2 && memcmp(blob, blob2, len) == 0, "subset %d: rescoring changed the session", subset);
        free(blob2);
        /* the next predictions, through segment ends */
        double la[47], lb[47], lc[47];
        feed(a, &t, 53, 100, la);
        feed(b, &t, 53, 100, lb);
        feed(c, &t, 53, 100, lc);
        CHECKF(memcmp(la, lb, sizeof la) == 0 && memcmp(la, lc, sizeof la) == 0,
               "subset %d: imported/cloned stream predicts differently", subset);
        nc_dist x, y;
        memset(&x, 0, sizeof x);
        memset(&y, 0, sizeof y);
        stream_predict(a, false, &x, err, sizeof err);
        stream_predict(b, false, &y, err, sizeof err);
        CHECK(x.n == y.n && memcmp(x.p, y.p, x.n * sizeof *x.p) == 0);
        dist_free(&x);
        dist_free(&y);
        /* a damaged blob is refused, never half-read */
        for (size_t cut = len - 1; cut > len - 200 && cut > 12; cut -= 37) {
            nc_stream *z = NULL;
            CHECK(stream_import(m, NULL, NULL, blob, cut, &z, err, sizeof err) == NC_EFORMAT && !z);
        }
        free(blob);
        tokens_clear(&conts[0]);
        tokens_clear(&conts[1]);
        stream_free(a);
        stream_free(b);
        stream_free(c);
        tokens_clear(&t);
    }
    model_free(m);
}

TEST(refuses_without_statistics)
{
    char err[NC_ERRLEN];
    nc_model *m = load("lstm-2layer");
    if (!m)
        return;
    nc_cache_params p = dyn_params(0.1f, NC_DYN_TOP);
    nc_stream *s = NULL;
    int rc = stream_new(m, &p, NULL, NULL, true, &s, err, sizeof err);
    CHECK(rc == NC_EINVAL && !s);
    CHECK(strstr(err, "dyn-stats") != NULL);
    p.dyn_params = 7;
    CHECK(cache_params_validate(&p, err, sizeof err) == NC_EINVAL);
    model_free(m);
}

/* The CLI: dyn-stats writes DIR/dyneval, model_load attaches it, and
 * `score --dyn-lr` equals a stream fed the file. */
TEST(cli_stats_and_score)
{
    const char *bin = getenv("NEUROCACHE_BIN");
    char dir[] = "/tmp/nc-dyn-XXXXXX";
    if (!bin || !mkdtemp(dir)) {
        CHECKF(bin != NULL, "NEUROCACHE_BIN is not set");
        return;
    }
    char cmd[4096], path[2048], err[NC_ERRLEN];
    snprintf(cmd, sizeof cmd, "cp %s/lstm-2layer/config.json %s/lstm-2layer/vocab.txt %s/lstm-2layer/model.safetensors %s/",
             harness_fixtures(), harness_fixtures(), harness_fixtures(), dir);
    CHECK(system(cmd) == 0);
    nc_model *m = NULL;
    snprintf(path, sizeof path, "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    model_load(dir, &m, err, sizeof err);
    if (!m || !f) {
        CHECK(0);
        return;
    }
    for (int i = 0; i < 600; i++)
        fprintf(f, "%s%s", vocab_word(m->vocab, (int)((i * 7) % 11 + 3 + (rnd() % 5 == 0 ? rnd() % 30 : 0)) % 50),
                i % 17 == 16 ? "\n" : " ");
    fclose(f);
    model_free(m);
    snprintf(cmd, sizeof cmd, "%s/neurocache dyn-stats --model %s --train %s --segment 10 2>/dev/null", bin, dir, path);
    CHECK(system(cmd) == 0);
    m = NULL;
    int rc = model_load(dir, &m, err, sizeof err);
    CHECKF(rc == NC_OK && m && m->dyn_ms, "%s", err);
    if (!m)
        return;
    snprintf(cmd, sizeof cmd, "%s/neurocache score --model %s --dyn-lr 0.1 --dyn-segment 9 --dyn-params 2 %s 2>/dev/null",
             bin, dir, path);
    FILE *p = popen(cmd, "r");
    nc_tokens t;
    tokens_init(&t);
    nc_buf text = NC_BUF_INIT;
    buf_read_file(&text, path, err, sizeof err);
    tokenize(m, text.data, text.len, true, &t, err, sizeof err);
    nc_cache_params q = dyn_params(0.1f, NC_DYN_LSTM);
    q.dyn_segment = 9;
    q.dyn_decay = 0.02f;   /* the knob's default, as the CLI's */
    nc_stream *s = NULL;
    stream_new(m, &q, NULL, NULL, true, &s, err, sizeof err);
    double *lp = malloc(t.n * sizeof(double));
    feed(s, &t, 0, t.n, lp);
    char line[256];
    size_t i = 0, bad = 0;
    while (p && fgets(line, sizeof line, p)) {
        char *tab = strchr(line, '\t');
        /* the CLI prints %.6f of the float of the log-probability */
        if (tab && i < t.n && fabs(atof(tab + 1) - (float)lp[i]) > 1e-6)
            bad++;
        i++;
    }
    CHECKF(p && pclose(p) == 0, "score failed");
    CHECKF(i == t.n && bad == 0, "%zu lines for %zu tokens, %zu differ", i, t.n, bad);
    /* fit-gate with dynamic evaluation fits on the adapted session's
     * mixture: the constant-λ perplexity it prints is that of a stream with
     * the same knobs (printed %.3f: within 5e-4 + the sums' rounding) */
    stream_free(s);
    q.neural_size = 20;
    stream_new(m, &q, NULL, NULL, true, &s, err, sizeof err);
    feed(s, &t, 0, t.n, lp);
    double sum = 0;
    for (size_t j = 0; j < t.n; j++)
        sum += lp[j];
    double want = exp(-sum / (double)t.n), got = NAN;
    snprintf(cmd, sizeof cmd, "%s/neurocache fit-gate --model %s --valid %s --neural-size 20 --dyn-lr 0.1 "
             "--dyn-segment 9 --dyn-params 2 --iters 5 --out %s 2>/dev/null", bin, dir, path, dir);
    p = popen(cmd, "r");
    while (p && fgets(line, sizeof line, p))
        if (strncmp(line, "constant: perplexity ", 21) == 0)
            got = atof(line + 21);
    CHECKF(p && pclose(p) == 0, "fit-gate failed");
    CHECKF(fabs(got - want) <= 1e-3, "fit-gate's constant perplexity %.4f, the session's %.4f", got, want);
    free(lp);
    stream_free(s);
    tokens_clear(&t);
    buf_free(&text);
    model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static const char *DTEXT = "w1 w2 w3 w4 w5 w1 w2 w3\nw6 w7 w1 w2 w3 w4 zzz w8\nw1 w2 w3 w9 w1 w2\n"
                           "w4 w5 w1 w2 w3 w6 w7\nw1 w2 w3 w4 w5 w1 w2 w3\n";
#define DYN_OPTS "--dyn-lr 0.2 --dyn-segment 6 --dyn-params 2 --neural-cache 20 --theta 0.5 --lambda 0.2"
#define DYN_JSON "{\"cache\": {\"dyn_lr\": 0.2, \"dyn_segment\": 6, \"dyn_params\": 2, \"neural_size\": 20, " \
                 "\"neural_theta\": 0.5, \"neural_lambda\": 0.2}}"

static char *session(int port)
{
    http_resp r;
    char *id = NULL;
    if (http_json(port, "POST", "/v1/sessions", DYN_JSON, &r) == 0 && r.status == 201 && r.json)
        id = strdup(json_string_value(json_object_get(r.json, "id")));
    CHECKF(id != NULL, "session: %ld %s", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return id;
}

/* The session's scores of text (feed with scores) appended to out[*n]. */
static void feed_scores(int port, const char *id, const char *text, double *out, size_t *n, size_t cap)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/feed", id);
    json_t *b = json_pack("{s:s,s:b}", "text", text, "scores", 1);
    http_resp r;
    CHECK(http_post_json(port, path, b, &r) == 0 && r.status == 200);
    json_decref(b);
    json_t *sc = r.json ? json_object_get(r.json, "logprobs") : NULL;
    for (size_t i = 0; i < json_array_size(sc) && *n < cap; i++) {
        json_t *lp = json_array_get(sc, i);
        out[(*n)++] = json_is_number(lp) ? json_number_value(lp) : NAN;
    }
    CHECKF(sc != NULL, "feed: %s", r.body ? r.body : "");
    http_resp_free(&r);
}

static char *get_state(int port, const char *id, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/state", id);
    http_resp r;
    char *blob = NULL;
    if (http_call(port, "GET", path, NULL, NULL, 0, &r) == 0 && r.status == 200) {
        blob = malloc(r.len);
        memcpy(blob, r.body, r.len);
        *len = r.len;
    }
    CHECKF(blob != NULL, "export: %ld", r.status);
    http_resp_free(&r);
    return blob;
}

static char *predict_body(int port, const char *id)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/sessions/%s/predict", id);
    http_resp r;
    char *b = NULL;
    if (http_json(port, "POST", path, "{\"top_k\": 5}", &r) == 0 && r.status == 200 && r.json) {
        json_t *p = json_object_get(r.json, "predictions");
        b = json_dumps(p ? p : r.json, JSON_COMPACT | JSON_SORT_KEYS);
    }
    CHECKF(b != NULL, "predict: %ld %s", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return b;
}

/* The CLI (score) and a daemon session fed the same text in two chunks:
 * the same code (stream_feed) on both sides, but the chunk boundary falls
 * inside a segment, so one segment is scored in two LSTM passes and its
 * step recomputes the decoder (dyneval_push): reordered float sums, as
 * test_server's CLI comparison, within 1e-4 (the weights' few steps carry
 * the difference on; REORDER bounds of a few 1e-6 per pass). */
TEST(daemon_matches_cli_and_round_trips)
{
    char dir[] = "/tmp/nc-dynd-XXXXXX", cmd[4096], out[65536], path[2048];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "cp %s/lstm-2layer/config.json %s/lstm-2layer/vocab.txt %s/lstm-2layer/model.safetensors %s/",
             harness_fixtures(), harness_fixtures(), harness_fixtures(), dir);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 40; i++)
        fputs(DTEXT, f);
    if (f)
        fclose(f);
    snprintf(cmd, sizeof cmd, "%s dyn-stats --model %s --train %s --segment 6 2>&1", daemon_bin_path("neurocache"), dir,
             path);
    CHECKF(harness_run_capture(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(path, sizeof path, "%s/one.txt", dir);
    f = fopen(path, "w");
    if (f) {
        fputs(DTEXT, f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "%s score --model %s --format json " DYN_OPTS " %s 2>/dev/null",
             daemon_bin_path("neurocache"), dir, path);
    CHECK(harness_run_capture(cmd, out, sizeof out) == 0);
    json_t *cli = json_loads(out, 0, NULL);
    json_t *want = cli ? json_object_get(cli, "logprobs") : NULL;
    size_t nw = json_array_size(want);
    CHECK(nw > 30);
    nc_daemon d;
    const char *args[] = {"--model", dir, NULL};
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        json_decref(cli);
        return;
    }
    http_resp r;
    CHECK(http_json(d.port, "GET", "/v1/model", NULL, &r) == 0 && r.status == 200);
    json_t *dm = r.json ? json_object_get(r.json, "dyneval") : NULL;
    CHECK(json_is_true(json_object_get(dm, "statistics")));
    CHECK(json_integer_value(json_object_get(json_object_get(dm, "memory_per_session"), "0")) > 0);
    CHECK(json_object_get(json_object_get(r.json, "cache_knobs"), "dyn_lr") != NULL);
    http_resp_free(&r);
    char *id = session(d.port);
    double got[256];
    size_t n = 0;
    size_t cut = 36;   /* after 13 tokens: inside a segment of 6 */
    char first[256];
    snprintf(first, sizeof first, "%.*s", (int)cut, DTEXT);
    feed_scores(d.port, id, first, got, &n, 256);
    feed_scores(d.port, id, DTEXT + cut, got, &n, 256);
    CHECKF(n == nw, "daemon %zu scores, CLI %zu", n, nw);
    double worst = 0;
    for (size_t i = 0; i < n && i < nw; i++) {
        double a = json_number_value(json_array_get(want, i));
        if (fabs(a - got[i]) > worst)
            worst = fabs(a - got[i]);
    }
    CHECKF(worst <= 1e-4, "daemon and CLI differ by %g", worst);
    /* export, import under another id: the next predictions and scores are
     * the same bit for bit; rescoring leaves the blob unchanged */
    size_t len = 0, len2 = 0;
    char *blob = get_state(d.port, id, &len);
    char rpath[256];
    snprintf(rpath, sizeof rpath, "/v1/sessions/%s/rescore", id);
    CHECK(http_json(d.port, "POST", rpath, "{\"hypotheses\": [\"w1 w2 w3 w4 w5 w6 w7\", \"w9 w9\"]}", &r) == 0 &&
          r.status == 200);
    http_resp_free(&r);
    char *blob2 = get_state(d.port, id, &len2);
    CHECK(blob && blob2 && len == len2 && memcmp(blob, blob2, len) == 0);
    free(blob2);
    CHECK(blob && http_call(d.port, "PUT", "/v1/sessions/ses_dyncopy/state", "application/octet-stream", blob, len,
                            &r) == 0 && r.status == 201);
    http_resp_free(&r);
    char *p1 = predict_body(d.port, id), *p2 = predict_body(d.port, "ses_dyncopy");
    CHECKF(p1 && p2 && strcmp(p1, p2) == 0, "predictions differ: %.300s | %.300s", p1 ? p1 : "-", p2 ? p2 : "-");
    free(p1);
    free(p2);
    double s1[256], s2[256];
    size_t n1 = 0, n2 = 0;
    feed_scores(d.port, id, DTEXT, s1, &n1, 256);
    feed_scores(d.port, "ses_dyncopy", DTEXT, s2, &n2, 256);
    CHECK(n1 == n2 && n1 > 0 && memcmp(s1, s2, n1 * sizeof(double)) == 0);
    free(blob);
    free(id);
    /* dyn_lr on a model without statistics: 400 dyneval_unavailable (its
     * own code: the value is in range) naming the command, on every route
     * that takes cache settings; dyn_lr 0 is served */
    CHECK(daemon_stop(&d) == 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s/dyneval", dir);
    CHECK(system(cmd) == 0);
    if (daemon_start(&d, args) == 0) {
        static const char *const routes[][2] = {
            {"/v1/sessions", DYN_JSON},
            {"/v1/score", "{\"text\": \"w1 w2\", \"cache\": {\"dyn_lr\": 0.002}}"},
            {"/v1/rescore", "{\"hypotheses\": [\"w1 w2\"], \"cache\": {\"dyn_lr\": 0.002}}"},
        };
        for (size_t i = 0; i < 3; i++) {
            CHECK(http_json(d.port, "POST", routes[i][0], routes[i][1], &r) == 0);
            CHECKF(r.status == 400 && !strcmp(http_error_code(&r), "dyneval_unavailable") && r.body &&
                   strstr(r.body, "neurocache dyn-stats"), "%s: %ld %s", routes[i][0], r.status, r.body ? r.body : "");
            http_resp_free(&r);
        }
        CHECK(http_json(d.port, "POST", "/v1/sessions", "{\"cache\": {\"dyn_lr\": 0}}", &r) == 0 && r.status == 201);
        http_resp_free(&r);
        CHECK(daemon_stop(&d) == 0);
    }
    json_decref(cli);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* The shipped demo model has its statistics (models/demo/dyneval, BF16:
 * docs/dyneval.md), of its own configuration and vocabulary (the loader
 * checks), and a session of the daemon asking dyn_lr 0.002 adapts: the
 * sentence fed a third time scores better, by nats, than in a session
 * without dynamic evaluation (the same before the first step). */
TEST(demo_model_ships_statistics)
{
    char err[NC_ERRLEN];
    nc_model *m = NULL;
    CHECKF(model_load("models/demo", &m, err, sizeof err) == NC_OK, "%s", err);
    CHECK(m && m->dyn_ms);
    model_free(m);
    const char *args[] = {"--model", "models/demo", NULL};
    nc_daemon d;
    if (daemon_start(&d, args) != 0) {
        CHECK(!"daemon started");
        return;
    }
    static const char text[] = "the quetzalcoatl fund sold its stake in the quetzalcoatl company\n";
    const char *body[2] = {"{\"id\": \"dyn\", \"cache\": {\"dyn_lr\": 0.002}}", "{\"id\": \"static\"}"};
    const char *ids[2] = {"dyn", "static"};
    double sum[2][3] = {{0}};
    for (int k = 0; k < 2; k++) {
        http_resp r;
        CHECK(http_json(d.port, "POST", "/v1/sessions", body[k], &r) == 0 && r.status == 201);
        http_resp_free(&r);
        for (int pass = 0; pass < 3; pass++) {
            double lp[64];
            size_t n = 0;
            feed_scores(d.port, ids[k], text, lp, &n, 64);
            for (size_t i = 0; i < n; i++)
                sum[k][pass] += lp[i];
        }
    }
    /* the first 12 tokens come before the first step (segments of 20) */
    CHECKF(fabs(sum[0][0] - sum[1][0]) < 1e-3 && sum[0][2] > sum[1][2] + 1.0, "adapting %g %g %g, static %g %g %g",
           sum[0][0], sum[0][1], sum[0][2], sum[1][0], sum[1][1], sum[1][2]);
    CHECK(daemon_stop(&d) == 0);
}

/* An F16 model's binary16 copies (model.h) are of the trained weights:
 * the shadow model of an adaptation keeps those of the tensors it does not
 * adapt and drops those of the ones it does (a float32 copy that leaves the
 * half grid at its first step), so its products read the adapted weights:
 * the shadow's logits follow a change of its decoder. */
TEST(f16_copies_dropped_where_adapted)
{
    char err[NC_ERRLEN];
    nc_model *m = load("lstm-2layer-f16");
    if (!m)
        return;
    attach_stats(m);
    CHECK(m->decoder_f16 && m->layers[0].w_ih_f16 && m->layers[1].w_hh_f16);
    nc_state *s0 = state_after(m, 3);
    for (int subset = NC_DYN_BIAS; subset <= NC_DYN_ALL; subset++) {
        nc_dyneval *d = NULL;
        int rc = dyn_new(m, subset, s0, true, &d, err, sizeof err);
        CHECKF(rc == NC_OK, "%s", err);
        if (rc)
            break;
        const nc_model *sh = dyneval_model(d);
        const int L = m->cfg.num_layers;
        for (int l = 0; l < L; l++) {
            /* TOP adapts the last layer's matrices, LSTM and ALL every layer's */
            bool adapted = subset == NC_DYN_LSTM || subset == NC_DYN_ALL || (subset == NC_DYN_TOP && l == L - 1);
            CHECKF((sh->layers[l].w_ih_f16 == NULL) == adapted && (sh->layers[l].w_hh_f16 == NULL) == adapted,
                   "subset %d layer %d: binary16 copies %p %p", subset, l, (const void *)sh->layers[l].w_ih_f16,
                   (const void *)sh->layers[l].w_hh_f16);
        }
        CHECKF((sh->decoder_f16 == NULL) == (subset == NC_DYN_ALL), "subset %d: decoder copy %p", subset,
               (const void *)sh->decoder_f16);
        if (subset == NC_DYN_ALL) {
            /* the adapted decoder (the shadow's own float32 copy) is what
             * lstm_logits reads */
            const int V = m->cfg.vocab_size;
            float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
            const float *h = lstm_state_top(s0);
            lstm_logits(sh, h, a);
            float *w = sh->decoder_w;
            const float old = w[0];
            w[0] += 0.5f;
            lstm_logits(sh, h, b);
            w[0] = old;
            CHECKF(fabsf(b[0] - a[0] - 0.5f * h[0]) <= 1e-5f * (1.0f + fabsf(a[0])), "logit 0 moved %g, expected %g",
                   (double)(b[0] - a[0]), 0.5 * h[0]);
            CHECK(m->decoder_w[0] == old);
            free(a), free(b);
        }
        dyneval_free(d);
    }
    lstm_state_free(s0);
    model_free(m);
}

int main(void)
{
    httpc_init();
    RUN(gradient_matches_central_differences);
    RUN(update_matches_naive_rule);
    RUN(f16_copies_dropped_where_adapted);
    RUN(lr_zero_is_today_and_decay_returns);
    RUN(recorded_forward_matches_own_forward);
    RUN(causal);
    RUN(gate_sink_rows_are_the_adapted_model);
    RUN(export_import_and_rescore);
    RUN(refuses_without_statistics);
    RUN(cli_stats_and_score);
    RUN(daemon_matches_cli_and_round_trips);
    RUN(demo_model_ships_statistics);
    return harness_summary();
}
