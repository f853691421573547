/* cmd_fitgate.c -- `neurocache fit-gate`: fits the adaptive mixture's gate
 * (core/gate.h) on a validation text and writes it into the model directory.
 * One LSTM pass and one scoring pass (with the caches as given, constant λ)
 * collect each token's features and each component's probability of the
 * target; the gate is then fitted on those by L-BFGS (gate_fit). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheopts.h"
#include "commands.h"
#include "gate.h"

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
            "Fit on validation text, evaluate on other text.\n"
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

int cmd_fit_gate(int argc, char **argv)
{
    static const struct option own[] = {
        {"model", required_argument, NULL, OPT_MODEL}, {"valid", required_argument, NULL, OPT_VALID},
        {"out", required_argument, NULL, OPT_OUT},     {"bos", required_argument, NULL, OPT_BOS},
        {"iters", required_argument, NULL, OPT_ITERS}, {"l2", required_argument, NULL, OPT_L2},
        {"max-loss", required_argument, NULL, OPT_MAXLOSS}, {"help", no_argument, NULL, OPT_HELP},
        {"hidden", required_argument, NULL, OPT_HIDDEN}, {"seed", required_argument, NULL, OPT_SEED},
        {NULL, 0, NULL, 0},
    };
    struct option opts[CACHEOPTS_MAX];
    cacheopts_options(own, opts);
    const char *model_dir = NULL, *valid = NULL, *out_dir = NULL;
    bool bos_eos = true;
    long iters = 200, hidden = 0, seed = 1;
    double l2 = 1e-4, max_loss = 0.0025;
    cacheopts co;
    cacheopts_init(&co);
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: model_dir = optarg; break;
        case OPT_VALID: valid = optarg; break;
        case OPT_OUT: out_dir = optarg; break;
        case OPT_BOS:
            if (strcmp(optarg, "eos") && strcmp(optarg, "none")) {
                fprintf(stderr, "neurocache fit-gate: --bos must be 'eos' or 'none', not '%s'\n", optarg);
                return 2;
            }
            bos_eos = !strcmp(optarg, "eos");
            break;
        case OPT_ITERS:
            if (!co_parse_int(optarg, 0, 100000, &iters)) {
                fprintf(stderr, "neurocache fit-gate: --iters must be an integer in [0, 100000], not '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_HIDDEN:
            if (!co_parse_int(optarg, 0, NC_GATE_MAXH, &hidden)) {
                fprintf(stderr, "neurocache fit-gate: --hidden must be an integer in [0, %d], not '%s'\n",
                        NC_GATE_MAXH, optarg);
                return 2;
            }
            break;
        case OPT_SEED:
            if (!co_parse_int(optarg, 0, 2147483647L, &seed)) {
                fprintf(stderr, "neurocache fit-gate: --seed must be an integer in [0, 2147483647], not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_L2:
            if (!co_parse_float(optarg, 0, 1e3, &l2)) {
                fprintf(stderr, "neurocache fit-gate: --l2 must be a number in [0, 1000], not '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_MAXLOSS:
            if (!co_parse_float(optarg, 0, 1, &max_loss)) {
                fprintf(stderr, "neurocache fit-gate: --max-loss must be a number in [0, 1], not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        case ':':
            return co_bad_option("fit-gate", opts, c, argv);
        default:
            switch (cacheopts_parse(&co, c, optarg, "fit-gate")) {
            case 1: continue;
            case -1: return 2;
            }
            return co_bad_option("fit-gate", opts, c, argv);
        }
    }
    if (!model_dir || !valid || optind != argc) {
        return co_usage_error("fit-gate", "%s", !model_dir ? "--model DIR is required"
                                                : !valid   ? "--valid FILE is required"
                                                           : "unexpected argument (the file goes after --valid)");
    }
    if (cacheopts_given(&co, CO_KNOB_gate) || cacheopts_given(&co, CO_KNOB_gate_skip)) {
        fprintf(stderr, "neurocache fit-gate: --gate/--gate-skip use a gate; fit-gate fits one\n");
        return 2;
    }
    if (cacheopts_finish(&co, "fit-gate"))
        return 2;
    nc_cache_params *p = &co.p;
    if (p->neural_size == 0 && p->unigram_size == 0 && !p->unbounded && !(p->open_vocab && p->uniform_mu > 0)) {
        fprintf(stderr, "neurocache fit-gate: switch on at least one cache (--neural-size N, --unigram-size N, "
                        "--unbounded) for the gate to weigh\n");
        return 2;
    }

    char err[NC_ERRLEN], path[1200], info[1024], desc[512];
    nc_model *m = NULL;
    nc_tokens toks;
    tokens_init(&toks);
    nc_wordtable *words = NULL;
    nc_unbounded_cache *ub = NULL;
    nc_doc *d = NULL;
    double *lp = NULL;
    nc_gate_data gd = {0};
    nc_gate g;
    FILE *curve = NULL;
    int rc = model_load(model_dir, &m, err, sizeof err);
    if (!rc)
        rc = co_read_tokens(m, valid, &toks, err, sizeof err);
    if (!rc && p->open_vocab)
        rc = wordtable_new(m->vocab, &words, err, sizeof err);
    if (!rc && p->unbounded)
        rc = cacheopts_make_ub(&co, p, m, words, &ub, err, sizeof err);
    if (!rc && ub && co.memory_path)
        rc = cacheopts_fill_memory(m, co.memory_path, words, ub, true, err, sizeof err);
    double t0 = co_now();
    if (!rc)
        rc = co_prepare_ex(m, &toks, bos_eos, words, true, &d, err, sizeof err);
    if (!rc && d->n <= d->first)
        rc = nc_error(err, sizeof err, NC_EINVAL, "%s: no tokens to fit on", valid);
    if (!rc) {
        fprintf(stderr, "fit-gate: %zu tokens, LSTM pass %.1f s\n", d->n - d->first, co_now() - t0);
        lp = malloc(d->n * sizeof(double));
        gd.n = d->n;
        gd.f = malloc(d->n * NC_GATE_NFEAT * sizeof(double));
        gd.pc = malloc(d->n * NC_NCOMP * sizeof(double));
        if (!lp || !gd.f || !gd.pc)
            rc = nc_error(err, sizeof err, NC_ENOMEM, "statistics of %zu tokens", d->n);
    }
    /* the caches' statistics, once: the constant-λ scoring pass */
    t0 = co_now();
    if (!rc) {
        nc_doc_caches dc = {.ub = ub, .adapt = ub != NULL, .gate_f = gd.f, .gate_pc = gd.pc};
        int blas = co_search_begin(&co);
        rc = doc_score(d, p, &dc, 0, lp, err, sizeof err);
        co_search_end(blas);
    }
    double ppl_const = NAN, t_stats = co_now() - t0, t_fit = 0;
    size_t scored = 0;
    if (!rc) {
        ppl_const = co_ppl(lp, d->n, &scored);
        fprintf(stderr, "fit-gate: caches' statistics %.1f s\n", t_stats);
        snprintf(path, sizeof path, "%s/gate-curve.csv", out_dir ? out_dir : model_dir);
        curve = fopen(path, "w");
        if (!curve)
            rc = nc_error(err, sizeof err, NC_EIO, "%s: cannot write", path);
        else
            fprintf(curve, "gate,iter,objective,exp_objective\n");
    }
    if (!rc) {
        t0 = co_now();
        rc = gate_fit(&g, p, &gd, (int)hidden, (uint64_t)seed, (int)iters, l2, max_loss, curve, err, sizeof err);
        t_fit = co_now() - t0;
    }
    if (curve && fclose(curve) != 0 && !rc)
        rc = nc_error(err, sizeof err, NC_EIO, "%s: write failed", path);
    if (!rc) {
        size_t used = 0;
        double nll0 = gate_objective(&g, false, &gd, 0.0, NULL, &used);
        double sk = 0, ppl_gate = exp(nll0), ppl_skip = gate_data_ppl(&g, &gd, g.skip, &sk);
        int ncomp = 0;
        for (int k = 0; k < NC_NCOMP; k++)
            ncomp += (g.comps >> k) & 1u;
        cache_params_describe(p, desc, sizeof desc);
        printf("constant: perplexity %.3f (%s)\n", ppl_const, desc);
        printf("gate: perplexity %.3f (%+.2f%%) on the %zu tokens with every component present\n", ppl_gate,
               100.0 * (ppl_gate / ppl_const - 1.0), used);
        int np = (ncomp - 1) * (NC_GATE_NW + g.nh) + g.nh * NC_GATE_NW;
        printf("gate: %d components, %d features + bias, %d hidden units: %d parameters per gate (model row "
               "fixed at 0; the pre-search gate as many), fit %.2f s\n",
               ncomp, NC_GATE_NFEAT, g.nh, np, t_fit);
        if (gate_searches(&g))
            printf("adaptive retrieval: threshold %.4g skips %.1f%% of the searches, perplexity %.3f (%+.2f%% "
                   "against the gate always searching)\n",
                   g.skip, 100.0 * sk, ppl_skip, 100.0 * (ppl_skip / ppl_gate - 1.0));
        snprintf(info, sizeof info, "neurocache fit-gate on %s (%zu tokens), %s: constant %.3f, gate %.3f, "
                 "fit %.2f s", valid, scored, desc, ppl_const, ppl_gate, t_fit);
        rc = gate_save(&g, out_dir ? out_dir : model_dir, info, err, sizeof err);
        if (!rc)
            fprintf(stderr, "fit-gate: wrote %s/gate.safetensors, gate.json, gate-curve.csv\n",
                    out_dir ? out_dir : model_dir);
    }
    if (rc)
        fprintf(stderr, "neurocache fit-gate: %s\n", err);
    free(lp);
    free(gd.f);
    free(gd.pc);
    doc_free(d);
    unbounded_cache_free(ub);
    wordtable_free(words);
    tokens_clear(&toks);
    model_free(m);
    return rc ? 1 : 0;
}
