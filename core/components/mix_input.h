/* mix_input.h -- what design §4's formulas read at one position t
 * (nc_mix_input): the model's logits or the target's, each row's own
 * pairs and state, the gate's inputs. The mixture (mixture.h) and the gate
 * (gate.h) both read it; it sits below both. */
#ifndef NC_MIX_INPUT_H
#define NC_MIX_INPUT_H

#include "nc_common.h"
#include "dist.h"

struct nc_gate;

/* A row's own fields at t (nc_mix_input.pairs[c]): the pairs its memory
 * offers here as (score, word) -- the neural window's dots h_t·h_i and
 * words x_{i+1} (any order), the unbounded search's squared distances
 * (ascending) and words (-1: no neighbour) -- and, for a searched row,
 * whether the pre-search gate skipped its search here (then n = 0). Its
 * at_h, search and scans fill it; a row without pairs reads its state. */
typedef struct {
    const float *score;
    const int *word;
    int n;
    bool skipped;
} nc_row_pairs;

/* Everything the formulas read at one position t. */
typedef struct {
    int V;                        /* model vocabulary size */
    const float *logits;          /* [V] decoder logits s (full path only) */
    float s_target;               /* s_x for the target (target path; -INF if x >= V) */
    float log_z;                  /* logsumexp(s) over V (target path) */
    nc_row_pairs pairs[NC_NCOMP]; /* each row's own (zero: none) */
    int vocab_full;               /* |V_full| for the uniform term */
    /* The adaptive mixture (gate.h), when p->gate: the gate and p_vocab's
     * statistics (gate_vocab_stats). */
    const struct nc_gate *gate;
    float v_ent, v_logmax;
    int v_argmax;
    /* the target path's way to p_vocab of one word w for the features
     * (logits is NULL there): W_w · h + b_w with the model's decoder */
    const float *h, *dec_w, *dec_b;
    int H;
    double *weights;              /* out (NULL = not wanted): [NC_NCOMP] weights used */
    /* Each row's session state as it stands at t (component.h state_new;
     * NULL for a row without one, or where the caller has none): a row
     * without fields of its own above reads its memory here. */
    const void *state[NC_NCOMP];
} nc_mix_input;

/* log p_vocab(w) = s_w - log Z, floored at NC_LOGP_FLOOR (a word >= V has
 * p_vocab 0): from the logits when the full path has them, else one row of
 * the decoder (W_w · h + b_w, H multiply-adds); 0 when neither is there.
 * The gate's features read it (the rows' gate_features, component.h). */
#define NC_LOGP_FLOOR (-20.0)
double mix_vocab_logp(const nc_mix_input *in, int w);

#endif
