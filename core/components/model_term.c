/* model_term.c -- the mixture's first component (component.h): the model's
 * p_vocab = softmax(s) (0 for open-vocabulary words >= V). A later row may
 * join its softmax (component.h joint: the neural cache's global
 * normalisation, eq. 4, in neural_cache.c): its prob and step are then
 * that row's. */
#include "component.h"
#include "components.h"
#include "cache_knobs.h"
#include "vmath.h"
#include "fault.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* p_vocab(x) = exp(s_x - log Z), or the joint softmax's */
static double model_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    double s_x = x < in->V ? (double)in->s_target : -INFINITY;
    const nc_component *j = components_joint(p, in);
    if (j)
        return j->joint_prob(p, in, s_x, x);
    return exp(s_x - in->log_z);
}

/* out->p = p_vocab over [0, n) (0 from V on), or the joint softmax. The V
 * exponentials are vectorised (vmath): with libm they cost more than the
 * decoder product of a server predict. */
static int model_step(const nc_comp_step *s)
{
    const nc_mix_input *in = s->in;
    const nc_component *j = components_joint(s->p, in);
    if (j)
        return j->joint_step(s);
    const int V = in->V;
    nc_dist *out = s->out;
    double m = vm_max(in->logits, (size_t)V);
    double z = vm_exp_sum(out->p, in->logits, (size_t)V, (float)m);
    for (size_t w = (size_t)V; w < out->n; w++)
        out->p[w] = 0.0f;
    float inv = (float)(1.0 / z);
    for (size_t w = 0; w < (size_t)V; w++)
        out->p[w] *= inv;
    if (s->shares)
        memcpy(out->share[s->comp], out->p, out->n * sizeof(float));
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
