/* cmd_dynstats.c -- `neurocache dyn-stats`: measures dynamic evaluation's
 * mean squared gradients MS_g on training text (core/model/dyneval.h) and writes
 * them beside the weights, in DIR/dyneval (a model directory of the same
 * configuration whose weights are MS_g, F32). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheopts.h"
#include "report.h"
#include "texts.h"
#include "commands.h"
#include "dyneval.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: neurocache dyn-stats --model DIR --train FILE [options]\n"
            "\n"
            "Measures, for every weight of the model, the mean squared gradient of the\n"
            "mean loss of a segment of N tokens over consecutive segments of FILE (the\n"
            "state carried from one to the next, the weights fixed), as dynamic\n"
            "evaluation's RMS-normalised step needs it (Krause et al. 2018), and writes\n"
            "it into DIR/dyneval (or --out DIR). Measure on training text. Then\n"
            "--dyn-lr X turns dynamic evaluation on (score, eval, tune, sessions).\n"
            "\n"
            "options:\n"
            "  --model DIR, --train FILE  model directory, training text\n"
            "  --segment N          tokens per segment (default 20)\n"
            "  --tokens N           read at most N tokens of FILE (default 200000, 0 = all)\n"
            "  --out DIR            where to write (default DIR/dyneval)\n"
            "  --f32                write float32 (default bfloat16: half the size, float32's\n"
            "                       range; the figures it gives: docs/dyneval.md)\n"
            "  -h, --help           this help\n"
            "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n");
}

int cmd_dyn_stats(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},   {"train", required_argument, NULL, 't'},
        {"segment", required_argument, NULL, 'n'}, {"tokens", required_argument, NULL, 'k'},
        {"out", required_argument, NULL, 'o'},     {"help", no_argument, NULL, 'h'},
        {"f32", no_argument, NULL, 'f'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = NULL, *train = NULL, *outdir = NULL;
    long seg = 20, maxtok = 200000;
    nc_save_dtype dtype = NC_SAVE_BF16;
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 't': train = optarg; break;
        case 'o': outdir = optarg; break;
        case 'f': dtype = NC_SAVE_F32; break;
        case 'n':
        case 'k': {
            long v = strtol(optarg, &end, 10);
            if (*end || v < (c == 'n' ? 1 : 0) || v > 1000000000) {
                fprintf(stderr, "neurocache dyn-stats: --%s must be a whole number %s, not '%s'\n",
                        c == 'n' ? "segment" : "tokens", c == 'n' ? ">= 1" : ">= 0", optarg);
                return 2;
            }
            *(c == 'n' ? &seg : &maxtok) = v;
            break;
        }
        case 'h': usage(stdout); return 0;
        case ':':
            fprintf(stderr, "neurocache dyn-stats: option '%s' needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "neurocache dyn-stats: unknown option '%s'\n(see 'neurocache dyn-stats --help')\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (!dir || !train || optind != argc) {
        fprintf(stderr, "neurocache dyn-stats: %s\n(see 'neurocache dyn-stats --help')\n",
                !dir ? "--model DIR is required" : !train ? "--train FILE is required" : "unexpected argument");
        return 2;
    }
    char err[NC_ERRLEN], path[4096];
    nc_model *m = NULL, *ms = NULL;
    nc_tokens toks;
    tokens_init(&toks);
    int rc = model_load(dir, &m, err, sizeof err);
    if (!rc)
        rc = co_read_tokens(m, train, &toks, err, sizeof err);
    double t0 = nc_now_s(), loss = 0;
    const nc_dyn_stats_text text = {
        .toks = toks.ids, .ntok = toks.n, .segment = (int)seg, .max_tokens = (size_t)maxtok};
    if (!rc)
        rc = dyneval_stats(m, &text, &ms, &loss, err, sizeof err);
    double dt = nc_now_s() - t0;
    snprintf(path, sizeof path, "%s/dyneval", dir);
    if (!rc)
        rc = model_save(ms, outdir ? outdir : path, dtype, err, sizeof err);
    if (!rc) {
        size_t n = maxtok && (size_t)maxtok < toks.n ? (size_t)maxtok : toks.n;
        fprintf(stderr, "dyn-stats: %zu segments of %ld tokens in %.1f s (%.0f tokens/s), mean loss %.4f "
                "(perplexity %.2f); wrote %s\n", n / (size_t)seg, seg, dt, (double)(n / (size_t)seg * seg) / dt,
                loss, exp(loss), outdir ? outdir : path);
        static const char *const names[] = {"biases (sparse)", "last LSTM layer", "every LSTM layer", "all weights"};
        for (int sub = NC_DYN_BIAS; sub <= NC_DYN_ALL; sub++)
            fprintf(stderr, "dyn-stats: a session adapting dyn_params %d (%s) holds %zu bytes of weights\n", sub,
                    names[sub], dyneval_memory_of(m, sub));
    } else {
        fprintf(stderr, "neurocache dyn-stats: %s\n", err);
    }
    model_free(ms);
    model_free(m);
    tokens_clear(&toks);
    return rc ? 1 : 0;
}
