/* mixture.c -- design §4's mixture at one position: full distribution and
 * target-only log-probability. Both paths run the same steps in the same
 * order (see mixture.h) so they agree to float rounding. The caches' terms
 * are their files' (unigram_cache.h, neural_cache.h, unbounded_cache.h):
 * this file only composes them. */
#include "mixture.h"
#include "cache_params.h"
#include "gate.h"
#include "vmath.h"
#include "fault.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool neural_on(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->neural_size > 0 && in->nn > 0;
}

static bool unigram_on(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->unigram_size > 0 && in->uni && in->uni->count > 0;
}

/* the unbounded cache is a component: on, searched, and some neighbour */
static bool unbounded_on(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->unbounded && in->ub_k > 0 && !in->ub_skipped &&
           unbounded_cache_kernel_sum(p->kernel, in->ub_d2, in->ub_words, in->ub_k, NULL) > 0.0;
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
            if ((size_t)unigram_cache_at(in->uni, i) >= n_words)
                n_words = (size_t)unigram_cache_at(in->uni, i) + 1;
    if (dist_reserve(out, n_words, shares))
        return nc_error(err, errlen, NC_ENOMEM, "distribution over %zu words", n_words);
    /* q: dense scratch of the later steps, only when one is on. */
    bool dense = unigram_on(p, in) || (p->unbounded && in->ub_k > 0) ||
                 (p->open_vocab && p->uniform_mu > 0.0f);
    double *q = dense ? nc_zalloc(n_words, sizeof(double)) : NULL;
    double *kw = in->ub_k > 0 ? nc_malloc((size_t)in->ub_k * sizeof(double)) : NULL;   /* K_i / Σ K */
    float *e = in->nn > 0 ? nc_malloc((size_t)in->nn * sizeof(float)) : NULL;
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
        double mc = neural_cache_max_logit(in->ndots, in->nn, p->neural_theta, p->neural_alpha);
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
        double mc = global ? m : neural_cache_max_logit(in->ndots, in->nn, p->neural_theta, 0.0);
        double unused;
        zc = neural_cache_exp_sum(e, in->ndots, in->nvals, in->nn, p->neural_theta, bias, mc, -1, &unused);
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
        unigram_cache_add_dist(in->uni, q);
        blend(out, shares, p->unigram_lambda, q, NC_COMP_UNIGRAM);
    }

    /* 4. unbounded cache: kernel density over the k nearest neighbours */
    if (p->unbounded && in->ub_k > 0) {
        if (unbounded_cache_weights(p->kernel, in->ub_d2, in->ub_words, in->ub_k, kw) > 0.0) {
            memset(q, 0, n_words * sizeof(double));
            for (int i = 0; i < in->ub_k; i++)
                if (in->ub_words[i] >= 0)
                    q[in->ub_words[i]] += kw[i];
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

unsigned mixture_available(const nc_cache_params *p, const nc_mix_input *in)
{
    unsigned a = 1u << NC_COMP_MODEL;
    if (neural_on(p, in) && !p->global_norm)
        a |= 1u << NC_COMP_NEURAL;
    if (unigram_on(p, in))
        a |= 1u << NC_COMP_UNIGRAM;
    if (unbounded_on(p, in))
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

/* The model component's probability of x: p_vocab(x) = exp(s_x - log Z)
 * (0 for an open-vocabulary word), or under global normalisation the model
 * and the neural cache in one softmax (neural_cache_global_prob, eq. 4). */
static double model_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    double s_x = x < in->V ? (double)in->s_target : -INFINITY;
    if (neural_on(p, in) && p->global_norm)
        return neural_cache_global_prob(in->ndots, in->nvals, in->nn, p->neural_theta, p->neural_alpha, s_x,
                                        in->log_z, x);
    return exp(s_x - in->log_z);
}

/* The caches' terms of x, each from its cache's file */
static double neural_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    return neural_cache_prob(in->ndots, in->nvals, in->nn, p->neural_theta, x);
}

static double unbounded_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    return unbounded_cache_prob(p->kernel, in->ub_d2, in->ub_words, in->ub_k, x);
}

/* |V_full| of the uniform term */
static int vocab_full(const nc_mix_input *in)
{
    return in->vocab_full > 0 ? in->vocab_full : in->V;
}

void mixture_components(const nc_cache_params *p, const nc_mix_input *in, int x, double pc[NC_NCOMP])
{
    unsigned a = mixture_available(p, in);
    for (int c = 0; c < NC_NCOMP; c++)
        pc[c] = NAN;
    /* global normalisation: one component, the model with the cache terms
     * in its normaliser (eq. 4) */
    pc[NC_COMP_MODEL] = model_prob(p, in, x);
    if (a & (1u << NC_COMP_NEURAL))
        pc[NC_COMP_NEURAL] = neural_prob(p, in, x);
    if (a & (1u << NC_COMP_UNIGRAM))
        pc[NC_COMP_UNIGRAM] = unigram_cache_prob(in->uni, x);
    if (a & (1u << NC_COMP_UNBOUNDED))
        pc[NC_COMP_UNBOUNDED] = unbounded_prob(p, in, x);
    if (a & (1u << NC_COMP_UNIFORM))
        pc[NC_COMP_UNIFORM] = 1.0 / vocab_full(in);
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
    /* the constant λs, step by step in mixture.h's order */
    double pr = model_prob(p, in, x);
    if (neural_on(p, in) && !p->global_norm)
        pr = (1.0 - p->neural_lambda) * pr + p->neural_lambda * neural_prob(p, in, x);
    if (unigram_on(p, in))
        pr = (1.0 - p->unigram_lambda) * pr + p->unigram_lambda * unigram_cache_prob(in->uni, x);
    if (unbounded_on(p, in))
        pr = (1.0 - p->unbounded_lambda) * pr + p->unbounded_lambda * unbounded_prob(p, in, x);
    if (p->open_vocab && p->uniform_mu > 0.0f)
        pr = (1.0 - p->uniform_mu) * pr + p->uniform_mu / vocab_full(in);
    return pr > 0.0 ? log(pr) : -INFINITY;
}
