/* optim.h -- parameter updates over flat float buffers: gradient-norm
 * clipping, SGD and Adagrad. */
#ifndef NC_OPTIM_H
#define NC_OPTIM_H

#include <stddef.h>

/* Global L2 norm of g[0..n), accumulated in double. */
double optim_grad_norm(const float *g, size_t n);

/* Scales g so that its global L2 norm is at most max_norm, as PyTorch's
 * clip_grad_norm_ does (coefficient max_norm / (norm + 1e-6), applied only
 * when below 1). max_norm <= 0 disables. Returns the norm before clipping. */
double optim_clip_grad_norm(float *g, size_t n, float max_norm);

/* Plain SGD: w <- w - lr g. */
void optim_sgd(float *w, const float *g, size_t n, float lr);

/* Adagrad (Duchi, Hazan & Singer 2011), PyTorch's form:
 * acc <- acc + g^2; w <- w - lr g / (sqrt(acc) + eps). */
void optim_adagrad(float *w, float *acc, const float *g, size_t n, float lr, float eps);

#endif
