/* cacheopts.h -- the cache options shared by `score`, `eval` and `tune`:
 * their getopt table, help and parsing (cacheopts.c), their combination
 * rules (cacheopts_rules.c), the usage errors, and strict number and list
 * parsing for the commands' own options. The texts the commands read are
 * texts.h, scoring with the caches cache_scoring.h, the hidden-state
 * pipeline hidden_pass.h, clocks and plots report.h. */
#ifndef NC_CACHEOPTS_H
#define NC_CACHEOPTS_H

#include <getopt.h>
#include <stdbool.h>

#include "cache_params.h"

/* getopt codes: one per row of the core's knob table (CO_KNOB_<name>), then
 * the options of the CLI's own. */
#define CO_KNOB_CODE(name, flag, type, min, max, def, needs, doc) CO_KNOB_##name,
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
 * conventions (texts.h co_parse_normalize). A code outside [CO_FIRST,
 * CO_LAST): not a cache option (eval --row refuses it); cacheopts_options
 * lists it and cacheopts_parse takes it. */
#define CO_NO_NORMALIZE 999

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
/* After parsing: rejects knobs given without the knob they need (the knob
 * table's needs: --theta without --neural-size), --lambda with
 * --global-norm, --exact with --index, and validates. 0 or 2. */
int cacheopts_finish(cacheopts *co, const char *cmd);
/* The knob of a getopt code (CO_KNOB_<name>), NULL for the CLI's own
 * options; and a knob's code. */
const nc_cache_knob *cacheopts_knob(int code);
int cacheopts_knob_code(const nc_cache_knob *k);
/* A cache option's name by its getopt code: the knob's flag (neural-size)
 * or the CLI's own option's (memory); "?" for another code. */
const char *cacheopts_option_name(int code);

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

/* Strict number parsing and comma lists, for the commands' own options. */
bool co_parse_int(const char *s, long lo, long hi, long *out);
bool co_parse_float(const char *s, double lo, double hi, double *out);
/* Parses "a,b,c" into out (malloc'ed); returns count, -1 on a bad item. */
int co_parse_list(const char *s, double **out);
#endif
