/* mixture.c -- design §4's formulas for one position: full distribution and
 * target-only log-probability. Both paths run the same steps in the same
 * order (see mixture.h) so they agree to float rounding. */
#include "cache.h"
#include "gate.h"
#include "vmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const nc_comp_names[NC_NCOMP] = {"model", "neural", "unigram", "unbounded", "uniform"};

void dist_init(nc_dist *d)
{
    memset(d, 0, sizeof *d);
}

void dist_free(nc_dist *d)
{
    if (!d)
        return;
    nc_free(d->p);
    for (int c = 0; c < NC_NCOMP; c++)
        nc_free(d->share[c]);
    memset(d, 0, sizeof *d);
}

static int dist_reserve(nc_dist *d, size_t n, bool shares)
{
    if (n > d->cap) {
        nc_free(d->p);
        for (int c = 0; c < NC_NCOMP; c++) {
            nc_free(d->share[c]);
            d->share[c] = NULL;
        }
        d->cap = 0;
        d->p = nc_alloc(n * sizeof(float));
        if (!d->p)
            return NC_ENOMEM;
        d->cap = n;
    }
    for (int c = 0; c < NC_NCOMP; c++) {
        if (shares && !d->share[c]) {
            d->share[c] = nc_alloc(d->cap * sizeof(float));
            if (!d->share[c])
                return NC_ENOMEM;
        }
    }
    d->n = n;
    return NC_OK;
}

/* Kernel weights of the unbounded cache (Grave, Cisse, Joulin 2017, eq. 6):
 * u_i = d_i / θ(h) with θ(h) the distance to the k-th (last) neighbour
 * returned; K(u) = exp(-u²/2) or max(0, 1-u²); θ = 0 gives weight 1 to all.
 * Writes w[i] (0 for missing neighbours) when w is non-NULL and returns Σ w,
 * 0 when there is no neighbour. */
static double ub_weight(const nc_cache_params *p, double theta2, float d2)
{
    if (theta2 <= 0.0)
        return 1.0;
    double u2 = (d2 > 0.0f ? d2 : 0.0) / theta2;
    return p->kernel == NC_KERNEL_GAUSSIAN ? exp(-0.5 * u2) : (u2 < 1.0 ? 1.0 - u2 : 0.0);
}

static double ub_theta2(const nc_mix_input *in)
{
    int last = -1;
    for (int i = 0; i < in->ub_k; i++)
        if (in->ub_words[i] >= 0)
            last = i;
    if (last < 0)
        return -1.0;
    return in->ub_d2[last] > 0.0f ? (double)in->ub_d2[last] : 0.0;
}

static double ub_weights(const nc_cache_params *p, const nc_mix_input *in, double *w)
{
    double theta2 = ub_theta2(in);
    if (theta2 < 0.0)
        return 0.0;
    double sum = 0.0;
    for (int i = 0; i < in->ub_k; i++) {
        double k = in->ub_words[i] >= 0 ? ub_weight(p, theta2, in->ub_d2[i]) : 0.0;
        if (w)
            w[i] = k;
        sum += k;
    }
    return sum;
}

static bool neural_on(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->neural_size > 0 && in->nn > 0;
}

static bool unigram_on(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->unigram_size > 0 && in->uni && in->uni->count > 0;
}

/* max_i θ h·h_i + bias: θ >= 0 (validated), so it is θ max_i h·h_i + bias,
 * one vectorised max instead of a scalar pass per token. */
static double max_scaled(const nc_mix_input *in, double theta, double bias)
{
    if (in->nn <= 0)
        return -INFINITY;
    return theta * (double)vm_max(in->ndots, (size_t)in->nn) + bias;
}

/* Linear step on the full distribution: p <- (1-λ) p + λ q, shares scaled
 * and q's mass credited to component comp. q is double[n]. */
static void blend(nc_dist *d, bool shares, double lambda, const double *q, int comp)
{
    float a = (float)(1.0 - lambda);
    for (size_t w = 0; w < d->n; w++)
        d->p[w] = (float)((1.0 - lambda) * d->p[w] + lambda * q[w]);
    if (shares) {
        for (int c = 0; c < NC_NCOMP; c++) {
            if (c == comp)
                continue;
            for (size_t w = 0; w < d->n; w++)
                d->share[c][w] *= a;
        }
        for (size_t w = 0; w < d->n; w++)
            d->share[comp][w] = (float)(a * d->share[comp][w] + lambda * q[w]);
    }
}

static int mixture_full_const(const nc_cache_params *p, const nc_mix_input *in, size_t n_words, bool shares,
                              nc_dist *out, char *err, size_t errlen)
{
    const int V = in->V;
    if (n_words < (size_t)V)
        n_words = (size_t)V;
    /* every cached id must fit: grow n rather than drop mass */
    for (int i = 0; i < in->nn; i++)
        if (in->nvals[i] >= 0 && (size_t)in->nvals[i] >= n_words)
            n_words = (size_t)in->nvals[i] + 1;
    for (int i = 0; i < in->ub_k; i++)
        if (in->ub_words && in->ub_words[i] >= 0 && (size_t)in->ub_words[i] >= n_words)
            n_words = (size_t)in->ub_words[i] + 1;
    if (in->uni)
        for (int i = 0; i < in->uni->count; i++)
            if ((size_t)ucache_at(in->uni, i) >= n_words)
                n_words = (size_t)ucache_at(in->uni, i) + 1;
    if (dist_reserve(out, n_words, shares))
        return nc_error(err, errlen, NC_ENOMEM, "distribution over %zu words", n_words);
    /* q: dense scratch of the later steps, only when one is on. */
    bool dense = unigram_on(p, in) || (p->unbounded && in->ub_k > 0) ||
                 (p->open_vocab && p->uniform_mu > 0.0f);
    double *q = dense ? calloc(n_words, sizeof(double)) : NULL;
    double *kw = in->ub_k > 0 ? malloc((size_t)in->ub_k * sizeof(double)) : NULL;
    float *e = in->nn > 0 ? malloc((size_t)in->nn * sizeof(float)) : NULL;
    if ((dense && !q) || (in->ub_k > 0 && !kw) || (in->nn > 0 && !e)) {
        free(q);
        free(kw);
        free(e);
        return nc_error(err, errlen, NC_ENOMEM, "mixture scratch");
    }
    if (shares)
        for (int c = 0; c < NC_NCOMP; c++)
            memset(out->share[c], 0, n_words * sizeof(float));

    /* 1-2. p_vocab, or the globally normalised neural cache (Grave et al.
     * 2017, §4 "global normalization"): p(w) ∝ exp(s_w) + Σ exp(θ h·h_i + α).
     * The V exponentials are vectorised (vmath): with libm they cost more
     * than the decoder product of a server predict. */
    double smax = vm_max(in->logits, (size_t)V);
    bool global = neural_on(p, in) && p->global_norm;
    bool linear = neural_on(p, in) && !global;
    double m = smax;
    if (global) {
        double mc = max_scaled(in, p->neural_theta, p->neural_alpha);
        if (mc > m)
            m = mc;
    }
    double z = vm_exp_sum(out->p, in->logits, (size_t)V, (float)m);
    for (size_t w = (size_t)V; w < n_words; w++)
        out->p[w] = 0.0f;
    /* e_i: the cache terms exp(θ h·h_i + α - m) (global) or the softmax_i
     * numerators exp(θ h·h_i - mc) (linear), with their sum. */
    double zc = 0.0;
    if (global || linear) {
        double bias = global ? p->neural_alpha : 0.0;
        double mc = global ? m : max_scaled(in, p->neural_theta, 0.0);
        double unused;
        zc = vm_cache_exp_sum(e, in->ndots, in->nvals, (size_t)in->nn, (float)p->neural_theta,
                              (float)(mc - bias), -1, &unused);
    }
    double ztot = global ? z + zc : z;
    float inv = (float)(1.0 / ztot);
    for (size_t w = 0; w < (size_t)V; w++)
        out->p[w] *= inv;
    if (shares)
        memcpy(out->share[NC_COMP_MODEL], out->p, n_words * sizeof(float));
    if (global) {
        for (int i = 0; i < in->nn; i++) {
            int w = in->nvals[i];
            float ew = e[i] * inv;
            out->p[w] += ew;
            if (shares)
                out->share[NC_COMP_NEURAL][w] += ew;
        }
    } else if (linear) {
        /* linear interpolation: p_cache(w) = Σ_{x_{i+1}=w} softmax_i(θ h·h_i)
         * (eq. 2); p <- (1-λ) p + λ p_cache, p_cache sparse over the window. */
        float a = (float)(1.0 - p->neural_lambda), lz = (float)(p->neural_lambda / zc);
        for (size_t w = 0; w < n_words; w++)
            out->p[w] *= a;
        if (shares)
            for (size_t w = 0; w < n_words; w++)
                out->share[NC_COMP_MODEL][w] *= a;
        for (int i = 0; i < in->nn; i++) {
            int w = in->nvals[i];
            out->p[w] += lz * e[i];
            if (shares)
                out->share[NC_COMP_NEURAL][w] += lz * e[i];
        }
    }
    free(e);

    /* 3. unigram cache (Kuhn & De Mori): counts / |W| */
    if (unigram_on(p, in)) {
        memset(q, 0, n_words * sizeof(double));
        for (int i = 0; i < in->uni->count; i++)
            q[ucache_at(in->uni, i)] += 1.0 / in->uni->count;
        blend(out, shares, p->unigram_lambda, q, NC_COMP_UNIGRAM);
    }

    /* 4. unbounded cache: kernel density over the k nearest neighbours */
    if (p->unbounded && in->ub_k > 0) {
        double sw = ub_weights(p, in, kw);
        if (sw > 0.0) {
            memset(q, 0, n_words * sizeof(double));
            for (int i = 0; i < in->ub_k; i++)
                if (in->ub_words[i] >= 0)
                    q[in->ub_words[i]] += kw[i] / sw;
            blend(out, shares, p->unbounded_lambda, q, NC_COMP_UNBOUNDED);
        }
    }

    /* 5. open vocabulary: uniform over |V_full| */
    if (p->open_vocab && p->uniform_mu > 0.0f) {
        double u = 1.0 / (in->vocab_full > 0 ? in->vocab_full : (int)n_words);
        for (size_t w = 0; w < n_words; w++)
            q[w] = u;
        blend(out, shares, p->uniform_mu, q, NC_COMP_UNIFORM);
    }
    free(q);
    free(kw);
    return NC_OK;
}

/* Σ_i exp(θ h·h_i + bias - m) over the window into *z, and the part of it
 * whose pair predicts x into *num: one vectorised pass (vm_cache_exp_sum);
 * with libm's scalar exp these were most of the neural cache's cost
 * (2,000 per token), and a scalar match loop after them the next most. */
static void neural_sums(const nc_mix_input *in, double theta, double bias, double m, int x, double *z,
                        double *num)
{
    *z = vm_cache_exp_sum(NULL, in->ndots, in->nvals, (size_t)in->nn, (float)theta, (float)(m - bias), x, num);
}

static bool ub_on(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->unbounded && in->ub_k > 0 && !in->ub_skipped && ub_weights(p, in, NULL) > 0.0;
}

unsigned mixture_available(const nc_cache_params *p, const nc_mix_input *in)
{
    unsigned a = 1u << NC_COMP_MODEL;
    if (neural_on(p, in) && !p->global_norm)
        a |= 1u << NC_COMP_NEURAL;
    if (unigram_on(p, in))
        a |= 1u << NC_COMP_UNIGRAM;
    if (ub_on(p, in))
        a |= 1u << NC_COMP_UNBOUNDED;
    if (p->open_vocab && p->uniform_mu > 0.0f)
        a |= 1u << NC_COMP_UNIFORM;
    return a;
}

unsigned mixture_components_on(const nc_cache_params *p)
{
    unsigned a = 1u << NC_COMP_MODEL;
    if (p->neural_size > 0 && !p->global_norm)
        a |= 1u << NC_COMP_NEURAL;
    if (p->unigram_size > 0)
        a |= 1u << NC_COMP_UNIGRAM;
    if (p->unbounded)
        a |= 1u << NC_COMP_UNBOUNDED;
    if (p->open_vocab && p->uniform_mu > 0.0f)
        a |= 1u << NC_COMP_UNIFORM;
    return a;
}

/* The gate's weights at this position (gate.h): the full gate when the
 * unbounded cache's features exist, else the pre-search one. */
static unsigned gated_weights(const nc_cache_params *p, const nc_mix_input *in, double w[NC_NCOMP])
{
    unsigned avail = mixture_available(p, in);
    bool ub = (avail >> NC_COMP_UNBOUNDED) & 1u;
    double f[NC_GATE_NFEAT];
    gate_features(p, in, ub, f);
    gate_weights(in->gate, !ub, f, avail, w);
    return avail;
}

int mixture_full(const nc_cache_params *p, const nc_mix_input *in, size_t n_words, bool shares,
                 nc_dist *out, char *err, size_t errlen)
{
    if (!p->gate || !in->gate) {
        int rc = mixture_full_const(p, in, n_words, shares, out, err, errlen);
        if (rc == NC_OK)
            gate_const_weights(p, mixture_available(p, in), out->weight);
        return rc;
    }
    /* The gate's flat weights w_c as the λs of the steps: step c mixes
     * (1-λ_c) p + λ_c p_c, so λ_c = w_c / Σ_{c' <= c} w_c' (a component not
     * available has w_c = 0 and is skipped by the step anyway). The full
     * path is float: λ rounded to float moves p by ~1e-7 relative, inside
     * the full/target agreement. */
    double w[NC_NCOMP];
    gated_weights(p, in, w);
    nc_cache_params q = *p;
    double cum = w[NC_COMP_MODEL];
    float *lam[NC_NCOMP] = {NULL, &q.neural_lambda, &q.unigram_lambda, &q.unbounded_lambda, &q.uniform_mu};
    for (int c = 1; c < NC_NCOMP; c++) {
        cum += w[c];
        *lam[c] = (float)(cum > 0.0 ? w[c] / cum : 0.0);
    }
    nc_mix_input in2 = *in;
    if (in->ub_skipped)
        in2.ub_k = 0;
    int rc = mixture_full_const(&q, &in2, n_words, shares, out, err, errlen);
    if (rc == NC_OK)
        memcpy(out->weight, w, sizeof w);
    if (in->weights)
        memcpy(in->weights, w, sizeof w);
    return rc;
}

void mixture_components(const nc_cache_params *p, const nc_mix_input *in, int x, double pc[NC_NCOMP])
{
    unsigned a = mixture_available(p, in);
    for (int c = 0; c < NC_NCOMP; c++)
        pc[c] = NAN;
    if (neural_on(p, in) && p->global_norm) {
        /* global normalisation: one component, the model with the cache
         * terms in its normaliser (eq. 4) -- the same sums as mixture_target */
        double m = in->log_z, mc = max_scaled(in, p->neural_theta, p->neural_alpha);
        if (mc > m)
            m = mc;
        double zc, nc;
        neural_sums(in, p->neural_theta, p->neural_alpha, m, x, &zc, &nc);
        pc[NC_COMP_MODEL] = ((x < in->V ? exp(in->s_target - m) : 0.0) + nc) / (exp(in->log_z - m) + zc);
    } else {
        pc[NC_COMP_MODEL] = x < in->V ? exp((double)in->s_target - in->log_z) : 0.0;
    }
    if (a & (1u << NC_COMP_NEURAL)) {
        double mc = max_scaled(in, p->neural_theta, 0.0), zs, num;
        neural_sums(in, p->neural_theta, 0.0, mc, x, &zs, &num);
        pc[NC_COMP_NEURAL] = num / zs;
    }
    if (a & (1u << NC_COMP_UNIGRAM))
        pc[NC_COMP_UNIGRAM] = ucache_prob(in->uni, x);
    if (a & (1u << NC_COMP_UNBOUNDED)) {
        double sw = ub_weights(p, in, NULL), theta2 = ub_theta2(in), num = 0.0;
        for (int i = 0; i < in->ub_k; i++)
            if (in->ub_words[i] == x)
                num += ub_weight(p, theta2, in->ub_d2[i]);
        pc[NC_COMP_UNBOUNDED] = num / sw;
    }
    if (a & (1u << NC_COMP_UNIFORM))
        pc[NC_COMP_UNIFORM] = 1.0 / (in->vocab_full > 0 ? in->vocab_full : in->V);
}

double mixture_target(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    if (p->gate && in->gate) {
        /* p(x) = Σ_c w_c(f_t) p_c(x): f_t never reads x (gate.h) */
        double w[NC_NCOMP], pc[NC_NCOMP], pr = 0.0;
        unsigned a = gated_weights(p, in, w);
        mixture_components(p, in, x, pc);
        for (int c = 0; c < NC_NCOMP; c++)
            if ((a >> c) & 1u)
                pr += w[c] * pc[c];
        if (in->weights)
            memcpy(in->weights, w, sizeof w);
        return pr > 0.0 ? log(pr) : -INFINITY;
    }
    bool global = neural_on(p, in) && p->global_norm;
    double pr;
    if (global) {
        double m = in->log_z;
        double mc = max_scaled(in, p->neural_theta, p->neural_alpha);
        if (mc > m)
            m = mc;
        double zc, nc;
        neural_sums(in, p->neural_theta, p->neural_alpha, m, x, &zc, &nc);
        double num = (x < in->V ? exp(in->s_target - m) : 0.0) + nc;
        double z = exp(in->log_z - m) + zc;
        pr = num / z;
    } else {
        pr = x < in->V ? exp((double)in->s_target - in->log_z) : 0.0;
        if (neural_on(p, in)) {
            double mc = max_scaled(in, p->neural_theta, 0.0), zs, num;
            neural_sums(in, p->neural_theta, 0.0, mc, x, &zs, &num);
            pr = (1.0 - p->neural_lambda) * pr + p->neural_lambda * num / zs;
        }
    }
    if (unigram_on(p, in))
        pr = (1.0 - p->unigram_lambda) * pr + p->unigram_lambda * ucache_prob(in->uni, x);
    if (p->unbounded && in->ub_k > 0 && !in->ub_skipped) {
        double sw = ub_weights(p, in, NULL), theta2 = ub_theta2(in);
        if (sw > 0.0) {
            double num = 0.0;
            for (int i = 0; i < in->ub_k; i++)
                if (in->ub_words[i] == x)
                    num += ub_weight(p, theta2, in->ub_d2[i]);
            pr = (1.0 - p->unbounded_lambda) * pr + p->unbounded_lambda * num / sw;
        }
    }
    if (p->open_vocab && p->uniform_mu > 0.0f)
        pr = (1.0 - p->uniform_mu) * pr + p->uniform_mu / (in->vocab_full > 0 ? in->vocab_full : in->V);
    return pr > 0.0 ? log(pr) : -INFINITY;
}
