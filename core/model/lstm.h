/* lstm.h -- LSTM forward pass (step and batched), decoder and log-softmax. */
#ifndef NC_LSTM_H
#define NC_LSTM_H

#include "nc_common.h"
#include "model.h"

/* Recurrent state after consuming some tokens: per-layer (h, c). The top
 * layer's h (lstm_state_top) is the decoder input and the cache key h_t. */
typedef struct {
    int num_layers, hidden_size;
    float *h;                     /* [L, H] */
    float *c;                     /* [L, H] */
} nc_state;

nc_state *lstm_state_new(const nc_model *m);   /* zero state; NULL on ENOMEM */
void lstm_state_free(nc_state *s);             /* NULL allowed */
void lstm_state_reset(nc_state *s);            /* back to zeros */
void lstm_state_copy(nc_state *dst, const nc_state *src);  /* same shape */
static inline const float *lstm_state_top(const nc_state *s)
{
    return s->h + (size_t)(s->num_layers - 1) * s->hidden_size;
}
/* Serialisation: a fixed-size little-endian blob of (L, H, h, c). */
size_t lstm_state_blob_size(const nc_state *s);
void lstm_state_to_blob(const nc_state *s, void *blob);
int lstm_state_from_blob(nc_state *s, const void *blob, size_t len, char *err, size_t errlen);

/* Scratch memory for the step path, so stepping never allocates. */
typedef struct nc_lstm_work nc_lstm_work;
nc_lstm_work *lstm_work_new(const nc_model *m);
void lstm_work_free(nc_lstm_work *w);

/* Consumes one token (model id, 0 <= token < V): s advances by one step. */
void lstm_step(const nc_model *m, nc_state *s, int token, nc_lstm_work *w);

/* A recorder of lstm_forward_seq's activations (m->hook): dynamic
 * evaluation keeps the scoring pass's for the segment's gradient instead of
 * running the LSTM forward a second time (dyneval.c). begin: the start
 * state and the tokens; step: after step t of layer l, rows = its input
 * row, the activated gates i, f, g, o [4H], c, tanh(c) and h [H]. */
typedef struct nc_lstm_hook {
    void *ctx;
    void (*begin)(void *ctx, const nc_state *s, const int *tokens, size_t T);
    void (*step)(void *ctx, int l, size_t t, const float *const rows[5]);
} nc_lstm_hook;

/* Batched path: consumes tokens[0..T) starting from s; writes the top
 * layer's h after each token into hidden[T, H] (row t = h after tokens[t]);
 * s ends as after the last token. Input projections of all positions are one
 * GEMM per layer; only the recurrence is sequential. Allocates its own
 * scratch (O(T * 4H)); processes long inputs in blocks. */
int lstm_forward_seq(const nc_model *m, nc_state *s, const int *tokens, size_t T,
                     float *hidden, char *err, size_t errlen);

/* Decoder logits: logits[V] = W_dec h + b_dec; lstm_logits_rows of one row. */
void lstm_logits(const nc_model *m, const float *h, float *logits);
/* Decoder over a block: logits[T, V] = hidden[T, H] W_dec^T + b: one GEMM,
 * or up to LSTM_LOGITS_ROWS_MAX rows (a daemon's feed of a few words),
 * lstm_logits_rows -- each row then the same bits as lstm_logits alone. */
void lstm_logits_batch(const nc_model *m, const float *hidden, size_t T, float *logits);
#define LSTM_LOGITS_ROWS_MAX 32
/* The same for a few rows (a batch of sessions' predicts, a segment of
 * dynamic evaluation) with the decoder read in place -- its binary16 copy
 * when the model has one (vm_gemm_nt_f16), else vm_gemm_nt -- instead of
 * OpenBLAS's packed copy. Batch-invariant: row t is the same bits as
 * lstm_logits of hidden[t] alone; equal to lstm_logits_batch's GEMM within
 * float rounding (vmath.h's bound). */
void lstm_logits_rows(const nc_model *m, const float *hidden, size_t T, float *logits);

/* log(sum(exp(x))) computed stably (max subtracted). */
float nc_logsumexp(const float *x, size_t n);
/* In place: x <- x - logsumexp(x). */
void nc_log_softmax(float *x, size_t n);

#endif
