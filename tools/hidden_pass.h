/* hidden_pass.h -- the model's hidden states over a text, chunk by chunk
 * to a callback on a second thread (hidden_pass.c). */
#ifndef NC_HIDDEN_PASS_H
#define NC_HIDDEN_PASS_H

#include <stdbool.h>
#include <stddef.h>

#include "texts.h"

/* Runs the model over x->toks from the state after one eos (x->bos_eos is
 * not read) and calls fn
 * with chunks of rows: h[i] = the h_t that predicts token ids[i] (i.e. the
 * pair (h[i], ids[i])). Chunks of at most 4096 rows, in order, one call at a
 * time, from a second thread while the LSTM runs over the next chunk (on one
 * BLAS thread meanwhile): fn must not touch what the caller's thread uses.
 * fn returns NC_OK to go on; its error (code and message) is returned. */
typedef int (*co_hidden_fn)(const float *h, const int *ids, size_t n, void *ctx, char *err, size_t errlen);
int co_hidden_pass(const co_text *x, co_hidden_fn fn, void *ctx, bool progress, char *err, size_t errlen);

#endif
