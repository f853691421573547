/* neural_cache.h -- the continuous (neural) cache (Grave, Joulin, Usunier,
 * ICLR 2017, §3 "Neural cache model"): its memory, a ring buffer of the last
 * N pairs (h_i, x_{i+1}) with keys float32 or float16, and its terms -- the
 * cache distribution of eq. 2, global normalisation (eq. 4) and the
 * per-pair weights that explain reports. mixture.h composes the terms;
 * every path (predict, doc_score, tune, explain, the gate's features) reads
 * the window through these functions. Design §4. */
#ifndef NC_NEURAL_CACHE_H
#define NC_NEURAL_CACHE_H

#include "nc_common.h"

typedef struct {
    int size;                     /* window N (> 0) */
    int dim;                      /* H */
    bool f16;                     /* keys stored as IEEE half */
    int count;                    /* pairs held, <= size */
    int head;                     /* next slot to write */
    void *keys;                   /* [size, dim] float or uint16_t */
    int *values;                  /* [size] word ids x_{i+1} */
} nc_neural_cache;

int neural_cache_init(nc_neural_cache *c, int size, int dim, bool f16, char *err, size_t errlen);
void neural_cache_free(nc_neural_cache *c);   /* zeroed c allowed */
void neural_cache_clear(nc_neural_cache *c);
/* Appends (h[dim], w), evicting the oldest pair when full. */
void neural_cache_push(nc_neural_cache *c, const float *h, int w);
/* Slot of the i-th oldest pair (0 <= i < count). */
static inline int neural_cache_slot(const nc_neural_cache *c, int i)
{
    return (c->head - c->count + i + 2 * c->size) % c->size;
}
/* Copies the keys oldest-first into out[count, dim] (float32) and the values
 * into vals[count] (either may be NULL). Returns count. */
int neural_cache_export(const nc_neural_cache *c, float *out, int *vals);
/* dots[i] = q . key_i for the pairs oldest-first; returns count. */
int neural_cache_dots(const nc_neural_cache *c, const float *q, float *dots);
size_t neural_cache_memory(const nc_neural_cache *c);

/* ---- the terms ------------------------------------------------------------
 * They read the window W_t as seen from position t: dots[i] = h_t·h_i
 * (neural_cache_dots) and vals[i] = x_{i+1} for its n pairs, in any order.
 * θ >= 0 (validated by cache_params_validate). They take the window as one
 * view: */
typedef struct {
    const float *dots; /* dots[i] = h_t·h_i */
    const int *vals;   /* vals[i] = x_{i+1} (may be NULL where no term reads words) */
    int n;             /* pairs in the window */
    double theta;      /* θ, the flatness of the attention */
} nc_neural_window;
/* The window a mixture input holds (mix_input.h: the row's pairs, scores
 * the dots), read with cache parameters p's θ. */
#define NC_NEURAL_PAIRS(in) ((in)->pairs[NC_COMP_NEURAL])
#define NC_NEURAL_WINDOW(in, p)                                                                             \
    ((nc_neural_window){NC_NEURAL_PAIRS(in).score, NC_NEURAL_PAIRS(in).word, NC_NEURAL_PAIRS(in).n, (p)->neural_theta})

/* max_i θ h_t·h_i + bias (-inf when n = 0): the shift that keeps the
 * exponentials finite. θ >= 0, so it is θ max_i h_t·h_i + bias: one
 * vectorised max. */
double neural_cache_max_logit(const nc_neural_window *w, double bias);

/* e_i = exp(θ h_t·h_i + bias - m) into e[n] (NULL: not kept); returns Σ_i e_i
 * and puts Σ_{vals[i] = x} e_i in *match (x = -1: none). One vectorised pass
 * (vm_cache_exp_sum, float exponentials, Σ in double, the match in float):
 * the kernel of every term below. */
double neural_cache_exp_sum(float *e, const nc_neural_window *w, double bias, double m, int x, double *match);

/* Linear interpolation's cache term (eq. 2):
 * p_cache(x) = Σ_{i : x_{i+1} = x} softmax_i(θ h_t·h_i); 0 when n = 0. */
double neural_cache_prob(const nc_neural_window *w, int x);

/* Global normalisation (eq. 4), the model and the cache in one softmax:
 * p(x) = (exp(s_x) + Σ_{x_{i+1} = x} exp(θ h_t·h_i + α))
 *        / (Σ_w exp(s_w) + Σ_i exp(θ h_t·h_i + α)),
 * with s_x the decoder logit of x (-inf when x >= V: the cache alone) and
 * log_z = log Σ_w exp(s_w). */
double neural_cache_global_prob(const nc_neural_window *w, double alpha, double s_x, double log_z, int x);

/* Explain: out[i] = the weight pair i carries in the term of its own word
 * vals[i], normalised as the mixture normalises it, so that
 * Σ_{i : vals[i] = x} out[i] is the cache's term for x --
 *   linear (global false): softmax_i(θ h_t·h_i), the sum being
 *     neural_cache_prob(x);
 *   global: exp(θ h_t·h_i + α) / (Σ_w exp(s_w) + Σ_j exp(θ h_t·h_j + α))
 *     (log_z = log Σ_w exp(s_w)), the sum being the cache's part of
 *     neural_cache_global_prob(x).
 * The exponentials are neural_cache_exp_sum's, as in the mixture. out[n];
 * nothing written when n = 0. NC_ENOMEM (out untouched) if the scratch of n
 * floats cannot be had. */
int neural_cache_weights(const nc_neural_window *w, double alpha, bool global, double log_z, double *out);

#endif
