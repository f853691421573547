/* mixture.h -- design §4's mixture of the terms at one position, through the two
 * paths that must agree: the full next-word distribution and the target-only
 * log-probability (normalisers by sums over the window, no V-sized vector
 * beyond the model's log-sum-exp; Wadsworth & Palefsky-Smith §3.1).
 *
 * Mixture order (each step sees the previous result as p_model):
 *   1. p_vocab = softmax(s) (0 for open-vocabulary words >= V)
 *   2. neural cache (neural_cache.h): linear (1-λ)p + λ p_cache (Grave et al.
 *      2017, eq. 3, p_cache of eq. 2), or global normalisation
 *      p(w) ∝ exp(s_w) + Σ_{x_{i+1}=w} exp(θ h·h_i + α)   (eq. 4)
 *   3. unigram cache (unigram_cache.h): (1-λu) p + λu p_uni
 *   4. unbounded cache (unbounded_cache.h): (1-λ) p + λ p_kde,
 *      p_kde(w) ∝ Σ_{i∈N_k, w_i=w} K(d_i/θ(h))   (Grave, Cisse, Joulin 2017, eq. 5-6)
 *   5. open vocabulary: (1-μ) p + μ/|V_full|
 * Each term is its component's row (component.h), defined in its own file
 * and listed once in component_table.h, whose order is this one; this
 * module loops over the rows, weighing and summing them, so predict,
 * doc_score (score, tune, eval) and explain (stream_explain) read one
 * definition of each formula.
 * A component that is off, or whose memory is empty, is skipped (p unchanged).
 * With p->gate and in->gate, the weights come per position from the gate
 * (gate.h) instead of the constant λs: p = Σ_c w_c p_c. */
#ifndef NC_MIXTURE_H
#define NC_MIXTURE_H

#include "nc_common.h"
#include "dist.h"
#include "neural_cache.h"
#include "unbounded_cache.h"
#include "unigram_cache.h"
#include "mix_input.h"
#include "component.h"

struct nc_cache_params_s;


/* Bit c set: component c is part of the mixture at this position -- the
 * model always; a cache when it is on and holds something (an empty window,
 * no neighbour or a skipped search leave it out); the uniform term when
 * open_vocab with uniform_mu > 0 (with global normalisation the neural
 * cache is inside the model component, not a component of its own). */
unsigned mixture_available(const struct nc_cache_params_s *p, const nc_mix_input *in);
/* The components p switches on (whatever the caches hold): the set a gate
 * is fitted for (gate.json's "components"). */
unsigned mixture_components_on(const struct nc_cache_params_s *p);

/* Each component's probability of target x, pc[c] (NAN for a component not
 * in mixture_available): the terms that mixture_target mixes. */
void mixture_components(const struct nc_cache_params_s *p, const nc_mix_input *in, int x,
                        double pc[NC_NCOMP]);

/* One token of the gate's fitting data (gate.h nc_gate_data): the raw
 * features f (the post-search ones when the searched component is
 * available) and mixture_components' pc. */
void mixture_gate_data(const struct nc_cache_params_s *p, const nc_mix_input *in, int x, double f[NC_GATE_NFEAT],
                       double pc[NC_NCOMP]);

/* Full distribution over [0, n_words) (n_words >= V and greater than every
 * id in the caches). shares: also fill out->share. */
int mixture_full(const struct nc_cache_params_s *p, const nc_mix_input *in, size_t n_words,
                 bool shares, nc_dist *out, char *err, size_t errlen);
/* Natural-log probability of target id x (may be -INFINITY when nothing
 * gives it mass). Allocates nothing. */
double mixture_target(const struct nc_cache_params_s *p, const nc_mix_input *in, int x);

#endif
