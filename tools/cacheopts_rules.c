/* cacheopts_rules.c -- the cache options' combination rules, checked once
 * the command line is read (cacheopts_finish): a knob given without the
 * knob it needs (the knob table's "needs" column, core/knobs/cache_knobs.h), the
 * CLI's own options that need the unbounded cache, the two contradictions,
 * then the settings' validation (cache_params_validate). */
#include "cacheopts.h"

#include <stdio.h>
#include <string.h>

#include "unbounded_cache.h"

/* The CLI's own options that need a knob: they shape the unbounded cache
 * cacheopts_make_ub builds (cache_scoring.c). */
static const struct {
    int code;
    const char *needs;
} own_needs[] = {{CO_INDEX, "unbounded"}, {CO_SWITCH_AT, "unbounded"}, {CO_MEMORY, "unbounded"}};

/* The one hint a needs message carries: --lambda was the neural cache's
 * option before the knobs took their names, and it is the one a user of
 * the unbounded cache reaches for. */
static const char *needs_hint(int code)
{
    return code == CO_KNOB_neural_lambda ? " (for the unbounded cache use --unbounded-lambda)" : "";
}

/* Option code, given, needs the knob need, not given: "--neural-theta
 * needs --neural-size N" (what the needed option takes: N for a size, a
 * value X, nothing for a switch). 2, or 0 when need was given. */
static int check_needs(const cacheopts *co, int code, const nc_cache_knob *need, const char *cmd)
{
    if (!cacheopts_given(co, code) || cacheopts_given(co, cacheopts_knob_code(need)))
        return 0;
    fprintf(stderr, "neurocache %s: --%s needs --%s%s%s\n", cmd, cacheopts_option_name(code), need->flag,
            need->type == NC_KNOB_BOOL ? "" : need->type == NC_KNOB_INT ? " N" : " X", needs_hint(code));
    return 2;
}

int cacheopts_finish(cacheopts *co, const char *cmd)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++)
        if (k[i].needs && check_needs(co, cacheopts_knob_code(&k[i]), k[i].needs, cmd))
            return 2;
    for (size_t i = 0; i < sizeof own_needs / sizeof *own_needs; i++)
        if (check_needs(co, own_needs[i].code, cache_knob_find(own_needs[i].needs), cmd))
            return 2;
    if (cacheopts_given(co, CO_KNOB_neural_lambda) && co->p.global_norm) {
        fprintf(stderr, "neurocache %s: --neural-lambda is for linear interpolation; with --global-norm use --neural-alpha\n",
                cmd);
        return 2;
    }
    if (cacheopts_given(co, CO_KNOB_exact) && cacheopts_given(co, CO_INDEX)) {
        fprintf(stderr, "neurocache %s: --exact and --index contradict each other\n", cmd);
        return 2;
    }
    char err[NC_ERRLEN];
    if (cache_params_validate(&co->p, err, sizeof err) != NC_OK) {
        fprintf(stderr, "neurocache %s: %s\n", cmd, err);
        return 2;
    }
    /* One FAISS thread unless asked: searches come in blocks of 64 queries,
     * where OpenMP's fork/join costs more than it saves, and with the cores
     * busy (a training run, the other scorer) its spin-waiting threads made
     * `score --unbounded` 60x slower (170 vs 9,900 tokens/s, BENCHMARKS.md). */
    unbounded_cache_set_threads(co->threads > 0 ? co->threads : 1);
    return 0;
}
