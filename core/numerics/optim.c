/* optim.c -- clipping, SGD and Adagrad over flat parameter buffers. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")   /* vectorise the loops (see lstm_grad.c) */
#endif
#include "optim.h"

#include <math.h>

double optim_grad_norm(const float *g, size_t n)
{
    /* Blocks of float partial sums, added in double: fast and accurate
     * enough for a clipping threshold. */
    double total = 0.0;
    for (size_t i = 0; i < n; i += 4096) {
        size_t end = i + 4096 < n ? i + 4096 : n;
        float s = 0.0f;
        for (size_t j = i; j < end; j++)
            s += g[j] * g[j];
        total += s;
    }
    return sqrt(total);
}

double optim_clip_grad_norm(float *g, size_t n, float max_norm)
{
    double norm = optim_grad_norm(g, n);
    if (max_norm > 0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) {
            float c = (float)coef;
            for (size_t i = 0; i < n; i++)
                g[i] *= c;
        }
    }
    return norm;
}

void optim_sgd(float *w, const float *g, size_t n, float lr)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= lr * g[i];
}

void optim_adagrad(float *w, float *acc, const float *g, size_t n, float lr, float eps)
{
    for (size_t i = 0; i < n; i++) {
        float a = acc[i] + g[i] * g[i];
        acc[i] = a;
        w[i] -= lr * g[i] / (sqrtf(a) + eps);
    }
}
