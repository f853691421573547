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
            "(--neural-cache N, --unigram-cache N, --unbounded); with none, the neural cache\n"
            "with N=2000. The other knobs (--knn, --nprobe, --kernel, --open-vocab, ...) are\n"
            "fixed as given. Prints each stage's best options, writes the grids as CSV and\n"
            "the theta x lambda perplexities as a heat map (gnuplot PNG). With --gate every\n"
            "point is weighed by the model's gate (fit-gate): the lambdas then have no\n"
            "effect, theta, N and k still do.\n"
            "\n"
            "grid options (comma lists):\n"
            "  --thetas LIST              default 0,0.1,0.2,0.3,0.4,0.5,0.7,1,1.5,2\n"
            "  --lambdas LIST             default 0.02,0.05,0.1,0.15,0.2,0.25,0.3,0.4,0.5\n"
            "  --alphas LIST              default -8,-6,-4,-3,-2,-1,0,1,2\n"
            "  --unigram-lambdas LIST     default 0.01,0.02,0.05,0.1,0.15,0.2,0.3\n"
            "  --unbounded-lambdas LIST   default 0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9\n"
            "other options:\n"
            "  --model DIR, --valid FILE  model directory, validation text\n"
            "  --bos eos|none             start state (default eos)\n"
            "  --out PREFIX               PREFIX-neural.csv, PREFIX.png, PREFIX-unbounded.csv,\n"
            "                             PREFIX-unigram.csv (default tune)\n"
            "  --no-plot                  no PNG\n"
            "  -h, --help                 this help\n"
            "\n%s\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n",
            cacheopts_help());
}

enum { OPT_MODEL = 1, OPT_VALID, OPT_BOS, OPT_THETAS, OPT_LAMBDAS, OPT_ALPHAS, OPT_ULAMBDAS, OPT_UBLAMBDAS,
       OPT_OUT, OPT_NOPLOT, OPT_HELP };

typedef struct {
    const nc_doc *d;
    double *lp;
    const float *pre_d2;
    const int *pre_w;
    nc_ubcache *ub;
    int npoints;
} tune_ctx;

static int point(tune_ctx *t, const nc_cache_params *p, double *ppl, char *err, size_t errlen)
{
    nc_doc_caches dc = {.ub = t->ub, .pre_d2 = t->pre_d2, .pre_words = t->pre_w};
    int rc = doc_score(t->d, p, p->unbounded ? &dc : NULL, 0, t->lp, err, errlen);
    *ppl = rc ? NAN : co_ppl(t->lp, t->d->n, NULL);
    t->npoints++;
    return rc;
}

static int parse_grid(const char *opt, const char *arg, double lo, double hi, double **out, int *n)
{
    free(*out);
    *n = co_parse_list(arg, out);
    for (int i = 0; *n > 0 && i < *n; i++)
        if (!isfinite((*out)[i]) || (*out)[i] < lo || (*out)[i] > hi) {
            fprintf(stderr, "neurocache tune: --%s: %g out of range [%g, %g]\n", opt, (*out)[i], lo, hi);
            return 2;
        }
    if (*n <= 0) {
        fprintf(stderr, "neurocache tune: --%s: bad list '%s'\n", opt, arg);
        return 2;
    }
    return 0;
}

static void options_of(const nc_cache_params *p, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
#define ADD(...) do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    if (p->neural_size > 0) {
        ADD("--neural-cache %d --theta %g ", p->neural_size, (double)p->neural_theta);
        if (p->global_norm)
            ADD("--global-norm --alpha %g ", (double)p->neural_alpha);
        else
            ADD("--lambda %g ", (double)p->neural_lambda);
    }
    if (p->unigram_size > 0)
        ADD("--unigram-cache %d --unigram-lambda %g ", p->unigram_size, (double)p->unigram_lambda);
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
    if (p->gate) {
        ADD("--gate ");
        if (p->gate_skip >= 0.0f && p->unbounded)
            ADD("--gate-skip %g ", (double)p->gate_skip);
    }
    if (o > 0 && o < len)
        buf[o - 1] = '\0';
#undef ADD
}

int cmd_tune(int argc, char **argv)
{
    static const struct option opts[] = {
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
        {"help", no_argument, NULL, OPT_HELP},
        CACHEOPTS_LONG,
        {NULL, 0, NULL, 0},
    };
    static const double d_thetas[] = {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1, 1.5, 2};
    static const double d_lambdas[] = {0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5};
    static const double d_alphas[] = {-8, -6, -4, -3, -2, -1, 0, 1, 2};
    static const double d_ul[] = {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3};
    static const double d_ubl[] = {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9};
    double *thetas = NULL, *lambdas = NULL, *ul = NULL, *ubl = NULL;
    int nth = 0, nla = 0, nul = 0, nubl = 0;
    bool lambdas_are_alphas = false, alphas_given = false, lambdas_given = false, plot = true;
    const char *model_dir = NULL, *valid = NULL, *prefix = "tune";
    bool bos_eos = true;
    cacheopts co;
    cacheopts_init(&co);
    int c, bad = 0;
    opterr = 0;
    optind = 1;
    while (!bad && (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: model_dir = optarg; break;
        case OPT_VALID: valid = optarg; break;
        case OPT_OUT: prefix = optarg; break;
        case OPT_NOPLOT: plot = false; break;
        case OPT_BOS:
            if (strcmp(optarg, "eos") && strcmp(optarg, "none")) {
                fprintf(stderr, "neurocache tune: --bos must be 'eos' or 'none', not '%s'\n", optarg);
                bad = 2;
            }
            bos_eos = !strcmp(optarg, "eos");
            break;
        case OPT_THETAS: bad = parse_grid("thetas", optarg, 0, 1e4, &thetas, &nth); break;
        case OPT_LAMBDAS:
            lambdas_given = true;
            bad = parse_grid("lambdas", optarg, 0, 1, &lambdas, &nla);
            break;
        case OPT_ALPHAS:
            alphas_given = true;
            bad = parse_grid("alphas", optarg, -100, 100, &lambdas, &nla);
            break;
        case OPT_ULAMBDAS: bad = parse_grid("unigram-lambdas", optarg, 0, 1, &ul, &nul); break;
        case OPT_UBLAMBDAS: bad = parse_grid("unbounded-lambdas", optarg, 0, 1, &ubl, &nubl); break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        case ':':
            fprintf(stderr, "neurocache tune: option '%s' needs a value\n", argv[optind - 1]);
            bad = 2;
            break;
        default:
            switch (cacheopts_parse(&co, c, optarg, "tune")) {
            case 1: continue;
            case -1: bad = 2; continue;
            }
            fprintf(stderr, "neurocache tune: unknown option '%s'\n(see 'neurocache tune --help')\n",
                    argv[optind - 1]);
            bad = 2;
        }
    }
    nc_cache_params *g = &co.p;
    if (!bad && (!model_dir || !valid || optind != argc)) {
        fprintf(stderr, "neurocache tune: %s\n\n", !model_dir ? "--model DIR is required"
                                                   : !valid   ? "--valid FILE is required"
                                                              : "unexpected argument (the file goes after --valid)");
        usage(stderr);
        bad = 2;
    }
    /* the grids replace the single values: --theta/--lambda/--alpha are errors here */
    if (!bad && (cacheopts_given(&co, CO_KNOB_neural_theta) || cacheopts_given(&co, CO_KNOB_neural_lambda) ||
                 cacheopts_given(&co, CO_KNOB_neural_alpha) || cacheopts_given(&co, CO_KNOB_unigram_lambda) ||
                 cacheopts_given(&co, CO_KNOB_unbounded_lambda))) {
        fprintf(stderr, "neurocache tune: give grids (--thetas, --lambdas, --alphas, --unigram-lambdas, "
                        "--unbounded-lambdas), not single values\n");
        bad = 2;
    }
    if (!bad && alphas_given && lambdas_given) {
        fprintf(stderr, "neurocache tune: --lambdas (linear interpolation) and --alphas (--global-norm) "
                        "exclude each other\n");
        bad = 2;
    }
    if (!bad && alphas_given && !g->global_norm) {
        fprintf(stderr, "neurocache tune: --alphas needs --global-norm\n");
        bad = 2;
    }
    if (!bad && lambdas_given && g->global_norm) {
        fprintf(stderr, "neurocache tune: --lambdas is for linear interpolation; with --global-norm use --alphas\n");
        bad = 2;
    }
    if (!bad && nubl && !g->unbounded) {
        fprintf(stderr, "neurocache tune: --unbounded-lambdas needs --unbounded\n");
        bad = 2;
    }
    if (!bad && nul && g->unigram_size == 0) {
        fprintf(stderr, "neurocache tune: --unigram-lambdas needs --unigram-cache N\n");
        bad = 2;
    }
    if (!bad && (thetas || lambdas) && g->neural_size == 0 && (g->unigram_size > 0 || g->unbounded)) {
        fprintf(stderr, "neurocache tune: --thetas/--lambdas/--alphas need --neural-cache N\n");
        bad = 2;
    }
    if (!bad && cacheopts_finish(&co, "tune"))
        bad = 2;
    if (bad) {
        free(thetas);
        free(lambdas);
        free(ul);
        free(ubl);
        return bad;
    }
    bool neural = g->neural_size > 0 || (g->unigram_size == 0 && !g->unbounded);
    if (neural && g->neural_size == 0)
        g->neural_size = 2000;
    lambdas_are_alphas = g->global_norm;
#define DEFAULT(arr, n, d) do { if (!arr) { n = (int)(sizeof d / sizeof *d); arr = malloc(sizeof d); \
        if (arr) memcpy(arr, d, sizeof d); } } while (0)
    DEFAULT(thetas, nth, d_thetas);
    if (lambdas_are_alphas)
        DEFAULT(lambdas, nla, d_alphas);
    else
        DEFAULT(lambdas, nla, d_lambdas);
    DEFAULT(ul, nul, d_ul);
    DEFAULT(ubl, nubl, d_ubl);
#undef DEFAULT

    char err[NC_ERRLEN], path[1200], opt[512];
    nc_model *m = NULL;
    nc_tokens toks;
    tokens_init(&toks);
    nc_wordtable *words = NULL;
    nc_ubcache *ub = NULL;
    nc_doc *d = NULL;
    float *nd2 = NULL;
    int *nw = NULL;
    double *lp = NULL, *grid = NULL;
    tune_ctx t = {0};
    FILE *f = NULL;
    int rc = (!thetas || !lambdas || !ul || !ubl) ? nc_error(err, sizeof err, NC_ENOMEM, "grids") : NC_OK;
    if (!rc)
        rc = model_load(model_dir, &m, err, sizeof err);
    if (!rc)
        rc = co_read_tokens(m, valid, &toks, err, sizeof err);
    if (!rc && g->open_vocab)
        rc = wordtable_new(m->vocab, &words, err, sizeof err);
    if (!rc && g->unbounded)
        rc = cacheopts_make_ub(&co, g, m, words, &ub, err, sizeof err);
    if (!rc && ub && co.memory_path)
        rc = cacheopts_fill_memory(m, co.memory_path, words, ub, true, err, sizeof err);
    double t0 = co_now();
    if (!rc)
        rc = co_prepare(m, &toks, bos_eos, words, &d, err, sizeof err);
    if (!rc && d->n <= d->first)
        rc = nc_error(err, sizeof err, NC_EINVAL, "%s: no tokens to score", valid);
    if (!rc) {
        fprintf(stderr, "tune: %zu tokens, LSTM pass %.1f s\n", d->n - d->first, co_now() - t0);
        lp = malloc(d->n * sizeof(double));
        grid = malloc((size_t)nth * (size_t)nla * sizeof(double));
        if (!lp || !grid)
            rc = nc_error(err, sizeof err, NC_ENOMEM, "scores");
    }
    if (!rc && ub) {
        nd2 = malloc(d->n * (size_t)g->knn * sizeof(float));
        nw = malloc(d->n * (size_t)g->knn * sizeof(int));
        if (!nd2 || !nw)
            rc = nc_error(err, sizeof err, NC_ENOMEM, "neighbours (%zu x %d)", d->n, g->knn);
        t0 = co_now();
        int blas = co_search_begin(&co);
        if (!rc)
            rc = doc_neighbours(d, g, ub, true, 0, nd2, nw, err, sizeof err);
        co_search_end(blas);
        if (!rc)
            fprintf(stderr, "tune: unbounded search (k=%d, %s) %.1f s\n", g->knn,
                    ubcache_is_exact(ub) ? "exact" : "IVF", co_now() - t0);
    }
    t = (tune_ctx){.d = d, .lp = lp, .pre_d2 = nd2, .pre_w = nw, .ub = ub};
    nc_cache_params st = *g, best_neural, best = *g;
    st.neural_size = st.unigram_size = 0;
    st.unbounded = st.global_norm = st.neural_f16 = st.exact = false;
    double ppl_static = NAN;
    t0 = co_now();
    if (!rc && (rc = point(&t, &st, &ppl_static, err, sizeof err)) == NC_OK)
        printf("static: perplexity %.3f\n", ppl_static);

    /* stage 1: neural theta x lambda (or alpha) */
    if (!rc && neural) {
        nc_cache_params p = st;
        p.neural_size = g->neural_size;
        p.global_norm = g->global_norm;
        p.neural_f16 = g->neural_f16;
        best_neural = p;
        double bp = INFINITY;
        for (int i = 0; !rc && i < nth; i++)
            for (int j = 0; !rc && j < nla; j++) {
                p.neural_theta = (float)thetas[i];
                if (lambdas_are_alphas)
                    p.neural_alpha = (float)lambdas[j];
                else
                    p.neural_lambda = (float)lambdas[j];
                double v;
                rc = point(&t, &p, &v, err, sizeof err);
                grid[i * nla + j] = v;
                if (!rc && v < bp) {
                    bp = v;
                    best_neural = p;
                }
            }
        if (!rc) {
            options_of(&best_neural, opt, sizeof opt);
            printf("best neural: perplexity %.3f (%+.1f%%) options: %s\n", bp, 100.0 * (bp / ppl_static - 1), opt);
            snprintf(path, sizeof path, "%s-neural.csv", prefix);
            f = fopen(path, "w");
            if (!f)
                rc = nc_error(err, sizeof err, NC_EIO, "%s: cannot write", path);
        }
        if (!rc) {
            const char *ln = lambdas_are_alphas ? "alpha" : "lambda";
            fprintf(f, "theta,%s,ppl\n", ln);
            for (int i = 0; i < nth; i++)
                for (int j = 0; j < nla; j++)
                    fprintf(f, "%g,%g,%.6f\n", thetas[i], lambdas[j], grid[i * nla + j]);
            if (fclose(f) != 0)
                rc = nc_error(err, sizeof err, NC_EIO, "%s: write failed", path);
            f = NULL;
            if (!rc && plot) {
                /* pm3d map: works for uneven grids (rows separated by blank lines) */
                snprintf(path, sizeof path, "%s-neural.dat", prefix);
                FILE *dat = fopen(path, "w");
                if (!dat)
                    rc = nc_error(err, sizeof err, NC_EIO, "%s: cannot write", path);
                for (int i = 0; dat && i < nth; i++) {
                    for (int j = 0; j < nla; j++)
                        fprintf(dat, "%g %g %.6f\n", thetas[i], lambdas[j], grid[i * nla + j]);
                    fprintf(dat, "\n");
                }
                if (dat)
                    fclose(dat);
                char script[3000];
                snprintf(script, sizeof script,
                         "set terminal pngcairo size 800,600\nset output '%s.png'\n"
                         "set title 'neural cache N=%d%s: best %.2f at theta %g, %s %g (static %.2f)' noenhanced\n"
                         "set xlabel 'theta'\nset ylabel '%s'\nset view map\nset pm3d at b corners2color c1\n"
                         "set palette rgbformulae 22,13,-31\nunset surface\nset cblabel 'perplexity'\n"
                         "splot '%s' using 1:2:3 with pm3d notitle\n",
                         prefix, g->neural_size, lambdas_are_alphas ? " global" : "", bp,
                         (double)best_neural.neural_theta, ln,
                         lambdas_are_alphas ? (double)best_neural.neural_alpha : (double)best_neural.neural_lambda,
                         ppl_static, ln, path);
                if (!rc)
                    rc = co_gnuplot(script, err, sizeof err);
                unlink(path);
                if (!rc)
                    fprintf(stderr, "tune: wrote %s.png\n", prefix);
            }
        }
        best.neural_size = best_neural.neural_size;
        best.neural_theta = best_neural.neural_theta;
        best.neural_lambda = best_neural.neural_lambda;
        best.neural_alpha = best_neural.neural_alpha;
    }
    /* stage 2: unigram lambda (alone) */
    if (!rc && g->unigram_size > 0) {
        nc_cache_params p = st, bu = st;
        p.unigram_size = g->unigram_size;
        double bp = INFINITY;
        snprintf(path, sizeof path, "%s-unigram.csv", prefix);
        f = fopen(path, "w");
        if (!f)
            rc = nc_error(err, sizeof err, NC_EIO, "%s: cannot write", path);
        else
            fprintf(f, "unigram_lambda,ppl\n");
        for (int i = 0; !rc && i < nul; i++) {
            p.unigram_lambda = (float)ul[i];
            double v;
            rc = point(&t, &p, &v, err, sizeof err);
            fprintf(f, "%g,%.6f\n", ul[i], v);
            if (!rc && v < bp) {
                bp = v;
                bu = p;
            }
        }
        if (f && fclose(f) != 0 && !rc)
            rc = nc_error(err, sizeof err, NC_EIO, "%s: write failed", path);
        f = NULL;
        if (!rc) {
            options_of(&bu, opt, sizeof opt);
            printf("best unigram: perplexity %.3f (%+.1f%%) options: %s\n", bp, 100.0 * (bp / ppl_static - 1), opt);
        }
        best.unigram_lambda = bu.unigram_lambda;
    }
    /* stage 3: unbounded lambda, alone and on top of the neural cache at its
     * best theta, jointly with the neural lambda (or alpha): with the
     * unbounded cache beside it the neural cache's best weight is lower
     * (War and Peace: 0.3 instead of 0.4, BENCHMARKS.md) */
    if (!rc && g->unbounded) {
        snprintf(path, sizeof path, "%s-unbounded.csv", prefix);
        f = fopen(path, "w");
        if (!f)
            rc = nc_error(err, sizeof err, NC_EIO, "%s: cannot write", path);
        else
            fprintf(f, "with,neural_%s,unbounded_lambda,ppl\n", lambdas_are_alphas ? "alpha" : "lambda");
        for (int pass = 0; !rc && pass < (neural ? 2 : 1); pass++) {
            nc_cache_params p = pass ? best_neural : st, bu;
            p.unbounded = true;
            p.knn = g->knn;
            p.nprobe = g->nprobe;
            p.kernel = g->kernel;
            p.exact = g->exact;
            bu = p;
            double bp = INFINITY;
            for (int j = 0; !rc && j < (pass ? nla : 1); j++) {
                double nl = NAN;
                if (pass) {
                    nl = lambdas[j];
                    if (lambdas_are_alphas)
                        p.neural_alpha = (float)nl;
                    else
                        p.neural_lambda = (float)nl;
                }
                for (int i = 0; !rc && i < nubl; i++) {
                    p.unbounded_lambda = (float)ubl[i];
                    double v;
                    rc = point(&t, &p, &v, err, sizeof err);
                    if (pass)
                        fprintf(f, "neural,%g,%g,%.6f\n", nl, ubl[i], v);
                    else
                        fprintf(f, "static,,%g,%.6f\n", ubl[i], v);
                    if (!rc && v < bp) {
                        bp = v;
                        bu = p;
                    }
                }
            }
            if (!rc) {
                options_of(&bu, opt, sizeof opt);
                printf("best %s: perplexity %.3f (%+.1f%%) options: %s\n", pass ? "neural+unbounded" : "unbounded",
                       bp, 100.0 * (bp / ppl_static - 1), opt);
                if (pass || !neural)
                    best.unbounded_lambda = bu.unbounded_lambda;
                if (pass) {
                    best.neural_lambda = bu.neural_lambda;
                    best.neural_alpha = bu.neural_alpha;
                }
            }
        }
        if (f && fclose(f) != 0 && !rc)
            rc = nc_error(err, sizeof err, NC_EIO, "%s: write failed", path);
        f = NULL;
    }
    if (!rc) {
        fprintf(stderr, "tune: %d grid points in %.1f s\n", t.npoints, co_now() - t0);
        options_of(&best, opt, sizeof opt);
        printf("best all: options: %s\n", opt);
    }
    if (rc)
        fprintf(stderr, "neurocache tune: %s\n", err);
    if (f)
        fclose(f);
    free(thetas);
    free(lambdas);
    free(ul);
    free(ubl);
    free(lp);
    free(grid);
    free(nd2);
    free(nw);
    doc_free(d);
    ubcache_free(ub);
    wordtable_free(words);
    tokens_clear(&toks);
    model_free(m);
    return rc ? 1 : 0;
}
