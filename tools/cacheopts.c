/* cacheopts.c -- the cache options shared by `score`, `eval` and `tune`
 * (cacheopts.h): their getopt table and help, built from the knob table
 * (core/knobs/cache_knobs.h) and the CLI's own few; parsing them, the usage
 * errors and the nearest option to a misspelt one; strict number and list
 * parsing for the commands' own options. Which options need which is
 * cacheopts_rules.c. */
#include "cacheopts.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suggest.h"
#include "texts.h"

static char help_text[6144];

/* The CLI's own cache options, after the knobs (codes CO_INDEX...). */
static const struct option own_cache_opts[] = {
    {"index", required_argument, NULL, CO_INDEX},
    {"switch-at", required_argument, NULL, CO_SWITCH_AT},
    {"threads", required_argument, NULL, CO_THREADS},
    {"memory", required_argument, NULL, CO_MEMORY},
    {"no-normalize", no_argument, NULL, CO_NO_NORMALIZE},
};

const char *cacheopts_option_name(int code)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    if (code > CO_FIRST && code - CO_FIRST - 1 < (int)n)
        return k[code - CO_FIRST - 1].flag;
    for (size_t i = 0; i < sizeof own_cache_opts / sizeof *own_cache_opts; i++)
        if (own_cache_opts[i].val == code)
            return own_cache_opts[i].name;
    return "?";
}

const nc_cache_knob *cacheopts_knob(int code)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    return code > CO_FIRST && code - CO_FIRST - 1 < (int)n ? &k[code - CO_FIRST - 1] : NULL;
}

int cacheopts_knob_code(const nc_cache_knob *k)
{
    const nc_cache_knob *first = cache_knobs(NULL);
    NC_ASSERT(k, "cacheopts_knob_code: no k");
    return CO_FIRST + 1 + (int)(k - first);
}

void cacheopts_options(const struct option *own, struct option *out)
{
    size_t o = 0, n, rows = 0, aliases = 0;
    const nc_cache_knob *k = cache_knobs(&n);
    while (own && own[rows].name)
        rows++;
    for (size_t i = 0; i < n; i++)
        aliases += k[i].alias != NULL;
    if (rows + n + aliases + sizeof own_cache_opts / sizeof *own_cache_opts + 1 > CACHEOPTS_MAX)
        abort();   /* a command with more options than the table holds: a programming error */
    for (; o < rows; o++)
        out[o] = own[o];
    for (size_t i = 0; i < n; i++) {
        int has_arg = k[i].type == NC_KNOB_BOOL ? no_argument : required_argument;
        out[o++] = (struct option){k[i].flag, has_arg, NULL, CO_FIRST + 1 + (int)i};
        if (k[i].alias)
            out[o++] = (struct option){k[i].alias, has_arg, NULL, CO_FIRST + 1 + (int)i};
    }
    for (size_t i = 0; i < sizeof own_cache_opts / sizeof *own_cache_opts; i++)
        out[o++] = own_cache_opts[i];
    out[o] = (struct option){NULL, 0, NULL, 0};
}

static void build_help(void)
{
    size_t n, o = 0;
    const nc_cache_knob *k = cache_knobs(&n);
#define ADD(...) do { if (o < sizeof help_text) o += (size_t)snprintf(help_text + o, sizeof help_text - o, __VA_ARGS__); } while (0)
    ADD("cache options (all off by default; design §4; each is the JSON/config knob\n"
        "of the same name with '-' for '_'; older names in brackets still work):\n");
    for (size_t i = 0; i < n; i++) {
        char opt[64];
        snprintf(opt, sizeof opt, "--%s%s", k[i].flag,
                 k[i].type == NC_KNOB_BOOL ? "" : k[i].type == NC_KNOB_INT ? " N" : k[i].type == NC_KNOB_KERNEL ? " K" : " X");
        ADD("  %-22s %s", opt, k[i].doc);
        if (k[i].type == NC_KNOB_INT || k[i].type == NC_KNOB_FLOAT)
            ADD(" [%g, %g]", k[i].min, k[i].max);
        if (k[i].type != NC_KNOB_BOOL)
            ADD(" (default %s)", k[i].def);
        if (k[i].alias)
            ADD(" [--%s]", k[i].alias);
        ADD("\n");
    }
    ADD("  --index FILE           trained index (default: the model's unbounded.faiss if present)\n"
        "  --switch-at N          pairs kept in the exact index before switching (default 65536)\n"
        "  --threads N            threads of the unbounded cache's searches (FAISS OpenMP;\n"
        "                         OpenBLAS runs on one meanwhile; default 1; 2 on an idle 2-core machine)\n"
        "  --memory FILE          stream FILE into the unbounded cache before scoring\n"
        "  --no-normalize         FILE is already in the model's text conventions: split on white space\n"
        "                         only, eos per line (docs/normalisation.md)\n");
#undef ADD
}

const char *cacheopts_help(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_help);
    return help_text;
}

void cacheopts_init(cacheopts *co)
{
    memset(co, 0, sizeof *co);
    cache_params_default(&co->p);
}

void cacheopts_start(cacheopts *co)
{
    cacheopts_init(co);
    opterr = 0;   /* the command prints its own messages */
    optind = 1;
}

bool cacheopts_given(const cacheopts *co, int code)
{
    return code > CO_FIRST && code < CO_LAST && co->seen[code - CO_FIRST];
}

int co_usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "neurocache %s: %s; see 'neurocache %s --help'\n", cmd, msg, cmd);
    return 2;
}

/* The knob an option row sets (under its name or its alias), NULL for another option. */
static const nc_cache_knob *option_knob(const struct option *o)
{
    return o->val > CO_FIRST && o->val < CO_INDEX ? cache_knob_by_flag(o->name) : NULL;
}

const char *co_suggest_option(const struct option *opts, const char *arg)
{
    char word[64];
    size_t len = strcspn(arg, "=");
    while (len > 0 && *arg == '-')
        arg++, len--;
    snprintf(word, sizeof word, "%.*s", (int)len, arg);
    nc_suggest s;
    suggest_init(&s, word);
    for (size_t i = 0; opts[i].name; i++) {
        const nc_cache_knob *k = option_knob(&opts[i]);
        suggest_offer_as(&s, opts[i].name, k ? k->flag : opts[i].name);
    }
    return suggest_best(&s);
}

int co_bad_option(const char *cmd, const struct option *opts, int code, char **argv)
{
    const char *arg = argv[optind - 1];
    if (code == ':')
        return co_usage_error(cmd, "option '%s' needs a value", arg);
    /* an unknown option: getopt_long takes unique prefixes, so a prefix of
     * several is ambiguous rather than unknown */
    if (!strncmp(arg, "--", 2) && arg[2]) {
        size_t len = strcspn(arg + 2, "="), nm = 0;
        char list[256] = "";
        for (size_t i = 0; opts[i].name; i++) {
            const nc_cache_knob *k = option_knob(&opts[i]);
            if (k && strcmp(k->flag, opts[i].name))
                continue;   /* an alias: its knob is listed under its name */
            if (!strncmp(opts[i].name, arg + 2, len)) {
                nm++;
                size_t o = strlen(list);
                snprintf(list + o, sizeof list - o, "%s--%s", o ? ", " : "", opts[i].name);
            }
        }
        if (nm > 1)
            return co_usage_error(cmd, "option '%s' is ambiguous (%s)", arg, list);
    }
    const char *near = co_suggest_option(opts, arg);
    if (near)
        return co_usage_error(cmd, "unknown option '%s' (did you mean '--%s'?)", arg, near);
    return co_usage_error(cmd, "unknown option '%s'", arg);
}

bool co_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool co_parse_float(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int co_parse_list(const char *s, double **out)
{
    *out = NULL;
    int n = 0, cap = 0;
    const char *p = s;
    double *v = NULL;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char buf[64];
        double x;
        if (len == 0 || len >= sizeof buf) {
            free(v);
            return -1;
        }
        memcpy(buf, p, len);
        buf[len] = '\0';
        if (!co_parse_float(buf, -1e9, 1e9, &x)) {
            free(v);
            return -1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            double *nv = realloc(v, (size_t)cap * sizeof(double));
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[n++] = x;
        p += len + (e ? 1 : 0);
        if (e && !*p) {
            free(v);
            return -1;
        }
    }
    if (n == 0)
        return -1;
    *out = v;
    return n;
}


int cacheopts_parse(cacheopts *co, int code, const char *arg, const char *cmd)
{
    if (co_parse_normalize(code))
        return 1;
    if (code <= CO_FIRST || code >= CO_LAST)
        return 0;
    co->seen[code - CO_FIRST] = 1;
    size_t nknobs;
    const nc_cache_knob *knobs = cache_knobs(&nknobs);
    if (code - CO_FIRST - 1 < (int)nknobs) {   /* a knob: the table parses and checks it */
        const nc_cache_knob *k = &knobs[code - CO_FIRST - 1];
        char err[NC_ERRLEN];
        if (cache_knob_set_text(&co->p, k, k->type == NC_KNOB_BOOL ? "true" : arg, err, sizeof err) == NC_OK)
            return 1;
        fprintf(stderr, "neurocache %s: --%s: %s\n", cmd, k->flag, err);
        return -1;
    }
    long iv;
    switch (code) {
    case CO_INDEX: co->index_path = arg; break;
    case CO_SWITCH_AT:
        if (!co_parse_int(arg, 1, 4000000000L, &iv))
            goto bad;
        co->switch_at = iv;
        break;
    case CO_THREADS:
        if (!co_parse_int(arg, 1, 1024, &iv))
            goto bad;
        co->threads = (int)iv;
        break;
    case CO_MEMORY: co->memory_path = arg; break;
    }
    return 1;
bad:
    fprintf(stderr, "neurocache %s: bad value '%s' for --%s\n", cmd, arg, cacheopts_option_name(code));
    return -1;
}

