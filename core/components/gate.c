/* gate.c -- the adaptive mixture's gate (see gate.h): features, weights,
 * objective and gradient, L-BFGS fit, adaptive-retrieval decision, files. */
#include "gate.h"
#include "cache_params.h"
#include "components.h"
#include "rng.h"
#include "vmath.h"
#include "atomicfile.h"
#include "fault.h"
#include "safetensors.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gate_vocab_stats(const float *logits, int V, float *scratch, float *ent, float *logmax, int *argmax)
{
    /* H = -Σ p log p = log Z - Σ p_w s_w with p_w = exp(s_w - log Z): one
     * vectorised exp pass and one dot product */
    int am = 0;
    for (int w = 1; w < V; w++)
        if (logits[w] > logits[am])
            am = w;
    float m = logits[am];
    double z = vm_exp_sum(scratch, logits, (size_t)V, m);
    double es = (double)cblas_sdot(V, scratch, 1, logits, 1) / z;   /* Σ p s */
    double lz = m + log(z);
    *ent = (float)(lz - es);
    *logmax = (float)(m - lz);
    *argmax = am;
}

void gate_features(const nc_cache_params *p, const nc_mix_input *in, bool post, double f[NC_GATE_NFEAT])
{
    for (int i = 0; i < NC_GATE_NFEAT; i++)
        f[i] = 0.0;
    /* each row's features at its offsets: the pre-search ones in the
     * table's order, then the post-search ones (components.h) */
    nc_feat_ctx ctx = {.attended = -2};
    int pre = 0, after = NC_GATE_NPRE;
    for (int c = 0; c < NC_NCOMP; c++) {
        const nc_component *r = nc_component_rows[c];
        if (r->gate_features)
            r->gate_features(p, in, &ctx, f + pre, post ? f + after : NULL);
        pre += nc_component_npre[c];
        after += nc_component_npost[c];
    }
}

/* softmax of z over the fitted components, then the weight of a fitted
 * component not in avail passed on to the ones before it (gate.h) */
static void weights_of(const nc_gate *g, const double z[NC_NCOMP], unsigned avail, double w[NC_NCOMP])
{
    double zm = -INFINITY, s = 0.0;
    for (int c = 0; c < NC_NCOMP; c++)
        if (((g->comps >> c) & 1u) && z[c] > zm)
            zm = z[c];
    for (int c = 0; c < NC_NCOMP; c++) {
        w[c] = ((g->comps >> c) & 1u) ? exp(z[c] - zm) : 0.0;
        s += w[c];
    }
    for (int c = 0; c < NC_NCOMP; c++)
        w[c] /= s;
    for (int c = NC_NCOMP - 1; c > 0; c--) {
        if (((avail >> c) & 1u) || w[c] == 0.0)
            continue;
        double before = 0.0;
        for (int e = 0; e < c; e++)
            before += w[e];
        if (before > 0.0) {
            double k = (before + w[c]) / before;
            for (int e = 0; e < c; e++)
                w[e] *= k;
        } else {
            w[0] = w[c];   /* the first row: the model */
        }
        w[c] = 0.0;
    }
}

/* z from raw features: x (normalised) and the hidden activations a are
 * kept for the gradient */
static void logits_of(const nc_gate_net *net, const nc_gate *g, const double *f, double *x, double *a,
                      double z[NC_NCOMP])
{
    /* normalised, and clipped to ±NC_GATE_CLIP: a text or memory unlike the
     * fitting one (a denser index, another domain) must not drive the gate
     * by extrapolation far outside what it was fitted on */
    for (int i = 0; i < NC_GATE_NFEAT; i++) {
        double v = (f[i] - g->mean[i]) / g->sd[i];
        x[i] = v > NC_GATE_CLIP ? NC_GATE_CLIP : v < -NC_GATE_CLIP ? -NC_GATE_CLIP : v;
    }
    for (int j = 0; j < g->nh; j++) {
        double s = net->u[j][NC_GATE_NFEAT];
        for (int i = 0; i < NC_GATE_NFEAT; i++)
            s += net->u[j][i] * x[i];
        a[j] = tanh(s);
    }
    for (int c = 0; c < NC_NCOMP; c++) {
        double s = net->w[c][NC_GATE_NFEAT];
        for (int i = 0; i < NC_GATE_NFEAT; i++)
            s += net->w[c][i] * x[i];
        for (int j = 0; j < g->nh; j++)
            s += net->v[c][j] * a[j];
        z[c] = s;
    }
}

void gate_weights(const nc_gate *g, bool pre, const double f[NC_GATE_NFEAT], unsigned avail, double w[NC_NCOMP])
{
    NC_ASSERT(g, "gate_weights: no g");
    double x[NC_GATE_NFEAT], a[NC_GATE_MAXH], z[NC_NCOMP];
    logits_of(pre ? &g->pre : &g->full, g, f, x, a, z);
    weights_of(g, z, avail, w);
}

void gate_const_weights(const nc_cache_params *p, unsigned avail, double w[NC_NCOMP])
{
    double lam[NC_NCOMP];
    for (int c = 0; c < NC_NCOMP; c++) {
        lam[c] = nc_component_rows[c]->lambda ? nc_component_rows[c]->lambda(p) : 0.0;
        w[c] = 0.0;
    }
    w[0] = 1.0;
    /* step c: p <- (1-λ_c) p + λ_c p_c (mixture.h), in this order */
    for (int c = 1; c < NC_NCOMP; c++) {
        if (!((avail >> c) & 1u))
            continue;
        for (int e = 0; e < c; e++)
            w[e] *= 1.0 - lam[c];
        w[c] = lam[c];
    }
}

bool gate_searches(const nc_gate *g)
{
    NC_ASSERT(g, "gate_searches: no g");
    return (g->comps & components_searched()) != 0;
}

double gate_threshold(const nc_gate *g, const nc_cache_params *p)
{
    NC_ASSERT(p, "gate_threshold: no p");
    NC_ASSERT(g, "gate_threshold: no g");
    return p->gate_skip < 0.0f ? g->skip : (double)p->gate_skip;
}

bool gate_skip_search(const nc_gate *g, const nc_cache_params *p, const nc_mix_input *in, int sc)
{
    NC_ASSERT(g, "gate_skip_search: no g");
    double thr = gate_threshold(g, p);
    if (!(thr > 0.0) || !(((g->comps & components_searched()) >> sc) & 1u))
        return false;
    double f[NC_GATE_NFEAT], w[NC_NCOMP];
    /* the unbounded share among all the fitted components, whichever are
     * empty here: the decision reads the features only, not the state of
     * the unigram window (which a batch sees at its block's start) */
    gate_features(p, in, false, f);
    gate_weights(g, true, f, g->comps, w);
    return w[sc] < thr;
}

static atomic_ullong n_searched, n_skipped;

void gate_count_searches(uint64_t searched, uint64_t skipped)
{
    atomic_fetch_add(&n_searched, searched);
    atomic_fetch_add(&n_skipped, skipped);
}

void gate_counters(uint64_t *searched, uint64_t *skipped)
{
    *searched = atomic_load(&n_searched);
    *skipped = atomic_load(&n_skipped);
}

/* ---- fitting ---- */

/* a token counts when every fitted component is available there */
static bool token_used(const nc_gate *g, const double *pc)
{
    double s = 0.0;
    for (int c = 0; c < NC_NCOMP; c++)
        if ((g->comps >> c) & 1u) {
            if (isnan(pc[c]))
                return false;
            s += pc[c];
        }
    return s > 0.0;
}

double gate_objective(const nc_gate *g, bool pre, const nc_gate_data *d, double l2, double *grad, size_t *used)
{
    NC_ASSERT(d, "gate_objective: no d");
    NC_ASSERT(g, "gate_objective: no g");
    const nc_gate_net *net = pre ? &g->pre : &g->full;
    nc_gate_net *gr = (nc_gate_net *)grad;
    double loss = 0.0, x[NC_GATE_NFEAT], a[NC_GATE_MAXH], z[NC_NCOMP], w[NC_NCOMP], gz[NC_NCOMP];
    size_t n = 0;
    if (gr)
        memset(gr, 0, sizeof *gr);
    for (size_t t = 0; t < d->n; t++) {
        const double *pc = d->pc + t * NC_NCOMP, *f = d->f + t * NC_GATE_NFEAT;
        if (!token_used(g, pc))
            continue;
        logits_of(net, g, f, x, a, z);
        weights_of(g, z, g->comps, w);
        double P = 0.0;
        for (int c = 0; c < NC_NCOMP; c++)
            if ((g->comps >> c) & 1u)
                P += w[c] * pc[c];
        loss -= log(P);
        n++;
        if (!gr)
            continue;
        /* d(-log Σ_c w_c p_c)/dz_c = -w_c (p_c / P - 1) (softmax), then
         * back through the linear part and the tanh layer */
        for (int c = 0; c < NC_NCOMP; c++) {
            gz[c] = ((g->comps >> c) & 1u) ? -w[c] * (pc[c] / P - 1.0) : 0.0;
            if (gz[c] == 0.0)
                continue;
            for (int i = 0; i < NC_GATE_NFEAT; i++)
                gr->w[c][i] += gz[c] * x[i];
            gr->w[c][NC_GATE_NFEAT] += gz[c];
            for (int j = 0; j < g->nh; j++)
                gr->v[c][j] += gz[c] * a[j];
        }
        for (int j = 0; j < g->nh; j++) {
            double da = 0.0;
            for (int c = 0; c < NC_NCOMP; c++)
                da += gz[c] * net->v[c][j];
            da *= 1.0 - a[j] * a[j];
            for (int i = 0; i < NC_GATE_NFEAT; i++)
                gr->u[j][i] += da * x[i];
            gr->u[j][NC_GATE_NFEAT] += da;
        }
    }
    if (used)
        *used = n;
    double inv = n ? 1.0 / (double)n : 0.0;
    loss *= inv;
    if (gr)
        for (int i = 0; i < NC_GATE_NP; i++)
            grad[i] *= inv;
    /* L2 on the weights, not the biases */
    for (int c = 0; c < NC_NCOMP; c++) {
        for (int i = 0; i < NC_GATE_NFEAT; i++) {
            loss += 0.5 * l2 * net->w[c][i] * net->w[c][i];
            if (gr)
                gr->w[c][i] += l2 * net->w[c][i];
        }
        for (int j = 0; j < g->nh; j++) {
            loss += 0.5 * l2 * net->v[c][j] * net->v[c][j];
            if (gr)
                gr->v[c][j] += l2 * net->v[c][j];
        }
    }
    for (int j = 0; j < g->nh; j++)
        for (int i = 0; i < NC_GATE_NFEAT; i++) {
            loss += 0.5 * l2 * net->u[j][i] * net->u[j][i];
            if (gr)
                gr->u[j][i] += l2 * net->u[j][i];
        }
    return loss;
}

#define NP NC_GATE_NP
#define LBFGS_M 8

/* the free parameters: rows of the fitted components but the model's (the
 * softmax is invariant to a common shift: the model's row stays 0); the
 * pre-search gate: the bias and the pre-search feature columns only */
static void free_mask(const nc_gate *g, bool pre, double *mask)
{
    nc_gate_net *m = (nc_gate_net *)mask;
    memset(m, 0, sizeof *m);
    for (int c = 0; c < NC_NCOMP; c++) {
        bool row = c != 0 && ((g->comps >> c) & 1u);
        for (int i = 0; i < NC_GATE_NW; i++)
            m->w[c][i] = row && (!pre || i < NC_GATE_NPRE || i == NC_GATE_NFEAT);
        for (int j = 0; j < g->nh; j++)
            m->v[c][j] = row;
    }
    for (int j = 0; j < g->nh; j++)
        for (int i = 0; i < NC_GATE_NW; i++)
            m->u[j][i] = !pre || i < NC_GATE_NPRE || i == NC_GATE_NFEAT;
}

static double dot(const double *a, const double *b)
{
    double s = 0.0;
    for (int i = 0; i < NP; i++)
        s += a[i] * b[i];
    return s;
}

/* One of the two gates' fitting problems: its net in g, the data, the L2
 * weight and which parameters are free (mask 1) */
typedef struct {
    nc_gate *g;
    bool pre;
    const nc_gate_data *d;
    double l2;
    double mask[NP];
} fit_problem;

static double eval_at(const fit_problem *fp, const double *x, double *grad)
{
    memcpy(fp->pre ? &fp->g->pre : &fp->g->full, x, sizeof(nc_gate_net));
    double f = gate_objective(fp->g, fp->pre, fp->d, fp->l2, grad, NULL);
    for (int i = 0; i < NP; i++)
        grad[i] *= fp->mask[i];
    return f;
}

/* L-BFGS's memory: the last LBFGS_M steps s = x' - x, gradient changes
 * y = g' - g and ρ = 1 / s·y, newest at head - 1 */
typedef struct {
    double S[LBFGS_M][NP], Y[LBFGS_M][NP], rho[LBFGS_M];
    int hist, head;
} lbfgs_memory;

/* The two-loop recursion (Nocedal & Wright, Algorithm 7.4): dir = -H g,
 * H the inverse Hessian estimate of the memory, scaled by γ = s·y / y·y of
 * the newest pair (or a step of length <= 1 with no memory yet). */
static void lbfgs_direction(const lbfgs_memory *mem, const double *gr, double *dir)
{
    double alpha[LBFGS_M];
    for (int i = 0; i < NP; i++)
        dir[i] = -gr[i];
    for (int k = 0; k < mem->hist; k++) {
        int j = (mem->head - 1 - k + LBFGS_M) % LBFGS_M;
        alpha[j] = mem->rho[j] * dot(mem->S[j], dir);
        for (int i = 0; i < NP; i++)
            dir[i] -= alpha[j] * mem->Y[j][i];
    }
    if (mem->hist > 0) {
        int j = (mem->head - 1 + LBFGS_M) % LBFGS_M;
        double gamma = dot(mem->S[j], mem->Y[j]) / dot(mem->Y[j], mem->Y[j]);
        for (int i = 0; i < NP; i++)
            dir[i] *= gamma;
    } else {
        double gnorm = sqrt(dot(gr, gr));
        for (int i = 0; i < NP; i++)
            dir[i] /= gnorm > 1.0 ? gnorm : 1.0;
    }
    for (int k = mem->hist - 1; k >= 0; k--) {
        int j = (mem->head - 1 - k + LBFGS_M) % LBFGS_M;
        double b = mem->rho[j] * dot(mem->Y[j], dir);
        for (int i = 0; i < NP; i++)
            dir[i] += mem->S[j][i] * (alpha[j] - b);
    }
}

/* Remembers the step x -> xn with gradients gr -> gn (skipped when s·y is
 * not positive: the estimate would lose positive definiteness). */
static void lbfgs_remember(lbfgs_memory *mem, const double *x, const double *xn, const double *gr, const double *gn)
{
    double *s = mem->S[mem->head], *y = mem->Y[mem->head];
    for (int i = 0; i < NP; i++) {
        s[i] = xn[i] - x[i];
        y[i] = gn[i] - gr[i];
    }
    double sy = dot(s, y);
    if (sy > 1e-18) {
        mem->rho[mem->head] = 1.0 / sy;
        mem->head = (mem->head + 1) % LBFGS_M;
        if (mem->hist < LBFGS_M)
            mem->hist++;
    }
}

/* L-BFGS with a backtracking Armijo line search: a handful of parameters,
 * a smooth concave log-likelihood */
static void lbfgs(nc_gate *g, bool pre, const nc_gate_data *d, const nc_gate_fit_opts *o)
{
    lbfgs_memory mem = {.hist = 0, .head = 0};
    double x[NP], gr[NP], dir[NP], xn[NP], gn[NP];
    fit_problem fp = {.g = g, .pre = pre, .d = d, .l2 = o->l2};
    free_mask(g, pre, fp.mask);
    memcpy(x, pre ? &g->pre : &g->full, sizeof x);
    double f = eval_at(&fp, x, gr);
    if (o->curve)
        fprintf(o->curve, "%s,0,%.9f,%.6f\n", pre ? "pre" : "full", f, exp(f));
    for (int it = 1; it <= o->iters; it++) {
        lbfgs_direction(&mem, gr, dir);
        double slope = dot(gr, dir);
        if (!(slope < 0.0)) {
            for (int i = 0; i < NP; i++)
                dir[i] = -gr[i];
            slope = dot(gr, dir);
            mem.hist = 0;
        }
        if (!(slope < -1e-15))
            break;
        double step = 1.0, fn = f;
        int tries;
        for (tries = 0; tries < 40; tries++, step *= 0.5) {
            for (int i = 0; i < NP; i++)
                xn[i] = x[i] + step * dir[i];
            fn = eval_at(&fp, xn, gn);
            if (fn <= f + 1e-4 * step * slope)
                break;
        }
        if (tries == 40)
            break;
        lbfgs_remember(&mem, x, xn, gr, gn);
        double df = f - fn;
        memcpy(x, xn, sizeof x);
        memcpy(gr, gn, sizeof gr);
        f = fn;
        if (o->curve)
            fprintf(o->curve, "%s,%d,%.9f,%.6f\n", pre ? "pre" : "full", it, f, exp(f));
        if (df < 1e-11 * (fabs(f) > 1.0 ? fabs(f) : 1.0))
            break;
    }
    memcpy(pre ? &g->pre : &g->full, x, sizeof x);
}

double gate_data_ppl(const nc_gate *g, const nc_gate_data *d, double thr, double *skipped)
{
    NC_ASSERT(d, "gate_data_ppl: no d");
    NC_ASSERT(g, "gate_data_ppl: no g");
    double nll = 0.0, w[NC_NCOMP];
    size_t n = 0, sk = 0;
    unsigned sb = g->comps & components_searched();
    for (size_t t = 0; t < d->n; t++) {
        const double *pc = d->pc + t * NC_NCOMP, *f = d->f + t * NC_GATE_NFEAT;
        if (!token_used(g, pc))
            continue;
        /* each searched row skipped on its own pre-search weight; a skip
         * leaves the pre-search net to weigh the rest */
        unsigned skip = 0;
        if (sb && thr > 0.0) {
            gate_weights(g, true, f, g->comps, w);
            for (int c = 0; c < NC_NCOMP; c++)
                if ((sb >> c) & 1u && w[c] < thr)
                    skip |= 1u << c;
        }
        if (skip)
            gate_weights(g, true, f, g->comps & ~skip, w);
        else
            gate_weights(g, false, f, g->comps, w);
        double P = 0.0;
        for (int c = 0; c < NC_NCOMP; c++)
            if (w[c] > 0.0)
                P += w[c] * pc[c];
        nll -= log(P);
        n++;
        sk += skip != 0;
    }
    if (skipped)
        *skipped = n ? (double)sk / (double)n : 0.0;
    return n ? exp(nll / (double)n) : NAN;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* g->comps: the components the fitting text has at all (the first row
 * always); then mean and sd of the features over the tokens that count.
 * Returns those tokens' number. */
static size_t fit_normalisation(nc_gate *g, const nc_gate_data *d)
{
    for (size_t t = 0; t < d->n; t++)
        for (int c = 0; c < NC_NCOMP; c++)
            if (!isnan(d->pc[t * NC_NCOMP + c]))
                g->comps |= 1u << c;
    g->comps |= 1u;
    size_t n = 0;
    double s1[NC_GATE_NFEAT] = {0}, s2[NC_GATE_NFEAT] = {0};
    for (size_t t = 0; t < d->n; t++) {
        if (!token_used(g, d->pc + t * NC_NCOMP))
            continue;
        n++;
        for (int i = 0; i < NC_GATE_NFEAT; i++) {
            double v = d->f[t * NC_GATE_NFEAT + i];
            s1[i] += v;
            s2[i] += v * v;
        }
    }
    for (int i = 0; n >= 2 && i < NC_GATE_NFEAT; i++) {
        g->mean[i] = s1[i] / (double)n;
        double var = s2[i] / (double)n - g->mean[i] * g->mean[i];
        g->sd[i] = var > 1e-12 ? sqrt(var) : 1.0;
    }
    return n;
}

/* The start: the constant mixture of p (W = V = 0, b = log of its weights,
 * a weight 0 floored), hidden units U ~ uniform(±1/√F) from the seed (V = 0:
 * still the constant mixture); the pre-search gate's copy without the
 * post-search features. */
static void fit_start(nc_gate *g, const nc_cache_params *p, uint64_t seed)
{
    double w0[NC_NCOMP];
    gate_const_weights(p, g->comps, w0);
    for (int c = 0; c < NC_NCOMP; c++)
        if ((g->comps >> c) & 1u) {
            double b = log(w0[c] > 1e-6 ? w0[c] : 1e-6) - log(w0[0] > 1e-6 ? w0[0] : 1e-6);
            g->full.w[c][NC_GATE_NFEAT] = g->pre.w[c][NC_GATE_NFEAT] = b;
        }
    nc_rng r;
    rng_seed(&r, seed);
    for (int j = 0; j < g->nh; j++)
        for (int i = 0; i < NC_GATE_NW; i++) {
            double u = (2.0 * rng_uniform(&r) - 1.0) / sqrt((double)NC_GATE_NFEAT);
            g->full.u[j][i] = u;
            g->pre.u[j][i] = i < NC_GATE_NPRE || i == NC_GATE_NFEAT ? u : 0.0;
        }
}

/* The skip threshold, one for every searched row: the largest candidate
 * (quantiles of the pre-search gate's weights of the searched rows over
 * the tokens that count) costing at most max_loss. */
static int fit_skip(nc_gate *g, const nc_gate_data *d, double max_loss, FILE *curve, char *err, size_t errlen)
{
    g->skip = 0.0;
    const unsigned sb = g->comps & components_searched();
    if (!sb)
        return NC_OK;
    size_t n = 0;
    for (size_t t = 0; t < d->n; t++)
        n += token_used(g, d->pc + t * NC_NCOMP) * (size_t)__builtin_popcount(sb);
    double *q = nc_malloc(n * sizeof(double)), w[NC_NCOMP];
    if (!q)
        return nc_error(err, errlen, NC_ENOMEM, "gate: %zu weights", n);
    size_t m = 0;
    for (size_t t = 0; t < d->n; t++)
        if (token_used(g, d->pc + t * NC_NCOMP)) {
            gate_weights(g, true, d->f + t * NC_GATE_NFEAT, g->comps, w);
            for (int c = 0; c < NC_NCOMP; c++)
                if ((sb >> c) & 1u)
                    q[m++] = w[c];
        }
    qsort(q, m, sizeof *q, cmp_double);
    double base = gate_data_ppl(g, d, -1.0, NULL);
    for (int k = 1; k < 20; k++) {
        double thr = q[m * (size_t)k / 20], sk;
        double ppl = gate_data_ppl(g, d, thr, &sk);
        if (curve)
            fprintf(curve, "skip,%g,%.9f,%.6f\n", thr, log(ppl), ppl);
        if (ppl <= base * (1.0 + max_loss))
            g->skip = thr;
    }
    free(q);
    return NC_OK;
}

int gate_fit(nc_gate *g, const nc_cache_params *p, const nc_gate_data *d, const nc_gate_fit_opts *o, char *err,
             size_t errlen)
{
    NC_ASSERT(o, "gate_fit: no o");
    NC_ASSERT(g, "gate_fit: no g");
    memset(g, 0, sizeof *g);
    if (o->hidden < 0 || o->hidden > NC_GATE_MAXH)
        return nc_error(err, errlen, NC_EINVAL, "gate: %d hidden units, at most %d", o->hidden, NC_GATE_MAXH);
    g->nh = o->hidden;
    size_t n = fit_normalisation(g, d);
    if (n < 2)
        return nc_error(err, errlen, NC_EINVAL, "gate: %zu tokens with every component available: too few to fit", n);
    fit_start(g, p, o->seed);
    lbfgs(g, false, d, o);
    lbfgs(g, true, d, o);
    return fit_skip(g, d, o->max_loss, o->curve, err, errlen);
}

/* ---- files ---- */

/* gate.json "version": what gate_save writes and the newest gate_load reads */
#define GATE_FORMAT_VERSION 1

#define NTENSOR 8
static const char *const tensor_names[NTENSOR] = {"w", "w_pre", "mean", "sd", "u", "u_pre", "v", "v_pre"};

/* tensor i of g: a pointer to its first double, its shape (rows 0: a
 * vector) and the row stride in doubles (the hidden tensors are the
 * leading nh rows/columns of fixed arrays); 4..7 only with nh > 0 */
static void tensor_of(const nc_gate *g, int i, const double **data, int *rows, int *cols, int *stride)
{
    const nc_gate_net *n = (i == 1 || i == 5 || i == 7) ? &g->pre : &g->full;
    switch (i) {
    case 0: case 1: *data = &n->w[0][0]; *rows = NC_NCOMP; *cols = NC_GATE_NW; *stride = NC_GATE_NW; break;
    case 2: *data = g->mean; *rows = 0; *cols = NC_GATE_NFEAT; *stride = 0; break;
    case 3: *data = g->sd; *rows = 0; *cols = NC_GATE_NFEAT; *stride = 0; break;
    case 4: case 5: *data = &n->u[0][0]; *rows = g->nh; *cols = NC_GATE_NW; *stride = NC_GATE_NW; break;
    default: *data = &n->v[0][0]; *rows = NC_NCOMP; *cols = g->nh; *stride = NC_GATE_MAXH; break;
    }
}

static size_t tensor_count(int rows, int cols)
{
    return (size_t)(rows ? rows : 1) * (size_t)cols;
}

static double *tensor_at(const double *data, int rows, int cols, int stride, size_t k)
{
    return (double *)(rows ? data + (k / (size_t)cols) * (size_t)stride + k % (size_t)cols : data + k);
}

/* dir/name replaced atomically with len bytes of data (atomicfile.h:
 * temporary file, fsync, rename, fsync of the directory). */
static int save_file(const char *dir, const char *name, const void *data, size_t len, char *err, size_t errlen)
{
    char path[1200];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return nc_error(err, errlen, NC_EINVAL, "path too long: %s/%s", dir, name);
    return atomicfile_write(path, data, len, err, errlen);
}

/* dir/name replaced with j (NULL: out of memory) indented, ending with a
 * newline. */
static int save_json(const char *dir, const char *name, const json_t *j, char *err, size_t errlen)
{
    char *js = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    size_t n = js ? strlen(js) : 0;
    char *line = js ? nc_realloc(js, n + 2) : NULL;
    if (!line) {
        free(js);
        return nc_error(err, errlen, NC_ENOMEM, "%s", name);
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    int rc = save_file(dir, name, line, n + 1, err, errlen);
    free(line);
    return rc;
}

int gate_save(const nc_gate *g, const char *dir, const char *info, char *err, size_t errlen)
{
    NC_ASSERT(g, "gate_save: no g");
    /* gate.safetensors: F64 little-endian (exact doubles) */
    json_t *hdr = json_object();
    size_t off = 0;
    int nt = g->nh > 0 ? NTENSOR : 4;
    for (int i = 0; i < nt; i++) {
        const double *data;
        int r, c, st;
        tensor_of(g, i, &data, &r, &c, &st);
        size_t cnt = tensor_count(r, c);
        json_t *shape = r ? json_pack("[i,i]", r, c) : json_pack("[i]", c);
        json_object_set_new(hdr, tensor_names[i],
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F64", "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + cnt * 8)));
        off += cnt * 8;
    }
    char *h = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(hdr);
    if (!h)
        return nc_error(err, errlen, NC_ENOMEM, "gate header");
    size_t hl = strlen(h), pad = (8 - (8 + hl) % 8) % 8;
    size_t total = 8 + hl + pad + off;
    unsigned char *buf = nc_malloc(total);
    if (!buf) {
        free(h);
        return nc_error(err, errlen, NC_ENOMEM, "gate file");
    }
    uint64_t hlen = hl + pad;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, h, hl);
    memset(buf + 8 + hl, ' ', pad);
    free(h);
    unsigned char *o = buf + 8 + hlen;
    for (int i = 0; i < nt; i++) {
        const double *data;
        int r, c, st;
        tensor_of(g, i, &data, &r, &c, &st);
        size_t cnt = tensor_count(r, c);
        for (size_t k = 0; k < cnt; k++) {
            uint64_t u;
            memcpy(&u, tensor_at(data, r, c, st, k), 8);
            for (int b = 0; b < 8; b++)
                *o++ = (unsigned char)(u >> (8 * b));
        }
    }
    int rc = save_file(dir, "gate.safetensors", buf, total, err, errlen);
    free(buf);
    if (rc)
        return rc;
    /* gate.json: what the numbers mean (read back: features, components,
     * skip threshold; the rest is for people) */
    json_t *feats = json_array(), *comps = json_array(), *mean = json_array(), *sd = json_array();
    for (int i = 0; i < NC_GATE_NFEAT; i++) {
        json_array_append_new(feats, json_string(components_feature_name(i)));
        json_array_append_new(mean, json_real(g->mean[i]));
        json_array_append_new(sd, json_real(g->sd[i]));
    }
    for (int c = 0; c < NC_NCOMP; c++)
        if ((g->comps >> c) & 1u)
            json_array_append_new(comps, json_string(nc_comp_names[c]));
    json_t *j = json_pack("{s:i,s:o,s:i,s:o,s:i,s:f,s:o,s:o,s:s}", "version", GATE_FORMAT_VERSION, "features", feats,
                          "pre_search_features", NC_GATE_NPRE, "components", comps, "hidden", g->nh, "skip_threshold",
                          g->skip, "mean", mean, "sd", sd, "form",
                          "x = clip((f - mean) / sd, -4, 4); w_c = softmax_c(b_c + W_c.x + sum_j V_cj tanh(U_j.x + b'_j)); "
                          "model row 0");
    if (j && info)
        json_object_set_new(j, "fitted", json_string(info));
    rc = save_json(dir, "gate.json", j, err, errlen);
    json_decref(j);
    return rc;
}

/* Tensor i of g from the file: F64 of the shape tensor_of gives (the byte
 * range was checked by safetensors_open), finite, sd positive. */
static int read_tensor(nc_gate *g, int i, const nc_safetensors *st, const char *path, char *err, size_t errlen)
{
    const double *data;
    int r, c, stride;
    tensor_of(g, i, &data, &r, &c, &stride);
    size_t cnt = tensor_count(r, c);
    const nc_st_tensor *t = safetensors_find(st, tensor_names[i]);
    bool ok = t && !strcmp(t->dtype, "F64") && t->rank == (r ? 2 : 1) && t->dims[0] == (r ? r : c) &&
              (!r || t->dims[1] == c);
    if (!ok)
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s' missing or not F64 of shape [%d%s%d]", path,
                        tensor_names[i], r ? r : c, r ? "," : "", r ? c : 0);
    /* safetensors_open checked the byte range against dtype x shape */
    NC_ASSERT(t->end - t->begin == cnt * 8, "tensor '%s'", tensor_names[i]);
    const unsigned char *src = st->data + t->begin;
    for (size_t k = 0; k < cnt; k++) {
        uint64_t u = 0;
        for (int q = 0; q < 8; q++)
            u |= (uint64_t)src[k * 8 + q] << (8 * q);
        double *dst = tensor_at(data, r, c, stride, k);
        memcpy(dst, &u, 8);
        if (!isfinite(*dst) || (i == 3 && !(*dst > 0.0)))
            return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s' has a non-finite%s value", path,
                            tensor_names[i], i == 3 ? " or non-positive" : "");
    }
    return NC_OK;
}

int gate_load(const char *dir, nc_gate **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/gate.safetensors", dir);
    if (access(path, F_OK) != 0)
        return NC_ENOTFOUND;
    nc_gate *g = nc_zalloc(1, sizeof *g);
    if (!g)
        return nc_error(err, errlen, NC_ENOMEM, "gate");
    int rc = NC_OK;
    /* gate.json: the feature list must be this program's; components,
     * hidden units, threshold */
    snprintf(path, sizeof path, "%s/gate.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    json_t *feats = j ? json_object_get(j, "features") : NULL, *comps = j ? json_object_get(j, "components") : NULL;
    json_t *skip = j ? json_object_get(j, "skip_threshold") : NULL, *hid = j ? json_object_get(j, "hidden") : NULL;
    json_t *ver = j ? json_object_get(j, "version") : NULL;
    if (!j)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: %s", path, je.text);
    else if (json_is_integer(ver) && json_integer_value(ver) > GATE_FORMAT_VERSION)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: gate format version %lld is newer than this build reads "
                      "(version %d): fitted by a later neurocache; fit it again with this one (fit-gate)", path,
                      (long long)json_integer_value(ver), GATE_FORMAT_VERSION);
    else if (!json_is_array(feats) || json_array_size(feats) != NC_GATE_NFEAT)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: \"features\" must list the %d features", path, NC_GATE_NFEAT);
    for (int i = 0; !rc && i < NC_GATE_NFEAT; i++) {
        const char *fs = json_string_value(json_array_get(feats, (size_t)i));
        if (!fs || strcmp(fs, components_feature_name(i)))
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: feature %d is '%s', this program computes '%s'", path, i,
                          fs ? fs : "?", components_feature_name(i));
    }
    if (!rc && !json_is_array(comps))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: \"components\" must be an array", path);
    for (size_t i = 0; !rc && i < json_array_size(comps); i++) {
        const char *cs = json_string_value(json_array_get(comps, i));
        int c = 0;
        while (c < NC_NCOMP && (!cs || strcmp(cs, nc_comp_names[c])))
            c++;
        if (c == NC_NCOMP)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: unknown component '%s'", path, cs ? cs : "?");
        else
            g->comps |= 1u << c;
    }
    if (!rc && !(g->comps & 1u))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: \"components\" must include \"model\"", path);
    if (!rc && (!json_is_number(skip) || !(json_number_value(skip) >= 0.0) || json_number_value(skip) > 1.0))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: \"skip_threshold\" must be a number in [0, 1]", path);
    if (!rc && (!json_is_integer(hid) || json_integer_value(hid) < 0 || json_integer_value(hid) > NC_GATE_MAXH))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: \"hidden\" must be an integer in [0, %d]", path, NC_GATE_MAXH);
    if (!rc) {
        g->skip = json_number_value(skip);
        g->nh = (int)json_integer_value(hid);
    }
    json_decref(j);
    /* gate.safetensors: F64 tensors of the shapes gate.json implies */
    snprintf(path, sizeof path, "%s/gate.safetensors", dir);
    nc_safetensors st = {0};
    if (!rc)
        rc = safetensors_open(&st, path, err, errlen);
    int nt = g->nh > 0 ? NTENSOR : 4;
    for (int i = 0; !rc && i < nt; i++)
        rc = read_tensor(g, i, &st, path, err, errlen);
    safetensors_close(&st);
    if (rc) {
        free(g);
        return rc;
    }
    *out = g;
    return NC_OK;
}

void gate_free(nc_gate *g)
{
    free(g);
}
