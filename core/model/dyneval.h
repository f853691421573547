/* dyneval.h -- dynamic evaluation (Krause, Kahembwe, Murray & Renals, ICML
 * 2018, "Dynamic Evaluation of Neural Sequence Models"): a stream's own copy
 * of some of the model's weights, adapted online by one gradient step per
 * segment of n tokens fed and decayed back towards the trained weights.
 *
 * The update (the paper's RMS-normalised step with the RMS-scaled global
 * prior, its "dynamic evaluation with RMS norm" rule):
 *
 *   theta_i = theta_{i-1} - eta * grad L(s_i) / (sqrt(MS_g) + eps)
 *             + lambda * (theta_g - theta_{i-1}) .* min(RMS_norm, 1/lambda)
 *   RMS_norm = (sqrt(MS_g) + eps) / mean(sqrt(MS_g))
 *
 * (The paper's RMS_norm has no eps: with it, a weight whose training
 * gradients were all 0 -- an untied embedding row of a word absent from the
 * statistics' text -- still decays, at rate lambda eps / mean, so decay
 * alone always brings every weight back.)
 *
 * L(s_i) is the mean cross-entropy of the segment's tokens (truncated BPTT
 * inside the segment: the state it starts from is a constant), theta_g the
 * trained weights and MS_g the mean squared gradient of that same loss over
 * segments of training text, measured once (dyneval_stats) and stored with
 * the model (dyneval/model.safetensors: the model's own layout, F32).
 *
 * Causality: the tokens of segment i are scored with theta_{i-1}; the step
 * on their loss is taken after the last of them was scored.
 *
 * The adapted weights live in a shadow nc_model (dyneval_model): a shallow
 * copy of the trained model whose adapted tensors point at the stream's own
 * copies, so every forward pass, decoder and cache formula runs unchanged on
 * it. Not thread-safe (one stream's). */
#ifndef NC_DYNEVAL_H
#define NC_DYNEVAL_H

#include "binio.h"
#include "lstm.h"
#include "model.h"

/* Which weights adapt (the knob dyn_params). The decoder bias always does. */
enum {
    NC_DYN_BIAS = 0,   /* sparse: the decoder bias and every LSTM bias (b_ih, b_hh) */
    NC_DYN_TOP = 1,    /* the last LSTM layer (W_ih, W_hh, biases) + decoder bias */
    NC_DYN_LSTM = 2,   /* every LSTM layer + decoder bias */
    NC_DYN_ALL = 3,    /* everything: also the embedding / decoder matrix */
};

/* eps of the update, relative to mean(sqrt(MS_g)): keeps a parameter whose
 * training gradients were ~0 (a rare word's embedding row) from taking a
 * step of eta / eps when it finally gets one. */
#define NC_DYN_EPS_REL 0.1f

/* Under NC_DYN_ALL the embedding / decoder matrix steps at this fraction of
 * eta (the LSTM's and the biases' rate). Measured on PTB valid (its first
 * 1,000 lines, models/demo, eta 0.003, decay 0.02, segments of 20): the
 * fraction 1 diverges (perplexity 104.7 -> 331), 0.3 gives 97.3, 0.1 92.4,
 * 0.03 93.9 alone; with the neural cache 0.1 and 0.03 both 84.5 (LSTM and
 * biases alone: 95.8 and 85.3). Each row of the matrix is one word: its
 * gradients are sparse and large next to the LSTM's. */
#define NC_DYN_EMBED_SCALE 0.1f

/* The normalised gradient grad / (sqrt(MS_g) + eps) is clipped to
 * [-NC_DYN_CLIP, NC_DYN_CLIP] (a guard against a too large eta: the
 * weights stay finite and within eta * NC_DYN_CLIP / (decay rate) of the
 * trained ones). */
#define NC_DYN_CLIP 1000.0f

typedef struct nc_dyneval nc_dyneval;

/* A segment of tokens y[0..T) and the state s0 it starts from (has_h: s0
 * holds an h that predicts y[0]; else y[0] is context only). */
typedef struct {
    const nc_state *s0;
    bool has_h;
    const int *y;
    int T;
} nc_dyn_segment;

/* The update's settings: a step every `segment` tokens, learning rate lr
 * (eta) and decay towards the trained weights (lambda). */
typedef struct {
    int segment;
    float lr;
    float decay;
} nc_dyn_rule;

/* New adaptation state on m (borrowed) for subset (NC_DYN_*), with the
 * weights at the trained ones and an empty segment that starts from
 * start->s0 (start->has_h as in nc_dyn_segment; its tokens come by
 * dyneval_push). NC_EINVAL when m has no gradient statistics (m->dyn_ms;
 * neurocache dyn-stats). */
int dyneval_new(const nc_model *m, int subset, const nc_dyn_segment *start, nc_dyneval **out, char *err,
                size_t errlen);
void dyneval_free(nc_dyneval *d);        /* NULL allowed */

/* The model with the adapted weights (valid while d lives). */
const nc_model *dyneval_model(const nc_dyneval *d);
int dyneval_subset(const nc_dyneval *d);
/* Tokens of the current (incomplete) segment. */
int dyneval_pending(const nc_dyneval *d);
/* True when every adapted weight equals the trained one bit for bit. */
bool dyneval_at_rest(const nc_dyneval *d);
/* Bytes a stream holds for it (adapted tensors, segment buffer). */
size_t dyneval_memory(const nc_dyneval *d);
/* The same for a subset without building one (for /v1/model, docs). */
size_t dyneval_memory_of(const nc_model *m, int subset);

/* Tokens just fed to a stream (and scored with the current weights): k
 * ids, their decoder logits [k, V] from the scoring pass (doc_prepare with
 * keep; overwritten) or NULL, and the stream's state after them (has_h as
 * the stream's). */
typedef struct {
    const int *ids;
    size_t k;
    float *logits;
    const nc_state *st;
    bool has_h;
} nc_dyn_fed;

/* Appends fed's tokens to the segment. The caller feeds at most
 * rule->segment - dyneval_pending(d) tokens between calls, so that a
 * segment is scored with one set of weights. When the segment is full,
 * takes the step on it (rule's lr and decay; lr 0 still decays) and starts
 * the next segment from fed->st. The logits are used when the k tokens are
 * a whole segment, so that the step needs no second decoder pass. */
int dyneval_push(nc_dyneval *d, const nc_dyn_fed *fed, const nc_dyn_rule *rule, char *err, size_t errlen);

/* Serialisation of the adaptation (segment and adapted tensors) into an
 * export blob; read validates sizes against m and subset. */
void dyneval_write(const nc_dyneval *d, binio_writer *w);
int dyneval_read(const nc_model *m, binio_reader *r, nc_dyneval **out, char *err, size_t errlen);

/* ---- for the statistics and the tests ---- */

/* Adapted tensor k in [0, dyneval_ntensors): its weights (in the shadow),
 * the gradient of the last dyneval_grad call, and its size. */
int dyneval_ntensors(const nc_dyneval *d);
void dyneval_tensor(nc_dyneval *d, int k, float **w, float **g, size_t *count);
/* After writing weights through dyneval_tensor: rederive b_sum. */
void dyneval_refresh(nc_dyneval *d);
/* A segment's loss: the sum of -log p over its scored tokens, and how
 * many were scored. */
typedef struct {
    double sum;
    int nscored;
} nc_dyn_loss;

/* The loss of seg with the current weights into *loss; with grad, the
 * gradient of the mean loss into the tensors' g. */
int dyneval_loss(nc_dyneval *d, const nc_dyn_segment *seg, bool grad, nc_dyn_loss *loss, char *err,
                 size_t errlen);

/* Steps of the calling thread that took the scoring pass's recorded
 * activations instead of a second forward pass (for the tests). */
unsigned long dyneval_trace_uses(void);

/* The text MS_g is measured on: ntok tokens, in segments of `segment`
 * tokens, at most max_tokens of them (0 = all). */
typedef struct {
    const int *toks;
    size_t ntok;
    int segment;
    size_t max_tokens;
} nc_dyn_stats_text;

/* MS_g: the mean squared gradient of every weight of m over consecutive
 * segments of text (state carried across segments, weights fixed). *out is
 * a model of m's shapes and vocabulary holding MS_g in place of the
 * weights, to save with model_save into m's dir/dyneval (BF16 keeps their
 * range, 1e-16 to 1e-3, which F16 would flush to zero). */
int dyneval_stats(const nc_model *m, const nc_dyn_stats_text *text, nc_model **out, double *mean_loss, char *err,
                  size_t errlen);

#endif
