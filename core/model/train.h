/* train.h -- training an LSTM language model on a corpus: vocabulary,
 * batching, truncated BPTT, SGD/Adagrad, validation, best-model saving and
 * exact checkpoint/resume. The numeric passes live in lstm_grad.h.
 *
 * The recipe is PyTorch's word_language_model example: the token stream is
 * cut into B parallel streams (batchify), segments of bptt steps are trained
 * with the recurrent state carried across segments (but not the gradient),
 * the gradient norm is clipped, and with SGD the learning rate is divided by
 * lr_decay whenever an epoch's validation loss does not improve. */
#ifndef NC_TRAIN_H
#define NC_TRAIN_H

#include "nc_common.h"
#include "lstm_grad.h"
#include "vocab.h"

enum { NC_OPT_SGD = 0, NC_OPT_ADAGRAD = 1 };

typedef struct {
    /* Data and output (paths copied into the checkpoint for --resume). */
    char train_path[1024];        /* training text: whitespace tokens, eos per line */
    char valid_path[1024];        /* validation text ("" = none: no best-model selection) */
    char out_dir[1024];           /* model directory written (best validation) */
    /* Model. */
    int embedding_size;           /* E (default 256) */
    int hidden_size;              /* H (default 256) */
    int num_layers;               /* L (default 2) */
    bool tie_weights;             /* decoder.weight = encoder.weight (E == H) */
    int vocab_max;                /* keep the most frequent words (0 = all) */
    bool lowercase;               /* lower-case the corpus (recorded in config.json) */
    nc_text_conv text;            /* text conventions the corpus is normalised to (normalize.h;
                                   * recorded in config.json); not declared = whitespace split */
    char unk_token[64], eos_token[64];
    /* Optimisation. */
    int bptt;                     /* truncated BPTT length (35) */
    int batch_size;               /* parallel streams (20) */
    int eval_batch_size;          /* streams for validation (10, as PyTorch's example) */
    int optimizer;                /* NC_OPT_SGD or NC_OPT_ADAGRAD */
    float lr;                     /* initial learning rate (SGD 20) */
    float lr_decay;               /* divide lr by this on a validation plateau (4) */
    int lr_decay_start;           /* from this epoch on, also divide lr every epoch (0 = never) */
    float min_lr;                 /* lr never decays below this (0 = no floor) */
    float clip;                   /* max global gradient norm (0.25; 0 = off) */
    float init_range;             /* encoder/decoder uniform init (0.1) */
    float lstm_init_range;        /* LSTM uniform init (0 = 1/sqrt(H), PyTorch) */
    float adagrad_eps;            /* 1e-10 */
    lstm_grad_dropout dropout;    /* emb, hid, out probabilities */
    int epochs;                   /* number of epochs (0 = until time budget) */
    double time_budget;           /* seconds of training wall-clock (0 = none) */
    uint64_t seed;
    int threads;                  /* OpenBLAS threads (0 = leave as is) */
    double checkpoint_every;      /* seconds between state checkpoints (300) */
    bool save_f16;                /* write the best model in F16 */
    long stop_at_step;            /* test hook: checkpoint and stop after this global step (0 = off) */
} nc_train_params;

void train_default_params(nc_train_params *p);

/* Progress events reported to the callback. */
enum {
    NC_TRAIN_EV_START = 0,        /* data loaded; message describes the run */
    NC_TRAIN_EV_STEP,             /* after each optimiser step */
    NC_TRAIN_EV_VALID,            /* after a validation pass (end of epoch or of budget) */
    NC_TRAIN_EV_CHECKPOINT,       /* training state written */
    NC_TRAIN_EV_DONE,             /* finished (epochs or budget) */
    NC_TRAIN_EV_STOPPED,          /* stopped on request (callback or stop_at_step); resumable */
};

typedef struct {
    int event;
    int epoch;                    /* 1-based current epoch */
    int epochs;                   /* params.epochs (0 = budget-bound) */
    long step;                    /* global optimiser steps so far */
    long steps_per_epoch;
    double epoch_frac;            /* progress within the epoch, [0, 1] */
    double tokens_per_s;          /* recent training throughput */
    double train_loss;            /* mean training loss of the epoch so far */
    double lr;
    double elapsed;               /* training seconds so far (across resumes) */
    double eta;                   /* seconds to the end (epochs or budget), < 0 unknown */
    double val_loss, val_ppl;     /* EV_VALID: this validation */
    double best_val_ppl;          /* best so far (INFINITY before the first) */
    bool improved;                /* EV_VALID: the best model was saved */
    const char *message;          /* EV_START / EV_CHECKPOINT: human-readable detail */
} nc_train_progress;

/* Called often (every step); returning non-zero asks the trainer to write a
 * checkpoint and return (event NC_TRAIN_EV_STOPPED). */
typedef int (*nc_train_callback)(const nc_train_progress *p, void *ud);

typedef struct {
    int epochs_done;              /* completed epochs */
    long steps;
    double best_val_ppl;          /* INFINITY without validation */
    double last_val_ppl;
    double elapsed;               /* seconds */
    double tokens_per_s;          /* mean over this process's training steps */
    bool stopped;                 /* interrupted (resumable) rather than finished */
} nc_train_result;

/* Trains according to p (or, with resume, continues the run whose state is
 * in p->out_dir/train-state.bin: p must then come from train_load_params,
 * possibly with epochs, time_budget, threads, checkpoint_every, stop_at_step
 * changed). Writes into p->out_dir: the best model (config.json, vocab.txt,
 * model.safetensors), curve.csv (one row per validation) and
 * train-state.bin (atomically, every checkpoint_every seconds, at every
 * epoch end and on stop). cb may be NULL. */
int train_run(const nc_train_params *p, bool resume, nc_train_callback cb, void *ud,
              nc_train_result *res, char *err, size_t errlen);

/* Reads the parameters stored in dir/train-state.bin. */
int train_load_params(const char *dir, nc_train_params *p, char *err, size_t errlen);

/* Reads the current weights stored in dir/train-state.bin (for tests and
 * tools): *w (malloc'd, caller frees) of *n floats in lstm_grad_net layout. */
int train_load_state_weights(const char *dir, float **w, size_t *n, char *err, size_t errlen);

/* Builds the vocabulary of a training file read under p's text
 * conventions and lower-casing, ids in order of first appearance (as
 * PyTorch's example); p->eos_token ends every line; p->unk_token is always
 * present. With p->vocab_max > 0 only the vocab_max most frequent words
 * are kept (ties: first appearance), eos and unk included. */
int train_build_vocab(const char *path, const nc_train_params *p, nc_vocab **out, char *err, size_t errlen);

/* Reads a text file as token ids under v, tokenised as p says (unknown
 * words -> p->unk_token's id, eos after every line, also a last line
 * without newline). *ids is malloc'd. */
int train_read_corpus(const char *path, const nc_train_params *p, const nc_vocab *v, int **ids, size_t *n, char *err,
                      size_t errlen);

#endif
