/* apiutil.h -- what the API's handlers share: the session a path names, the token budget, JSON
 * log-probabilities, top-k selection, detokenised text and the model's name. No handler lives here. */
#ifndef NC_SERVER_APIUTIL_H
#define NC_SERVER_APIUTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "http.h"
#include "strbuf.h"
#include "sessions.h"

/* The session a request names (req->params[0]), held (release with
 * sessions_release); pulled from the peers if it is not here (migrate.h).
 * NULL when nobody holds it, answered 404 session_not_here, 503
 * session_moved or 404 session_not_found. */
nc_session *api_session_acquire(nc_server *srv, http_request *req, http_response *resp);

/* Locks s->lock for a request; if the session was handed over while the
 * request waited (or the replica drains), unlocks, answers 503
 * session_moved, if it was deleted, 404 session_not_found, and if it reads
 * the unbounded cache of a namespace incarnation deleted since, 410
 * namespace_deleted (api_session_namespace_check), and returns -1 (the
 * caller still releases s). */
int api_session_lock(nc_server *srv, nc_session *s, http_response *resp);
/* The same checks on s already locked (a batch job's session): 0, or
 * answers as api_session_lock and returns -1 with s still locked. */
int api_session_live(nc_server *srv, nc_session *s, http_response *resp);

/* s locked: 0 if s may go on, or answers 410 namespace_deleted and
 * returns -1 when the namespace incarnation s is bound to was deleted and
 * the request needs it -- it adapts (adapt), or s's stream reads the
 * namespace's unbounded cache. */
int api_session_namespace_check(nc_session *s, bool adapt, http_response *resp);

/* At least the number of tokens tokenize() gives for text[0..len) without
 * normalisation: it splits on Unicode white space (a superset of ASCII's)
 * and appends eos at each '\n'. A byte scan, so that an oversized text is
 * refused before it is tokenised. normalized: the model's conventions apply
 * (they may drop punctuation and newlines), so only words holding an ASCII
 * letter or digit count (each gives at least one token). */
size_t api_tokens_at_least(const char *text, size_t len, bool normalized);

/* n LSTM steps against max_tokens_per_request: 0, or answers 413
 * too_many_tokens and returns -1. */
int api_over_token_budget(nc_server *srv, size_t n, http_response *resp);

/* Dynamic evaluation asked for (p->dyn_lr > 0) on a model without its
 * gradient statistics: answers 400 dyneval_unavailable naming dyn-stats
 * and returns -1; else 0. */
int api_dyneval_check(nc_server *srv, const nc_cache_params *p, http_response *resp);

/* Tokenises text (normalised to the model's text conventions unless
 * normalize is false: the request's "normalize") and enforces
 * max_tokens_per_request; on failure answers and returns -1 (t is cleared
 * either way by the caller). */
int api_tokenize(nc_server *srv, const char *text, size_t len, bool final_eos, bool normalize, nc_tokens *t,
                 http_response *resp);

/* Offsets as clients count them: in characters (Unicode code points), as
 * OpenAI's text_offset and Python's str do (JavaScript's strings count
 * UTF-16 units: docs/api.md). A walk through valid UTF-8 text s[0..len):
 * api_char_offset gives the code points before byte b, in O(text) for
 * offsets asked in increasing order (a smaller one starts over). The text
 * may move between calls (a growing buffer): s is passed each time. */
typedef struct {
    size_t byte, chars;           /* s[0..byte) holds chars code points */
} api_charpos;

size_t api_char_offset(api_charpos *c, const char *s, size_t len, size_t b);
/* Code points in s[0..n) (valid UTF-8). */
size_t api_char_count(const char *s, size_t n);

/* Adds to the answer o what a client needs to see unknown words and find
 * each token in the text it sent: "unk_count" (tokens that are the model's
 * unk), and with listed (the answer lists the tokens) "unk" (a flag per
 * token), "offsets" and "lengths" (in characters of text[0..len), the
 * text the client sent, that each token came from: a normalised word
 * points at the user's characters). */
void api_token_info(json_t *o, const nc_model *m, const nc_tokens *t, const char *text, size_t len, bool listed);

/* The model's text conventions (config.json's "text", normalize.h) as a
 * JSON object, or null when it declares none (white-space split). New
 * reference. */
json_t *api_text_conventions(const nc_model *m);

/* proto_logprob (proto.h), as the handlers name it. New reference. */
json_t *api_logprob(double lp);

/* dist_top_k (dist.h), as the handlers name it. */
size_t api_top_k(const float *p, size_t n, size_t k, int *out);

/* The id token i of t has in st's distributions: its vocabulary id, or,
 * for an out-of-vocabulary word with open vocabulary, the cache's own id
 * (-1 while the word is new: only the uniform term gives it mass). */
int api_stream_token_id(nc_stream *st, const nc_model *m, const nc_tokens *t, size_t i);

/* Feeds token i of t alone into st (stream_feed: the target-only path,
 * whose log-probability agrees with the full distribution's, design §4);
 * *lp its log-probability. */
int api_stream_feed_one(nc_stream *st, const nc_tokens *t, size_t i, double *lp, char *err, size_t errlen);

/* The model's name: the last component of its directory (thread-local
 * buffer, valid until the thread's next call). */
const char *api_model_name(nc_server *srv);

#endif
