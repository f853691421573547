/* cache_scoring.c -- scoring a text with the caches on, as `score`, `eval`,
 * `tune` and `fit-gate` share it (cache_scoring.h): the unbounded cache
 * built and filled with --memory, a stream's pass (dynamic evaluation) or
 * a prepared document's doc_score, and the thread bracketing of the
 * searches. */
#include "cache_scoring.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "components.h"
#include "hidden_pass.h"
#include "stream.h"

int co_search_begin(const cacheopts *co)
{
    int saved = openblas_get_num_threads();
    if (co->threads > 1)
        openblas_set_num_threads(1);
    return saved;
}

void co_search_end(int saved)
{
    openblas_set_num_threads(saved);
}

static int add_to_ub(const float *h, const int *ids, size_t n, void *ctx, char *err, size_t errlen)
{
    return unbounded_cache_add(ctx, h, ids, n, NULL, err, errlen);
}

/* --memory's text streamed into ub: every pair (h_t, x_{t+1}) of it, from
 * the state after one eos. */
static int fill_memory(const co_ub_spec *s, nc_unbounded_cache *ub, char *err, size_t errlen)
{
    const char *path = s->co->memory_path;
    nc_tokens t;
    tokens_init(&t);
    int rc = co_read_tokens(s->m, path, &t, err, errlen);
    if (!rc && s->progress)
        fprintf(stderr, "memory: streaming %zu tokens of %s into the unbounded cache\n", t.n, path);
    if (!rc)
        rc = co_hidden_pass(&(co_text){.m = s->m, .toks = &t, .words = s->words}, add_to_ub, ub, s->progress, err,
                            errlen);
    tokens_clear(&t);
    return rc;
}

int cacheopts_make_ub(const co_ub_spec *s, nc_unbounded_cache **out, char *err, size_t errlen)
{
    const cacheopts *co = s->co;
    const nc_cache_params *p = s->p;
    const nc_model *m = s->m;
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, m->cfg.hidden_size);
    char path[1200];
    o.exact = p->exact;
    if (!p->exact) {
        if (co->index_path) {
            o.trained_path = co->index_path;
        } else {
            snprintf(path, sizeof path, "%s/unbounded.faiss", m->dir);
            if (m->dir[0] && access(path, R_OK) == 0)
                o.trained_path = path;
        }
    }
    if (co->switch_at > 0)
        o.switch_at = co->switch_at;
    o.nprobe = p->nprobe;
    /* the daemon's lifecycle (unbounded_cache.h): the cache trains its own
     * index at --switch-at and as it grows -- in the adding thread, so that
     * a run's numbers never depend on timing; --index FILE asks for that
     * training instead */
    o.own_training = !co->index_path;
    o.train_sync = true;
    int rc = unbounded_cache_new(&o, s->words, out, err, errlen);
    if (!rc && co->memory_path)
        rc = fill_memory(s, *out, err, errlen);
    return rc;
}

/* A mixture row past the model's on (component.h on), or what changes the
 * model's own term: global normalisation (a cache inside it, model_term.c),
 * the open vocabulary's ids, dynamic evaluation. */
bool cacheopts_any(const cacheopts *co)
{
    const nc_cache_params *p = &co->p;
    return (components_on(p) & ~(1u << NC_COMP_MODEL)) != 0 || p->global_norm || p->open_vocab ||
           p->dyn_lr > 0.0f;
}

int co_score_stream(const co_text *x, const nc_cache_params *p, nc_unbounded_cache *ub, double *lp, char *err,
                    size_t errlen)
{
    nc_stream *s = NULL;
    int rc = stream_new(x->m, p, ub, x->words, x->bos_eos, &s, err, errlen);
    if (!rc)
        rc = stream_feed(s, x->toks, ub != NULL, lp, err, errlen);
    stream_free(s);
    return rc;
}

int co_score_cached(const co_text *x, const cacheopts *co, double *lp, bool progress, char *err, size_t errlen)
{
    const nc_model *m = x->m;
    nc_wordtable *words = NULL;
    nc_unbounded_cache *ub = NULL;
    nc_doc *d = NULL;
    int rc = NC_OK;
    if (co->p.open_vocab)
        rc = wordtable_new(m->vocab, &words, err, errlen);
    if (!rc && co->p.unbounded)
        rc = cacheopts_make_ub(&(co_ub_spec){co, &co->p, m, words, progress}, &ub, err, errlen);
    if (!rc && co->p.dyn_lr > 0.0f) {
        int blas = co_search_begin(co);
        rc = co_score_stream(&(co_text){m, x->toks, x->bos_eos, words}, &co->p, ub, lp, err, errlen);
        co_search_end(blas);
    } else if (!rc) {
        rc = co_prepare(&(co_text){m, x->toks, x->bos_eos, words}, &d, err, errlen);
    }
    if (!rc && d) {
        nc_doc_caches dc = {.ub = ub, .adapt = ub != NULL};
        int blas = co_search_begin(co);
        rc = doc_score(d, &co->p, &dc, lp, err, errlen);
        co_search_end(blas);
        if (!rc && progress && dc.searched + dc.skipped > 0)
            fprintf(stderr, "gate: %zu of %zu unbounded searches skipped (%.1f%%)\n", dc.skipped,
                    dc.searched + dc.skipped, 100.0 * (double)dc.skipped / (double)(dc.searched + dc.skipped));
    }
    if (!rc && ub && progress)
        fprintf(stderr, "unbounded cache: %lld pairs, %s index\n", (long long)unbounded_cache_count(ub),
                unbounded_cache_is_exact(ub) ? "exact (flat)" : "IVF");
    doc_free(d);
    unbounded_cache_free(ub);
    wordtable_free(words);
    return rc;
}
