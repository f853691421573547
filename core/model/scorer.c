/* scorer.c -- batched target-only scoring with the static model. */
#include "scorer.h"
#include "fault.h"

#include <stdlib.h>
#include <string.h>

struct nc_scorer {
    const nc_model *m;
    size_t block;
    size_t nb;                    /* positions of the last scored block */
    float *hidden;                /* [block + 1, H] */
    float *logits;                /* [block, V] */
    float *lse;                   /* [block] */
};

nc_scorer *scorer_new(const nc_model *m, size_t block)
{
    NC_ASSERT(m, "scorer_new: no m");
    if (block == 0)
        block = NC_SCORE_BLOCK;
    nc_scorer *sc = nc_zalloc(1, sizeof *sc);
    if (!sc)
        return NULL;
    sc->m = m;
    sc->block = block;
    sc->hidden = nc_calloc((block + 1) * (size_t)m->cfg.hidden_size, sizeof(float));
    sc->logits = nc_calloc(block * (size_t)m->cfg.vocab_size, sizeof(float));
    sc->lse = nc_calloc(block, sizeof(float));
    if (!sc->hidden || !sc->logits || !sc->lse) {
        scorer_free(sc);
        return NULL;
    }
    return sc;
}

void scorer_free(nc_scorer *sc)
{
    if (!sc)
        return;
    nc_free(sc->hidden);
    nc_free(sc->logits);
    nc_free(sc->lse);
    free(sc);
}

size_t scorer_block_size(const nc_scorer *sc)
{
    NC_ASSERT(sc, "scorer_block_size: no sc");
    return sc->block;
}

int scorer_begin(nc_scorer *sc, nc_state *s, nc_bos bos, const int *tokens, size_t n, size_t *first,
                 char *err, size_t errlen)
{
    NC_ASSERT(sc, "scorer_begin: no sc");
    lstm_state_reset(s);
    *first = 0;
    int tok = sc->m->eos_id;
    if (bos == NC_BOS_NONE) {
        if (n == 0)
            return NC_OK;
        tok = tokens[0];
        *first = 1;
    }
    return lstm_forward_seq(sc->m, s, &tok, 1, sc->hidden, err, errlen);
}

int scorer_block(nc_scorer *sc, nc_state *s, const int *tokens, size_t nb, float *logprobs, char *err,
                 size_t errlen)
{
    NC_ASSERT(sc, "scorer_block: no sc");
    const nc_model *m = sc->m;
    const size_t H = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    if (nb > sc->block)
        return nc_error(err, errlen, NC_EINVAL, "scorer_block: %zu positions exceed the block size %zu", nb,
                        sc->block);
    sc->nb = 0;
    if (nb == 0)
        return NC_OK;
    /* Row 0 is the state we start from; rows 1..nb the states after each
     * token, so row i predicts tokens[i] (causal by construction). */
    memcpy(sc->hidden, lstm_state_top(s), H * sizeof(float));
    int rc = lstm_forward_seq(m, s, tokens, nb, sc->hidden + H, err, errlen);
    if (rc != NC_OK)
        return rc;
    lstm_logits_batch(m, sc->hidden, nb, sc->logits);
    /* Target-only score: log p(w) = s_w - logsumexp(s). */
    for (size_t i = 0; i < nb; i++) {
        const float *row = sc->logits + i * V;
        sc->lse[i] = nc_logsumexp(row, V);
        if (logprobs) {
            int tok = tokens[i];
            if (tok < 0 || tok >= (int)V)
                tok = m->unk_id;
            logprobs[i] = row[tok] - sc->lse[i];
        }
    }
    sc->nb = nb;
    return NC_OK;
}

const float *scorer_hidden(const nc_scorer *sc)
{
    NC_ASSERT(sc, "scorer_hidden: no sc");
    return sc->hidden;
}

const float *scorer_logits(const nc_scorer *sc)
{
    NC_ASSERT(sc, "scorer_logits: no sc");
    return sc->logits;
}

const float *scorer_lse(const nc_scorer *sc)
{
    NC_ASSERT(sc, "scorer_lse: no sc");
    return sc->lse;
}

int scorer_run(nc_scorer *sc, nc_state *s, const int *tokens, size_t n, float *logprobs,
                 nc_score_progress progress, void *ctx, char *err, size_t errlen)
{
    NC_ASSERT(sc, "scorer_run: no sc");
    for (size_t t0 = 0; t0 < n; t0 += sc->block) {
        size_t nb = n - t0 < sc->block ? n - t0 : sc->block;
        int rc = scorer_block(sc, s, tokens + t0, nb, logprobs ? logprobs + t0 : NULL, err, errlen);
        if (rc != NC_OK)
            return rc;
        if (progress)
            progress(t0 + nb, n, ctx);
    }
    return NC_OK;
}
