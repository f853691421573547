/* dist.h -- a next-word distribution with each mixture component's share of
 * it: what mixture_full fills and predict, generation and completions read.
 * Design §4 names the components. */
#ifndef NC_DIST_H
#define NC_DIST_H

#include "nc_common.h"
#include "component_table.h"

/* Components of the final distribution, in the mixture's order: the rows
 * of component_table.h (NC_COMP_MODEL, NC_COMP_NEURAL, ...; their code is
 * component.h's rows). p[w] = Σ_c share[c][w]. */
#define NC_COMP_ENUM_(ID, name, npre, npost) NC_COMP_##ID,
enum { NC_COMPONENT_TABLE(NC_COMP_ENUM_) NC_NCOMP };
#undef NC_COMP_ENUM_
extern const char *const nc_comp_names[NC_NCOMP];   /* "model", "neural", ... */

/* A distribution over word ids [0, n). Arrays are owned and reused across
 * calls; dist_free releases them. */
typedef struct {
    size_t n, cap;
    float *p;                     /* [n], sums to 1 */
    float *share[NC_NCOMP];       /* [n] each when shares were asked, else NULL */
    double weight[NC_NCOMP];      /* the components' weights at this position (Σ = 1; 0 = off,
                                   * empty or skipped; global normalisation: all in "model") */
} nc_dist;
void dist_init(nc_dist *d);
void dist_free(nc_dist *d);      /* releases the arrays; d is empty again (dist_init) */

/* Sets d->n = n, growing the arrays when n > cap (their contents are then
 * undefined); shares: also the share arrays. NC_ENOMEM, d left freeable. */
int dist_reserve(nc_dist *d, size_t n, bool shares);

/* Indices of the k largest p[0..n), sorted by decreasing p (ties: lower id
 * first), into out[k]. A bounded min-heap: O(n log k). Returns the count
 * written (min(k, n)). The API's top_k and generation's nucleus read it. */
size_t dist_top_k(const float *p, size_t n, size_t k, int *out);

#endif
