/* cache.h -- cache settings and the per-stream predictor (LSTM state + local
 * caches + an optional namespace's unbounded cache). Design §3-§5.
 *
 * CONTRACT DRAFT: the caches work (issue 4) implements and may refine this
 * header; the server (issue 5) and the CLI build on it. */
#ifndef NC_CACHE_H
#define NC_CACHE_H

#include "nc_common.h"
#include "model.h"
#include "tokenizer.h"
#include "lstm.h"

typedef enum { NC_KERNEL_GAUSSIAN = 0, NC_KERNEL_EPANECHNIKOV = 1 } nc_kernel;

/* Every knob of the mixture, with units and ranges; cache_params_default()
 * gives the server's and CLI's defaults (all caches off). */
typedef struct {
    int unigram_size;             /* window N of the unigram cache, 0 = off */
    float unigram_lambda;         /* [0,1] */
    int neural_size;              /* window N of the neural cache, 0 = off */
    float neural_theta;           /* >= 0, flatness of softmax_i(theta h_t.h_i) */
    float neural_lambda;          /* [0,1], linear interpolation weight */
    bool global_norm;             /* global normalisation instead of linear */
    float neural_alpha;           /* global normalisation bias alpha */
    bool neural_f16;              /* store keys as float16 */
    bool unbounded;               /* read the namespace's unbounded cache */
    int knn;                      /* k nearest neighbours, >= 1 */
    int nprobe;                   /* IVF lists probed, >= 1 */
    float unbounded_lambda;       /* [0,1] */
    nc_kernel kernel;
    bool exact;                   /* force exact (flat) search */
    bool open_vocab;              /* OOV words get their own ids >= V */
    float uniform_mu;             /* [0,1], p = (1-mu) p + mu / |V_full| (open vocab) */
    int vocab_size_full;          /* |V_full| for the uniform term; 0 = V + words seen */
} nc_cache_params;

void cache_params_default(nc_cache_params *p);
/* NC_EINVAL with the offending field named if any value is out of range or
 * the combination makes no sense. */
int cache_params_validate(const nc_cache_params *p, char *err, size_t errlen);

#endif
