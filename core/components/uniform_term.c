/* uniform_term.c -- the open vocabulary's uniform term, the mixture's last
 * component (component.h): p <- (1-μ) p + μ / |V_full|, so that a word no
 * other component knows (a new open-vocabulary word) keeps some mass.
 * The worked example of docs/design.md "Components": the whole of a
 * component is this file plus its line in component_table.h. */
#include "component.h"
#include "cache_knobs.h"

static bool uniform_on(const nc_cache_params *p)
{
    return p->open_vocab && p->uniform_mu > 0.0f;
}

static int uniform_validate(const nc_cache_params *p, char *err, size_t errlen)
{
    if (p->uniform_mu > 0.0f && !p->open_vocab)
        return nc_error(err, errlen, NC_EINVAL, "uniform_mu needs open_vocab");
    if (p->vocab_size_full > 0 && !p->open_vocab)
        return nc_error(err, errlen, NC_EINVAL, "vocab_size_full needs open_vocab");
    return NC_OK;
}

static double uniform_lambda(const nc_cache_params *p)
{
    return p->uniform_mu;
}

static bool uniform_available(const nc_cache_params *p, const nc_mix_input *in)
{
    (void)in;
    return uniform_on(p);
}

/* |V_full| of the target path */
static int vocab_full(const nc_mix_input *in)
{
    return in->vocab_full > 0 ? in->vocab_full : in->V;
}

static double uniform_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    (void)p, (void)x;
    return 1.0 / vocab_full(in);
}

/* μ / |V_full| as the constant mixture has always computed it: in float
 * (μ is a float knob), so that its numbers stay the same bit for bit */
static double uniform_lambda_prob(const nc_cache_params *p, const nc_mix_input *in, int x, double lambda)
{
    (void)p, (void)x;
    return (float)lambda / vocab_full(in);
}

/* the full path: |V_full| or, when unknown, the distribution's n words */
static int uniform_dense(const nc_cache_params *p, const nc_mix_input *in, double *q, size_t n)
{
    (void)p;
    double u = 1.0 / (in->vocab_full > 0 ? in->vocab_full : (int)n);
    for (size_t w = 0; w < n; w++)
        q[w] = u;
    return NC_OK;
}

static const char *const uniform_knobs[] = {"open_vocab", "uniform_mu", "vocab_size_full", NULL};
static const char *const uniform_feature_names[] = {NULL};

const nc_component nc_component_uniform = {
    .name = "uniform",
    .knobs = uniform_knobs,
    .on = uniform_on,
    .validate = uniform_validate,
    .lambda = uniform_lambda,
    .available = uniform_available,
    .prob = uniform_prob,
    .lambda_prob = uniform_lambda_prob,
    .dense = uniform_dense,
    .features = uniform_feature_names,
};
