/* cacheopts.h -- the cache options shared by `score`, `eval` and `tune`:
 * parsing, combination checks and building the unbounded cache. */
#ifndef NC_CACHEOPTS_H
#define NC_CACHEOPTS_H

#include <getopt.h>

#include "doc.h"
#include "tokenizer.h"
#include "model.h"
#include "cache_params.h"

/* getopt codes: one per row of the core's knob table (CO_KNOB_<name>), then
 * the options of the CLI's own. */
#define CO_KNOB_CODE(name, flag, type, min, max, def, doc) CO_KNOB_##name,
enum {
    CO_FIRST = 1000,
    NC_CACHE_KNOBS(CO_KNOB_CODE)
    CO_INDEX, CO_SWITCH_AT, CO_THREADS, CO_MEMORY, CO_LAST
};
#undef CO_KNOB_CODE

/* The getopt_long table of a command: its own rows (own, up to its {NULL}
 * row), then each knob under its name with '-' (--neural-theta; a BOOL knob
 * takes no argument) and under its older alias (--theta), then the CLI's own
 * cache options (--index, --switch-at, --threads, --memory) and the ending
 * row. out must hold CACHEOPTS_MAX rows. */
#define CACHEOPTS_MAX 128
void cacheopts_options(const struct option *own, struct option *out);

/* --no-normalize: read FILEs as already written in the model's text
 * conventions (white-space split, eos per line; docs/normalisation.md). A
 * code outside [CO_FIRST, CO_LAST): not a cache option (eval --row refuses
 * it); cacheopts_options lists it and cacheopts_parse takes it (through
 * co_parse_normalize). */
#define CO_NO_NORMALIZE 999
/* 1 when code is --no-normalize (co_read_tokens then splits on white space
 * only), else 0. */
int co_parse_normalize(int code);
/* co_read_tokens prints "FILE: N tokens (...), U unknown words (x%)" on
 * stderr (default true; score prints the rate beside its perplexity). */
extern bool co_report_unk;

typedef struct {
    nc_cache_params p;
    unsigned seen[CO_LAST - CO_FIRST];  /* which options were given */
    const char *index_path;       /* --index: trained index; NULL = DIR/unbounded.faiss if present */
    long switch_at;               /* --switch-at: pairs before leaving the flat index */
    int threads;                  /* --threads: FAISS OpenMP threads (0 = default) */
    const char *memory_path;      /* --memory: text streamed into the unbounded cache first */
} cacheopts;

/* The cache options' help: the knob table's rows, then the CLI's own. */
const char *cacheopts_help(void);

/* Defaults (cacheopts_init); cacheopts_start also readies getopt_long for
 * the command's own loop over argv (from argv[1], quiet). */
void cacheopts_init(cacheopts *co);
void cacheopts_start(cacheopts *co);
/* Handles one getopt code: 1 = it was a cache option (consumed), 0 = not
 * one, -1 = bad value (message printed, prefixed with cmd). */
int cacheopts_parse(cacheopts *co, int code, const char *arg, const char *cmd);
bool cacheopts_given(const cacheopts *co, int code);
/* After parsing: rejects knobs given without their cache (--theta without
 * --neural-cache, --lambda with --global-norm, ...) and validates. 0 or 2. */
int cacheopts_finish(cacheopts *co, const char *cmd);
/* A fresh unbounded cache for model m (trained index from --index or the
 * model directory's unbounded.faiss unless --exact). */
int cacheopts_make_ub(const cacheopts *co, const nc_cache_params *p, const nc_model *m,
                      nc_wordtable *words, nc_unbounded_cache **out, char *err, size_t errlen);

/* A text to run the model over: its tokens, the start state (bos_eos: the
 * state after eos, every token scored; else the first token is context
 * only) and the open-vocabulary word table (NULL: closed vocabulary). */
typedef struct {
    const nc_model *m;
    const nc_tokens *toks;
    bool bos_eos;
    nc_wordtable *words;
} co_text;

/* Streams the text file path through the model (state after one eos, then
 * every token) and adds every pair (h_t, x_{t+1}) to ub: the memory a
 * namespace would hold after that text was fed into it. words: open
 * vocabulary table or NULL. progress: print a line on stderr now and then. */
int cacheopts_fill_memory(const nc_model *m, const char *path, nc_wordtable *words, nc_unbounded_cache *ub,
                          bool progress, char *err, size_t errlen);

/* Runs the model over x->toks from the state after one eos (x->bos_eos is
 * not read) and calls fn
 * with chunks of rows: h[i] = the h_t that predicts token ids[i] (i.e. the
 * pair (h[i], ids[i])). Chunks of at most 4096 rows, in order, one call at a
 * time, from a second thread while the LSTM runs over the next chunk (on one
 * BLAS thread meanwhile): fn must not touch what the caller's thread uses.
 * fn returns NC_OK to go on; its error (code and message) is returned. */
typedef int (*co_hidden_fn)(const float *h, const int *ids, size_t n, void *ctx, char *err, size_t errlen);
int co_hidden_pass(const co_text *x, co_hidden_fn fn, void *ctx, bool progress, char *err, size_t errlen);

/* True when any cache or open vocabulary is on (the doc_score path). */
bool cacheopts_any(const cacheopts *co);

/* Scores x through a stream of parameters p (stream_feed: how a session
 * scores; dynamic evaluation needs it, its weights changing as it goes),
 * ub adapted when given. lp[j] as doc_score's. */
int co_score_stream(const co_text *x, const nc_cache_params *p, nc_unbounded_cache *ub, double *lp, char *err,
                    size_t errlen);
/* The whole cache scoring of one file as `score` does it: open-vocabulary
 * table if asked (x->words is not read), unbounded cache (filled with
 * --memory first) with adapt, one prepared document, doc_score.
 * lp[toks->n]: NAN for context-only tokens (bos none). */
int co_score_cached(const co_text *x, const cacheopts *co, double *lp, bool progress, char *err, size_t errlen);

/* Runs gnuplot on script (a whole program, ending with the plot command).
 * NC_EIO with the reason if gnuplot is missing or fails. */
int co_gnuplot(const char *script, char *err, size_t errlen);

/* Usage errors, one line on stderr: "neurocache CMD: MESSAGE; see
 * 'neurocache CMD --help'" (not the whole help, which would bury it).
 * Returns 2, the usage error's exit status. */
int co_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* getopt_long's complaint about argv[optind - 1] as a usage error: code
 * ':' (the option needs a value) or anything else (unknown, or an
 * ambiguous prefix), with the nearest option of opts (a knob's alias
 * answers with its name): "unknown option '--neural-sise' (did you mean
 * '--neural-size'?)". Returns 2. */
int co_bad_option(const char *cmd, const struct option *opts, int code, char **argv);
/* The name of opts' option nearest to arg ("--neural-sise=5" -> "neural-size"), or NULL. */
const char *co_suggest_option(const struct option *opts, const char *arg);

/* Helpers for the tools: strict number parsing; comma lists. */
bool co_parse_int(const char *s, long lo, long hi, long *out);
bool co_parse_float(const char *s, double lo, double hi, double *out);
/* Parses "a,b,c" into out (malloc'ed); returns count, -1 on a bad item. */
int co_parse_list(const char *s, double **out);
double co_now(void);
/* Brackets the unbounded cache's searches: with --threads > 1 (FAISS on
 * that many OpenMP threads) OpenBLAS runs on one thread until co_search_end,
 * for the two pools spin-wait on each other's cores otherwise (1M stored
 * states: 2,181 tokens/s with both on two threads, 3,981 with FAISS on two
 * and OpenBLAS on one; BENCHMARKS.md). Returns what co_search_end restores. */
int co_search_begin(const cacheopts *co);
void co_search_end(int saved);

/* CPU seconds used by the process so far (all threads). */
double co_cpu(void);

/* Reads a text file ('-' = stdin) and tokenises it (file semantics: a last
 * line without newline also ends with eos), normalised to the model's text
 * conventions unless --no-normalize was given. */
int co_read_tokens(const nc_model *m, const char *path, nc_tokens *out, char *err, size_t errlen);
/* Prepares a document of x (the LSTM pass). */
int co_prepare(const co_text *x, nc_doc **out, char *err, size_t errlen);
/* The same; vocab_stats: keep p_vocab's statistics for the gate's features
 * (co_prepare does when the model has a gate; fit-gate needs them before). */
int co_prepare_ex(const co_text *x, bool vocab_stats, nc_doc **out, char *err, size_t errlen);
/* Perplexity of the scored entries (NAN entries skipped); *n gets their count. */
double co_ppl(const double *lp, size_t len, size_t *n);
/* Tokens of t that are the model's unk, and their share of t in percent
 * (eos included in the denominator, as perplexity counts it): the figure
 * printed beside every perplexity, for <unk>-heavy text flatters it. */
double co_unk_rate(const nc_model *m, const nc_tokens *t, size_t *unk);

#endif
