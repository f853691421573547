/* model.h -- the LSTM language model: configuration, weights, loading, saving. */
#ifndef NC_MODEL_H
#define NC_MODEL_H

#include "nc_common.h"
#include "normalize.h"
#include "vocab.h"

typedef struct {
    char model_type[32];          /* "lstm" */
    int vocab_size;               /* V */
    int embedding_size;           /* E */
    int hidden_size;              /* H */
    int num_layers;               /* L */
    bool tie_weights;             /* decoder.weight == encoder.weight (needs E == H) */
    bool lowercase;               /* tokenizer lower-cases input (legacy: no "text" object) */
    nc_text_conv text;            /* the "text" object: conventions the tokenizer normalises to */
    char unk_token[64];
    char eos_token[64];
} nc_model_config;

/* One nn.LSTM layer, PyTorch layout (gate rows in the order i, f, g, o). */
typedef struct {
    int input_size;               /* E for layer 0, H above */
    float *w_ih;                  /* [4H, input_size] row-major */
    float *w_hh;                  /* [4H, H] */
    float *b_ih;                  /* [4H] */
    float *b_hh;                  /* [4H] */
    float *b_sum;                 /* [4H] = b_ih + b_hh (derived at load) */
    const uint16_t *w_hh_f16;     /* [4H, H] W_hh as binary16 when each weight is exactly
                                   * a half (F16 files; derived), else NULL */
    uint16_t *w_hh_f16_buf;       /* its storage (kept while training drops the copy) */
    const uint16_t *w_ih_f16;     /* [4H, input_size] W_ih the same way (one token's input
                                   * projection in lstm_step), else NULL */
    uint16_t *w_ih_f16_buf;
} nc_lstm_layer;

/* All weights are float32 in memory (F16 files are widened at load). */
typedef struct nc_model {
    nc_model_config cfg;
    nc_vocab *vocab;              /* model vocabulary, ids [0, V) */
    int unk_id;                   /* id of cfg.unk_token */
    int eos_id;                   /* id of cfg.eos_token */
    float *encoder;               /* [V, E] */
    nc_lstm_layer *layers;        /* [L] */
    float *decoder_w;             /* [V, H]; aliases encoder when tied */
    float *decoder_b;             /* [V] */
    const uint16_t *decoder_f16;  /* [V, H] decoder_w as binary16 when each weight is exactly a
                                   * half (derived; lstm_logits), else NULL */
    uint16_t *decoder_f16_buf;    /* its storage */
    char dir[1024];               /* directory it was loaded from ("" if built) */
    struct nc_gate *gate;         /* the adaptive mixture's gate (gate.h), NULL if the directory has none */
    const struct nc_lstm_hook *hook;   /* lstm_forward_seq's recorder (lstm.h): set only on dynamic
                                        * evaluation's shadow copy, NULL on a loaded model */
    struct nc_model *dyn_ms;      /* dynamic evaluation's gradient statistics in the model's own layout
                                   * (dyneval.h; dir/dyneval/ holds MS_g, kept as MS_g), NULL
                                   * if the directory has none */
    void *impl;                   /* owned storage (mmap / buffers) */
} nc_model;

/* Loads a model directory (design §2): config.json, vocab.txt,
 * model.safetensors (F32 or F16). Validates everything; on failure returns a
 * negative rc and a message naming the file and tensor. Caller frees with
 * model_free. The safetensors file is mmapped MAP_PRIVATE: aligned F32
 * tensors are used in place (writes are private copy-on-write), F16 are
 * widened. With tie_weights, decoder.weight is used when present, else the
 * decoder aliases the encoder. Tensors not named in design §2 are ignored
 * (but their byte ranges are still checked). A gate.safetensors + gate.json
 * (gate.h) are loaded into m->gate when present, and the gradient
 * statistics of dynamic evaluation (dyneval.h: a model directory
 * dir/dyneval of the same configuration and vocabulary) into m->dyn_ms. */
int model_load(const char *dir, nc_model **out, char *err, size_t errlen);

/* What model_load can tell without reading: dir is a directory holding
 * config.json, vocab.txt and model.safetensors, each readable. NC_ENOTFOUND
 * with model_load's message otherwise. The daemon asks before it listens,
 * so a mistyped --model fails before it announces a port (the load itself
 * comes after, while /health already answers). */
int model_probe(const char *dir, char *err, size_t errlen);

/* A model with freshly allocated, zeroed weights for cfg (vocab is taken over
 * by the model, on failure too: the caller must never free it). The vocab
 * must have exactly cfg->vocab_size words including unk_token and eos_token.
 * With tie_weights, decoder_w aliases encoder. Used by training and tests. */
int model_create(const nc_model_config *cfg, nc_vocab *vocab, nc_model **out,
                 char *err, size_t errlen);

/* The weights' type on disk: 0 and 1 are false and true of "F16?".
 * BF16 (bfloat16: float32's exponent, 8 bits of mantissa) keeps the range
 * of values far below F16's (dynamic evaluation's mean squared gradients,
 * 1e-16 to 1e-3: dyn-stats) at half F32's size. */
typedef enum { NC_SAVE_F32 = 0, NC_SAVE_F16 = 1, NC_SAVE_BF16 = 2 } nc_save_dtype;

/* Writes config.json, vocab.txt and model.safetensors into dir (created if
 * needed), F32, F16 or BF16 (rounded to nearest even), atomically (temp
 * files + rename). A tied model omits decoder.weight (design §2 allows it).
 * The header is space-padded so the data section is 8-byte aligned and F32
 * tensors load in place. The loader reads the three (F16, BF16 widened). */
int model_save(const nc_model *m, const char *dir, nc_save_dtype dtype, char *err, size_t errlen);

void model_free(nc_model *m);     /* NULL allowed */

/* Fills b_sum from b_ih + b_hh (after weights change). */
void model_refresh_derived(nc_model *m);

/* Number of float parameters (tied decoder counted once). */
size_t model_num_params(const nc_model *m);

/* 64-bit fingerprint of a model: crc32 and adler32 of its configuration,
 * vocabulary and every weight, so a session state or a replicated entry
 * from another model (or the same shape with other weights) is refused. */
uint64_t model_fingerprint(const nc_model *m);

#endif
