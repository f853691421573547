/* unbounded_term.h -- the unbounded cache's term (Grave, Cisse, Joulin, NIPS
 * 2017, §3.3, eq. 5-6): the kernel density estimate over the k nearest
 * neighbours of h_t that a search of the namespace's index store
 * (unbounded_cache.h) returns, with the per-neighbour weights that explain
 * reports. Its component row, nc_component_unbounded (component.h), owns
 * the session's side of the store: the search at a stream's h and its memo,
 * a document pass's adds and batched searches. Design §4-§5. */
#ifndef NC_UNBOUNDED_TERM_H
#define NC_UNBOUNDED_TERM_H

#include "nc_common.h"
#include "cache_knobs.h"
#include "unbounded_cache.h"

/* It reads one search's k neighbours as unbounded_cache_search returns them:
 * d2[k] squared distances ascending, words[k] word ids (-1 = no neighbour). */

/* Kernel weights of eq. 6: w[i] = K(d_i / θ(h)) with d_i = sqrt(d2[i]) and
 * θ(h) the distance to the last neighbour returned (the k-th), K(u) =
 * exp(-u²/2) (Gaussian) or max(0, 1 - u²) (Epanechnikov); every weight is 1
 * when θ(h) = 0, and 0 for a missing neighbour. w may be NULL. Returns
 * Σ_i w[i]: 0 when there is no neighbour (the cache then contributes
 * nothing). */
double unbounded_term_kernel_sum(nc_kernel kernel, const float *d2, const int *words, int k, double *w);

/* The cache's term, eq. 6 normalised over the neighbours:
 * p_cache(x) = Σ_{i : w_i = x} K_i / Σ_i K_i; 0 when there is no neighbour. */
double unbounded_term_prob(nc_kernel kernel, const float *d2, const int *words, int k, int x);

/* Explain and the full distribution: w[i] = K_i / Σ_j K_j, the weight
 * neighbour i carries in the term of its own word words[i], so that
 * Σ_{i : words[i] = x} w[i] = unbounded_term_prob(x); all 0 when there is
 * no neighbour. Returns Σ_j K_j. */
double unbounded_term_weights(nc_kernel kernel, const float *d2, const int *words, int k, double *w);

#endif
