/* cache_scoring.h -- scoring a text with the caches on (cache_scoring.c):
 * the unbounded cache of the options, --memory, one stream's or one
 * document's pass, and the searches' threads. */
#ifndef NC_CACHE_SCORING_H
#define NC_CACHE_SCORING_H

#include <stdbool.h>
#include <stddef.h>

#include "cacheopts.h"
#include "texts.h"
#include "unbounded_cache.h"

/* What the options' unbounded cache is built for: the options (--index,
 * --switch-at, --memory), the settings it serves (exact, nprobe: the
 * command's or one row's), the model, the open-vocabulary table (or NULL),
 * and whether --memory's streaming prints its progress on stderr. */
typedef struct {
    const cacheopts *co;
    const nc_cache_params *p;
    const nc_model *m;
    nc_wordtable *words;
    bool progress;
} co_ub_spec;

/* A fresh unbounded cache for s->m (trained index from --index or the
 * model directory's unbounded.faiss unless exact) holding --memory's text
 * when given: every pair (h_t, x_{t+1}) of it streamed through the model
 * from the state after one eos -- the memory a namespace would hold after
 * that text was fed into it. */
int cacheopts_make_ub(const co_ub_spec *s, nc_unbounded_cache **out, char *err, size_t errlen);

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

/* Brackets the unbounded cache's searches: with --threads > 1 (FAISS on
 * that many OpenMP threads) OpenBLAS runs on one thread until co_search_end,
 * for the two pools spin-wait on each other's cores otherwise (1M stored
 * states: 2,181 tokens/s with both on two threads, 3,981 with FAISS on two
 * and OpenBLAS on one; BENCHMARKS.md). Returns what co_search_end restores. */
int co_search_begin(const cacheopts *co);
void co_search_end(int saved);

#endif
