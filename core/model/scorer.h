/* scorer.h -- batched target-only scoring of token sequences with the static
 * model (design §4: input projections, decoder and normaliser by blocks of
 * GEMMs, the recurrence step by step). The CLI, the server and the caches'
 * mixture build on it. */
#ifndef NC_SCORER_H
#define NC_SCORER_H

#include "nc_common.h"
#include "lstm.h"
#include "model.h"

/* How scoring starts (design §3). */
typedef enum {
    NC_BOS_EOS = 0,               /* zero state advanced by one eos_token; every token is scored */
    NC_BOS_NONE = 1,              /* zero state; the first token is context only (reference vectors) */
} nc_bos;

/* Scratch for block scoring: hidden [B+1, H], logits [B, V], lse [B]
 * (lstm_forward_seq adds O(B * 4H) per block). One scorer per thread. */
typedef struct nc_scorer nc_scorer;

#define NC_SCORE_BLOCK 256        /* default positions per block */

/* block = 0 picks NC_SCORE_BLOCK. NULL on ENOMEM. */
nc_scorer *scorer_new(const nc_model *m, size_t block);
void scorer_free(nc_scorer *sc);  /* NULL allowed */
size_t scorer_block_size(const nc_scorer *sc);

/* Resets s to the start state of convention bos and sets *first to the
 * index of the first token to score: 0 for NC_BOS_EOS (s has consumed
 * eos_token), 1 for NC_BOS_NONE (s has consumed tokens[0]; 0 if n == 0). */
int scorer_begin(nc_scorer *sc, nc_state *s, nc_bos bos, const int *tokens, size_t n, size_t *first,
                 char *err, size_t errlen);

/* Scores one block: tokens[0..nb), nb <= block size, predicted from state s,
 * which then advances past tokens[nb-1]. logprobs[i] = log p(tokens[i] |
 * everything before) (natural log; may be NULL). After the call, until the
 * next one on sc:
 *   scorer_hidden(sc) [nb, H]: row i = h_t used to predict tokens[i] (the
 *       cache key of design §3: the pair (row i, tokens[i]));
 *   scorer_logits(sc) [nb, V]: raw decoder logits of row i;
 *   scorer_lse(sc)    [nb]:    logsumexp of logits row i.
 * Token ids must be in [0, V) (out-of-range ids act as unk). */
int scorer_block(nc_scorer *sc, nc_state *s, const int *tokens, size_t nb, float *logprobs, char *err,
                 size_t errlen);
const float *scorer_hidden(const nc_scorer *sc);
const float *scorer_logits(const nc_scorer *sc);
const float *scorer_lse(const nc_scorer *sc);

/* Progress callback: called after each block with the tokens done so far. */
typedef void (*nc_score_progress)(size_t done, size_t total, void *ctx);

/* Scores tokens[0..n) from state s by blocks (s advances past the last
 * token): logprobs[i] = log p(tokens[i] | state before it). */
int scorer_run(nc_scorer *sc, nc_state *s, const int *tokens, size_t n, float *logprobs,
                 nc_score_progress progress, void *ctx, char *err, size_t errlen);

#endif
