/* cache_params.c -- defaults, validation and description of nc_cache_params. */
#include "cache.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void cache_params_default(nc_cache_params *p)
{
    memset(p, 0, sizeof *p);
    p->unigram_lambda = 0.1f;
    p->neural_theta = 0.3f;
    p->neural_lambda = 0.1f;
    p->neural_alpha = 0.0f;
    p->knn = 1024;
    p->nprobe = 8;
    p->unbounded_lambda = 0.3f;
    p->kernel = NC_KERNEL_GAUSSIAN;
}

static bool in01(float x) { return isfinite(x) && x >= 0.0f && x <= 1.0f; }

int cache_params_validate(const nc_cache_params *p, char *err, size_t errlen)
{
    if (p->unigram_size < 0 || p->unigram_size > NC_CACHE_MAX_WINDOW)
        return nc_error(err, errlen, NC_EINVAL, "unigram_size %d out of range [0, %d]",
                        p->unigram_size, NC_CACHE_MAX_WINDOW);
    if (!in01(p->unigram_lambda))
        return nc_error(err, errlen, NC_EINVAL, "unigram_lambda %g out of range [0, 1]",
                        (double)p->unigram_lambda);
    if (p->neural_size < 0 || p->neural_size > NC_CACHE_MAX_WINDOW)
        return nc_error(err, errlen, NC_EINVAL, "neural_size %d out of range [0, %d]",
                        p->neural_size, NC_CACHE_MAX_WINDOW);
    if (!isfinite(p->neural_theta) || p->neural_theta < 0.0f || p->neural_theta > 1e4f)
        return nc_error(err, errlen, NC_EINVAL, "neural_theta %g out of range [0, 1e4]",
                        (double)p->neural_theta);
    if (!in01(p->neural_lambda))
        return nc_error(err, errlen, NC_EINVAL, "neural_lambda %g out of range [0, 1]",
                        (double)p->neural_lambda);
    if (!isfinite(p->neural_alpha) || fabsf(p->neural_alpha) > 100.0f)
        return nc_error(err, errlen, NC_EINVAL, "neural_alpha %g out of range [-100, 100]",
                        (double)p->neural_alpha);
    if (p->global_norm && p->neural_size == 0)
        return nc_error(err, errlen, NC_EINVAL,
                        "global_norm needs the neural cache (neural_size > 0)");
    if (p->neural_f16 && p->neural_size == 0)
        return nc_error(err, errlen, NC_EINVAL, "neural_f16 needs the neural cache (neural_size > 0)");
    if (p->knn < 1 || p->knn > NC_CACHE_MAX_KNN)
        return nc_error(err, errlen, NC_EINVAL, "knn %d out of range [1, %d]", p->knn,
                        NC_CACHE_MAX_KNN);
    if (p->nprobe < 1 || p->nprobe > NC_CACHE_MAX_NPROBE)
        return nc_error(err, errlen, NC_EINVAL, "nprobe %d out of range [1, %d]", p->nprobe,
                        NC_CACHE_MAX_NPROBE);
    if (!in01(p->unbounded_lambda))
        return nc_error(err, errlen, NC_EINVAL, "unbounded_lambda %g out of range [0, 1]",
                        (double)p->unbounded_lambda);
    if (p->kernel != NC_KERNEL_GAUSSIAN && p->kernel != NC_KERNEL_EPANECHNIKOV)
        return nc_error(err, errlen, NC_EINVAL, "kernel %d unknown (gaussian or epanechnikov)",
                        (int)p->kernel);
    if (p->exact && !p->unbounded)
        return nc_error(err, errlen, NC_EINVAL, "exact applies to the unbounded cache, which is off");
    if (!in01(p->uniform_mu) || p->uniform_mu >= 1.0f)
        return nc_error(err, errlen, NC_EINVAL, "uniform_mu %g out of range [0, 1)",
                        (double)p->uniform_mu);
    if (p->uniform_mu > 0.0f && !p->open_vocab)
        return nc_error(err, errlen, NC_EINVAL, "uniform_mu needs open_vocab");
    if (p->vocab_size_full < 0)
        return nc_error(err, errlen, NC_EINVAL, "vocab_size_full %d is negative", p->vocab_size_full);
    if (p->vocab_size_full > 0 && !p->open_vocab)
        return nc_error(err, errlen, NC_EINVAL, "vocab_size_full needs open_vocab");
    return NC_OK;
}

const char *cache_params_describe(const nc_cache_params *p, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
#define ADD(...) do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    if (p->neural_size > 0) {
        if (p->global_norm)
            ADD("neural-global N=%d theta=%g alpha=%g ", p->neural_size, (double)p->neural_theta,
                (double)p->neural_alpha);
        else
            ADD("neural N=%d theta=%g lambda=%g ", p->neural_size, (double)p->neural_theta,
                (double)p->neural_lambda);
        if (p->neural_f16)
            ADD("f16 ");
    }
    if (p->unigram_size > 0)
        ADD("unigram N=%d lambda=%g ", p->unigram_size, (double)p->unigram_lambda);
    if (p->unbounded)
        ADD("unbounded k=%d nprobe=%d lambda=%g %s%s ", p->knn, p->nprobe,
            (double)p->unbounded_lambda, p->kernel == NC_KERNEL_GAUSSIAN ? "gaussian" : "epanechnikov",
            p->exact ? " exact" : "");
    if (p->open_vocab)
        ADD("open-vocab mu=%g ", (double)p->uniform_mu);
    if (o == 0)
        ADD("static");
    else if (o < len && o > 0 && buf[o - 1] == ' ')
        buf[o - 1] = '\0';
#undef ADD
    return buf;
}
