/* cmd_train.c -- `neurocache train`: train an LSTM language model on a corpus
 * (options table, progress display, signals, learning-curve plot). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cacheopts.h"
#include "commands.h"
#include "suggest.h"
#include "train.h"

/* ---- options table ----------------------------------------------------- */

typedef enum { OPT_STR, OPT_INT, OPT_FLOAT, OPT_BOOL_ON, OPT_BOOL_OFF, OPT_DURATION, OPT_OPTIM,
               OPT_DROPOUT_ALL, OPT_U64, OPT_LONG, OPT_TEXT } opt_type;

typedef struct {
    bool plot, quiet, resume;
    char resume_dir[1024];
    double log_every;
} cli_extra;

typedef struct {
    const char *name;
    opt_type type;
    size_t off;                   /* offset into nc_train_params (or cli_extra when extra) */
    bool extra;
    size_t size;                  /* OPT_STR buffer size */
    double min, max;
    bool resumable;               /* may be changed when resuming */
    const char *help;
} opt_def;

#define P(field) offsetof(nc_train_params, field), false, sizeof(((nc_train_params *)0)->field)
#define X(field) offsetof(cli_extra, field), true, sizeof(((cli_extra *)0)->field)

static const opt_def options[] = {
    {"--train", OPT_STR, P(train_path), 0, 0, false, "FILE  training text (required)"},
    {"--valid", OPT_STR, P(valid_path), 0, 0, false, "FILE  validation text (best-model selection, lr decay)"},
    {"--out", OPT_STR, P(out_dir), 0, 0, false, "DIR  model directory to write (required)"},
    {"--resume", OPT_STR, X(resume_dir), 0, 0, true, "DIR  continue the run checkpointed in DIR"},
    {"--emsize", OPT_INT, P(embedding_size), 1, 65536, false, "N  embedding size (256)"},
    {"--nhid", OPT_INT, P(hidden_size), 1, 65536, false, "N  LSTM units per layer (256)"},
    {"--nlayers", OPT_INT, P(num_layers), 1, 8, false, "N  LSTM layers (2)"},
    {"--tied", OPT_BOOL_ON, P(tie_weights), 0, 0, false, "  tie decoder and encoder weights (default)"},
    {"--untied", OPT_BOOL_OFF, P(tie_weights), 0, 0, false, "  separate decoder weights"},
    {"--vocab-size", OPT_INT, P(vocab_max), 0, 1e9, false, "N  keep the N most frequent words, rest -> unk (0: all)"},
    {"--lowercase", OPT_BOOL_ON, P(lowercase), 0, 0, false, "  lower-case the corpus (and the model's input)"},
    {"--text", OPT_TEXT, P(text), 0, 0, false,
     "ptb|none|KEY=VALUE  text conventions the corpus is normalised to and the model declares\n"
     "                     (docs/normalisation.md; repeatable: --text ptb --text lines=eos)"},
    {"--unk", OPT_STR, P(unk_token), 0, 0, false, "WORD  unknown-word token (<unk>)"},
    {"--eos", OPT_STR, P(eos_token), 0, 0, false, "WORD  end-of-line token (<eos>)"},
    {"--bptt", OPT_INT, P(bptt), 1, 10000, false, "N  truncated BPTT length (35)"},
    {"--batch", OPT_INT, P(batch_size), 1, 100000, false, "N  parallel streams (20)"},
    {"--eval-batch", OPT_INT, P(eval_batch_size), 1, 100000, false, "N  validation streams (10)"},
    {"--optimizer", OPT_OPTIM, P(optimizer), 0, 0, false, "sgd|adagrad  (sgd)"},
    {"--lr", OPT_FLOAT, P(lr), 1e-9, 1e6, false, "X  initial learning rate (20; Adagrad: try 0.2)"},
    {"--lr-decay", OPT_FLOAT, P(lr_decay), 1, 1e6, false, "X  divide lr by X when validation does not improve (4)"},
    {"--lr-decay-start", OPT_INT, P(lr_decay_start), 0, 1e6, false, "E  also divide lr after every epoch >= E (0: off)"},
    {"--min-lr", OPT_FLOAT, P(min_lr), 0, 1e6, false, "X  floor for the decayed lr (0)"},
    {"--clip", OPT_FLOAT, P(clip), 0, 1e6, false, "X  max gradient norm (0.25; 0: off)"},
    {"--init-range", OPT_FLOAT, P(init_range), 0, 100, false, "X  uniform init of embeddings/decoder (0.1)"},
    {"--lstm-init-range", OPT_FLOAT, P(lstm_init_range), 0, 100, false, "X  uniform init of the LSTM (0: 1/sqrt(nhid))"},
    {"--dropout", OPT_DROPOUT_ALL, P(dropout), 0, 0.999, false, "P  dropout everywhere (0.25)"},
    {"--dropout-emb", OPT_FLOAT, P(dropout.emb), 0, 0.999, false, "P  dropout on embeddings"},
    {"--dropout-hid", OPT_FLOAT, P(dropout.hid), 0, 0.999, false, "P  dropout between LSTM layers"},
    {"--dropout-out", OPT_FLOAT, P(dropout.out), 0, 0.999, false, "P  dropout on the top LSTM output"},
    {"--epochs", OPT_INT, P(epochs), 0, 1e6, true, "N  epochs (40; 0: until --time-budget)"},
    {"--time-budget", OPT_DURATION, P(time_budget), 0, 1e9, true, "T  wall-clock budget: 5400, 90m, 1.5h (0: none)"},
    {"--seed", OPT_U64, P(seed), 0, 0, false, "N  random seed (1111)"},
    {"--threads", OPT_INT, P(threads), 0, 256, true, "N  OpenBLAS threads (default: all cores)"},
    {"--checkpoint-every", OPT_DURATION, P(checkpoint_every), 1, 1e9, true, "T  training-state checkpoint period (5m)"},
    {"--save-f16", OPT_BOOL_ON, P(save_f16), 0, 0, true, "  write the model in F16"},
    {"--stop-at-step", OPT_LONG, P(stop_at_step), 0, 1e15, true, NULL},   /* test hook */
    {"--plot", OPT_BOOL_ON, X(plot), 0, 0, true, "  draw curve.png with gnuplot after each validation"},
    {"--log-every", OPT_DURATION, X(log_every), 1, 1e9, true, "T  period of log lines when stderr is not a terminal (30s)"},
    {"--quiet", OPT_BOOL_ON, X(quiet), 0, 0, true, "  only errors and the final summary"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: neurocache train --train FILE [--valid FILE] --out DIR [OPTIONS]\n"
               "       neurocache train --resume DIR [--epochs N] [--time-budget T] [--threads N] ...\n\n"
               "Trains a word-level LSTM language model (PyTorch word_language_model recipe:\n"
               "truncated BPTT, dropout, gradient clipping, SGD with lr/4 on plateau, or Adagrad).\n"
               "DIR receives the best-validation model, curve.csv and train-state.bin.\n\noptions:\n");
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (options[i].help)
            fprintf(f, "  %-18s %s\n", options[i].name, options[i].help);
}

/* "5400", "90s", "90m", "1.5h" -> seconds; -1 on error. */
static double parse_duration(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0))
        return -1;
    if (*end == '\0' || !strcmp(end, "s"))
        return v;
    if (!strcmp(end, "m") || !strcmp(end, "min"))
        return v * 60;
    if (!strcmp(end, "h"))
        return v * 3600;
    return -1;
}

/* --optimizer NAME */
static int set_optimizer(int *dst, const char *val)
{
    if (!strcasecmp(val, "sgd"))
        *dst = NC_OPT_SGD;
    else if (!strcasecmp(val, "adagrad"))
        *dst = NC_OPT_ADAGRAD;
    else {
        fprintf(stderr, "neurocache train: --optimizer: expected sgd or adagrad, got '%s'\n", val);
        return -1;
    }
    return 0;
}

/* --text ptb|none|KEY=VALUE: one setting of the text conventions (a bare
 * word is a preset) */
static int set_text(void *conv, const char *val)
{
    char key[32], err[NC_ERRLEN];
    const char *eq = strchr(val, '=');
    if (!eq)
        snprintf(key, sizeof key, "preset");
    else
        snprintf(key, sizeof key, "%.*s", (int)(eq - val < 31 ? eq - val : 31), val);
    if (text_conv_set(conv, key, eq ? eq + 1 : val, err, sizeof err) != NC_OK) {
        fprintf(stderr, "neurocache train: --text: %s\n", err);
        return -1;
    }
    return 0;
}

static int set_option(const opt_def *o, const char *val, nc_train_params *p, cli_extra *x)
{
    char *base = o->extra ? (char *)x : (char *)p;
    void *dst = base + o->off;
    char *end;
    errno = 0;
    switch (o->type) {
    case OPT_STR:
        if (strlen(val) >= o->size || !val[0]) {
            fprintf(stderr, "neurocache train: %s: value empty or too long\n", o->name);
            return -1;
        }
        snprintf(dst, o->size, "%s", val);
        return 0;
    case OPT_INT:
    case OPT_LONG: {
        long v = strtol(val, &end, 10);
        if (errno || *end || end == val || v < o->min || v > o->max) {
            fprintf(stderr, "neurocache train: %s: expected an integer in [%g, %g], got '%s'\n", o->name,
                    o->min, o->max, val);
            return -1;
        }
        if (o->type == OPT_INT)
            *(int *)dst = (int)v;
        else
            *(long *)dst = v;
        return 0;
    }
    case OPT_U64: {
        unsigned long long v = strtoull(val, &end, 10);
        if (errno || *end || end == val) {
            fprintf(stderr, "neurocache train: %s: expected an unsigned integer, got '%s'\n", o->name, val);
            return -1;
        }
        *(uint64_t *)dst = v;
        return 0;
    }
    case OPT_FLOAT:
    case OPT_DROPOUT_ALL: {
        double v = strtod(val, &end);
        if (errno || *end || end == val || !(v >= o->min && v <= o->max)) {
            fprintf(stderr, "neurocache train: %s: expected a number in [%g, %g], got '%s'\n", o->name,
                    o->min, o->max, val);
            return -1;
        }
        if (o->type == OPT_FLOAT) {
            *(float *)dst = (float)v;
        } else {
            lstm_grad_dropout *d = dst;
            d->emb = d->hid = d->out = (float)v;
        }
        return 0;
    }
    case OPT_DURATION: {
        double v = parse_duration(val);
        if (v < 0 || v < o->min || v > o->max) {
            fprintf(stderr, "neurocache train: %s: expected a duration (5400, 90m, 1.5h), got '%s'\n", o->name,
                    val);
            return -1;
        }
        *(double *)dst = v;
        return 0;
    }
    case OPT_OPTIM:
        return set_optimizer(dst, val);
    case OPT_BOOL_ON:
    case OPT_BOOL_OFF:
        *(bool *)dst = o->type == OPT_BOOL_ON;
        return 0;
    case OPT_TEXT:
        return set_text(dst, val);
    }
    return -1;
}

/* ---- progress ---------------------------------------------------------- */

typedef struct {
    bool tty, quiet, plot;
    double log_every, last_draw, last_log;
    const char *out_dir;
    bool bar_open;
} display;

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    stop_requested = 1;
    signal(sig, SIG_DFL);        /* a second signal kills */
}

static void fmt_hms(char *buf, size_t n, double s)
{
    if (s < 0 || !isfinite(s)) {
        snprintf(buf, n, "--:--");
        return;
    }
    long v = (long)(s + 0.5);
    if (v >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
    else
        snprintf(buf, n, "%02ld:%02ld", v / 60, v % 60);
}

static void clear_bar(display *d)
{
    if (d->bar_open) {
        fprintf(stderr, "\r\033[K");
        d->bar_open = false;
    }
}

static void plot_curve(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "gnuplot 2>/dev/null");
    FILE *g = popen(cmd, "w");
    if (!g)
        return;
    fprintf(g,
            "set terminal pngcairo size 900,560 font 'sans,10'\n"
            "set output '%s/curve.png'\n"
            "set datafile separator ','\n"
            "set key autotitle columnhead top right\n"
            "set title 'neurocache train: learning curve'\n"
            "set xlabel 'epoch'\nset ylabel 'perplexity'\nset logscale y\nset grid\n"
            "plot '%s/curve.csv' using 1:6 with linespoints title 'train', "
            "'' using 1:8 with linespoints title 'validation'\n",
            dir, dir);
    pclose(g);
}

static int on_progress(const nc_train_progress *pr, void *ud)
{
    display *d = ud;
    double t = nc_now_s();
    char eta[32], el[32];
    fmt_hms(eta, sizeof eta, pr->eta);
    fmt_hms(el, sizeof el, pr->elapsed);
    switch (pr->event) {
    case NC_TRAIN_EV_START:
        if (!d->quiet)
            fprintf(stderr, "%s\n", pr->message);
        break;
    case NC_TRAIN_EV_STEP:
        if (d->quiet)
            break;
        if (d->tty) {
            if (t - d->last_draw < 0.25)
                break;
            d->last_draw = t;
            char bar[21];
            int fill = (int)(pr->epoch_frac * 20 + 0.5);
            for (int i = 0; i < 20; i++)
                bar[i] = i < fill ? '#' : '.';
            bar[20] = '\0';
            char ep[32];
            if (pr->epochs > 0)
                snprintf(ep, sizeof ep, "%d/%d", pr->epoch, pr->epochs);
            else
                snprintf(ep, sizeof ep, "%d", pr->epoch);
            fprintf(stderr, "\r\033[Kepoch %s [%s] %5.1f%%  %6.0f tok/s  loss %.3f (ppl %.1f)  lr %.3g  %s  ETA %s",
                    ep, bar, 100 * pr->epoch_frac, pr->tokens_per_s, pr->train_loss, exp(pr->train_loss),
                    pr->lr, el, eta);
            d->bar_open = true;
        } else if (t - d->last_log >= d->log_every) {
            d->last_log = t;
            fprintf(stderr, "epoch %d %5.1f%% step %ld  %.0f tok/s  loss %.4f (ppl %.2f)  lr %.4g  elapsed %s  ETA %s\n",
                    pr->epoch, 100 * pr->epoch_frac, pr->step, pr->tokens_per_s, pr->train_loss,
                    exp(pr->train_loss), pr->lr, el, eta);
        }
        break;
    case NC_TRAIN_EV_VALID:
        clear_bar(d);
        if (!d->quiet)
            fprintf(stderr, "| epoch %d | step %ld | elapsed %s | lr %.4g | train ppl %.2f | valid ppl %.2f%s\n",
                    pr->epoch, pr->step, el, pr->lr, exp(pr->train_loss), pr->val_ppl,
                    pr->improved ? " | saved (best)" : "");
        if (d->plot)
            plot_curve(d->out_dir);
        break;
    case NC_TRAIN_EV_CHECKPOINT:
        if (!d->quiet && !d->tty)
            fprintf(stderr, "%s\n", pr->message);
        break;
    case NC_TRAIN_EV_DONE:
    case NC_TRAIN_EV_STOPPED:
        clear_bar(d);
        break;
    }
    return stop_requested ? 1 : 0;
}

#define NOPTIONS (sizeof options / sizeof options[0])

/* The option named by argv[i] (up to a '='), or NULL with the error said
 * (and a suggestion). */
static const opt_def *find_option(const char *arg, size_t nlen)
{
    for (size_t k = 0; k < NOPTIONS; k++)
        if (strlen(options[k].name) == nlen && !strncmp(options[k].name, arg, nlen))
            return &options[k];
    nc_suggest sg;
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)nlen, arg);
    suggest_init(&sg, word);
    for (size_t k = 0; k < NOPTIONS; k++)
        if (options[k].help)   /* not the test hooks */
            suggest_offer(&sg, options[k].name);
    if (suggest_best(&sg))
        co_usage_error("train", "unknown option '%s' (did you mean '%s'?)", arg, suggest_best(&sg));
    else
        co_usage_error("train", "unknown option '%s'", arg);
    return NULL;
}

/* argv into cli and x (given[k]: option k was on the line); -1 to go on,
 * else the exit status. */
static int train_getopt(int argc, char **argv, nc_train_params *cli, cli_extra *x, bool *given)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        const char *arg = argv[i], *val = NULL;
        const char *eq = strchr(arg, '=');
        const opt_def *o = find_option(arg, eq ? (size_t)(eq - arg) : strlen(arg));
        if (!o)
            return 2;
        bool takes = o->type != OPT_BOOL_ON && o->type != OPT_BOOL_OFF;
        if (takes) {
            if (eq)
                val = eq + 1;
            else if (i + 1 < argc)
                val = argv[++i];
            else
                return co_usage_error("train", "option '%s' needs a value", o->name);
        } else if (eq) {
            return co_usage_error("train", "option '%s' takes no value", o->name);
        }
        if (set_option(o, val, cli, x) != 0)
            return 2;
        given[o - options] = true;
    }
    return -1;
}

/* --resume DIR: the run's stored parameters, changed by the resumable
 * options given on the line (cli); -1 to go on, else the exit status. */
static int resume_params(const char *dir, const nc_train_params *cli, const bool *given, nc_train_params *p)
{
    char err[NC_ERRLEN];
    if (train_load_params(dir, p, err, sizeof err) != NC_OK) {
        fprintf(stderr, "neurocache train: %s\n", err);
        return 1;
    }
    snprintf(p->out_dir, sizeof p->out_dir, "%s", dir);
    p->stop_at_step = 0;
    for (size_t k = 0; k < NOPTIONS; k++) {
        if (!given[k] || options[k].extra)
            continue;
        if (!options[k].resumable) {
            fprintf(stderr, "neurocache train: %s cannot change when resuming (the run's own value is "
                            "kept); allowed: --epochs --time-budget --threads --checkpoint-every --save-f16\n",
                    options[k].name);
            return 2;
        }
        memcpy((char *)p + options[k].off, (const char *)cli + options[k].off, options[k].size);
    }
    return -1;
}

/* Runs the training with the progress display, SIGINT/SIGTERM stopping it
 * at a checkpoint; the closing line. */
static int train_with_display(const nc_train_params *p, bool resume, const cli_extra *x)
{
    char err[NC_ERRLEN];
    display d = {.tty = isatty(2) != 0, .quiet = x->quiet, .plot = x->plot, .log_every = x->log_every,
                 .out_dir = p->out_dir};
    d.last_log = nc_now_s();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    nc_train_result res;
    int rc = train_run(p, resume, on_progress, &d, &res, err, sizeof err);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    clear_bar(&d);
    if (rc != NC_OK) {
        fprintf(stderr, "neurocache train: %s\n", err);
        return 1;
    }
    if (x->plot)
        plot_curve(p->out_dir);
    char el[32];
    fmt_hms(el, sizeof el, res.elapsed);
    if (res.stopped)
        fprintf(stderr, "stopped at step %ld after %s (best valid ppl %.2f); continue with: neurocache train "
                        "--resume %s\n", res.steps, el, res.best_val_ppl, p->out_dir);
    else
        fprintf(stderr, "done: %d epochs, %ld steps, %s, %.0f tokens/s, best valid ppl %.2f -> %s\n",
                res.epochs_done, res.steps, el, res.tokens_per_s, res.best_val_ppl, p->out_dir);
    return 0;
}

int cmd_train(int argc, char **argv)
{
    nc_train_params p, cli;
    train_default_params(&p);
    cli_extra x = {.log_every = 30};
    bool given[NOPTIONS] = {false};
    /* Parse into a scratch copy first: with --resume, the stored parameters
     * are the base and only resumable options may be changed. */
    cli = p;
    int st = train_getopt(argc, argv, &cli, &x, given);
    if (st >= 0)
        return st;
    bool resume = x.resume_dir[0] != '\0';
    if (resume) {
        st = resume_params(x.resume_dir, &cli, given, &p);
        if (st >= 0)
            return st;
    } else {
        p = cli;
        if (!p.train_path[0] || !p.out_dir[0]) {
            return co_usage_error("train", "--train and --out are required (or --resume DIR)");
        }
    }
    if (p.threads == 0 && !resume) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p.threads = n > 0 ? (int)n : 1;
    }
    return train_with_display(&p, resume, &x);
}
