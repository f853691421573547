/* mixture.h -- the formulas of design §4 for one position, through the two
 * paths that must agree: the full next-word distribution and the target-only
 * log-probability (normalisers by sums over the window, no V-sized vector
 * beyond the model's log-sum-exp; Wadsworth & Palefsky-Smith §3.1).
 *
 * Mixture order (each step sees the previous result as p_model):
 *   1. p_vocab = softmax(s) (0 for open-vocabulary words >= V)
 *   2. neural cache: linear (1-λ)p + λ p_cache, or global normalisation
 *      p(w) ∝ exp(s_w) + Σ_{x_{i+1}=w} exp(θ h·h_i + α)   (Grave et al. 2017, eq. 2-4)
 *   3. unigram cache: (1-λu) p + λu p_uni
 *   4. unbounded cache: (1-λ) p + λ p_kde, p_kde(w) ∝ Σ_{i∈N_k, w_i=w} K(d_i/θ(h))
 *      (Grave, Cisse, Joulin 2017, eq. 5-6)
 *   5. open vocabulary: (1-μ) p + μ/|V_full|
 * A component that is off, or whose memory is empty, is skipped (p unchanged).
 * With p->gate and in->gate, the weights come per position from the gate
 * (gate.h) instead of the constant λs: p = Σ_c w_c p_c. */
#ifndef NC_MIXTURE_H
#define NC_MIXTURE_H

#include "nc_common.h"
#include "ucache.h"

struct nc_cache_params_s;
struct nc_gate;

/* Components of the final distribution: p[w] = Σ_c share[c][w]. */
enum { NC_COMP_MODEL = 0, NC_COMP_NEURAL, NC_COMP_UNIGRAM, NC_COMP_UNBOUNDED,
       NC_COMP_UNIFORM, NC_NCOMP };
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
void dist_free(nc_dist *d);

/* Everything the formulas read at one position t. */
typedef struct {
    int V;                        /* model vocabulary size */
    const float *logits;          /* [V] decoder logits s (full path only) */
    float s_target;               /* s_x for the target (target path; -INF if x >= V) */
    float log_z;                  /* logsumexp(s) over V (target path) */
    const float *ndots;           /* [nn] h_t·h_i over the neural window, any order */
    const int *nvals;             /* [nn] x_{i+1} of those pairs */
    int nn;
    const nc_ucache *uni;         /* unigram window (NULL or empty = off) */
    const float *ub_d2;           /* [ub_k] squared distances, ascending */
    const int *ub_words;          /* [ub_k] word ids, -1 = no neighbour */
    int ub_k;
    int vocab_full;               /* |V_full| for the uniform term */
    /* The adaptive mixture (gate.h), when p->gate: the gate, p_vocab's
     * statistics (gate_vocab_stats) and whether the unbounded search was
     * skipped for this position (then ub_k = 0). */
    const struct nc_gate *gate;
    float v_ent, v_logmax;
    int v_argmax;
    /* the target path's way to p_vocab of one word w for the features
     * (logits is NULL there): W_w · h + b_w with the model's decoder */
    const float *h, *dec_w, *dec_b;
    int H;
    bool ub_skipped;
    double *weights;              /* out (NULL = not wanted): [NC_NCOMP] weights used */
} nc_mix_input;

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

/* Full distribution over [0, n_words) (n_words >= V and greater than every
 * id in the caches). shares: also fill out->share. */
int mixture_full(const struct nc_cache_params_s *p, const nc_mix_input *in, size_t n_words,
                 bool shares, nc_dist *out, char *err, size_t errlen);
/* Natural-log probability of target id x (may be -INFINITY when nothing
 * gives it mass). Allocates nothing. */
double mixture_target(const struct nc_cache_params_s *p, const nc_mix_input *in, int x);

#endif
