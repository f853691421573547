/* cmd_tune.c -- `neurocache tune`: grid search of the cache hyper-parameters
 * on a validation file. One LSTM pass (doc_prepare) and one unbounded-cache
 * search (doc_neighbours) serve every grid point; each point is a cheap
 * target-only doc_score (design §4). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cacheopts.h"
#include "cache_scoring.h"
#include "report.h"
#include "texts.h"
#include "commands.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: neurocache tune --model DIR --valid FILE [cache options] [grid options]\n"
            "\n"
            "Grid-searches, on FILE, the neural cache's theta x lambda (or theta x alpha with\n"
            "--global-norm), the unigram cache's lambda and the unbounded cache's lambda\n"
            "(alone, and with the neural cache at its best theta, jointly with its lambda or\n"
            "alpha). Stages run for the caches given\n"
            "(--neural-size N, --unigram-size N, --unbounded); with none, the neural cache\n"
            "with N=2000. The other knobs (--knn, --nprobe, --kernel, --open-vocab, ...) are\n"
            "fixed as given. Prints each stage's best options, writes the grids as CSV and\n"
            "the theta x lambda perplexities as a heat map (gnuplot PNG). With --gate every\n"
            "point is weighed by the model's gate (fit-gate): the lambdas then have no\n"
            "effect, theta, N and k still do. With --dyn a last stage tunes dynamic\n"
            "evaluation (docs/dyneval.md; the model needs neurocache dyn-stats): its\n"
            "learning rate, then its decay at the best rate, then its segment length, alone\n"
            "and with the caches at their best, each point a pass through a session on the\n"
            "first --dyn-tokens tokens (the weights change as it goes: no shared LSTM pass).\n"
            "\n"
            "grid options (comma lists):\n"
            "  --thetas LIST              default 0,0.1,0.2,0.3,0.4,0.5,0.7,1,1.5,2\n"
            "  --lambdas LIST             default 0.02,0.05,0.1,0.15,0.2,0.25,0.3,0.4,0.5\n"
            "  --alphas LIST              default -8,-6,-4,-3,-2,-1,0,1,2\n"
            "  --unigram-lambdas LIST     default 0.01,0.02,0.05,0.1,0.15,0.2,0.3\n"
            "  --unbounded-lambdas LIST   default 0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9\n"
            "  --dyn-lrs LIST             default 0.0005,0.001,0.002,0.003,0.005\n"
            "  --dyn-decays LIST          default 0,0.005,0.01,0.02,0.05\n"
            "  --dyn-segments LIST        default 5,10,20,40\n"
            "  --dyn-tokens N             the dynamic evaluation stage's text: the first N tokens\n"
            "                             of FILE (default 20000, 0 = all)\n"
            "other options:\n"
            "  --model DIR, --valid FILE  model directory, validation text\n"
            "  --bos eos|none             start state (default eos)\n"
            "  --out PREFIX               PREFIX-neural.csv, PREFIX.png, PREFIX-unbounded.csv,\n"
            "                             PREFIX-unigram.csv (default tune)\n"
            "  --no-plot                  no PNG\n"
            "  --dyn                      the dynamic evaluation stage (--dyn-params N: its subset)\n"
            "  -h, --help                 this help\n"
            "\n%s\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n",
            cacheopts_help());
}

enum { OPT_MODEL = 1, OPT_VALID, OPT_BOS, OPT_THETAS, OPT_LAMBDAS, OPT_ALPHAS, OPT_ULAMBDAS, OPT_UBLAMBDAS,
       OPT_OUT, OPT_NOPLOT, OPT_HELP, OPT_DYN, OPT_DLRS, OPT_DDECAYS, OPT_DSEGS, OPT_DTOKENS };

typedef struct {
    const nc_doc *d;
    double *lp;
    const float *pre_d2;
    const int *pre_w;
    nc_unbounded_cache *ub;
    int npoints;
} tune_ctx;

static int point(tune_ctx *t, const nc_cache_params *p, double *ppl, char *err, size_t errlen)
{
    nc_doc_caches dc = {.ub = t->ub, .pre_d2 = t->pre_d2, .pre_words = t->pre_w};
    int rc = doc_score(t->d, p, p->unbounded ? &dc : NULL, t->lp, err, errlen);
    *ppl = rc ? NAN : co_ppl(t->lp, t->d->n, NULL);
    t->npoints++;
    return rc;
}

/* A grid of values of one knob: each checked against the knob table's
 * bounds (cache_knobs.h), with its message. */
static int parse_grid(const char *opt, const char *arg, const char *knob, double **out, int *n)
{
    free(*out);
    *n = co_parse_list(arg, out);
    if (*n <= 0) {
        fprintf(stderr, "neurocache tune: --%s: bad list '%s'\n", opt, arg);
        return 2;
    }
    const nc_cache_knob *k = cache_knob_find(knob);
    nc_cache_params p;
    cache_params_default(&p);
    char err[NC_ERRLEN];
    for (int i = 0; i < *n; i++)
        if (cache_knob_set_number(&p, k, (*out)[i], err, sizeof err) != NC_OK) {
            fprintf(stderr, "neurocache tune: --%s: %s\n", opt, err);
            return 2;
        }
    return 0;
}

/* The command-line options of p, to paste: the shipped caches' in their
 * established order and form (cache_row_described_by_hand), then any other
 * row's knobs in effect, then dynamic evaluation and the gate. */
static void options_of(const nc_cache_params *p, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
#define ADD(...) do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    if (p->neural_size > 0) {
        ADD("--neural-size %d --neural-theta %g ", p->neural_size, (double)p->neural_theta);
        if (p->global_norm)
            ADD("--global-norm --neural-alpha %g ", (double)p->neural_alpha);
        else
            ADD("--neural-lambda %g ", (double)p->neural_lambda);
        if (p->neural_f16)   /* the keys' precision moves the scores: the line must reproduce it */
            ADD("--neural-f16 ");
    }
    if (p->unigram_size > 0)
        ADD("--unigram-size %d --unigram-lambda %g ", p->unigram_size, (double)p->unigram_lambda);
    if (p->unbounded)
        ADD("--unbounded --knn %d --nprobe %d --unbounded-lambda %g%s%s ", p->knn, p->nprobe,
            (double)p->unbounded_lambda, p->kernel == NC_KERNEL_EPANECHNIKOV ? " --kernel epanechnikov" : "",
            p->exact ? " --exact" : "");
    if (p->open_vocab) {
        ADD("--open-vocab ");
        if (p->uniform_mu > 0)
            ADD("--uniform-mu %g ", (double)p->uniform_mu);
        if (p->vocab_size_full > 0)
            ADD("--vocab-size-full %d ", p->vocab_size_full);
    }
    size_t nk;
    const nc_cache_knob *k = cache_knobs(&nk);
    for (size_t i = 0; i < nk; i++) {   /* the rows not written above: each knob in effect */
        if (k[i].owner < 0 || cache_row_described_by_hand(k[i].owner) || !cache_knob_in_effect(p, &k[i]))
            continue;
        double v = cache_knob_get(p, &k[i]);
        if (k[i].type == NC_KNOB_BOOL)
            ADD("--%s ", k[i].flag);
        else if (k[i].type == NC_KNOB_KERNEL)
            ADD("--%s %s ", k[i].flag, cache_kernel_name((int)v));
        else   /* a float knob as the lines above print theirs */
            ADD(k[i].type == NC_KNOB_INT ? "--%s %.0f " : "--%s %g ", k[i].flag, v);
    }
    if (p->dyn_lr > 0.0f)
        ADD("--dyn-lr %g --dyn-decay %g --dyn-segment %d --dyn-params %d ", (double)p->dyn_lr, (double)p->dyn_decay,
            p->dyn_segment, p->dyn_params);
    if (p->gate) {
        ADD("--gate ");
        if (p->gate_skip >= 0.0f && p->unbounded)
            ADD("--gate-skip %g ", (double)p->gate_skip);
    }
    if (o > 0 && o < len)
        buf[o - 1] = '\0';
#undef ADD
}

/* What the command line asks for: the cache options and the grids. */
typedef struct {
    cacheopts co;                 /* co.p: the fixed knobs, and which caches */
    const char *model_dir, *valid, *prefix;
    bool bos_eos, plot;
    bool neural;                  /* stage 1 runs (also the default) */
    bool lambdas_are_alphas;      /* --global-norm: the neural grid is theta x alpha */
    bool lambdas_given, alphas_given;
    double *thetas, *lambdas, *ul, *ubl;
    int nth, nla, nul, nubl;
    bool dyn;                     /* the dynamic evaluation stage runs */
    double *dlr, *ddec, *dseg;
    int ndlr, nddec, ndseg;
    long dyn_tokens;
} tune_args;

static void args_free(tune_args *a)
{
    free(a->thetas);
    free(a->lambdas);
    free(a->ul);
    free(a->ubl);
    free(a->dlr);
    free(a->ddec);
    free(a->dseg);
}

/* --dyn-tokens N: 0, or 2 with the reason printed. */
static int parse_dyn_tokens(const char *arg, long *out)
{
    char *end;
    *out = strtol(arg, &end, 10);
    if (*end || *out < 0) {
        fprintf(stderr, "neurocache tune: --dyn-tokens must be a whole number >= 0, not '%s'\n", arg);
        return 2;
    }
    return 0;
}

/* --bos eos|none: 0, or 2 with the reason printed. */
static int parse_bos(const char *arg, bool *bos_eos)
{
    int bad = 0;
    if (strcmp(arg, "eos") && strcmp(arg, "none")) {
        fprintf(stderr, "neurocache tune: --bos must be 'eos' or 'none', not '%s'\n", arg);
        bad = 2;
    }
    *bos_eos = !strcmp(arg, "eos");
    return bad;
}

/* getopt over argv. 0, or the exit status to return now (2 usage error,
 * -1 help printed). */
static int parse_args(int argc, char **argv, tune_args *a)
{
    static const struct option own[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"valid", required_argument, NULL, OPT_VALID},
        {"bos", required_argument, NULL, OPT_BOS},
        {"thetas", required_argument, NULL, OPT_THETAS},
        {"lambdas", required_argument, NULL, OPT_LAMBDAS},
        {"alphas", required_argument, NULL, OPT_ALPHAS},
        {"unigram-lambdas", required_argument, NULL, OPT_ULAMBDAS},
        {"unbounded-lambdas", required_argument, NULL, OPT_UBLAMBDAS},
        {"out", required_argument, NULL, OPT_OUT},
        {"no-plot", no_argument, NULL, OPT_NOPLOT},
        {"dyn", no_argument, NULL, OPT_DYN},
        {"dyn-lrs", required_argument, NULL, OPT_DLRS},
        {"dyn-decays", required_argument, NULL, OPT_DDECAYS},
        {"dyn-segments", required_argument, NULL, OPT_DSEGS},
        {"dyn-tokens", required_argument, NULL, OPT_DTOKENS},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    struct option opts[CACHEOPTS_MAX];
    cacheopts_options(own, opts);
    int c, bad = 0;
    while (!bad && (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: a->model_dir = optarg; break;
        case OPT_VALID: a->valid = optarg; break;
        case OPT_OUT: a->prefix = optarg; break;
        case OPT_NOPLOT: a->plot = false; break;
        case OPT_DYN: a->dyn = true; break;
        case OPT_DLRS: bad = parse_grid("dyn-lrs", optarg, "dyn_lr", &a->dlr, &a->ndlr); break;
        case OPT_DDECAYS: bad = parse_grid("dyn-decays", optarg, "dyn_decay", &a->ddec, &a->nddec); break;
        case OPT_DSEGS: bad = parse_grid("dyn-segments", optarg, "dyn_segment", &a->dseg, &a->ndseg); break;
        case OPT_DTOKENS: bad = parse_dyn_tokens(optarg, &a->dyn_tokens); break;
        case OPT_BOS: bad = parse_bos(optarg, &a->bos_eos); break;
        case OPT_THETAS: bad = parse_grid("thetas", optarg, "neural_theta", &a->thetas, &a->nth); break;
        case OPT_LAMBDAS:
            a->lambdas_given = true;
            bad = parse_grid("lambdas", optarg, "neural_lambda", &a->lambdas, &a->nla);
            break;
        case OPT_ALPHAS:
            a->alphas_given = true;
            bad = parse_grid("alphas", optarg, "neural_alpha", &a->lambdas, &a->nla);
            break;
        case OPT_ULAMBDAS: bad = parse_grid("unigram-lambdas", optarg, "unigram_lambda", &a->ul, &a->nul); break;
        case OPT_UBLAMBDAS: bad = parse_grid("unbounded-lambdas", optarg, "unbounded_lambda", &a->ubl, &a->nubl); break;
        case 'h':
        case OPT_HELP: usage(stdout); return -1;
        case ':':
            bad = co_bad_option("tune", opts, c, argv);
            break;
        default:
            switch (cacheopts_parse(&a->co, c, optarg, "tune")) {
            case 1: continue;
            case -1: bad = 2; continue;
            }
            bad = co_bad_option("tune", opts, c, argv);
        }
    }
    if (!bad && (!a->model_dir || !a->valid || optind != argc)) {
        bad = co_usage_error("tune", "%s", !a->model_dir ? "--model DIR is required"
                                           : !a->valid   ? "--valid FILE is required"
                                                         : "unexpected argument (the file goes after --valid)");
    }
    return bad;
}

/* The options that exclude or need each other. 0, or 2 with the reason
 * printed. */
static int check_args(tune_args *a)
{
    const nc_cache_params *g = &a->co.p;
    const char *why = NULL;
    /* the grids replace the single values: --neural-theta/--neural-lambda/--neural-alpha are errors here */
    if (cacheopts_given(&a->co, CO_KNOB_neural_theta) || cacheopts_given(&a->co, CO_KNOB_neural_lambda) ||
        cacheopts_given(&a->co, CO_KNOB_neural_alpha) || cacheopts_given(&a->co, CO_KNOB_unigram_lambda) ||
        cacheopts_given(&a->co, CO_KNOB_unbounded_lambda))
        why = "give grids (--thetas, --lambdas, --alphas, --unigram-lambdas, --unbounded-lambdas), not single values";
    else if (a->alphas_given && a->lambdas_given)
        why = "--lambdas (linear interpolation) and --alphas (--global-norm) exclude each other";
    else if (a->alphas_given && !g->global_norm)
        why = "--alphas needs --global-norm";
    else if (a->lambdas_given && g->global_norm)
        why = "--lambdas is for linear interpolation; with --global-norm use --alphas";
    else if (a->nubl && !g->unbounded)
        why = "--unbounded-lambdas needs --unbounded";
    else if ((a->dlr || a->ddec || a->dseg) && !a->dyn)
        why = "--dyn-lrs/--dyn-decays/--dyn-segments need --dyn";
    else if (cacheopts_given(&a->co, CO_KNOB_dyn_lr) || cacheopts_given(&a->co, CO_KNOB_dyn_decay) ||
             cacheopts_given(&a->co, CO_KNOB_dyn_segment))
        why = "give grids (--dyn with --dyn-lrs, --dyn-decays, --dyn-segments), not single values";
    else if (a->nul && g->unigram_size == 0)
        why = "--unigram-lambdas needs --unigram-size N";
    else if ((a->thetas || a->lambdas) && g->neural_size == 0 && (g->unigram_size > 0 || g->unbounded))
        why = "--thetas/--lambdas/--alphas need --neural-size N";
    if (why) {
        fprintf(stderr, "neurocache tune: %s\n", why);
        return 2;
    }
    return cacheopts_finish(&a->co, "tune") ? 2 : 0;
}

/* The stages to run and the default grids for those not given. 0, or -1
 * out of memory. */
static int choose_stages(tune_args *a)
{
    static const double d_thetas[] = {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1, 1.5, 2};
    static const double d_lambdas[] = {0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5};
    static const double d_alphas[] = {-8, -6, -4, -3, -2, -1, 0, 1, 2};
    static const double d_ul[] = {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3};
    static const double d_ubl[] = {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9};
    nc_cache_params *g = &a->co.p;
    a->neural = g->neural_size > 0 || (g->unigram_size == 0 && !g->unbounded);
    if (a->neural && g->neural_size == 0)
        g->neural_size = 2000;
    a->lambdas_are_alphas = g->global_norm;
#define DEFAULT(arr, n, d) do { if (!arr) { n = (int)(sizeof d / sizeof *d); arr = malloc(sizeof d); \
        if (arr) memcpy(arr, d, sizeof d); } } while (0)
    DEFAULT(a->thetas, a->nth, d_thetas);
    if (a->lambdas_are_alphas)
        DEFAULT(a->lambdas, a->nla, d_alphas);
    else
        DEFAULT(a->lambdas, a->nla, d_lambdas);
    DEFAULT(a->ul, a->nul, d_ul);
    DEFAULT(a->ubl, a->nubl, d_ubl);
    static const double d_dlr[] = {0.0005, 0.001, 0.002, 0.003, 0.005};
    static const double d_ddec[] = {0, 0.005, 0.01, 0.02, 0.05};
    /* 5: the paper's word-level segments, best on PTB valid (BENCHMARKS.md) */
    static const double d_dseg[] = {5, 10, 20, 40};
    DEFAULT(a->dlr, a->ndlr, d_dlr);
    DEFAULT(a->ddec, a->nddec, d_ddec);
    DEFAULT(a->dseg, a->ndseg, d_dseg);
#undef DEFAULT
    return a->thetas && a->lambdas && a->ul && a->ubl && a->dlr && a->ddec && a->dseg ? 0 : -1;
}

/* What every stage scores with (made once by tune_prepare), and the best
 * options found so far. */
typedef struct {
    const tune_args *a;
    const nc_cache_params *g;
    nc_model *m;
    nc_tokens toks;
    nc_wordtable *words;
    nc_unbounded_cache *ub;
    nc_doc *d;
    float *nd2;                   /* [n, knn] precomputed neighbours */
    int *nw;
    double *lp;                   /* [n] scratch log-probabilities */
    tune_ctx t;
    nc_cache_params st;           /* every cache off */
    nc_cache_params best_neural;  /* stage 1's best */
    nc_cache_params best;         /* every stage's best, for "best all" */
    double ppl_static;
} tune_run;

static void run_free(tune_run *r)
{
    free(r->lp);
    free(r->nd2);
    free(r->nw);
    doc_free(r->d);
    unbounded_cache_free(r->ub);
    wordtable_free(r->words);
    tokens_clear(&r->toks);
    model_free(r->m);
}

/* The one LSTM pass and the one unbounded-cache search every grid point
 * reuses. */
static int tune_prepare(tune_args *a, tune_run *r, char *err, size_t errlen)
{
    cacheopts *co = &a->co;
    const nc_cache_params *g = r->g = &a->co.p;
    r->a = a;
    int rc = model_load(a->model_dir, &r->m, err, errlen);
    if (!rc)
        rc = co_read_tokens(r->m, a->valid, &r->toks, err, errlen);
    if (!rc && g->open_vocab)
        rc = wordtable_new(r->m->vocab, &r->words, err, errlen);
    if (!rc && g->unbounded)
        rc = cacheopts_make_ub(&(co_ub_spec){co, g, r->m, r->words, true}, &r->ub, err, errlen);
    double t0 = nc_now_s();
    if (!rc)
        rc = co_prepare(&(co_text){r->m, &r->toks, a->bos_eos, r->words}, &r->d, err, errlen);
    if (!rc && r->d->n <= r->d->first)
        rc = nc_error(err, errlen, NC_EINVAL, "%s: no tokens to score", a->valid);
    if (!rc) {
        fprintf(stderr, "tune: %zu tokens, LSTM pass %.1f s\n", r->d->n - r->d->first, nc_now_s() - t0);
        r->lp = malloc(r->d->n * sizeof(double));
        if (!r->lp)
            rc = nc_error(err, errlen, NC_ENOMEM, "scores");
    }
    if (!rc && r->ub) {
        r->nd2 = malloc(r->d->n * (size_t)g->knn * sizeof(float));
        r->nw = malloc(r->d->n * (size_t)g->knn * sizeof(int));
        if (!r->nd2 || !r->nw)
            rc = nc_error(err, errlen, NC_ENOMEM, "neighbours (%zu x %d)", r->d->n, g->knn);
        t0 = nc_now_s();
        int blas = co_search_begin(co);
        const nc_doc_knn kn = {.ub = r->ub, .adapt = true, .d2 = r->nd2, .words = r->nw};
        if (!rc)
            rc = doc_neighbours(r->d, g, &kn, err, errlen);
        co_search_end(blas);
        if (!rc)
            fprintf(stderr, "tune: unbounded search (k=%d, %s) %.1f s\n", g->knn,
                    unbounded_cache_is_exact(r->ub) ? "exact" : "IVF", nc_now_s() - t0);
    }
    r->t = (tune_ctx){.d = r->d, .lp = r->lp, .pre_d2 = r->nd2, .pre_w = r->nw, .ub = r->ub};
    r->st = r->best = *g;
    cache_params_caches_off(&r->st);
    r->ppl_static = NAN;
    return rc;
}

/* The baseline every stage's gain is measured against. */
static int stage_static(tune_run *r, char *err, size_t errlen)
{
    int rc = point(&r->t, &r->st, &r->ppl_static, err, errlen);
    if (!rc)
        printf("static: perplexity %.3f\n", r->ppl_static);
    return rc;
}

static void print_best(const tune_run *r, const char *what, double ppl, const nc_cache_params *p)
{
    char opt[512];
    options_of(p, opt, sizeof opt);
    printf("best %s: perplexity %.3f (%+.1f%%) options: %s\n", what, ppl, 100.0 * (ppl / r->ppl_static - 1), opt);
}

/* Stage 1's grid as PREFIX-neural.csv. */
static int write_neural_csv(const tune_run *r, const double *grid, char *err, size_t errlen)
{
    const tune_args *a = r->a;
    char path[1200];
    snprintf(path, sizeof path, "%s-neural.csv", a->prefix);
    FILE *f = fopen(path, "w");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: cannot write", path);
    fprintf(f, "theta,%s,ppl\n", a->lambdas_are_alphas ? "alpha" : "lambda");
    for (int i = 0; i < a->nth; i++)
        for (int j = 0; j < a->nla; j++)
            fprintf(f, "%g,%g,%.6f\n", a->thetas[i], a->lambdas[j], grid[i * a->nla + j]);
    if (fclose(f) != 0)
        return nc_error(err, errlen, NC_EIO, "%s: write failed", path);
    return NC_OK;
}

/* Stage 1's grid as the heat map PREFIX.png (gnuplot). */
static int plot_neural(const tune_run *r, const double *grid, double bp, char *err, size_t errlen)
{
    const tune_args *a = r->a;
    const char *ln = a->lambdas_are_alphas ? "alpha" : "lambda";
    char path[1200];
    int rc = NC_OK;
    /* pm3d map: works for uneven grids (rows separated by blank lines) */
    snprintf(path, sizeof path, "%s-neural.dat", a->prefix);
    FILE *dat = fopen(path, "w");
    if (!dat)
        rc = nc_error(err, errlen, NC_EIO, "%s: cannot write", path);
    for (int i = 0; dat && i < a->nth; i++) {
        for (int j = 0; j < a->nla; j++)
            fprintf(dat, "%g %g %.6f\n", a->thetas[i], a->lambdas[j], grid[i * a->nla + j]);
        fprintf(dat, "\n");
    }
    if (dat)
        fclose(dat);
    const nc_cache_params *b = &r->best_neural;
    char script[3000];
    snprintf(script, sizeof script,
             "set terminal pngcairo size 800,600\nset output '%s.png'\n"
             "set title 'neural cache N=%d%s: best %.2f at theta %g, %s %g (static %.2f)' noenhanced\n"
             "set xlabel 'theta'\nset ylabel '%s'\nset view map\nset pm3d at b corners2color c1\n"
             "set palette rgbformulae 22,13,-31\nunset surface\nset cblabel 'perplexity'\n"
             "splot '%s' using 1:2:3 with pm3d notitle\n",
             a->prefix, r->g->neural_size, a->lambdas_are_alphas ? " global" : "", bp, (double)b->neural_theta, ln,
             a->lambdas_are_alphas ? (double)b->neural_alpha : (double)b->neural_lambda, r->ppl_static, ln, path);
    if (!rc)
        rc = co_gnuplot(script, err, errlen);
    unlink(path);
    if (!rc)
        fprintf(stderr, "tune: wrote %s.png\n", a->prefix);
    return rc;
}

/* Stage 1: the neural cache's theta x lambda (or alpha). */
static int stage_neural(tune_run *r, char *err, size_t errlen)
{
    const tune_args *a = r->a;
    double *grid = malloc((size_t)a->nth * (size_t)a->nla * sizeof(double));
    if (!grid)
        return nc_error(err, errlen, NC_ENOMEM, "scores");
    nc_cache_params p = r->st;
    p.neural_size = r->g->neural_size;
    p.global_norm = r->g->global_norm;
    p.neural_f16 = r->g->neural_f16;
    r->best_neural = p;
    double bp = INFINITY;
    int rc = NC_OK;
    for (int i = 0; !rc && i < a->nth; i++)
        for (int j = 0; !rc && j < a->nla; j++) {
            p.neural_theta = (float)a->thetas[i];
            if (a->lambdas_are_alphas)
                p.neural_alpha = (float)a->lambdas[j];
            else
                p.neural_lambda = (float)a->lambdas[j];
            double v;
            rc = point(&r->t, &p, &v, err, errlen);
            grid[i * a->nla + j] = v;
            if (!rc && v < bp) {
                bp = v;
                r->best_neural = p;
            }
        }
    if (!rc) {
        print_best(r, "neural", bp, &r->best_neural);
        rc = write_neural_csv(r, grid, err, errlen);
    }
    if (!rc && a->plot)
        rc = plot_neural(r, grid, bp, err, errlen);
    free(grid);
    r->best.neural_size = r->best_neural.neural_size;
    r->best.neural_theta = r->best_neural.neural_theta;
    r->best.neural_lambda = r->best_neural.neural_lambda;
    r->best.neural_alpha = r->best_neural.neural_alpha;
    return rc;
}

/* Stage 2: the unigram cache's lambda (alone), as PREFIX-unigram.csv. */
static int stage_unigram(tune_run *r, char *err, size_t errlen)
{
    const tune_args *a = r->a;
    nc_cache_params p = r->st, bu = r->st;
    p.unigram_size = r->g->unigram_size;
    double bp = INFINITY;
    char path[1200];
    snprintf(path, sizeof path, "%s-unigram.csv", a->prefix);
    int rc = NC_OK;
    FILE *f = fopen(path, "w");
    if (!f)
        rc = nc_error(err, errlen, NC_EIO, "%s: cannot write", path);
    else
        fprintf(f, "unigram_lambda,ppl\n");
    for (int i = 0; !rc && i < a->nul; i++) {
        p.unigram_lambda = (float)a->ul[i];
        double v;
        rc = point(&r->t, &p, &v, err, errlen);
        fprintf(f, "%g,%.6f\n", a->ul[i], v);
        if (!rc && v < bp) {
            bp = v;
            bu = p;
        }
    }
    if (f && fclose(f) != 0 && !rc)
        rc = nc_error(err, errlen, NC_EIO, "%s: write failed", path);
    if (!rc)
        print_best(r, "unigram", bp, &bu);
    r->best.unigram_lambda = bu.unigram_lambda;
    return rc;
}

/* One pass of stage 3: the unbounded lambda alone (pass 0) or with the
 * neural cache at its best theta jointly with the neural lambda or alpha
 * (pass 1); rows go to f. */
static int unbounded_pass(tune_run *r, int pass, FILE *f, char *err, size_t errlen)
{
    const tune_args *a = r->a;
    const nc_cache_params *g = r->g;
    nc_cache_params p = pass ? r->best_neural : r->st, bu;
    p.unbounded = true;
    p.knn = g->knn;
    p.nprobe = g->nprobe;
    p.kernel = g->kernel;
    p.exact = g->exact;
    bu = p;
    double bp = INFINITY;
    int rc = NC_OK;
    for (int j = 0; !rc && j < (pass ? a->nla : 1); j++) {
        double nl = NAN;
        if (pass) {
            nl = a->lambdas[j];
            if (a->lambdas_are_alphas)
                p.neural_alpha = (float)nl;
            else
                p.neural_lambda = (float)nl;
        }
        for (int i = 0; !rc && i < a->nubl; i++) {
            p.unbounded_lambda = (float)a->ubl[i];
            double v;
            rc = point(&r->t, &p, &v, err, errlen);
            if (pass)
                fprintf(f, "neural,%g,%g,%.6f\n", nl, a->ubl[i], v);
            else
                fprintf(f, "static,,%g,%.6f\n", a->ubl[i], v);
            if (!rc && v < bp) {
                bp = v;
                bu = p;
            }
        }
    }
    if (rc)
        return rc;
    print_best(r, pass ? "neural+unbounded" : "unbounded", bp, &bu);
    if (pass || !a->neural)
        r->best.unbounded_lambda = bu.unbounded_lambda;
    if (pass) {
        r->best.neural_lambda = bu.neural_lambda;
        r->best.neural_alpha = bu.neural_alpha;
    }
    return NC_OK;
}

/* Stage 3: the unbounded cache's lambda, alone and on top of the neural
 * cache at its best theta, jointly with the neural lambda (or alpha): with
 * the unbounded cache beside it the neural cache's best weight is lower
 * (War and Peace: 0.3 instead of 0.4, BENCHMARKS.md). PREFIX-unbounded.csv. */
static int stage_unbounded(tune_run *r, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s-unbounded.csv", r->a->prefix);
    FILE *f = fopen(path, "w");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: cannot write", path);
    fprintf(f, "with,neural_%s,unbounded_lambda,ppl\n", r->a->lambdas_are_alphas ? "alpha" : "lambda");
    int rc = NC_OK;
    for (int pass = 0; !rc && pass < (r->a->neural ? 2 : 1); pass++)
        rc = unbounded_pass(r, pass, f, err, errlen);
    if (fclose(f) != 0 && !rc)
        rc = nc_error(err, errlen, NC_EIO, "%s: write failed", path);
    return rc;
}

/* One point of the dynamic evaluation stage: a session of parameters p
 * through the first n tokens (a fresh unbounded cache with --memory: the
 * session adapts it). */
static int dyn_point(tune_run *r, const nc_cache_params *p, size_t n, double *ppl, char *err, size_t errlen)
{
    nc_tokens part = r->toks;
    part.n = n;
    nc_unbounded_cache *ub = NULL;
    nc_wordtable *words = NULL;
    int rc = NC_OK;
    if (p->open_vocab)
        rc = wordtable_new(r->m->vocab, &words, err, errlen);
    if (!rc && p->unbounded)
        rc = cacheopts_make_ub(&(co_ub_spec){&r->a->co, p, r->m, words, false}, &ub, err, errlen);
    if (!rc) {
        int blas = co_search_begin(&r->a->co);
        rc = co_score_stream(&(co_text){r->m, &part, r->a->bos_eos, words}, p, ub, r->lp, err, errlen);
        co_search_end(blas);
    }
    *ppl = rc ? NAN : co_ppl(r->lp, n, NULL);
    r->t.npoints++;
    unbounded_cache_free(ub);
    wordtable_free(words);
    return rc;
}

/* Stage 4: dynamic evaluation's learning rate, then its decay at the best
 * rate, then its segment length (coordinate search: each point is a whole
 * pass), alone and with the caches at their best; prints each point. */
static int stage_dyn(tune_run *r, char *err, size_t errlen)
{
    const tune_args *a = r->a;
    size_t n = a->dyn_tokens > 0 && (size_t)a->dyn_tokens < r->toks.n ? (size_t)a->dyn_tokens : r->toks.n;
    char path[1200];
    snprintf(path, sizeof path, "%s-dyn.csv", a->prefix);
    FILE *f = fopen(path, "w");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: cannot write", path);
    fprintf(f, "with,dyn_lr,dyn_decay,dyn_segment,ppl\n");
    int rc = NC_OK;
    bool any_cache = cache_params_caches_on(&r->best) != 0;
    for (int with = 0; !rc && with <= (any_cache ? 1 : 0); with++) {
        nc_cache_params base = with ? r->best : r->st, best = base;
        base.dyn_params = r->g->dyn_params;
        double b0 = NAN, bp = INFINITY;
        rc = dyn_point(r, &base, n, &b0, err, errlen);   /* dyn_lr 0: the reference */
        fprintf(f, "%s,0,,,%.6f\n", with ? "caches" : "alone", b0);
        for (int stage = 0; !rc && stage < 3; stage++) {
            const double *g = stage == 0 ? a->dlr : stage == 1 ? a->ddec : a->dseg;
            int ng = stage == 0 ? a->ndlr : stage == 1 ? a->nddec : a->ndseg;
            nc_cache_params c = stage == 0 ? base : best;
            /* a single value the best point already has: nothing to try */
            if (stage > 0 && ng == 1 && (stage == 1 ? (float)g[0] == best.dyn_decay : (int)g[0] == best.dyn_segment))
                continue;
            for (int i = 0; !rc && i < ng; i++) {
                if (stage == 0)
                    c.dyn_lr = (float)g[i];
                else if (stage == 1)
                    c.dyn_decay = (float)g[i];
                else
                    c.dyn_segment = (int)g[i];
                double v;
                rc = dyn_point(r, &c, n, &v, err, errlen);
                fprintf(f, "%s,%g,%g,%d,%.6f\n", with ? "caches" : "alone", (double)c.dyn_lr, (double)c.dyn_decay,
                        c.dyn_segment, v);
                fflush(f);
                fprintf(stderr, "tune: dyn %s lr %g decay %g segment %d: %.3f (without: %.3f)\n",
                        with ? "with caches" : "alone", (double)c.dyn_lr, (double)c.dyn_decay, c.dyn_segment, v, b0);
                if (!rc && v < bp) {
                    bp = v;
                    best = c;
                }
            }
        }
        if (!rc) {
            char opt[512];
            options_of(&best, opt, sizeof opt);
            printf("best dyn%s (first %zu tokens): perplexity %.3f (%+.1f%% against %.3f without) options: %s\n",
                   with ? "+caches" : "", n, bp, 100.0 * (bp / b0 - 1), b0, opt);
            if (with || !any_cache) {
                r->best.dyn_lr = best.dyn_lr;
                r->best.dyn_decay = best.dyn_decay;
                r->best.dyn_segment = best.dyn_segment;
                r->best.dyn_params = best.dyn_params;
            }
        }
    }
    if (fclose(f) != 0 && !rc)
        rc = nc_error(err, errlen, NC_EIO, "%s: write failed", path);
    return rc;
}

int cmd_tune(int argc, char **argv)
{
    tune_args a = {.prefix = "tune", .bos_eos = true, .plot = true, .dyn_tokens = 20000};
    cacheopts_start(&a.co);
    int bad = parse_args(argc, argv, &a);
    if (!bad)
        bad = check_args(&a);
    if (bad) {
        args_free(&a);
        return bad < 0 ? 0 : bad;
    }
    char err[NC_ERRLEN], opt[512];
    tune_run r = {0};
    tokens_init(&r.toks);
    int rc = choose_stages(&a) ? nc_error(err, sizeof err, NC_ENOMEM, "grids") : NC_OK;
    if (!rc)
        rc = tune_prepare(&a, &r, err, sizeof err);
    double t0 = nc_now_s();
    if (!rc)
        rc = stage_static(&r, err, sizeof err);
    if (!rc && a.neural)
        rc = stage_neural(&r, err, sizeof err);
    if (!rc && a.co.p.unigram_size > 0)
        rc = stage_unigram(&r, err, sizeof err);
    if (!rc && a.co.p.unbounded)
        rc = stage_unbounded(&r, err, sizeof err);
    if (!rc && a.dyn)
        rc = stage_dyn(&r, err, sizeof err);
    if (!rc) {
        fprintf(stderr, "tune: %d grid points in %.1f s\n", r.t.npoints, nc_now_s() - t0);
        options_of(&r.best, opt, sizeof opt);
        printf("best all: options: %s\n", opt);
    }
    if (rc)
        fprintf(stderr, "neurocache tune: %s\n", err);
    run_free(&r);
    args_free(&a);
    return rc ? 1 : 0;
}
