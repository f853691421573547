/* doc.h -- batched, causal scoring of a token sequence with the caches.
 *
 * A document is first "prepared" (one LSTM pass: input projections and the
 * decoder as GEMMs, recurrence step by step), keeping per token j the query
 * row h before token j, the decoder logit of token j and the log-sum-exp of
 * the logits. doc_score then reads the caches position by position: each
 * row's window a block of positions at a time (component.h scan_block: the
 * neural cache's dot products in one GEMM against the window),
 * unbounded searches batched per block. Causality (design §3): token j's
 * probability depends only on pairs of tokens < j, however the text is cut
 * into calls -- including the unbounded cache, where a block's own pairs are
 * added before its search and filtered out by FAISS id (unbounded_cache_search's
 * id_limit). The prepared document can be scored many times with different
 * parameters (tune shares the LSTM pass across a grid). */
#ifndef NC_DOC_H
#define NC_DOC_H

#include "cache_params.h"
#include "lstm.h"
#include "component.h"
#include "tokenizer.h"
#include "unbounded_cache.h"
#include "wordtable.h"

struct nc_gate;

typedef struct {
    int dim;                      /* H */
    int V;                        /* model vocabulary size */
    size_t n;                     /* tokens */
    size_t first;                 /* tokens [0, first) are context only (no query) */
    float *q;                     /* [n, dim] row j = h before token j: query for j, key of pair j */
    int *ids;                     /* [n] cache word id of token j (>= V: open-vocabulary word) */
    int *mem_ids;                 /* [n] id the unbounded cache stores for token j, or NULL = ids:
                                   * differs when a closed-vocabulary reader adapts a memory
                                   * with a word table (its OOV words go there by name) */
    int unk_id;                   /* the model's unk_token id: how a closed-vocabulary reader
                                   * reads stored OOV words (unbounded_cache.h); -1 = unknown (doc_alloc) */
    float *s_target;              /* [n] decoder logit of token j at row j (-INF if id >= V) */
    float *log_z;                 /* [n] logsumexp of the decoder logits at row j */
    int *vfull;                   /* [n] |V_full| before token j: V + dynamic words seen */
    /* The adaptive mixture (gate.h): the model's gate (NULL if none) and
     * p_vocab's statistics at row j (NULL unless prepared with them). */
    const struct nc_gate *gate;
    float *v_ent, *v_logmax;
    int *v_argmax;
    const float *dec_w, *dec_b;   /* the model's decoder (borrowed), for p_vocab of one word */
    float *logits;                /* [n, V] decoder logits of row j (rows >= first), kept by
                                   * doc_prepare with keep, for dynamic evaluation's gradient; else NULL */
} nc_doc;

/* Empty document with room for n tokens (fields to be filled by the caller:
 * tests build documents from reference vectors). */
int doc_alloc(int dim, int V, size_t n, nc_doc **out, char *err, size_t errlen);
void doc_free(nc_doc *d);        /* NULL allowed */

/* What doc_prepare runs the model over, and what it keeps.
 * s: the state, advanced in place to after the last token. has_h: s
 * already holds an h_t that predicts toks[0] (a session, or a document
 * started with eos); otherwise toks[0] is context only (--bos none).
 * words: open-vocabulary table (OOV tokens get their own ids, added to
 * it), or NULL for closed vocabulary (OOV = unk). mem_words: the word table
 * of the unbounded cache the document will adapt, or NULL: when it is not
 * words (a closed-vocabulary stream adapting a namespace), OOV tokens are
 * stored there by their own name (d->mem_ids), so that the namespace holds
 * the same words whichever kind of session wrote them (design §4).
 * logits0 (or NULL), for a caller that already holds row 0's decoder
 * logits: lstm_logits(m, h) at the h s holds (has_h), which a stream's
 * predict made at that h; used where the pass would make that row with the
 * same GEMV (a first block of one or two rows, keep false), so the
 * document is the same to the bit. */
typedef struct {
    const nc_model *m;
    nc_state *s;
    bool has_h;
    const nc_tokens *toks;
    nc_wordtable *words, *mem_words;
    bool keep;          /* every row's decoder logits kept in d->logits (n x V floats: for short
                         * documents, a dynamic evaluation segment) */
    bool vocab_stats;   /* p_vocab's statistics for the gate's features even for a model without
                         * a gate (fitting one, a gate sink); always with a gate */
    const float *logits0;
} nc_doc_prep;

/* Runs the model over a->toks (one LSTM pass). */
int doc_prepare(const nc_doc_prep *a, nc_doc **out, char *err, size_t errlen);

/* The caches a scoring pass reads and updates. The rows' session states
 * (component.h state_new; a stream's) end holding the document's last
 * pairs (they continue a stream); NULL: empty ones for the call. */
typedef struct {
    size_t block;                 /* positions per GEMM/search batch (0 = 64) */
    void *const *states;          /* [NC_NCOMP] each row's state (NULL where it keeps none), or NULL */
    nc_unbounded_cache *ub;               /* read when p->unbounded; NULL = none */
    bool adapt;                   /* also add the document's pairs to ub */
    /* Optional precomputed neighbours [n, p->knn] from doc_neighbours: used
     * instead of searching ub (tuning λ reuses one search for all points). */
    const float *pre_d2;
    const int *pre_words;
    /* Out, with p->gate: unbounded searches run and skipped (adaptive
     * retrieval, gate.h); with precomputed neighbours a skip drops them. */
    size_t searched, skipped;
    /* Optional: the rows' states still hold what their at_h and search_h
     * made at row 0's h (a stream's predict at this h, the states unchanged
     * since: component.h nc_at_h.memo); a row's scan may read it when row 0
     * is the first block alone: the same bits, not 2 MB of a 2,000-key
     * neural window read again (issue 36), nor the unbounded cache's coarse
     * search of that h (reused by the add of its pair) and, when the pass
     * does not adapt and the store is unchanged, its neighbours. */
    bool at_h0;
    /* Optional out, for fitting a gate: per position, the gate's raw
     * features [n, NC_GATE_NFEAT] and each component's probability of the
     * target [n, NC_NCOMP] (NAN: unavailable; rows < first all NAN). */
    double *gate_f, *gate_pc;
} nc_doc_caches;

/* Where doc_neighbours searches and what it fills. */
typedef struct {
    nc_unbounded_cache *ub;
    bool adapt;                   /* the document's own earlier pairs are in the memory: added to ub */
    size_t block;                 /* positions per search batch (0 = 64) */
    float *d2;                    /* out [n, p->knn] */
    int *words;                   /* out [n, p->knn] */
} nc_doc_knn;

/* The unbounded-cache neighbours of every position, with the same causal
 * rules as doc_score, into k->d2 and k->words; rows before d->first are
 * left as "no neighbour". */
int doc_neighbours(const nc_doc *d, const nc_cache_params *p, const nc_doc_knn *k, char *err, size_t errlen);

/* logprobs[j] = log p(token j | tokens < j, caches) for j >= first, NAN for
 * j < first; c (or NULL: the caches p switches on, empty) as above. With
 * p->gate the weights come from d->gate (NC_EINVAL if the model has none),
 * and a position whose pre-search gate predicts a small unbounded weight is
 * not searched (its pair is still added with adapt). */
int doc_score(const nc_doc *d, const nc_cache_params *p, nc_doc_caches *c, double *logprobs, char *err,
              size_t errlen);

#endif
