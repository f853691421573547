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
#include "cache_scoring.h"
#include "report.h"
#include "texts.h"
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
    double dt = nc_now_s() - p->t0;
    fprintf(stderr, "\r[%.*s%*s] %3d%% %zu/%zu tokens, %.0f tokens/s", fill,
            "##############################", width - fill, "", pct, done, total,
            dt > 0 ? (double)done / dt : 0.0);
    fflush(stderr);
}

/* The command line. */
typedef struct {
    struct option opts[CACHEOPTS_MAX];
    const char *model_dir, *file;
    nc_bos bos;
    bool json;
    cacheopts co;
} score_args;

/* getopt over argv into a, checked; -1 to go on, else the exit status. */
static int score_parse_args(score_args *a, int argc, char **argv)
{
    static const struct option own[] = {
        {"model", required_argument, NULL, 'm'},
        {"bos", required_argument, NULL, 'b'},
        {"format", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    cacheopts_options(own, a->opts);
    a->bos = NC_BOS_EOS;
    cacheopts_start(&a->co);
    int c;
    while ((c = getopt_long(argc, argv, ":h", a->opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            a->model_dir = optarg;
            break;
        case 'b':
            if (!strcmp(optarg, "eos"))
                a->bos = NC_BOS_EOS;
            else if (!strcmp(optarg, "none"))
                a->bos = NC_BOS_NONE;
            else {
                fprintf(stderr, "neurocache score: --bos must be 'eos' or 'none', not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'f':
            if (!strcmp(optarg, "tsv") || !strcmp(optarg, "json"))
                a->json = !strcmp(optarg, "json");
            else {
                fprintf(stderr, "neurocache score: --format must be 'tsv' or 'json', not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
            score_usage(stdout);
            return 0;
        case ':':
            return co_bad_option("score", a->opts, c, argv);
        default:
            switch (cacheopts_parse(&a->co, c, optarg, "score")) {
            case 1:
                continue;
            case -1:
                return 2;
            }
            return co_bad_option("score", a->opts, c, argv);
        }
    }
    if (!a->model_dir || optind != argc - 1) {
        return co_usage_error("score", "%s", !a->model_dir ? "--model DIR is required"
                                             : optind >= argc ? "FILE is required"
                                                              : "exactly one FILE expected");
    }
    a->file = argv[optind];
    if (cacheopts_finish(&a->co, "score"))
        return 2;
    return -1;
}

/* A scored file: lp[i] the log-probability of token first + i (i <
 * scored); dlp the cache path's doubles (NULL on the static path); dt its
 * seconds. */
typedef struct {
    float *lp;
    double *dlp;
    size_t first, scored;
    double dt;
} score_result;

/* The cache path: one prepared document scored through doc_score. */
static int score_cached(const score_args *a, const nc_model *m, const nc_tokens *toks, score_result *r, char *err,
                        size_t errlen)
{
    double t0 = nc_now_s();
    int rc = NC_OK;
    r->dlp = malloc((toks->n + 1) * sizeof(double));
    r->lp = malloc((toks->n + 1) * sizeof(float));
    if (!r->dlp || !r->lp)
        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory for %zu tokens", toks->n);
    if (rc == NC_OK)
        rc = co_score_cached(&(co_text){.m = m, .toks = toks, .bos_eos = a->bos == NC_BOS_EOS}, &a->co, r->dlp, true,
                             err, errlen);
    r->first = a->bos == NC_BOS_EOS ? 0 : (toks->n > 0 ? 1 : 0);
    r->scored = toks->n - r->first;
    r->dt = nc_now_s() - t0;
    for (size_t i = 0; rc == NC_OK && i < r->scored; i++)
        r->lp[i] = (float)r->dlp[r->first + i];
    return rc;
}

/* The static path: the model alone through the scorer, with a progress bar
 * on a terminal. */
static int score_static(const score_args *a, const nc_model *m, const nc_tokens *toks, score_result *r, char *err,
                        size_t errlen)
{
    double t0 = nc_now_s();
    int rc = NC_OK;
    nc_state *s = lstm_state_new(m);
    nc_scorer *sc = scorer_new(m, 0);
    r->lp = malloc((toks->n + 1) * sizeof(float));
    if (!s || !sc || !r->lp)
        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory for %zu tokens", toks->n);
    if (rc == NC_OK)
        rc = scorer_begin(sc, s, a->bos, toks->ids, toks->n, &r->first, err, errlen);
    if (rc == NC_OK)
        r->scored = toks->n - r->first;
    if (rc == NC_OK && r->scored) {   /* empty text: ids is NULL; print_scores refuses it */
        progress_ctx pc = {t0, -1};
        rc = scorer_run(sc, s, toks->ids + r->first, r->scored, r->lp, isatty(2) ? progress_bar : NULL, &pc, err,
                        errlen);
        r->dt = nc_now_s() - t0;
        if (isatty(2))
            fprintf(stderr, "\r\033[K");
    }
    scorer_free(sc);
    lstm_state_free(s);
    return rc;
}

/* The scored tokens as one JSON object on stdout: each token, its
 * log-probability and whether it is the model's unk (docs/cli.md). */
static int print_json(const nc_model *m, const nc_tokens *toks, const score_result *r, double ppl, char *err,
                      size_t errlen)
{
    size_t unk = tokens_count_unk(m, toks, r->first);
    int rc = NC_OK;
    json_t *o = json_object(), *tw = json_array(), *tl = json_array(), *tu = json_array();
    for (size_t i = 0; i < r->scored; i++) {
        json_array_append_new(tw, json_string(toks->words[r->first + i]));
        /* -inf (an open-vocabulary word nothing predicts) is null:
         * JSON has no infinities */
        json_array_append_new(tl, isfinite(r->lp[i]) ? json_real(r->lp[i]) : json_null());
        json_array_append_new(tu, json_boolean(toks->ids[r->first + i] == m->unk_id));
    }
    json_object_set_new(o, "tokens", tw);
    json_object_set_new(o, "logprobs", tl);
    json_object_set_new(o, "unk", tu);
    json_object_set_new(o, "ppl", json_real(ppl));
    json_object_set_new(o, "unk_count", json_integer((json_int_t)unk));
    if (json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) != 0)
        rc = nc_error(err, errlen, NC_EIO, "writing the output failed");
    fputc('\n', stdout);
    json_decref(o);
    return rc;
}

/* The scored tokens on stdout (TSV or JSON), the summary on stderr. */
static int print_scores(const score_args *a, const nc_model *m, const nc_tokens *toks, const score_result *r,
                        char *err, size_t errlen)
{
    if (!r->scored)   /* no perplexity: as /v1/score's 400, no answer on stdout */
        return nc_error(err, errlen, NC_EINVAL, "%s has no tokens to score: it is empty, or normalisation left "
                        "nothing of it%s", strcmp(a->file, "-") ? a->file : "the input",
                        toks->n == 1 ? " but one token, which --bos none leaves without a prediction" : "");
    int rc = NC_OK;
    double sum = 0;
    for (size_t i = 0; i < r->scored; i++)
        sum += r->dlp ? r->dlp[r->first + i] : r->lp[i];
    double ppl = exp(-sum / (double)r->scored);
    /* the unknown words among the scored tokens: an <unk>-heavy text's
     * perplexity flatters the model (docs/normalisation.md) */
    size_t unk = tokens_count_unk(m, toks, r->first);
    static char obuf[1 << 16];
    setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
    if (a->json) {
        rc = print_json(m, toks, r, ppl, err, errlen);
    } else {   /* word, log-probability, 1 when the word is the model's unk */
        for (size_t i = 0; i < r->scored; i++)
            printf("%s\t%.6f\t%d\n", toks->words[r->first + i], r->lp[i], toks->ids[r->first + i] == m->unk_id);
    }
    if (fflush(stdout) != 0 || ferror(stdout))
        rc = nc_error(err, errlen, NC_EIO, "writing the output failed: %s", strerror(errno));
    double dt = r->dt;
    fprintf(stderr, "%zu tokens scored in %.3f s (%.0f tokens/s), perplexity %.4f, unknown words %zu (%.2f%%)\n",
            r->scored, dt, dt > 0 ? (double)r->scored / dt : 0.0, ppl, unk, 100.0 * (double)unk / (double)r->scored);
    return rc;
}

int cmd_score(int argc, char **argv)
{
    static score_args a;
    memset(&a, 0, sizeof a);
    int st = score_parse_args(&a, argc, argv);
    if (st >= 0)
        return st;
    char err[NC_ERRLEN];
    nc_model *m = NULL;
    nc_tokens toks;
    tokens_init(&toks);
    score_result r = {0};
    int rc = model_load(a.model_dir, &m, err, sizeof err);
    co_report_unk = false;   /* beside the perplexity below */
    if (rc == NC_OK)
        rc = co_read_tokens(m, a.file, &toks, err, sizeof err);
    if (rc == NC_OK)
        rc = cacheopts_any(&a.co) ? score_cached(&a, m, &toks, &r, err, sizeof err)
                                  : score_static(&a, m, &toks, &r, err, sizeof err);
    if (rc == NC_OK)
        rc = print_scores(&a, m, &toks, &r, err, sizeof err);
    if (rc != NC_OK)
        fprintf(stderr, "neurocache score: %s\n", err);
    free(r.lp);
    free(r.dlp);
    tokens_clear(&toks);
    model_free(m);
    return rc == NC_OK ? 0 : 1;
}
