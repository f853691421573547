/* model_term.c -- the mixture's first component (component.h): the model's
 * p_vocab = softmax(s) (0 for open-vocabulary words >= V), or with the
 * neural cache's global normalisation (Grave et al. 2017, §4, eq. 4) the
 * model and the cache in one softmax:
 *     p(w) ∝ exp(s_w) + Σ_{x_{i+1}=w} exp(θ h·h_i + α),
 * the cache's terms credited to the neural share. */
#include "component.h"
#include "cache_knobs.h"
#include "neural_cache.h"
#include "vmath.h"
#include "fault.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool global_norm_on(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->neural_size > 0 && in->nn > 0 && p->global_norm;
}

/* p_vocab(x) = exp(s_x - log Z), or under global normalisation
 * neural_cache_global_prob (eq. 4) */
static double model_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    double s_x = x < in->V ? (double)in->s_target : -INFINITY;
    if (global_norm_on(p, in))
        return neural_cache_global_prob(&NC_NEURAL_WINDOW(in, p), p->neural_alpha, s_x, in->log_z, x);
    return exp(s_x - in->log_z);
}

/* The cache's terms e_i = exp(θ h·h_i + α - m) of eq. 4 added to out
 * (scaled by inv, the shared normaliser's inverse), credited to the neural
 * share. */
static void add_global_terms(const nc_comp_step *s, const float *e, float inv)
{
    const nc_mix_input *in = s->in;
    for (int i = 0; i < in->nn; i++) {
        int w = in->nvals[i];
        float ew = e[i] * inv;
        s->out->p[w] += ew;
        if (s->shares)
            s->out->share[NC_COMP_NEURAL][w] += ew;
    }
}

/* out->p = p_vocab over [0, n) (0 from V on), or eq. 4's softmax. The V
 * exponentials are vectorised (vmath): with libm they cost more than the
 * decoder product of a server predict. */
static int model_step(const nc_comp_step *s)
{
    const nc_cache_params *p = s->p;
    const nc_mix_input *in = s->in;
    const int V = in->V;
    nc_dist *out = s->out;
    bool global = global_norm_on(p, in);
    float *e = global ? nc_malloc((size_t)in->nn * sizeof(float)) : NULL;
    if (global && !e)
        return NC_ENOMEM;
    double m = vm_max(in->logits, (size_t)V);
    if (global) {
        double mc = neural_cache_max_logit(&NC_NEURAL_WINDOW(in, p), p->neural_alpha);
        if (mc > m)
            m = mc;
    }
    double z = vm_exp_sum(out->p, in->logits, (size_t)V, (float)m);
    for (size_t w = (size_t)V; w < out->n; w++)
        out->p[w] = 0.0f;
    double zc = 0.0, unused;
    if (global)
        zc = neural_cache_exp_sum(e, &NC_NEURAL_WINDOW(in, p), p->neural_alpha, m, -1, &unused);
    float inv = (float)(1.0 / (z + zc));
    for (size_t w = 0; w < (size_t)V; w++)
        out->p[w] *= inv;
    if (s->shares)
        memcpy(out->share[s->comp], out->p, out->n * sizeof(float));
    if (global)
        add_global_terms(s, e, inv);
    free(e);
    return NC_OK;
}

enum { F_ENT, F_LOGMAX };

/* p_vocab's statistics (gate_vocab_stats) */
static void model_features(const nc_cache_params *p, const nc_mix_input *in, nc_feat_ctx *ctx, double *pre,
                           double *post)
{
    (void)p, (void)ctx, (void)post;
    pre[F_ENT] = in->v_ent;         /* entropy of p_vocab (nats) */
    pre[F_LOGMAX] = in->v_logmax;   /* log max_w p_vocab(w) */
}

static const char *const model_knobs[] = {NULL};
static const char *const model_feature_names[] = {"vocab_entropy", "vocab_log_max", NULL};

const nc_component nc_component_model = {
    .name = "model",
    .knobs = model_knobs,
    .prob = model_prob,
    .step = model_step,
    .features = model_feature_names,
    .gate_features = model_features,
};
