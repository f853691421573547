/* lstm_grad.h -- training-time forward and backward pass of the LSTM language
 * model over a whole truncated-BPTT segment of B parallel streams.
 *
 * The network is PyTorch's word_language_model RNNModel: embedding, dropout,
 * nn.LSTM (gates i, f, g, o; both biases; dropout between layers), dropout,
 * linear decoder, softmax cross-entropy averaged over the T*B positions.
 * All parameters live in one flat float array (and the gradients in another
 * of the same layout), so clipping, optimisers and checkpoints are loops over
 * one buffer. Every product is an OpenBLAS sgemm over the whole segment except
 * the recurrent h_{t-1} W_hh^T term, which is one sgemm over the batch per
 * step. Nothing allocates after lstm_grad_work_new. */
#ifndef NC_LSTM_GRAD_H
#define NC_LSTM_GRAD_H

#include "nc_common.h"
#include "model.h"
#include "rng.h"

/* Tensor indices for lstm_grad_tensor. Per layer k there are four tensors
 * (w_ih, w_hh, b_ih, b_hh) at LG_T_LAYER0 + 4k + {0,1,2,3}; the decoder
 * tensors come after the layers (decoder.weight only when untied). */
enum { LG_T_ENCODER = 0, LG_T_LAYER0 = 1 };

typedef struct {
    int V, E, H, L;               /* vocabulary, embedding, hidden, layers */
    bool tied;                    /* decoder.weight is encoder.weight (E == H) */
    size_t n;                     /* number of floats in w (and g) */
    float *w;                     /* [n] parameters, layout below */
    float *g;                     /* [n] gradient of the mean loss */
    /* Offsets into w/g (floats). */
    size_t off_enc;               /* encoder [V, E] */
    size_t *off_w_ih, *off_w_hh;  /* [L] each: [4H, in_k], [4H, H] */
    size_t *off_b_ih, *off_b_hh;  /* [L] each: [4H] */
    size_t off_dec_w;             /* decoder weight [V, H] (== off_enc if tied) */
    size_t off_dec_b;             /* decoder bias [V] */
    int n_tensors;                /* 1 + 4L + (tied ? 1 : 2) */
} lstm_grad_net;

/* Dropout probabilities (0 disables), applied as inverted dropout
 * (kept units scaled by 1/(1-p)) so evaluation needs no rescaling. */
typedef struct {
    float emb;                    /* on the embeddings (layer-0 input) */
    float hid;                    /* between LSTM layers */
    float out;                    /* on the top layer's output, before the decoder */
} lstm_grad_dropout;

/* Activations of one segment, saved for the backward pass, plus the carried
 * recurrent state of the B streams ([L, B, H] each for h and c). */
typedef struct lstm_grad_work lstm_grad_work;

/* A network's shape. */
typedef struct {
    int V, E, H, L;               /* vocabulary, embedding, hidden units, layers */
    bool tied;                    /* decoder weight = encoder weight (needs E == H) */
} lstm_grad_shape;

/* Allocates the network with zeroed weights. */
int lstm_grad_net_new(const lstm_grad_shape *shape, lstm_grad_net **out, char *err, size_t errlen);
void lstm_grad_net_free(lstm_grad_net *net);   /* NULL allowed */

/* PyTorch word_language_model initialisation: encoder and decoder weights
 * uniform in [-init_range, init_range], decoder bias 0, every LSTM weight and
 * bias uniform in [-lstm_range, lstm_range] (nn.LSTM uses 1/sqrt(H); pass
 * lstm_range <= 0 for that). Consumes the generator deterministically. */
void lstm_grad_init_uniform(lstm_grad_net *net, nc_rng *rng, float init_range, float lstm_range);

/* Name (PyTorch's state_dict key), pointer into w, pointer into g and element
 * count of tensor idx in [0, n_tensors). Returns NC_EINVAL when out of range. */
int lstm_grad_tensor(const lstm_grad_net *net, int idx, const char **name, float **w,
                     float **g, size_t *count);

/* Workspace for segments of up to Tmax steps of B streams. */
int lstm_grad_work_new(const lstm_grad_net *net, int Tmax, int B, lstm_grad_work **out,
                       char *err, size_t errlen);
void lstm_grad_work_free(lstm_grad_work *w);   /* NULL allowed */
/* Zeroes the carried (h, c) of every stream (start of an epoch). */
void lstm_grad_work_reset_state(lstm_grad_work *w);
/* The carried state: h and c, each [L, B, H] row-major (read/write, for
 * checkpoints and tests). */
float *lstm_grad_work_state_h(lstm_grad_work *w);
float *lstm_grad_work_state_c(lstm_grad_work *w);
size_t lstm_grad_work_state_floats(const lstm_grad_work *w);   /* L*B*H */

/* What a segment's pass does besides the forward pass. */
typedef struct {
    bool train;                   /* dropout masks drawn from rng (drop's rates) */
    const lstm_grad_dropout *drop;
    nc_rng *rng;
    bool backward;                /* net->g receives the gradient of the mean cross-entropy over the
                                   * T*B positions (every tensor overwritten, nothing accumulates) */
} lstm_grad_pass;

/* Runs one segment: x[T*B] inputs and y[T*B] targets, time-major (position
 * t*B + b is step t of stream b), 1 <= T <= Tmax. Starts from the carried
 * state and leaves the state after step T-1 in it (truncated BPTT: no
 * gradient flows into the previous segment). pass NULL: forward only, no
 * dropout. Returns the SUM of -log p(y) over the T*B positions,
 * accumulated in double. Token ids must be in [0, V) (checked by the
 * caller). */
double lstm_grad_segment(lstm_grad_net *net, lstm_grad_work *w, const int *x, const int *y, int T,
                         const lstm_grad_pass *pass);

/* Copies the weights into an nc_model made by model_create with a matching
 * configuration (derived fields refreshed). */
int lstm_grad_to_model(const lstm_grad_net *net, nc_model *m, char *err, size_t errlen);
/* Copies the weights of a loaded model into net (same shapes). */
int lstm_grad_from_model(lstm_grad_net *net, const nc_model *m, char *err, size_t errlen);

#endif
