/* cmd_score.c -- `neurocache score`: per-token log-probabilities of a text
 * file under the static model, perplexity and speed on stderr. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cacheopts.h"
#include "commands.h"
#include "lstm.h"
#include "model.h"
#include "scorer.h"
#include "tokenizer.h"

static void score_usage(FILE *out)
{
    fprintf(out,
            "usage: neurocache score --model DIR [--bos eos|none] [--format tsv|json]\n"
            "                        [cache options] FILE\n"
            "\n"
            "Scores FILE ('-' for standard input) with the model's LSTM, and the caches\n"
            "if asked (design §4; the unbounded cache holds every earlier pair of FILE,\n"
            "after those of --memory), and prints,\n"
            "in tsv format, one line 'word<TAB>logprob' (natural log) per scored token,\n"
            "eos tokens at line ends included; json prints one object\n"
            "{\"tokens\": [...], \"logprobs\": [...], \"ppl\": x}. Perplexity and tokens/s go\n"
            "to stderr (with a progress bar when stderr is a terminal).\n"
            "\n"
            "options:\n"
            "  --model DIR        model directory (config.json, vocab.txt, model.safetensors)\n"
            "  --bos eos|none     eos (default): start from the state after one eos token and\n"
            "                     score every token; none: start from the zero state and use\n"
            "                     the first token as context only\n"
            "  --format tsv|json  output format (default tsv)\n"
            "  -h, --help         this help\n"
            "\n%s\n"
            "exit status: 0 success, 1 runtime error (model, file, text), 2 usage error\n",
            cacheopts_help());
}

typedef struct {
    double t0;
    int last_pct;
} progress_ctx;

static void progress_bar(size_t done, size_t total, void *ctx)
{
    progress_ctx *p = ctx;
    int pct = total ? (int)(100.0 * (double)done / (double)total) : 100;
    if (pct == p->last_pct && done < total)
        return;
    p->last_pct = pct;
    int width = 30, fill = pct * width / 100;
    double dt = co_now() - p->t0;
    fprintf(stderr, "\r[%.*s%*s] %3d%% %zu/%zu tokens, %.0f tokens/s", fill,
            "##############################", width - fill, "", pct, done, total,
            dt > 0 ? (double)done / dt : 0.0);
    fflush(stderr);
}

int cmd_score(int argc, char **argv)
{
    static const struct option own[] = {
        {"model", required_argument, NULL, 'm'},
        {"bos", required_argument, NULL, 'b'},
        {"format", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct option opts[CACHEOPTS_MAX];
    cacheopts_options(own, opts);
    const char *model_dir = NULL;
    nc_bos bos = NC_BOS_EOS;
    bool json = false;
    cacheopts co;
    cacheopts_start(&co);
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model_dir = optarg;
            break;
        case 'b':
            if (!strcmp(optarg, "eos"))
                bos = NC_BOS_EOS;
            else if (!strcmp(optarg, "none"))
                bos = NC_BOS_NONE;
            else {
                fprintf(stderr, "neurocache score: --bos must be 'eos' or 'none', not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'f':
            if (!strcmp(optarg, "tsv") || !strcmp(optarg, "json"))
                json = !strcmp(optarg, "json");
            else {
                fprintf(stderr, "neurocache score: --format must be 'tsv' or 'json', not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
            score_usage(stdout);
            return 0;
        case ':':
            return co_bad_option("score", opts, c, argv);
        default:
            switch (cacheopts_parse(&co, c, optarg, "score")) {
            case 1:
                continue;
            case -1:
                return 2;
            }
            return co_bad_option("score", opts, c, argv);
        }
    }
    if (!model_dir || optind != argc - 1) {
        return co_usage_error("score", "%s", !model_dir ? "--model DIR is required"
                                             : optind >= argc ? "FILE is required"
                                                              : "exactly one FILE expected");
    }
    const char *file = argv[optind];
    if (cacheopts_finish(&co, "score"))
        return 2;
    bool cached = cacheopts_any(&co);

    char err[NC_ERRLEN];
    nc_model *m = NULL;
    nc_tokens toks;
    tokens_init(&toks);
    nc_state *s = NULL;
    nc_scorer *sc = NULL;
    float *lp = NULL;
    int rc = model_load(model_dir, &m, err, sizeof err);
    co_report_unk = false;   /* beside the perplexity below */
    if (rc == NC_OK)
        rc = co_read_tokens(m, file, &toks, err, sizeof err);
    double *dlp = NULL;
    size_t first = 0, scored = 0;
    double t0 = co_now(), dt = 0;
    if (rc == NC_OK && cached) {
        /* cache path: one prepared document scored through doc_score */
        dlp = malloc((toks.n + 1) * sizeof(double));
        lp = malloc((toks.n + 1) * sizeof(float));
        if (!dlp || !lp)
            rc = nc_error(err, sizeof err, NC_ENOMEM, "out of memory for %zu tokens", toks.n);
        if (rc == NC_OK)
            rc = co_score_cached(m, &co, &toks, bos == NC_BOS_EOS, dlp, true, err, sizeof err);
        first = bos == NC_BOS_EOS ? 0 : (toks.n > 0 ? 1 : 0);
        scored = toks.n - first;
        dt = co_now() - t0;
        for (size_t i = 0; rc == NC_OK && i < scored; i++)
            lp[i] = (float)dlp[first + i];
    } else if (rc == NC_OK) {
        s = lstm_state_new(m);
        sc = scorer_new(m, 0);
        lp = malloc((toks.n + 1) * sizeof(float));
        if (!s || !sc || !lp)
            rc = nc_error(err, sizeof err, NC_ENOMEM, "out of memory for %zu tokens", toks.n);
    }
    if (rc == NC_OK && !cached)
        rc = scorer_begin(sc, s, bos, toks.ids, toks.n, &first, err, sizeof err);
    if (rc == NC_OK && !cached) {
        progress_ctx pc = {t0, -1};
        scored = toks.n - first;
        rc = scorer_run(sc, s, toks.ids + first, scored, lp, isatty(2) ? progress_bar : NULL, &pc, err,
                          sizeof err);
        dt = co_now() - t0;
        if (isatty(2))
            fprintf(stderr, "\r\033[K");
    }
    if (rc == NC_OK) {
        double sum = 0;
        for (size_t i = 0; i < scored; i++)
            sum += dlp ? dlp[first + i] : lp[i];
        double ppl = scored ? exp(-sum / (double)scored) : NAN;
        /* the unknown words among the scored tokens: an <unk>-heavy text's
         * perplexity flatters the model (docs/normalisation.md) */
        size_t unk = tokens_count_unk(m, &toks, first);
        static char obuf[1 << 16];
        setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
        if (json) {
            json_t *o = json_object(), *tw = json_array(), *tl = json_array();
            for (size_t i = 0; i < scored; i++) {
                json_array_append_new(tw, json_string(toks.words[first + i]));
                /* -inf (an open-vocabulary word nothing predicts) is null:
                 * JSON has no infinities */
                json_array_append_new(tl, isfinite(lp[i]) ? json_real(lp[i]) : json_null());
            }
            json_object_set_new(o, "tokens", tw);
            json_object_set_new(o, "logprobs", tl);
            json_object_set_new(o, "ppl", scored ? json_real(ppl) : json_null());
            json_object_set_new(o, "unk_count", json_integer((json_int_t)unk));
            if (json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) != 0)
                rc = nc_error(err, sizeof err, NC_EIO, "writing the output failed");
            fputc('\n', stdout);
            json_decref(o);
        } else {
            for (size_t i = 0; i < scored; i++)
                printf("%s\t%.6f\n", toks.words[first + i], lp[i]);
        }
        if (fflush(stdout) != 0 || ferror(stdout))
            rc = nc_error(err, sizeof err, NC_EIO, "writing the output failed: %s", strerror(errno));
        if (scored)
            fprintf(stderr, "%zu tokens scored in %.3f s (%.0f tokens/s), perplexity %.4f, unknown words %zu (%.2f%%)\n",
                    scored, dt, dt > 0 ? (double)scored / dt : 0.0, ppl, unk, 100.0 * (double)unk / (double)scored);
        else
            fprintf(stderr, "no tokens scored (empty input)\n");
    }
    if (rc != NC_OK)
        fprintf(stderr, "neurocache score: %s\n", err);
    free(lp);
    free(dlp);
    scorer_free(sc);
    lstm_state_free(s);
    tokens_clear(&toks);
    model_free(m);
    return rc == NC_OK ? 0 : 1;
}
