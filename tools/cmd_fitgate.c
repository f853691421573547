/* cmd_fitgate.c -- `neurocache fit-gate`: fits the adaptive mixture's gate
 * (core/components/gate.h) on a validation text and writes it into the model directory.
 * One LSTM pass and one scoring pass (with the caches as given, constant λ)
 * collect each token's features and each component's probability of the
 * target; the gate is then fitted on those by L-BFGS (gate_fit). */
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
#include "stream.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: neurocache fit-gate --model DIR --valid FILE [cache options] [options]\n"
            "\n"
            "Fits the adaptive mixture's gate on FILE: per token, the weights of the\n"
            "components switched on by the cache options (model, --neural-size,\n"
            "--unigram-size, --unbounded, --open-vocab's uniform term) from features\n"
            "known before the next word (p_vocab's entropy and max, the neural cache's\n"
            "attention, the unbounded cache's distances and neighbour words), by\n"
            "maximising the mixture's log-likelihood, starting from the constant weights\n"
            "of the λ options given. With --unbounded it also fits the pre-search gate\n"
            "that skips the search (adaptive retrieval) and picks its threshold: the\n"
            "largest costing at most --max-loss of perplexity on FILE. Writes\n"
            "gate.safetensors, gate.json and gate-curve.csv (the learning curve) into the\n"
            "model directory (or --out DIR); then --gate uses it (score, eval, sessions).\n"
            "Fit on validation text, evaluate on other text. With --dyn-lr the model's\n"
            "probabilities are those of a session adapting its weights (dynamic\n"
            "evaluation, docs/dyneval.md), as the rows with --dyn-lr score.\n"
            "\n"
            "options:\n"
            "  --model DIR, --valid FILE  model directory, fitting text\n"
            "  --out DIR            where to write the gate (default: the model directory)\n"
            "  --bos eos|none       start state (default eos)\n"
            "  --iters N            L-BFGS iterations at most per gate (default 200)\n"
            "  --l2 X               L2 penalty on the feature weights (default 1e-4)\n"
            "  --max-loss X         skip threshold: relative perplexity it may cost (default 0.0025)\n"
            "  --hidden N           tanh hidden units beside the linear map (default 0, at most 32)\n"
            "  --seed N             draw of the hidden units' first weights (default 1)\n"
            "  -h, --help           this help\n"
            "\n%s\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n",
            cacheopts_help());
}

enum { OPT_MODEL = 1, OPT_VALID, OPT_OUT, OPT_BOS, OPT_ITERS, OPT_L2, OPT_MAXLOSS, OPT_HIDDEN, OPT_SEED, OPT_HELP };

/* The command line. */
typedef struct {
    struct option opts[CACHEOPTS_MAX];
    const char *model_dir, *valid, *out_dir;
    bool bos_eos;
    long iters, hidden, seed;
    double l2, max_loss;
    cacheopts co;
} fitgate_args;

/* One of the fitting options (--iters, --hidden, --seed, --l2, --max-loss)
 * into a; 0 or 2 (a bad value, said). */
static int fitgate_number_option(fitgate_args *a, int c, const char *arg)
{
    switch (c) {
    case OPT_ITERS:
        if (!co_parse_int(arg, 0, 100000, &a->iters)) {
            fprintf(stderr, "neurocache fit-gate: --iters must be an integer in [0, 100000], not '%s'\n", arg);
            return 2;
        }
        break;
    case OPT_HIDDEN:
        if (!co_parse_int(arg, 0, NC_GATE_MAXH, &a->hidden)) {
            fprintf(stderr, "neurocache fit-gate: --hidden must be an integer in [0, %d], not '%s'\n",
                    NC_GATE_MAXH, arg);
            return 2;
        }
        break;
    case OPT_SEED:
        if (!co_parse_int(arg, 0, 2147483647L, &a->seed)) {
            fprintf(stderr, "neurocache fit-gate: --seed must be an integer in [0, 2147483647], not '%s'\n",
                    arg);
            return 2;
        }
        break;
    case OPT_L2:
        if (!co_parse_float(arg, 0, 1e3, &a->l2)) {
            fprintf(stderr, "neurocache fit-gate: --l2 must be a number in [0, 1000], not '%s'\n", arg);
            return 2;
        }
        break;
    case OPT_MAXLOSS:
        if (!co_parse_float(arg, 0, 1, &a->max_loss)) {
            fprintf(stderr, "neurocache fit-gate: --max-loss must be a number in [0, 1], not '%s'\n", arg);
            return 2;
        }
        break;
    }
    return 0;
}

/* getopt over argv into a; -1 to go on, else the exit status. */
static int fitgate_getopt(fitgate_args *a, int argc, char **argv)
{
    static const struct option own[] = {
        {"model", required_argument, NULL, OPT_MODEL}, {"valid", required_argument, NULL, OPT_VALID},
        {"out", required_argument, NULL, OPT_OUT},     {"bos", required_argument, NULL, OPT_BOS},
        {"iters", required_argument, NULL, OPT_ITERS}, {"l2", required_argument, NULL, OPT_L2},
        {"max-loss", required_argument, NULL, OPT_MAXLOSS}, {"help", no_argument, NULL, OPT_HELP},
        {"hidden", required_argument, NULL, OPT_HIDDEN}, {"seed", required_argument, NULL, OPT_SEED},
        {NULL, 0, NULL, 0},
    };
    cacheopts_options(own, a->opts);
    a->bos_eos = true;
    a->iters = 200;
    a->seed = 1;
    a->l2 = 1e-4;
    a->max_loss = 0.0025;
    cacheopts_init(&a->co);
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", a->opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: a->model_dir = optarg; break;
        case OPT_VALID: a->valid = optarg; break;
        case OPT_OUT: a->out_dir = optarg; break;
        case OPT_BOS:
            if (strcmp(optarg, "eos") && strcmp(optarg, "none")) {
                fprintf(stderr, "neurocache fit-gate: --bos must be 'eos' or 'none', not '%s'\n", optarg);
                return 2;
            }
            a->bos_eos = !strcmp(optarg, "eos");
            break;
        case OPT_ITERS: case OPT_HIDDEN: case OPT_SEED: case OPT_L2: case OPT_MAXLOSS:
            if (fitgate_number_option(a, c, optarg))
                return 2;
            break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        case ':':
            return co_bad_option("fit-gate", a->opts, c, argv);
        default:
            switch (cacheopts_parse(&a->co, c, optarg, "fit-gate")) {
            case 1: continue;
            case -1: return 2;
            }
            return co_bad_option("fit-gate", a->opts, c, argv);
        }
    }
    return -1;
}

/* The whole command line, checked; -1 to go on, else the exit status. */
static int fitgate_parse_args(fitgate_args *a, int argc, char **argv)
{
    int rc = fitgate_getopt(a, argc, argv);
    if (rc >= 0)
        return rc;
    if (!a->model_dir || !a->valid || optind != argc) {
        return co_usage_error("fit-gate", "%s", !a->model_dir ? "--model DIR is required"
                                                : !a->valid   ? "--valid FILE is required"
                                                              : "unexpected argument (the file goes after --valid)");
    }
    if (cacheopts_given(&a->co, CO_KNOB_gate) || cacheopts_given(&a->co, CO_KNOB_gate_skip)) {
        fprintf(stderr, "neurocache fit-gate: --gate/--gate-skip use a gate; fit-gate fits one\n");
        return 2;
    }
    if (cacheopts_finish(&a->co, "fit-gate"))
        return 2;
    const nc_cache_params *p = &a->co.p;
    if (!cache_params_caches_on(p) && !(components_on(p) & ~(1u << NC_COMP_MODEL))) {   /* only the model */
        fprintf(stderr, "neurocache fit-gate: switch on at least one cache (--neural-size N, --unigram-size N, "
                        "--unbounded) for the gate to weigh\n");
        return 2;
    }
    return -1;
}

/* The fitting text's LSTM pass and the caches' statistics of each token
 * (the gate's features, each component's probability of the target). */
typedef struct {
    nc_tokens toks;
    nc_wordtable *words;
    nc_unbounded_cache *ub;
    nc_doc *d;
    double *lp;
    nc_gate_data gd;
    double ppl_const;    /* perplexity of the constant-λ mixture */
    size_t scored;
} fitgate_data;

static void fitgate_data_free(fitgate_data *s)
{
    free(s->lp);
    free(s->gd.f);
    free(s->gd.pc);
    doc_free(s->d);
    unbounded_cache_free(s->ub);
    wordtable_free(s->words);
    tokens_clear(&s->toks);
}

/* With dynamic evaluation on, the statistics come from one session through
 * the text (its weights adapting as in eval and the daemon), so that the gate
 * is fitted on the adapted model's predictions. */
static int fitgate_collect_dyn(fitgate_data *s, const fitgate_args *a, const nc_model *m, char *err,
                               size_t errlen)
{
    const size_t n = s->toks.n;
    if (n == 0)
        return nc_error(err, errlen, NC_EINVAL, "%s: no tokens to fit on", a->valid);
    s->lp = malloc(n * sizeof(double));
    s->gd.n = n;
    s->gd.f = malloc(n * NC_GATE_NFEAT * sizeof(double));
    s->gd.pc = malloc(n * NC_NCOMP * sizeof(double));
    if (!s->lp || !s->gd.f || !s->gd.pc)
        return nc_error(err, errlen, NC_ENOMEM, "statistics of %zu tokens", n);
    double t0 = nc_now_s();
    nc_stream *st = NULL;
    int rc = stream_new(m, &a->co.p, s->ub, s->words, a->bos_eos, &st, err, errlen);
    if (!rc) {
        stream_gate_sink(st, s->gd.f, s->gd.pc);
        int blas = co_search_begin(&a->co);
        rc = stream_feed(st, &s->toks, s->ub != NULL, s->lp, err, errlen);
        co_search_end(blas);
    }
    stream_free(st);
    if (!rc) {
        s->ppl_const = co_ppl(s->lp, n, &s->scored);
        fprintf(stderr, "fit-gate: %zu tokens through a session with dynamic evaluation, %.1f s\n", n,
                nc_now_s() - t0);
    }
    return rc;
}

/* Reads the fitting text, runs the LSTM and the constant-λ scoring pass
 * that collects the statistics, once. */
static int fitgate_collect(fitgate_data *s, const fitgate_args *a, const nc_model *m, char *err, size_t errlen)
{
    const nc_cache_params *p = &a->co.p;
    int rc = co_read_tokens(m, a->valid, &s->toks, err, errlen);
    if (!rc && p->open_vocab)
        rc = wordtable_new(m->vocab, &s->words, err, errlen);
    if (!rc && p->unbounded)
        rc = cacheopts_make_ub(&(co_ub_spec){&a->co, p, m, s->words, true}, &s->ub, err, errlen);
    if (!rc && p->dyn_lr > 0.0f)
        return fitgate_collect_dyn(s, a, m, err, errlen);
    double t0 = nc_now_s();
    if (!rc)
        rc = co_prepare_ex(&(co_text){m, &s->toks, a->bos_eos, s->words}, true, &s->d, err, errlen);
    if (!rc && s->d->n <= s->d->first)
        rc = nc_error(err, errlen, NC_EINVAL, "%s: no tokens to fit on", a->valid);
    if (!rc) {
        size_t n = s->d->n;
        fprintf(stderr, "fit-gate: %zu tokens, LSTM pass %.1f s\n", n - s->d->first, nc_now_s() - t0);
        s->lp = malloc(n * sizeof(double));
        s->gd.n = n;
        s->gd.f = malloc(n * NC_GATE_NFEAT * sizeof(double));
        s->gd.pc = malloc(n * NC_NCOMP * sizeof(double));
        if (!s->lp || !s->gd.f || !s->gd.pc)
            rc = nc_error(err, errlen, NC_ENOMEM, "statistics of %zu tokens", n);
    }
    /* the caches' statistics, once: the constant-λ scoring pass */
    t0 = nc_now_s();
    if (!rc) {
        nc_doc_caches dc = {.ub = s->ub, .adapt = s->ub != NULL, .gate_f = s->gd.f, .gate_pc = s->gd.pc};
        int blas = co_search_begin(&a->co);
        rc = doc_score(s->d, p, &dc, s->lp, err, errlen);
        co_search_end(blas);
    }
    if (!rc) {
        s->ppl_const = co_ppl(s->lp, s->d->n, &s->scored);
        fprintf(stderr, "fit-gate: caches' statistics %.1f s\n", nc_now_s() - t0);
    }
    return rc;
}

/* Fits the gate on the statistics, writing the learning curve to
 * DIR/gate-curve.csv; *t_fit: its seconds. */
static int fitgate_fit(nc_gate *g, const fitgate_args *a, fitgate_data *s, double *t_fit, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/gate-curve.csv", a->out_dir ? a->out_dir : a->model_dir);
    FILE *curve = fopen(path, "w");
    if (!curve)
        return nc_error(err, errlen, NC_EIO, "%s: cannot write", path);
    fprintf(curve, "gate,iter,objective,exp_objective\n");
    double t0 = nc_now_s();
    nc_gate_fit_opts o = {.hidden = (int)a->hidden, .seed = (uint64_t)a->seed, .iters = (int)a->iters, .l2 = a->l2,
                          .max_loss = a->max_loss, .curve = curve};
    int rc = gate_fit(g, &a->co.p, &s->gd, &o, err, errlen);
    *t_fit = nc_now_s() - t0;
    if (fclose(curve) != 0 && !rc)
        rc = nc_error(err, errlen, NC_EIO, "%s: write failed", path);
    return rc;
}

/* Prints the fitted gate's perplexities and size, and saves it. */
static int fitgate_report_save(const nc_gate *g, const fitgate_args *a, const fitgate_data *s, double t_fit,
                               char *err, size_t errlen)
{
    char info[1024], desc[512];
    size_t used = 0;
    double nll0 = gate_objective(g, false, &s->gd, 0.0, NULL, &used);
    double sk = 0, ppl_gate = exp(nll0), ppl_skip = gate_data_ppl(g, &s->gd, g->skip, &sk);
    double ppl_const = s->ppl_const;
    int ncomp = 0;
    for (int k = 0; k < NC_NCOMP; k++)
        ncomp += (g->comps >> k) & 1u;
    cache_params_describe(&a->co.p, desc, sizeof desc);
    printf("constant: perplexity %.3f (%s)\n", ppl_const, desc);
    printf("gate: perplexity %.3f (%+.2f%%) on the %zu tokens with every component present\n", ppl_gate,
           100.0 * (ppl_gate / ppl_const - 1.0), used);
    int np = (ncomp - 1) * (NC_GATE_NW + g->nh) + g->nh * NC_GATE_NW;
    printf("gate: %d components, %d features + bias, %d hidden units: %d parameters per gate (model row "
           "fixed at 0; the pre-search gate as many), fit %.2f s\n",
           ncomp, NC_GATE_NFEAT, g->nh, np, t_fit);
    if (gate_searches(g))
        printf("adaptive retrieval: threshold %.4g skips %.1f%% of the searches, perplexity %.3f (%+.2f%% "
               "against the gate always searching)\n",
               g->skip, 100.0 * sk, ppl_skip, 100.0 * (ppl_skip / ppl_gate - 1.0));
    snprintf(info, sizeof info, "neurocache fit-gate on %s (%zu tokens), %s: constant %.3f, gate %.3f, "
             "fit %.2f s", a->valid, s->scored, desc, ppl_const, ppl_gate, t_fit);
    const char *dir = a->out_dir ? a->out_dir : a->model_dir;
    int rc = gate_save(g, dir, info, err, errlen);
    if (!rc)
        fprintf(stderr, "fit-gate: wrote %s/gate.safetensors, gate.json, gate-curve.csv\n", dir);
    return rc;
}

int cmd_fit_gate(int argc, char **argv)
{
    static fitgate_args a;
    memset(&a, 0, sizeof a);
    int st = fitgate_parse_args(&a, argc, argv);
    if (st >= 0)
        return st;
    char err[NC_ERRLEN];
    nc_model *m = NULL;
    fitgate_data s = {.ppl_const = NAN};
    tokens_init(&s.toks);
    nc_gate g;
    double t_fit = 0;
    int rc = model_load(a.model_dir, &m, err, sizeof err);
    if (!rc)
        rc = fitgate_collect(&s, &a, m, err, sizeof err);
    if (!rc)
        rc = fitgate_fit(&g, &a, &s, &t_fit, err, sizeof err);
    if (!rc)
        rc = fitgate_report_save(&g, &a, &s, t_fit, err, sizeof err);
    if (rc)
        fprintf(stderr, "neurocache fit-gate: %s\n", err);
    fitgate_data_free(&s);
    model_free(m);
    return rc ? 1 : 0;
}
