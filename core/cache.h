/* cache.h -- cache settings (implemented in cache_params.c) and the umbrella
 * header of the caches: including it gives the whole cache API. Design §3-§5.
 *
 *   ucache.h     unigram cache (window counts)
 *   ncache.h     neural cache ring buffer (keys f32 or f16)
 *   wordtable.h  thread-safe open-vocabulary word table (ids >= V)
 *   ubcache.h    unbounded cache: FAISS index + values + word table, per namespace
 *   mixture.h    the formulas of design §4: full distribution and target-only
 *   docscore.h   batched causal scoring of a token sequence
 *   stream.h     the per-stream predictor (a session): state + local caches
 */
#ifndef NC_CACHE_H
#define NC_CACHE_H

#include "nc_common.h"
#include "model.h"
#include "tokenizer.h"
#include "lstm.h"

typedef enum { NC_KERNEL_GAUSSIAN = 0, NC_KERNEL_EPANECHNIKOV = 1 } nc_kernel;

/* Every knob of the mixture, with units and ranges; cache_params_default()
 * gives the server's and CLI's defaults (all caches off). */
typedef struct nc_cache_params_s {
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

/* Defaults: every cache off; when a cache is switched on without its knobs,
 * these values apply: unigram_lambda 0.1, neural theta 0.3 lambda 0.1
 * alpha 0.0, knn 1024, nprobe 8, unbounded_lambda 0.3, Gaussian kernel,
 * uniform_mu 0. */
void cache_params_default(nc_cache_params *p);
/* NC_EINVAL with the offending field named if any value is out of range or
 * the combination makes no sense. */
int cache_params_validate(const nc_cache_params *p, char *err, size_t errlen);

/* One line "unigram=N/λ neural=N/θ/λ ..." describing what is on (for logs,
 * CLI tables). Returns buf. */
const char *cache_params_describe(const nc_cache_params *p, char *buf, size_t len);

/* Hard limits, so a request cannot ask for absurd memory. */
#define NC_CACHE_MAX_WINDOW 1000000
#define NC_CACHE_MAX_KNN 16384
#define NC_CACHE_MAX_NPROBE 65536

#include "ucache.h"
#include "ncache.h"
#include "wordtable.h"
#include "ubcache.h"
#include "mixture.h"
#include "docscore.h"
#include "stream.h"

#endif
