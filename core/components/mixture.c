/* mixture.c -- design §4's mixture at one position: full distribution and
 * target-only log-probability. Both paths run the same steps in the same
 * order (the rows of component_table.h) so they agree to float rounding.
 * The terms are the rows' (component.h): this file only composes them. */
#include "mixture.h"
#include "cache_params.h"
#include "components.h"
#include "gate.h"
#include "vmath.h"
#include "fault.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* n_words grown so that every word a component may give mass fits (grow n
 * rather than drop mass) */
static size_t words_needed(const nc_mix_input *in, size_t n_words)
{
    if (n_words < (size_t)in->V)
        n_words = (size_t)in->V;
    for (int c = 0; c < NC_NCOMP; c++) {
        int m = nc_component_rows[c]->max_word ? nc_component_rows[c]->max_word(in) : -1;
        if (m >= 0 && (size_t)m >= n_words)
            n_words = (size_t)m + 1;
    }
    return n_words;
}

/* The steps of the available components (avail) in the table's order with
 * the weights lam[c]: the first row's step fills out, each later one
 * either steps itself or gives a dense p_c that is blended. */
static int mixture_steps(const nc_cache_params *p, const nc_mix_input *in, const double lam[NC_NCOMP],
                         unsigned avail, bool shares, nc_dist *out)
{
    /* q: dense scratch of the later steps, only when one is there */
    bool dense = false;
    for (int c = 1; c < NC_NCOMP; c++)
        dense |= ((avail >> c) & 1u) && nc_component_rows[c]->dense;
    double *q = dense ? nc_zalloc(out->n, sizeof(double)) : NULL;
    if (dense && !q)
        return NC_ENOMEM;
    if (shares)
        for (int c = 0; c < NC_NCOMP; c++)
            memset(out->share[c], 0, out->n * sizeof(float));
    int rc = NC_OK;
    for (int c = 0; rc == NC_OK && c < NC_NCOMP; c++) {
        const nc_component *r = nc_component_rows[c];
        if (!((avail >> c) & 1u))
            continue;
        if (r->step) {
            rc = r->step(&(nc_comp_step){.p = p, .in = in, .lambda = lam[c], .out = out, .shares = shares,
                                         .comp = c});
            continue;
        }
        memset(q, 0, out->n * sizeof(double));
        if ((rc = r->dense(p, in, q, out->n)) == NC_OK)
            blend(out, shares, lam[c], q, c);
    }
    free(q);
    return rc;
}

/* The constant mixture's λs (component.h's lambda), as the steps read them */
static void const_lambdas(const nc_cache_params *p, double lam[NC_NCOMP])
{
    for (int c = 0; c < NC_NCOMP; c++)
        lam[c] = nc_component_rows[c]->lambda ? nc_component_rows[c]->lambda(p) : 0.0;
}

unsigned mixture_available(const nc_cache_params *p, const nc_mix_input *in)
{
    return components_available(p, in);
}

unsigned mixture_components_on(const nc_cache_params *p)
{
    return components_on(p);
}

/* The gate's weights at this position (gate.h): the full gate when the
 * searched rows' features exist (components_post), else the pre-search
 * one. */
static unsigned gated_weights(const nc_cache_params *p, const nc_mix_input *in, double w[NC_NCOMP])
{
    unsigned avail = mixture_available(p, in);
    bool post = components_post(p, avail);
    double f[NC_GATE_NFEAT];
    gate_features(p, in, post, f);
    gate_weights(in->gate, !post, f, avail, w);
    return avail;
}

int mixture_full(const nc_cache_params *p, const nc_mix_input *in, size_t n_words, bool shares,
                 nc_dist *out, char *err, size_t errlen)
{
    NC_ASSERT(out, "mixture_full: no out");
    double lam[NC_NCOMP], w[NC_NCOMP];
    unsigned avail;
    if (!p->gate || !in->gate) {
        avail = mixture_available(p, in);
        const_lambdas(p, lam);
        gate_const_weights(p, avail, w);
    } else {
        /* The gate's flat weights w_c as the λs of the steps: step c mixes
         * (1-λ_c) p + λ_c p_c, so λ_c = w_c / Σ_{c' <= c} w_c' (a component
         * not available has w_c = 0 and is skipped by the step anyway). λ
         * is rounded to float as a knob is: it moves p by ~1e-7 relative,
         * inside the full/target agreement. */
        avail = gated_weights(p, in, w);
        double cum = w[0];
        lam[0] = 0.0;
        for (int c = 1; c < NC_NCOMP; c++) {
            cum += w[c];
            lam[c] = (float)(cum > 0.0 ? w[c] / cum : 0.0);
        }
        if (in->weights)
            memcpy(in->weights, w, sizeof w);
    }
    n_words = words_needed(in, n_words);
    if (dist_reserve(out, n_words, shares))
        return nc_error(err, errlen, NC_ENOMEM, "distribution over %zu words", n_words);
    if (mixture_steps(p, in, lam, avail, shares, out) != NC_OK)
        return nc_error(err, errlen, NC_ENOMEM, "mixture scratch");
    memcpy(out->weight, w, sizeof w);
    return NC_OK;
}

void mixture_components(const nc_cache_params *p, const nc_mix_input *in, int x, double pc[NC_NCOMP])
{
    unsigned a = mixture_available(p, in);
    for (int c = 0; c < NC_NCOMP; c++)
        pc[c] = ((a >> c) & 1u) ? nc_component_rows[c]->prob(p, in, x) : NAN;
}

void mixture_gate_data(const nc_cache_params *p, const nc_mix_input *in, int x, double f[NC_GATE_NFEAT],
                       double pc[NC_NCOMP])
{
    unsigned a = mixture_available(p, in);
    gate_features(p, in, components_post(p, a), f);
    mixture_components(p, in, x, pc);
}

double mixture_target(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    NC_ASSERT(in, "mixture_target: no in");
    NC_ASSERT(p, "mixture_target: no p");
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
    /* the constant λs, step by step in the table's order */
    unsigned a = mixture_available(p, in);
    double pr = nc_component_rows[0]->prob(p, in, x);
    for (int c = 1; c < NC_NCOMP; c++) {
        const nc_component *r = nc_component_rows[c];
        if (!((a >> c) & 1u))
            continue;
        double lam = r->lambda(p);
        double term = r->lambda_prob ? r->lambda_prob(p, in, x, lam) : lam * r->prob(p, in, x);
        pr = (1.0 - lam) * pr + term;
    }
    return pr > 0.0 ? log(pr) : -INFINITY;
}
