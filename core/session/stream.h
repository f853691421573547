/* stream.h -- the per-stream predictor (one session): LSTM state, local
 * caches (unigram window, neural ring buffer) and an optional namespace
 * unbounded cache. Design §3: p(· | h_t, caches) predicts x_{t+1}, then
 * (h_t, x_{t+1}) enters the caches and the LSTM steps with x_{t+1}.
 *
 * Not thread-safe: callers serialise requests on one stream (the unbounded
 * cache and word table it points to are thread-safe and may be shared). */
#ifndef NC_STREAM_H
#define NC_STREAM_H

#include "cache_params.h"
#include "component.h"
#include "dist.h"
#include "model.h"
#include "tokenizer.h"
#include "unbounded_cache.h"
#include "wordtable.h"

typedef struct nc_stream nc_stream;

/* New stream on model m (borrowed, must outlive it) with params p (copied).
 * ub: the namespace's unbounded cache (borrowed) or NULL. words: the word
 * table for open vocabulary (borrowed); NULL = ub's table if any, else the
 * stream owns a private one (when p->open_vocab). bos: start from the zero
 * state advanced by eos (design §3); false = zero state, the first token fed
 * is context only. */
int stream_new(const nc_model *m, const nc_cache_params *p, nc_unbounded_cache *ub,
               nc_wordtable *words, bool bos, nc_stream **out, char *err, size_t errlen);
void stream_free(nc_stream *s);  /* NULL allowed */

/* Back to the start state (as stream_new with bos), caches emptied. */
void stream_reset(nc_stream *s, bool bos);

/* New parameters; windows resized keep their newest pairs. Turning on
 * unbounded on a stream created without it, or changing open_vocab either
 * way (the windows hold words in the mode they were fed), is NC_ESTATE. */
int stream_set_params(nc_stream *s, const nc_cache_params *p, char *err, size_t errlen);
const nc_cache_params *stream_params(const nc_stream *s);

/* Feeds tokens: for each, scores it (if logprobs != NULL: logprobs[i] =
 * log p(token i | everything before), NAN if the stream had no h yet), adds
 * the pair to the local caches and, if adapt and the stream has an unbounded
 * cache, to it, then advances the LSTM. Batched like doc_score; the result
 * does not depend on how the tokens are split across calls. */
int stream_feed(nc_stream *s, const nc_tokens *toks, bool adapt, double *logprobs,
                char *err, size_t errlen);

/* From now on each token stream_feed scores writes the gate's data of it
 * (doc.h's nc_doc_caches.gate_f/gate_pc: its features, each component's
 * probability) into row (position - the position now) of f [n, NC_GATE_NFEAT]
 * and pc [n, NC_NCOMP], which the caller sizes for what it feeds: fit-gate
 * fitting on the adapted model's predictions. NULL: off. */
void stream_gate_sink(nc_stream *s, double *f, double *pc);

/* The full next-word distribution over [0, n) with n = V + open-vocabulary
 * words known to the stream's table (closed vocabulary: n = V); shares: each
 * component's part too. Does not change the stream. NC_ESTATE if the stream
 * has no h yet (bos false and nothing fed). */
int stream_predict(nc_stream *s, bool shares, nc_dist *out, char *err, size_t errlen);
/* The decoder input h_t (top layer output, [H]; valid until the stream
 * changes), or NULL if the stream has no h yet. */
const float *stream_h(const nc_stream *s);
/* The weights the stream predicts with: its model, or while dynamic
 * evaluation holds adapted weights (dyneval.h), a model sharing the
 * trained tensors with its own copies of the adapted ones (valid until the
 * stream is fed, reset, given new parameters or freed). */
const nc_model *stream_model(const nc_stream *s);
/* stream_predict with the decoder logits W h_t + b ([V]) already computed by
 * the caller from stream_model's decoder, so that a server can batch the
 * decoder products of many streams into one pass (lstm_logits_rows). */
int stream_predict_logits(nc_stream *s, const float *logits, bool shares, nc_dist *out, char *err,
                          size_t errlen);

/* The memo of the model's output at the stream's h (stream.c): the
 * decoder logits a predict made (NULL when none, or the memo is off), which
 * a caller batching predicts uses instead of making that row again. */
const float *stream_memo_logits(const nc_stream *s);
/* logits = lstm_logits(stream_model(s), stream_h(s)), made by the caller
 * (this row of a batch's lstm_logits_rows, the same bits -- not a GEMM's
 * row, whose sums round otherwise): kept as the memo, for the next feed's
 * score at h. */
void stream_keep_logits(nc_stream *s, const float *logits);
/* Process-wide, for tests and measurements: off, nothing is memoised
 * (answers are the same to the bit either way). stream_memo_reads counts
 * the memo's uses since the process started. */
void stream_memo_disable(bool off);
uint64_t stream_memo_reads(void);

/* Explain of the next-word distribution at the stream's h (NC_ESTATE
 * without one): for each of the k words ids[q], into out[q * NC_EXPLAIN_ROWS
 * * per_source ...] and counts[q], the pairs that give it weight > 0 -- the
 * rows' explain in the table's order (component.h: the neural window's,
 * then the unbounded cache's neighbours), each row's heaviest first and at
 * most per_source of them. The unbounded cache is
 * searched as predict searches it, also where the gate would skip the
 * search (explain says where the mass would come from). With global
 * normalisation the neural weights share eq. 4's normaliser, so the decoder
 * product is recomputed. Does not change the stream's state. */
int stream_explain(nc_stream *s, const int *ids, size_t k, int per_source, nc_explain_entry *out, int *counts,
                   char *err, size_t errlen);

/* Open vocabulary: the id the stream's word table gives word[0..len) (a
 * model id, or >= V for a word remembered under its own name), -1 when the
 * table has no such word or the stream has no table. */
int stream_word_id(nc_stream *s, const char *word, size_t len);
/* How the stream reads its unbounded cache's word ids: NC_UB_OPEN in open
 * vocabulary, else the model's unk id (unbounded_cache.h). */
int stream_ub_reader(const nc_stream *s);
/* Surface string of id (model or open-vocabulary word), NULL if unknown. */
const char *stream_word(nc_stream *s, int id);
int64_t stream_position(const nc_stream *s);      /* tokens fed since start */
bool stream_has_h(const nc_stream *s);
size_t stream_memory(const nc_stream *s);         /* bytes owned by the stream */
nc_unbounded_cache *stream_unbounded_cache(const nc_stream *s);

/* N-best rescoring: scores each of the n continuations conts[i] from the
 * stream's current state as if it alone were fed (stream_feed with
 * logprobs: its own earlier tokens in the local caches, its new
 * open-vocabulary words counted in |V_full|, the unbounded cache read, never
 * adapted), and leaves the stream exactly as it was: LSTM state, caches and
 * word table unchanged, bit for bit. logprobs[i][j] = log p(token j of
 * continuation i | state, tokens < j of it), NAN where the stream had no h
 * yet (first token, bos none).
 *
 * Cheaper than n copies of the stream fed one by one: each continuation
 * starts from a copy of the LSTM state only (L x 2H floats); the caches are
 * used in place -- the few ring slots a continuation writes are saved and
 * put back after it, instead of copying the windows -- and the decoder
 * products of all the continuations' positions run as one series of GEMMs
 * (the cost that dominates: V x H per token). */
int stream_rescore(nc_stream *s, const nc_tokens *conts, size_t n, double **logprobs, char *err,
                   size_t errlen);

/* Deep copy (shares m, ub and a borrowed word table). */
int stream_clone(const nc_stream *s, nc_stream **out, char *err, size_t errlen);
/* Serialisation: a self-contained little-endian blob (params, LSTM state,
 * windows; open-vocabulary words by surface string so the blob can move to
 * another replica). *blob is malloc'ed: free() it. import validates
 * everything (NC_EFORMAT on a bad blob) and binds the stream to m, ub, words
 * as stream_new does. The blob's version ("NCSTRM04") is the one this build
 * writes; import reads 1 to it and refuses a newer one naming both versions
 * (docs/operations.md#compatibility). */
#define STREAM_BLOB_VERSION 4
int stream_export(const nc_stream *s, void **blob, size_t *len, char *err, size_t errlen);
int stream_import(const nc_model *m, nc_unbounded_cache *ub, nc_wordtable *words, const void *blob,
                  size_t len, nc_stream **out, char *err, size_t errlen);

#endif
