/* gate.h -- the adaptive mixture (design §4 "Adaptive mixture (gate)"): per
 * token weights of the components (model, neural, unigram, unbounded,
 * uniform) from a small fitted model g(f_t), and the adaptive retrieval that
 * skips the unbounded search when g predicts the unbounded cache useless.
 *
 * f_t holds only what is known before x_{t+1} (the target is never read):
 * statistics of p_vocab, of the neural cache's window, and -- after the
 * search -- of the unbounded cache's neighbours. The continuous-cache paper
 * (Grave et al. 2017, §4) suggests making λ a function of h_t; He, Neubig &
 * Berg-Kirkpatrick 2021 ("Efficient Nearest Neighbor Language Models", §4)
 * predict from pre-retrieval features when the search can be skipped.
 *
 * The gate is a softmax over the components it was fitted with, of a linear
 * map of the normalised features plus (optionally) one tanh hidden layer:
 *   z_c = b_c + Σ_f W_cf x_f + Σ_j V_cj tanh(U_j · x + b'_j),   w_c = softmax_c(z)
 * and the mixture is p(x) = Σ_c w_c p_c(x). A component that is off or empty
 * at a position (an empty window, no neighbour, a skipped search) passes its
 * weight on to the components before it in the mixture order, in proportion
 * to theirs -- exactly what the constant-λ mixture does when it skips a step
 * (mixture.h), so a gate whose W is 0 and whose b_c are the logs of the
 * constant mixture's weights reproduces the constant-λ numbers.
 *
 * Two weight matrices: the full gate (all features) weighs the components;
 * the pre-search gate (the same model fitted on the pre-search features
 * only) decides the skip: when its unbounded weight is below the threshold,
 * the search is not run, and the token's weights are the pre-search gate's
 * with the unbounded weight passed on as above.
 *
 * Files (model directory): gate.safetensors (F64 tensors "w", "w_pre"
 * [NC_NCOMP, NC_GATE_NFEAT + 1], "mean", "sd" [NC_GATE_NFEAT], and with nh
 * hidden units "u", "u_pre" [nh, NC_GATE_NFEAT + 1], "v", "v_pre"
 * [NC_NCOMP, nh]) and gate.json (feature names, components, hidden units,
 * skip threshold, how it was fitted). */
#ifndef NC_GATE_H
#define NC_GATE_H

#include "component.h"
#include "dist.h"
#include "mix_input.h"

#include <stdint.h>
#include <stdio.h>

struct nc_cache_params_s;

/* The features are the components' (component.h): each row names its own
 * and computes them; NC_GATE_NPRE of them are known before the unbounded
 * search, NC_GATE_NFEAT in all, in the order of components_feature_name
 * (the rows' pre-search ones in the table's order, then the post-search
 * ones). The built-in rows': p_vocab's entropy and log max (model); the
 * neural window's fill, max dot, log max attention, agreement of its
 * best-attended word w* with argmax p_vocab, log p_neural(w*) and log
 * p_vocab(w*) (neural); after the search, log(1 + d²) of the nearest and
 * the k-th neighbour, distinct words and the nearest one's share among the
 * 32 nearest, its agreement with w* and with argmax p_vocab, and its log
 * p_vocab (unbounded). */

#define NC_GATE_NW (NC_GATE_NFEAT + 1)   /* weights per unit, bias last */
#define NC_GATE_MAXH 32                  /* hidden units at most */
#define NC_GATE_CLIP 4.0                 /* normalised features are clipped to ±4 */

/* One gate's parameters (doubles only: L-BFGS treats it as one vector):
 *   a_j = tanh(b'_j + Σ_f U_jf x_f)            (j < nh; none when nh = 0)
 *   z_c = b_c + Σ_f W_cf x_f + Σ_j V_cj a_j,
 *   x_f = clip((f_f - mean_f) / sd_f, ±NC_GATE_CLIP) */
typedef struct {
    double w[NC_NCOMP][NC_GATE_NW];
    double u[NC_GATE_MAXH][NC_GATE_NW];
    double v[NC_NCOMP][NC_GATE_MAXH];
} nc_gate_net;
#define NC_GATE_NP ((int)(sizeof(nc_gate_net) / sizeof(double)))

typedef struct nc_gate {
    unsigned comps;                        /* bit c: component c was fitted */
    int nh;                                /* hidden units (0 = linear) */
    double mean[NC_GATE_NFEAT], sd[NC_GATE_NFEAT];
    nc_gate_net full;                      /* the gate */
    nc_gate_net pre;                       /* pre-search gate (unbounded feature columns 0) */
    double skip;                           /* threshold picked on validation (gate_skip = -1) */
} nc_gate;

/* p_vocab's statistics for the features, from the decoder logits [V] (one
 * vectorised pass; doc_prepare keeps them per token when the model has a
 * gate, a predict computes them). scratch: [V] floats, not logits. */
void gate_vocab_stats(const float *logits, int V, float *scratch, float *ent, float *logmax, int *argmax);

/* Raw features at one position (post: also the post-search ones; else they
 * are 0). Reads only in (never a target). */
void gate_features(const struct nc_cache_params_s *p, const nc_mix_input *in, bool post,
                   double f[NC_GATE_NFEAT]);


/* Weights from raw features: pre selects the pre-search gate; components
 * not in avail (or not fitted) get 0 and pass their weight on (see top). */
void gate_weights(const nc_gate *g, bool pre, const double f[NC_GATE_NFEAT], unsigned avail,
                  double w[NC_NCOMP]);

/* The constant mixture's weights for the components in avail (the product
 * form of mixture.h's steps: w_model = Π(1-λ), w_neural = λ Π_{later}(1-λ), ...). */
void gate_const_weights(const struct nc_cache_params_s *p, unsigned avail, double w[NC_NCOMP]);

/* Adaptive retrieval at one position: true when searched row sc's search
 * is to be skipped (the pre-search gate's weight of it below the
 * threshold; each searched row is decided on its own). */
bool gate_skip_search(const nc_gate *g, const struct nc_cache_params_s *p, const nc_mix_input *in, int sc);
/* g was fitted with a searched component (components.h): its pre-search
 * net can skip that component's search. */
bool gate_searches(const nc_gate *g);
/* The threshold in force: p->gate_skip, or the gate's own when it is < 0. */
double gate_threshold(const nc_gate *g, const struct nc_cache_params_s *p);

/* Process-wide counters of the unbounded searches run and skipped under a
 * gate (for /metrics). */
void gate_count_searches(uint64_t searched, uint64_t skipped);
void gate_counters(uint64_t *searched, uint64_t *skipped);

/* ---- fitting ----
 * Per token of the fitting text: raw features f [n, NFEAT] and each
 * component's probability of the target pc [n, NCOMP] (NAN = unavailable). */
typedef struct {
    size_t n;
    double *f;
    double *pc;
} nc_gate_data;

/* Mean negative log-likelihood (nats a token) of the tokens where every
 * fitted component is available, plus l2/2 Σ (W² + U² + V², not the
 * biases), for the gate's full (pre = false) or pre-search net; grad (NULL
 * or an nc_gate_net's NC_GATE_NP doubles, same layout) gets its gradient.
 * *used: the tokens counted. */
double gate_objective(const nc_gate *g, bool pre, const nc_gate_data *d, double l2, double *grad,
                      size_t *used);

/* How gate_fit fits. */
typedef struct {
    int hidden;      /* hidden units nh, 0..NC_GATE_MAXH (U drawn from seed) */
    uint64_t seed;
    int iters;       /* L-BFGS iterations at most, for each of the two gates */
    double l2;       /* weight of the L2 term in the objective */
    double max_loss; /* the skip threshold's budget: relative perplexity on d, e.g. 0.005 */
    FILE *curve;     /* NULL or a FILE: one CSV line per iteration: gate (full | pre), iter, objective (mean
                      * NLL + the L2 term), exp(objective); then one per skip threshold tried: skip,
                      * threshold, NLL, perplexity */
} nc_gate_fit_opts;

/* Fits g (comps, mean and sd set from d; both gates) by L-BFGS in double
 * precision, from the constant mixture of p (W = V = 0, b = log of its
 * weights); deterministic for a seed. Also picks g->skip: the largest
 * threshold whose skipping costs at most o->max_loss on d. */
int gate_fit(nc_gate *g, const struct nc_cache_params_s *p, const nc_gate_data *d, const nc_gate_fit_opts *o,
             char *err, size_t errlen);

/* Perplexity of d under g (pre: the pre-search gate) with skipping at
 * threshold thr (< 0: never), and the fraction of tokens skipped. */
double gate_data_ppl(const nc_gate *g, const nc_gate_data *d, double thr, double *skipped);

/* gate.safetensors + gate.json in dir (written atomically); load: NC_ENOTFOUND
 * (quietly, *out NULL) when dir has no gate.safetensors. info: free text
 * for gate.json's "fitted" field (NULL = none). */
int gate_save(const nc_gate *g, const char *dir, const char *info, char *err, size_t errlen);
int gate_load(const char *dir, nc_gate **out, char *err, size_t errlen);
void gate_free(nc_gate *g);

#endif
