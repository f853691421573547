/* probe.c -- the test build's component (component_table.h, under
 * NC_COMPONENT_PROBE): what adding a component takes is this file and its
 * line in the table. A uniform term over the model's vocabulary, mixed
 * last with its one knob probe_mu:
 *     p <- (1-μp) p + μp p_probe,   p_probe(w) = 1/V for w < V, 0 beyond
 * (an open-vocabulary word gets none), with one gate feature, twice log
 * max p_vocab. tests/component/test_probe.c proves it reaches predict's
 * "components", the gate and the export blob. Not in the release build. */
#include "component.h"
#include "cache_knobs.h"

static bool probe_on(const nc_cache_params *p)
{
    return p->probe_mu > 0.0f;
}

static double probe_lambda(const nc_cache_params *p)
{
    return p->probe_mu;
}

static bool probe_available(const nc_cache_params *p, const nc_mix_input *in)
{
    (void)in;
    return probe_on(p);
}

static double probe_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    (void)p;
    return x >= 0 && x < in->V ? 1.0 / in->V : 0.0;
}

static int probe_dense(const nc_cache_params *p, const nc_mix_input *in, double *q, size_t n)
{
    (void)p;
    for (size_t w = 0; w < n && w < (size_t)in->V; w++)
        q[w] = 1.0 / in->V;
    return NC_OK;
}

static void probe_features(const nc_cache_params *p, const nc_mix_input *in, nc_feat_ctx *ctx, double *pre,
                           double *post)
{
    (void)p, (void)ctx, (void)post;
    pre[0] = 2.0 * in->v_logmax;
}

static const char *const probe_knobs[] = {"probe_mu", NULL};
static const char *const probe_feature_names[] = {"probe_twice_log_max", NULL};

const nc_component nc_component_probe = {
    .name = "probe",
    .knobs = probe_knobs,
    .on = probe_on,
    .lambda = probe_lambda,
    .available = probe_available,
    .prob = probe_prob,
    .dense = probe_dense,
    .features = probe_feature_names,
    .gate_features = probe_features,
};
