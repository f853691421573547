/* generate.h -- text generation on a stream, shared by /v1/completions and
 * POST /v1/sessions/{id}/generate: drawing the next word (greedy, or
 * sampled with temperature and nucleus), what may be drawn (never
 * unk_token unless asked), and the stop sequences with the pieces of text
 * that may be sent before the generation ends. */
#ifndef NC_SERVER_GENERATE_H
#define NC_SERVER_GENERATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "mixture.h"
#include "proto.h"
#include "strbuf.h"
#include "rng.h"
#include "stream.h"
#include "workguard.h"

#define GEN_MAX_STOP 16

typedef struct {
    double temperature;           /* 0 = greedy */
    double top_p;                 /* nucleus mass, (0, 1] */
    long logprobs;                /* alternatives per token in "top", -1 = none */
    bool allow_unk;               /* unk_token may be drawn */
    const char *stop[GEN_MAX_STOP];     /* borrowed */
    size_t stop_len[GEN_MAX_STOP];
    size_t n_stop;
} gen_params;

/* The distribution generation draws from: the stream's next-word
 * distribution with unk_token's probability removed and the rest
 * renormalised (unless allow_unk): unk_token stands for every word the
 * model does not know, and writing it as a word is never what a reader
 * wants. Reported logprobs of generated tokens are under this
 * distribution. */
typedef struct {
    nc_stream *st;                /* borrowed: advanced by every word drawn */
    const nc_model *m;
    gen_params p;
    nc_rng *rng;
    nc_dist d;
    int *order;                   /* scratch of d.n */
    size_t order_cap;
} gen_state;

/* One word drawn. */
typedef struct {
    int id;                       /* the stream's id (>= V: an open-vocabulary word) */
    const char *word;             /* its surface string (the stream's; valid while it lives) */
    bool eos;                     /* eos_token: rendered as a newline */
    double logprob;
    json_t *top;                  /* owned: {word: logprob} of the p.logprobs likeliest, NULL if none asked */
} gen_token;

/* A request's sampling settings (the stop sequences borrowed, at most
 * GEN_MAX_STOP). */
typedef struct {
    double temperature, top_p;
    long logprobs;
    bool allow_unk;
    const char *const *stop;
    const size_t *stop_len;
    size_t n_stop;
    bool has_seed;
    long long seed;
} gen_request;

/* The gen_request of a decoded request r (proto_completions_req,
 * proto_generate_req: the same field names). */
#define GEN_REQUEST_OF(r)                                                                                  \
    ((gen_request){(r).temperature, (r).top_p, (r).logprobs, (r).allow_unk, (r).stop, (r).stop_len, (r).n_stop, \
                   (r).has_seed, (r).seed})

/* A request's sampling settings into *gp and rng seeded with its seed, or
 * without one from the system's entropy (the clock if that fails). */
void gen_setup(gen_params *gp, nc_rng *rng, const gen_request *rq);

void gen_init(gen_state *g, nc_stream *st, const nc_model *m, const gen_params *p, nc_rng *rng);
void gen_free(gen_state *g);
/* Draws the next word from the stream and feeds it (the LSTM and the local
 * caches; never a namespace's unbounded cache). NC_OK or an rc with err. */
int gen_next(gen_state *g, gen_token *out, char *err, size_t errlen);

/* The top-n entry {word: logprob} of a distribution (new reference). idx:
 * scratch of d->n ints. */
json_t *gen_top_json(nc_stream *st, const nc_dist *d, int n, int *idx);

/* Feeds t into st in slices of WORKGUARD_SLICE tokens, checking g between
 * them; lp (may be NULL) gets each token's logprob. *why = the stop seen
 * (WG_RUN: none). */
int gen_feed(nc_stream *st, workguard *g, const nc_tokens *t, double *lp, wg_stop *why, char *err,
             size_t errlen);

/* ---- stop sequences and the text that may be sent ---------------------
 * The generated text grows word by word in a buffer; a piece may be sent
 * once no stop sequence can still begin inside it. gen_text tracks the
 * words drawn but not yet sent. */
typedef struct {
    size_t start, end;            /* the word's bytes in the text (start: after its separator) */
    int id;
    const char *word;
    bool eos;
    double logprob;
    json_t *top;                  /* owned */
} gen_word;

typedef struct {
    strbuf text;                  /* prompt text + generated words */
    size_t from;                  /* where the generated text starts (stops are searched from here) */
    size_t sent;                  /* bytes of text already handed out */
    gen_word *pend;               /* drawn, not handed out */
    size_t npend, cap;
    bool stopped;                 /* a stop sequence ended the text at text.len */
} gen_text;

/* Starts with the prompt's text (generated words follow it, a space
 * between unless it ends in white space). sent = from = its length. */
int gen_text_init(gen_text *gt, const char *prompt, size_t len);
void gen_text_free(gen_text *gt);
/* Adds a drawn word (its top is taken over). Then: if a stop sequence is
 * complete, the text is cut where it starts, the words starting at or after
 * the cut are dropped and stopped is set. */
int gen_text_add(gen_text *gt, const gen_token *t, const gen_params *p);
/* How many pending words may be handed out now (all when final or
 * stopped; otherwise those ending before any unfinished stop sequence
 * could start), and *end = the text offset the piece reaches. */
size_t gen_text_ready(const gen_text *gt, const gen_params *p, bool final, size_t *end);
/* Forgets the first n pending words and marks text up to end as sent. */
void gen_text_consume(gen_text *gt, size_t n, size_t end);

#endif
