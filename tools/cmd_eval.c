/* cmd_eval.c -- `neurocache eval`: a perplexity table of the static model and
 * the cache combinations on text files, with the cost of each (tokens/s), and
 * sweeps of one knob (perplexity against cache size / k, as the papers'
 * figures) to CSV and a gnuplot PNG. One LSTM pass and one unbounded-cache
 * search per file serve every row. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheopts.h"
#include "cache_scoring.h"
#include "report.h"
#include "texts.h"
#include "commands.h"
#include "components.h"
#include "gate.h"
#include "mixture.h"

static const char *sweepable_list(void);

/* The sweepable knobs' options (sweepable_list) as the help's lines, under
 * its option's description. */
static const char *sweepable_help(void)
{
    static char help[1024];
    const char *list = sweepable_list(), *indent = "                       ";
    size_t o = 0, col = 0;
    for (const char *w = list; *w; ) {
        size_t len = strcspn(w, " ");
        if (col == 0 || col + 1 + len > 80) {
            o += (size_t)snprintf(help + o, sizeof help - o, "%s%s", col ? "\n" : "", indent);
            col = strlen(indent);
        } else {
            help[o++] = ' ';
            col++;
        }
        o += (size_t)snprintf(help + o, sizeof help - o, "%.*s", (int)len, w);
        col += len;
        w += len + (w[len] == ' ');
        if (o >= sizeof help - 2)
            break;
    }
    snprintf(help + o, sizeof help - o, "\n");
    return help;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: neurocache eval --model DIR [--bos eos|none] [cache options] [--csv FILE]\n"
            "                       [--sweep KNOB=V1,V2,... [--out PREFIX]] FILE...\n"
            "\n"
            "Prints, for each FILE, the perplexity and speed of the static model and of the\n"
            "caches: with no cache option, the static model, +unigram (N=2000), +neural\n"
            "linear (N=2000), +neural global, +unbounded and neural+unbounded with default\n"
            "knobs; with cache options, the static model, each cache asked for alone and\n"
            "all of them together. --open-vocab/--uniform-mu apply to every row. The\n"
            "unbounded cache of a FILE holds every earlier pair of that FILE (after the\n"
            "pairs of --memory). tokens/s counts everything a row needs: the LSTM pass,\n"
            "the unbounded search (once per file, at the largest k) and the mixture;\n"
            "tokens/CPU-s the same per CPU second of all threads (steadier on a busy machine).\n"
            "\n"
            "options:\n"
            "  --model DIR          model directory\n"
            "  --bos eos|none       start state (default eos, as `score`)\n"
            "  --csv FILE           also write the table as CSV\n"
            "  --sweep KNOB=LIST    one row per value instead of the table; KNOB is a size or\n"
            "                       weight of a cache:\n"
            "%s"
            "                       (or an older name: neural-cache, theta...; the other\n"
            "                       knobs as given); writes PREFIX.csv and PREFIX.png\n"
            "                       (gnuplot)\n"
            "  --out PREFIX         sweep output prefix (default sweep-KNOB)\n"
            "  --row \"OPTS\"        one more row with these cache options (repeatable; with\n"
            "                       no other cache option: the static row and these only)\n"
            "  --gate               (a cache option) the rows of the caches the model's gate\n"
            "                       was fitted for (fit-gate) once more, weighed per token by\n"
            "                       the gate; with the unbounded cache twice: always searching\n"
            "                       (skip<0) and with adaptive retrieval at the gate's own\n"
            "                       threshold (or --gate-skip's); the 'skipped' column: searches\n"
            "                       the gate skipped (their cost is still counted: the search\n"
            "                       runs once per file for every row; see tests/bench_cache\n"
            "                       for the saving)\n"
            "  -h, --help           this help\n"
            "\n%s\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n",
            sweepable_help(), cacheopts_help());
}

enum { OPT_MODEL = 1, OPT_BOS, OPT_CSV, OPT_SWEEP, OPT_OUT, OPT_ROW, OPT_HELP };

typedef struct {
    char name[200];
    nc_cache_params p;
    double sweep_value;
} row;

#define MAX_ROWS 512
#define MAX_EXTRA 16
/* The size of a cache eval switches on itself: the default table's rows,
 * and a sweep of a knob of a cache that is off. */
#define CACHE_SIZE_ON 2000

/* A knob a --row may set: a cache's (cache_row_remembers) or the
 * mixture's own (gate, dynamic evaluation). The knobs of the terms without
 * memory (the open vocabulary's) and the CLI's own options (the unbounded
 * cache's index and memory, its threads) are the command's, every row's. */
static bool per_row_option(int code)
{
    const nc_cache_knob *k = cacheopts_knob(code);
    return k && (k->owner < 0 || cache_row_remembers(k->owner));
}

/* --row "OPTS": cache options of one more row, parsed like the command's
 * own (same names, same combination rules); the settings of the terms
 * without memory (per_row_option) and the unbounded index choice stay the
 * command's. 0 or 2. */
static int parse_row(const char *spec, const cacheopts *main_co, const struct option *lopts, nc_cache_params *out)
{
    char buf[1024], *argv[64], *save = NULL;
    int argc = 0;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *tok = strtok_r(buf, " \t", &save); tok && argc < 64; tok = strtok_r(NULL, " \t", &save))
        argv[argc++] = tok;
    cacheopts co;
    cacheopts_init(&co);
    for (int i = 0; i < argc; i++) {
        const struct option *o = NULL;
        for (int j = 0; lopts[j].name; j++)
            if (!strncmp(argv[i], "--", 2) && !strcmp(argv[i] + 2, lopts[j].name) && lopts[j].val > CO_FIRST)
                o = &lopts[j];
        if (!o || !per_row_option(o->val)) {
            fprintf(stderr, "neurocache eval: --row '%s': '%s' is not a per-row cache option\n", spec, argv[i]);
            return 2;
        }
        const char *arg = NULL;
        if (o->has_arg == required_argument) {
            if (i + 1 >= argc) {
                fprintf(stderr, "neurocache eval: --row '%s': %s needs a value\n", spec, argv[i]);
                return 2;
            }
            arg = argv[++i];
        }
        if (cacheopts_parse(&co, o->val, arg, "eval --row") < 0)
            return 2;
    }
    if (argc == 0) {
        fprintf(stderr, "neurocache eval: --row needs cache options\n");
        return 2;
    }
    if (cacheopts_finish(&co, "eval --row"))
        return 2;
    *out = co.p;
    for (int c = 0; c < NC_NCOMP; c++)
        if (!cache_row_remembers(c))
            cache_params_row_copy(out, &main_co->p, c);
    if (out->unbounded)
        out->exact = main_co->p.exact;
    return 0;
}

/* A sweepable knob: a number (INT or FLOAT) of a cache (cache_row_remembers)
 * -- but nprobe: the rows share one unbounded search per file (at the
 * largest k, eval_doc_search), whose IVF probes are the command's. --sweep
 * takes their options (or the older aliases); their bounds are the knob
 * table's (core/knobs/cache_knobs.h). */
static bool sweepable(const nc_cache_knob *k)
{
    return (k->type == NC_KNOB_INT || k->type == NC_KNOB_FLOAT) && k->owner >= 0 && cache_row_remembers(k->owner) &&
           strcmp(k->name, "nprobe") != 0;
}

/* "neural-size, neural-theta, ...": the sweepable knobs' options, for the
 * help and the refusal. */
static const char *sweepable_list(void)
{
    static char list[512];
    size_t n, o = 0;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++)
        if (sweepable(&k[i]) && o < sizeof list)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", k[i].flag);
    return list;
}

/* What knob k needs to mean anything (the knob table's needs, in turn:
 * neural_alpha needs global_norm, which needs neural_size) switched on
 * where it is off: a switch to true, a size to CACHE_SIZE_ON. */
static void switch_on_needs(nc_cache_params *p, const nc_cache_knob *k)
{
    char err[NC_ERRLEN];
    for (const nc_cache_knob *need = k->needs; need; need = need->needs)
        if (!cache_knob_on(p, need) &&
            cache_knob_set_number(p, need, need->type == NC_KNOB_BOOL ? 1 : CACHE_SIZE_ON, err, sizeof err))
            abort();   /* a switch whose on value is out of its range: a programming error */
}

/* Sets the swept knob; a knob of a cache that is off switches the cache on
 * (switch_on_needs). */
static int set_knob(nc_cache_params *p, const nc_cache_knob *k, double v, char *err, size_t errlen)
{
    int rc = cache_knob_set_number(p, k, v, err, errlen);
    if (rc == NC_OK)
        switch_on_needs(p, k);
    return rc;
}

/* The sweepable knob named by --sweep's "KNOB=..." (an option or an alias), or NULL. */
static const nc_cache_knob *swept_knob(const char *sweep)
{
    const char *eq = strchr(sweep, '=');
    char flag[64];
    if (!eq || (size_t)(eq - sweep) >= sizeof flag)
        return NULL;
    snprintf(flag, sizeof flag, "%.*s", (int)(eq - sweep), sweep);
    const nc_cache_knob *k = cache_knob_by_flag(flag);
    return k && sweepable(k) ? k : NULL;
}

static void add_row(row *rows, int *n, const nc_cache_params *p)
{
    if (*n >= MAX_ROWS)
        return;
    row *r = &rows[(*n)++];
    r->p = *p;
    cache_params_describe(p, r->name, sizeof r->name);
}

/* Table rows from the options (see usage). With no cache asked for, the
 * papers' comparisons: each cache at a default size, the neural cache also
 * with global normalisation (Grave et al. 2017a's two forms) and with the
 * unbounded cache (2017b) -- a choice of rows, written as such. */
static int table_rows(const cacheopts *co, row *rows)
{
    int n = 0;
    const nc_cache_params *g = &co->p;
    nc_cache_params base = *g, p;
    cache_params_caches_off(&base);
    add_row(rows, &n, &base);
    if (!cache_params_caches_on(g)) {
        p = base;
        p.unigram_size = CACHE_SIZE_ON;
        add_row(rows, &n, &p);
        p = base;
        p.neural_size = CACHE_SIZE_ON;
        add_row(rows, &n, &p);
        p.global_norm = true;
        p.neural_theta = 1.0f;   /* global normalisation wants a sharper cache */
        add_row(rows, &n, &p);
        p = base;
        p.unbounded = true;
        p.exact = g->exact;
        add_row(rows, &n, &p);
        p.neural_size = CACHE_SIZE_ON;
        add_row(rows, &n, &p);
        return n;
    }
    /* each cache asked for alone, in the order of their switches in the knob
     * table, then all of them together */
    int parts = 0;
    size_t nk;
    const nc_cache_knob *k = cache_knobs(&nk);
    for (size_t i = 0; i < nk; i++) {
        int c = k[i].owner;
        if (k[i].needs || c < 0 || !(cache_params_caches_on(g) & (1u << c)))
            continue;   /* not a cache's switch, or its cache is off */
        p = base;
        cache_params_row_copy(&p, g, c);
        add_row(rows, &n, &p);
        parts++;
    }
    if (parts > 1)
        add_row(rows, &n, g);
    return n;
}

typedef struct {
    double ppl, seconds, cpu;     /* wall and CPU (all threads) seconds of the row */
    size_t scored;
    size_t unk;                   /* tokens of the file that are the model's unk (every row alike) */
    double skipped;               /* gate rows: fraction of unbounded searches skipped (else NAN) */
} result;

/* What scoring every file needs: the model, the command's cache options
 * and start state; err: the message of a failure. */
typedef struct {
    const nc_model *m;
    const cacheopts *co;
    bool bos_eos;
    char err[NC_ERRLEN];
} eval_ctx;

/* The rows of the table and each one's result for the file at hand. */
typedef struct {
    const row *rows;
    int nrows;
    result *res;
} eval_table;

/* A row with dynamic evaluation: a session through the file (its weights
 * change as it goes, so the shared LSTM pass and neighbours do not serve),
 * with its own unbounded cache filled with --memory, which it adapts. */
static int eval_dyn_row(eval_ctx *x, const nc_tokens *toks, const nc_cache_params *p, double *lp, result *res)
{
    const nc_model *m = x->m;
    const cacheopts *co = x->co;
    char *err = x->err;
    const size_t errlen = sizeof x->err;
    nc_wordtable *words = NULL;
    nc_unbounded_cache *ub = NULL;
    int rc = NC_OK;
    if (p->open_vocab)
        rc = wordtable_new(m->vocab, &words, err, errlen);
    if (!rc && p->unbounded)
        rc = cacheopts_make_ub(&(co_ub_spec){co, p, m, words, false}, &ub, err, errlen);
    double t0 = nc_now_s(), c0 = co_cpu();
    if (!rc) {
        int blas = co_search_begin(co);
        rc = co_score_stream(&(co_text){m, toks, x->bos_eos, words}, p, ub, lp, err, errlen);
        co_search_end(blas);
    }
    res->seconds = nc_now_s() - t0;
    res->cpu = co_cpu() - c0;
    res->skipped = NAN;
    res->ppl = rc ? NAN : co_ppl(lp, toks->n, &res->scored);
    unbounded_cache_free(ub);
    wordtable_free(words);
    return rc;
}

/* One file's shared work: its tokens, the LSTM pass (d), and the kmax
 * nearest unbounded-cache neighbours of every position (nd2/nw), of which
 * the rows asking for fewer take the first k (kd2/kw); the seconds and
 * CPU seconds of the pass and of the search, counted in every row. */
typedef struct {
    nc_tokens toks;
    nc_wordtable *words;
    nc_unbounded_cache *ub;
    nc_doc *d;
    float *nd2, *kd2;
    int *nw, *kw;
    double *lp;
    int kmax;
    double t_pass, cpu_pass, t_search, cpu_search;
} eval_doc;

static void eval_doc_free(eval_doc *e)
{
    free(e->lp);
    free(e->nd2);
    free(e->nw);
    free(e->kd2);
    free(e->kw);
    doc_free(e->d);
    unbounded_cache_free(e->ub);
    wordtable_free(e->words);
    tokens_clear(&e->toks);
}

/* Reads the file, fills the unbounded cache's memory and runs the LSTM. */
static int eval_doc_prepare(eval_doc *e, eval_ctx *x, const char *path)
{
    const nc_model *m = x->m;
    const cacheopts *co = x->co;
    char *err = x->err;
    const size_t errlen = sizeof x->err;
    int rc = co_read_tokens(m, path, &e->toks, err, errlen);
    if (!rc && co->p.open_vocab)
        rc = wordtable_new(m->vocab, &e->words, err, errlen);
    if (!rc && e->kmax > 0)
        rc = cacheopts_make_ub(&(co_ub_spec){co, &co->p, m, e->words, true}, &e->ub, err, errlen);
    double t0 = nc_now_s(), c0 = co_cpu();
    if (!rc)
        rc = co_prepare(&(co_text){m, &e->toks, x->bos_eos, e->words}, &e->d, err, errlen);
    e->t_pass = nc_now_s() - t0;
    e->cpu_pass = co_cpu() - c0;
    if (!rc && e->d->n <= e->d->first)
        rc = nc_error(err, errlen, NC_EINVAL, "%s: no tokens to score", path);
    if (!rc) {
        e->lp = malloc(e->d->n * sizeof(double));
        if (!e->lp)
            rc = nc_error(err, errlen, NC_ENOMEM, "%zu log-probabilities", e->d->n);
    }
    return rc;
}

/* The kmax nearest neighbours of every position, searched once for all rows. */
static int eval_doc_search(eval_doc *e, eval_ctx *x)
{
    const cacheopts *co = x->co;
    char *err = x->err;
    const size_t errlen = sizeof x->err;
    size_t n = e->d->n, k = (size_t)e->kmax;
    int rc = NC_OK;
    e->nd2 = malloc(n * k * sizeof(float));
    e->nw = malloc(n * k * sizeof(int));
    e->kd2 = malloc(n * k * sizeof(float));
    e->kw = malloc(n * k * sizeof(int));
    if (!e->nd2 || !e->nw || !e->kd2 || !e->kw)
        rc = nc_error(err, errlen, NC_ENOMEM, "neighbours of %zu positions", n);
    nc_cache_params sp = co->p;
    sp.unbounded = true;
    sp.knn = e->kmax;
    double t0 = nc_now_s(), c0 = co_cpu();
    int blas = co_search_begin(co);
    const nc_doc_knn kn = {.ub = e->ub, .adapt = true, .d2 = e->nd2, .words = e->nw};
    if (!rc)
        rc = doc_neighbours(e->d, &sp, &kn, err, errlen);
    co_search_end(blas);
    e->t_search = nc_now_s() - t0;
    e->cpu_search = co_cpu() - c0;
    return rc;
}

/* Points dc at the row's k nearest of the searched neighbours; adds the
 * time that takes and the search's to *t and *cpu. */
static void eval_doc_neighbours(eval_doc *e, int k, nc_doc_caches *dc, double *t, double *cpu)
{
    double t0 = nc_now_s(), c0 = co_cpu();
    if (k == e->kmax) {
        dc->pre_d2 = e->nd2;
        dc->pre_words = e->nw;
    } else {
        /* the first k of the kmax neighbours are the k nearest */
        for (size_t i = 0; i < e->d->n; i++) {
            memcpy(e->kd2 + i * k, e->nd2 + i * e->kmax, (size_t)k * sizeof(float));
            memcpy(e->kw + i * k, e->nw + i * e->kmax, (size_t)k * sizeof(int));
        }
        dc->pre_d2 = e->kd2;
        dc->pre_words = e->kw;
    }
    dc->ub = e->ub;
    *t = nc_now_s() - t0 + e->t_search;
    *cpu = co_cpu() - c0 + e->cpu_search;
}

/* Scores the prepared file under one row (without dynamic evaluation). */
static int eval_doc_row(eval_doc *e, eval_ctx *x, const nc_cache_params *p, result *res)
{
    nc_doc_caches dc = {0};
    double tk = 0, ck = 0;
    if (p->unbounded)
        eval_doc_neighbours(e, p->knn, &dc, &tk, &ck);
    double t0 = nc_now_s(), c0 = co_cpu();
    int rc = doc_score(e->d, p, &dc, e->lp, x->err, sizeof x->err);
    double ts = nc_now_s() - t0, cs = co_cpu() - c0;
    res->skipped = dc.searched + dc.skipped > 0 ? (double)dc.skipped / (double)(dc.searched + dc.skipped) : NAN;
    res->ppl = co_ppl(e->lp, e->d->n, &res->scored);
    res->unk = tokens_count_unk(x->m, &e->toks, 0);
    res->seconds = e->t_pass + tk + ts;
    res->cpu = e->cpu_pass + ck + cs;
    return rc;
}

/* Scores one file under every row; *t_lstm: the seconds of its LSTM pass. */
static int eval_file(eval_ctx *x, const char *path, const eval_table *tb, double *t_lstm)
{
    const row *rows = tb->rows;
    const int nrows = tb->nrows;
    eval_doc e = {0};
    tokens_init(&e.toks);
    for (int i = 0; i < nrows; i++)
        if (rows[i].p.unbounded && rows[i].p.knn > e.kmax)
            e.kmax = rows[i].p.knn;
    int rc = eval_doc_prepare(&e, x, path);
    *t_lstm = e.t_pass;
    if (!rc && e.kmax > 0)
        rc = eval_doc_search(&e, x);
    for (int i = 0; !rc && i < nrows; i++) {
        if (rows[i].p.dyn_lr > 0.0f)
            rc = eval_dyn_row(x, &e.toks, &rows[i].p, e.lp, &tb->res[i]);
        else
            rc = eval_doc_row(&e, x, &rows[i].p, &tb->res[i]);
    }
    eval_doc_free(&e);
    return rc;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int write_sweep_plot(const char *prefix, const char *knob, char *err, size_t errlen)
{
    char script[8192];   /* room for four 1024-byte prefixes */
    const nc_cache_knob *k = cache_knob_by_flag(knob);
    bool logx = k && k->type == NC_KNOB_INT;   /* sizes and k span decades */
    snprintf(script, sizeof script,
             "set terminal pngcairo size 800,500\n"
             "set output '%s.png'\n"
             "set datafile separator ','\n"
             "set key autotitle columnhead\n"
             "set title 'perplexity against %s'\n"
             "set xlabel '%s'\n"
             "set ylabel 'perplexity'\n"
             "%s"
             "set grid\n"
             "set key outside right\n"
             "stats '%s.csv' using 0 nooutput\n"
             "files = system(\"tail -n +2 '%s.csv' | cut -d, -f1 | sort -u\")\n"
             "plot for [f in files] '%s.csv' using ((strcol(1) eq f) ? $3 : NaN):4 with linespoints title f, \\\n"
             "     for [f in files] '%s.csv' using ((strcol(1) eq f) ? $3 : NaN):5 with lines dashtype 2 "
             "title f.' static'\n",
             prefix, knob, knob, logx ? "set logscale x\n" : "", prefix, prefix, prefix, prefix);
    return co_gnuplot(script, err, errlen);
}

/* The command line: the command's own options and the cache options. */
typedef struct {
    struct option opts[CACHEOPTS_MAX];
    const char *model_dir, *csv_path, *sweep, *out_prefix, *extra[MAX_EXTRA];
    int nextra;
    bool bos_eos;
    cacheopts co;
    const nc_cache_knob *swept;   /* --sweep's knob */
    char prefix[1024];            /* --sweep's output prefix */
} eval_args;

/* getopt over argv into a; -1 to go on, else the exit status. */
static int eval_getopt(eval_args *a, int argc, char **argv)
{
    static const struct option own[] = {
        {"model", required_argument, NULL, OPT_MODEL}, {"bos", required_argument, NULL, OPT_BOS},
        {"csv", required_argument, NULL, OPT_CSV},     {"sweep", required_argument, NULL, OPT_SWEEP},
        {"out", required_argument, NULL, OPT_OUT},     {"help", no_argument, NULL, OPT_HELP},
        {"row", required_argument, NULL, OPT_ROW},
        {NULL, 0, NULL, 0},
    };
    cacheopts_options(own, a->opts);
    a->bos_eos = true;
    cacheopts_start(&a->co);
    int c;
    while ((c = getopt_long(argc, argv, ":h", a->opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: a->model_dir = optarg; break;
        case OPT_CSV: a->csv_path = optarg; break;
        case OPT_SWEEP: a->sweep = optarg; break;
        case OPT_OUT: a->out_prefix = optarg; break;
        case OPT_ROW:
            if (a->nextra == MAX_EXTRA) {
                fprintf(stderr, "neurocache eval: at most %d --row options\n", MAX_EXTRA);
                return 2;
            }
            a->extra[a->nextra++] = optarg;
            break;
        case OPT_BOS:
            if (strcmp(optarg, "eos") && strcmp(optarg, "none")) {
                fprintf(stderr, "neurocache eval: --bos must be 'eos' or 'none', not '%s'\n", optarg);
                return 2;
            }
            a->bos_eos = !strcmp(optarg, "eos");
            break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        case ':':
            return co_bad_option("eval", a->opts, c, argv);
        default:
            switch (cacheopts_parse(&a->co, c, optarg, "eval")) {
            case 1: continue;
            case -1: return 2;
            }
            return co_bad_option("eval", a->opts, c, argv);
        }
    }
    return -1;
}

/* The whole command line, checked; -1 to go on, else the exit status. */
static int eval_parse_args(eval_args *a, int argc, char **argv)
{
    int rc = eval_getopt(a, argc, argv);
    if (rc >= 0)
        return rc;
    if (!a->model_dir || optind >= argc) {
        return co_usage_error("eval", "%s", !a->model_dir ? "--model DIR is required" : "FILE is required");
    }
    if (a->out_prefix && !a->sweep) {
        fprintf(stderr, "neurocache eval: --out needs --sweep\n");
        return 2;
    }
    /* a sweep of a cache's size switches that cache on: its knobs are then
     * legal without the size option */
    cacheopts *co = &a->co;
    const nc_cache_knob *sk = a->sweep ? swept_knob(a->sweep) : NULL;
    if (sk) {
        char err[NC_ERRLEN];
        if (!sk->needs && !cache_knob_on(&co->p, sk) &&   /* a cache's size: on at the default size */
            cache_knob_set_number(&co->p, sk, CACHE_SIZE_ON, err, sizeof err))
            abort();   /* a size whose default is out of its range: a programming error */
        switch_on_needs(&co->p, sk);
        for (const nc_cache_knob *on = sk->needs ? sk->needs : sk; on; on = on->needs)
            co->seen[cacheopts_knob_code(on) - CO_FIRST] = 1;
    }
    /* with --row, the index options (--switch-at, --index, --memory) serve
     * the rows' unbounded cache */
    if (a->nextra > 0)
        co->seen[CO_KNOB_unbounded - CO_FIRST] = 1;
    if (cacheopts_finish(co, "eval"))
        return 2;
    a->swept = sk;
    return -1;
}

/* --sweep's rows: one per value, then the static reference; 0 or 2. */
static int sweep_rows(eval_args *a, row *rows, int *nrows)
{
    const char *eq = strchr(a->sweep, '=');
    const nc_cache_knob *swept = a->swept;
    if (!swept) {
        fprintf(stderr, "neurocache eval: --sweep wants KNOB=V1,V2,... with KNOB one of %s\n", sweepable_list());
        return 2;
    }
    double *vals = NULL;
    int nv = co_parse_list(eq + 1, &vals);
    if (nv < 0 || nv > MAX_ROWS) {
        fprintf(stderr, "neurocache eval: --sweep %s: bad value list '%s'\n", swept->flag, eq + 1);
        return 2;
    }
    for (int i = 0; i < nv; i++) {
        double v = vals[i];
        if (!strcmp(swept->name, "neural_lambda") && cacheopts_given(&a->co, CO_KNOB_global_norm)) {
            fprintf(stderr, "neurocache eval: --sweep neural-lambda is for linear interpolation, not --global-norm\n");
            free(vals);
            return 2;
        }
        nc_cache_params p = a->co.p;
        char err[NC_ERRLEN];
        if (set_knob(&p, swept, v, err, sizeof err) != NC_OK) {
            fprintf(stderr, "neurocache eval: --sweep %s: %s\n", swept->flag, err);
            free(vals);
            return 2;
        }
        add_row(rows, nrows, &p);
        rows[*nrows - 1].sweep_value = v;
    }
    free(vals);
    snprintf(a->prefix, sizeof a->prefix, "%s", a->out_prefix ? a->out_prefix : "");
    if (!a->out_prefix)
        snprintf(a->prefix, sizeof a->prefix, "sweep-%s", swept->flag);
    /* the static reference, last */
    nc_cache_params st = a->co.p;
    cache_params_caches_off(&st);
    add_row(rows, nrows, &st);
    return 0;
}

/* --gate: the rows of the components the gate was fitted for, gated, after
 * the constant-λ rows n0.. ; with the unbounded cache twice, always
 * searching and with adaptive retrieval (unless --gate-skip fixes the
 * threshold). */
static void add_gated_rows(const cacheopts *co, row *rows, int *nrows)
{
    int n0 = *nrows;
    for (int i = 0; i < n0; i++) {
        rows[i].p.gate = false;
        cache_params_describe(&rows[i].p, rows[i].name, sizeof rows[i].name);
    }
    for (int i = 1; i < n0; i++) {
        nc_cache_params q = rows[i].p;
        q.gate = true;
        q.gate_skip = co->p.gate_skip;
        int searched = components_searched();
        if (searched >= 0 && (components_on(&q) & (1u << searched)) && !cacheopts_given(co, CO_KNOB_gate_skip)) {
            q.gate_skip = 0.0f;
            add_row(rows, nrows, &q);
            q.gate_skip = -1.0f;
        }
        add_row(rows, nrows, &q);
    }
}

/* Every row the options ask for, validated; *gate_rows_from: the first
 * gated row (-1: none). 0 or 2. */
static int eval_rows(eval_args *a, row *rows, int *nrows, int *gate_rows_from)
{
    const cacheopts *co = &a->co;
    *nrows = 0;
    *gate_rows_from = -1;
    if (a->sweep) {
        if (sweep_rows(a, rows, nrows))
            return 2;
    } else if (a->nextra > 0 && !cache_params_caches_on(&co->p)) {
        /* only the static reference and the rows asked for */
        nc_cache_params st = co->p;
        add_row(rows, nrows, &st);
    } else {
        *nrows = table_rows(co, rows);
        if (co->p.gate) {
            *gate_rows_from = *nrows;
            add_gated_rows(co, rows, nrows);
        }
    }
    for (int i = 0; i < a->nextra; i++) {
        nc_cache_params p;
        if (a->sweep) {
            fprintf(stderr, "neurocache eval: --row and --sweep exclude each other\n");
            return 2;
        }
        if (parse_row(a->extra[i], co, a->opts, &p))
            return 2;
        add_row(rows, nrows, &p);
    }
    for (int i = 0; i < *nrows; i++) {
        char e[NC_ERRLEN];
        if (cache_params_validate(&rows[i].p, e, sizeof e)) {
            fprintf(stderr, "neurocache eval: %s: %s\n", rows[i].name, e);
            return 2;
        }
    }
    return 0;
}

/* Checks the gated rows against the model's gate: a gate weighs the
 * components it was fitted with, so the twins of other component sets
 * (which would only show it used outside them) are dropped. */
static int keep_gate_rows(eval_ctx *x, const char *model_dir, row *rows, int *nrows, int gate_rows_from)
{
    const nc_model *m = x->m;
    for (int i = 0; i < *nrows; i++)
        if (rows[i].p.gate && !m->gate)
            return nc_error(x->err, sizeof x->err, NC_EINVAL, "%s has no gate (gate.safetensors): fit one with "
                            "neurocache fit-gate", model_dir);
    if (gate_rows_from < 0)
        return NC_OK;
    int o = gate_rows_from;
    for (int i = gate_rows_from; i < *nrows; i++)
        if (mixture_components_on(&rows[i].p) == m->gate->comps)
            rows[o++] = rows[i];
    if (o == gate_rows_from)
        fprintf(stderr, "neurocache eval: the gate was fitted for other caches (see its gate.json): "
                        "no gated row\n");
    *nrows = o;
    return NC_OK;
}

/* The CSV file (--csv, or PREFIX.csv of --sweep) with its header line. */
static int open_csv(const eval_args *a, FILE **csv, char *name, size_t namelen, char *err, size_t errlen)
{
    if (a->sweep)
        snprintf(name, namelen, "%s.csv", a->prefix);
    else
        snprintf(name, namelen, "%s", a->csv_path);
    *csv = fopen(name, "w");
    if (!*csv)
        return nc_error(err, errlen, NC_EIO, "%s: cannot write", name);
    if (a->sweep)
        fprintf(*csv, "file,knob,%s,ppl,static_ppl,seconds,tokens_per_s,cpu_seconds,tokens_per_cpu_s\n",
                a->swept->flag);
    else
        fprintf(*csv, "file,config,tokens,ppl,seconds,tokens_per_s,cpu_seconds,tokens_per_cpu_s,skipped\n");
    return NC_OK;
}

/* One file's table on stdout (and its CSV lines): a row per configuration,
 * its change against the static row (a sweep's is the last). */
static void print_file_table(const eval_args *a, const char *path, const eval_table *tb, double t_lstm, FILE *csv)
{
    const row *rows = tb->rows;
    const int nrows = tb->nrows;
    const result *res = tb->res;
    bool sweep = a->sweep != NULL;
    double ppl0 = sweep ? res[nrows - 1].ppl : res[0].ppl;
    printf("%s: %zu tokens scored, %zu unknown words (%.2f%%), LSTM pass %.2f s (%.0f tokens/s)%s\n", path,
           res[0].scored, res[0].unk, res[0].scored ? 100.0 * (double)res[0].unk / (double)res[0].scored : 0.0,
           t_lstm, res[0].scored / (t_lstm > 0 ? t_lstm : 1e-9), a->co.p.open_vocab ? ", open vocabulary" : "");
    int wname = 14;
    for (int i = 0; i < nrows; i++)
        if ((int)strlen(rows[i].name) > wname)
            wname = (int)strlen(rows[i].name);
    printf("  %-*s %12s %8s %12s %14s %9s\n", wname, sweep ? a->swept->flag : "configuration", "perplexity",
           "change", "tokens/s", "tokens/CPU-s", "skipped");
    for (int i = 0; i < nrows; i++) {
        const result *r = &res[i];
        double tps = r->scored / (r->seconds > 0 ? r->seconds : 1e-9);
        char chg[32] = "";
        if (isfinite(ppl0) && isfinite(r->ppl) && (sweep ? i != nrows - 1 : i != 0))
            snprintf(chg, sizeof chg, "%+.1f%%", 100.0 * (r->ppl / ppl0 - 1.0));
        double cps = r->scored / (r->cpu > 0 ? r->cpu : 1e-9);
        char skp[32] = "";
        if (!isnan(r->skipped))
            snprintf(skp, sizeof skp, "%.1f%%", 100.0 * r->skipped);
        printf("  %-*s %12.3f %8s %12.0f %14.0f %9s\n", wname, rows[i].name, r->ppl, chg, tps, cps, skp);
        if (csv && !sweep)
            fprintf(csv, "%s,\"%s\",%zu,%.6f,%.6f,%.1f,%.6f,%.1f,%s\n", base_name(path), rows[i].name, r->scored,
                    r->ppl, r->seconds, tps, r->cpu, cps, skp);
        else if (csv && i != nrows - 1)
            fprintf(csv, "%s,%s,%g,%.6f,%.6f,%.6f,%.1f,%.6f,%.1f\n", base_name(path), a->swept->flag,
                    rows[i].sweep_value, r->ppl, ppl0, r->seconds, tps, r->cpu, cps);
    }
    fflush(stdout);
}

int cmd_eval(int argc, char **argv)
{
    static eval_args a;
    memset(&a, 0, sizeof a);
    int st = eval_parse_args(&a, argc, argv);
    if (st >= 0)
        return st;
    static row rows[MAX_ROWS];
    int nrows, gate_rows_from;
    if (eval_rows(&a, rows, &nrows, &gate_rows_from))
        return 2;

    static eval_ctx x;
    x = (eval_ctx){.co = &a.co, .bos_eos = a.bos_eos};
    char *err = x.err, csvname[1100];
    const size_t errlen = sizeof x.err;
    nc_model *m = NULL;
    FILE *csv = NULL;
    int rc = model_load(a.model_dir, &m, err, errlen);
    x.m = m;
    if (!rc)
        rc = keep_gate_rows(&x, a.model_dir, rows, &nrows, gate_rows_from);
    if (!rc && (a.csv_path || a.sweep))
        rc = open_csv(&a, &csv, csvname, sizeof csvname, err, errlen);
    result *res = calloc((size_t)nrows, sizeof *res);
    if (!rc && !res)
        rc = nc_error(err, errlen, NC_ENOMEM, "results");
    const eval_table tb = {rows, nrows, res};
    for (int f = optind; !rc && f < argc; f++) {
        double tl = 0;
        rc = eval_file(&x, argv[f], &tb, &tl);
        if (!rc)
            print_file_table(&a, argv[f], &tb, tl, csv);
    }
    if (csv && fclose(csv) != 0 && !rc)
        rc = nc_error(err, errlen, NC_EIO, "%s: write failed", csvname);
    if (!rc && a.sweep) {
        rc = write_sweep_plot(a.prefix, a.swept->flag, err, errlen);
        if (!rc)
            fprintf(stderr, "wrote %s.csv and %s.png\n", a.prefix, a.prefix);
    } else if (!rc && a.csv_path) {
        fprintf(stderr, "wrote %s\n", a.csv_path);
    }
    if (rc)
        fprintf(stderr, "neurocache eval: %s\n", err);
    free(res);
    model_free(m);
    return rc ? 1 : 0;
}
