/* test_cache_cli.c -- the cache command lines as real processes on the
 * fixture models: `score` with cache options against the library, `eval`
 * rows and sweeps against `score`, `tune` best points against `score`,
 * `build-index` writing a trained empty index that `score` then fills, and
 * the usage errors of every command. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_io_c.h>

#include "harness.h"
#include "tolerance.h"
#include "doc.h"
#include "lstm.h"
#include "tokenizer.h"
#include "model.h"
#include "nc_common.h"

static char fixdir[1024], docpath[64] = "/tmp/nc_cli_docXXXXXX", tmpdir[64] = "/tmp/nc_cli_dirXXXXXX";

static const char *bin_dir(void)
{
    const char *d = getenv("NEUROCACHE_BIN");
    return d ? d : "bin";
}

/* Runs a shell command; stdout into *out (malloc'ed); exit status. */
static int run(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run(char **out, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while ((k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[n] = '\0';
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Perplexity from `score` tsv output (word TAB logprob lines). */
static double tsv_ppl(const char *out, size_t *n)
{
    double sum = 0;
    size_t c = 0;
    for (const char *l = out; l && *l;) {
        const char *tab = strchr(l, '\t'), *nl = strchr(l, '\n');
        if (!tab || !nl)
            break;
        sum += strtod(tab + 1, NULL);
        c++;
        l = nl + 1;
    }
    if (n)
        *n = c;
    return c ? exp(-sum / (double)c) : NAN;
}

static double score_ppl(const char *opts)
{
    char *out = NULL;
    int st = run(&out, "%s/neurocache score --model %s %s %s 2>/dev/null", bin_dir(), fixdir, opts, docpath);
    CHECKF(st == 0, "score %s: exit %d", opts, st);
    double p = tsv_ppl(out, NULL);
    free(out);
    return p;
}

/* Value of column col (0-based) of the CSV line whose first columns start
 * with key; NAN when absent. */
static double csv_value(const char *path, const char *key, int col)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NAN;
    char line[2048];
    double v = NAN;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) {
            char *p = line;
            for (int c = 0; c < col && p; c++) {
                p = strchr(p, ',');
                if (p)
                    p++;
            }
            if (p)
                v = strtod(p, NULL);
            break;
        }
    fclose(f);
    return v;
}

static bool is_png(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char m[8] = {0};
    bool ok = f && fread(m, 1, 8, f) == 8 && !memcmp(m, "\x89PNG\r\n\x1a\n", 8);
    if (f)
        fclose(f);
    return ok;
}

/* the harness macro tests its pointer: arrays need a decay */
static const char *cs(const char *s) { return s; }

#define REL(a, b) (fabs((a) / (b) - 1.0))

/* Perplexities of one text along two paths (score against eval and tune:
 * a shared LSTM pass, precomputed neighbours, other block sizes; 1 against
 * 2 BLAS threads): log ppl is minus the mean log-probability, so it moves
 * by at most the per-token bound TOL_FIXTURE_PATHS (tolerance.h), and ppl
 * relatively by as much to first order. */
#define TOL_PPL_PATHS TOL_FIXTURE_PATHS

/* A 720-token document over the fixture vocabulary: repeated phrases (so
 * caches help) on lines of 12 words, and an out-of-vocabulary word "zebra"
 * appearing now and then. */
static void write_doc(void)
{
    int fd = mkstemp(docpath);
    FILE *f = fdopen(fd, "w");
    unsigned x = 7;
    for (int i = 0; i < 720; i++) {
        x = x * 1103515245u + 12345u;
        int w = (x >> 16) % 3 == 0 ? (int)((x >> 8) % 48) : (i * 5) % 17;
        if (i % 97 == 50)
            fprintf(f, "zebra");
        else
            fprintf(f, "w%d", w);
        fputc(i % 12 == 11 ? '\n' : ' ', f);
    }
    fclose(f);
}

TEST(score_caches_match_library)
{
    const char *opts = "--neural-cache 40 --theta 0.7 --lambda 0.2 --unigram-cache 25 --unigram-lambda 0.1 "
                       "--unbounded --knn 16 --unbounded-lambda 0.3";
    char *out = NULL, err[NC_ERRLEN];
    int st = run(&out, "%s/neurocache score --model %s %s %s 2>/dev/null", bin_dir(), fixdir, opts, docpath);
    CHECK(st == 0);
    /* the library, directly */
    nc_model *m = NULL;
    CHECKF(model_load(fixdir, &m, err, sizeof err) == NC_OK, "%s", err);
    if (!m || !out) {
        free(out);
        return;
    }
    FILE *f = fopen(docpath, "rb");
    char text[65536];
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    nc_tokens t;
    tokens_init(&t);
    CHECK(tokenize(m, text, len, true, &t, err, sizeof err) == NC_OK);
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    lstm_step(m, s, m->eos_id, w);
    nc_doc *d = NULL;
    CHECK(doc_prepare(&(nc_doc_prep){.m = m, .s = s, .has_h = true, .toks = &t}, &d, err, sizeof err) == NC_OK);
    nc_cache_params p;
    cache_params_default(&p);
    p.neural_size = 40, p.neural_theta = 0.7f, p.neural_lambda = 0.2f;
    p.unigram_size = 25, p.unigram_lambda = 0.1f;
    p.unbounded = true, p.knn = 16, p.unbounded_lambda = 0.3f;
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, m->cfg.hidden_size);
    nc_unbounded_cache *ub = NULL;
    CHECK(unbounded_cache_new(&o, NULL, &ub, err, sizeof err) == NC_OK);
    double *lp = malloc(t.n * sizeof(double));
    nc_doc_caches dc = {.ub = ub, .adapt = true};
    CHECKF(doc_score(d, &p, &dc, lp, err, sizeof err) == NC_OK, "%s", err);
    /* line by line: word TAB logprob (%.6f) */
    size_t i = 0, bad = 0;
    double worst = 0;
    for (const char *l = out; *l && i < t.n; i++) {
        const char *tab = strchr(l, '\t'), *nl = strchr(l, '\n');
        if (!tab || !nl)
            break;
        double dlp = fabs(strtod(tab + 1, NULL) - lp[i]);
        worst = fmax(worst, dlp);
        /* the CLI prepares the text in its own chunks (another GEMM shape):
         * a second path (tolerance.h), plus %.6f's rounding, 5e-7 */
        if (strncmp(l, t.words[i], (size_t)(tab - l)) || dlp > TOL_FIXTURE_PATHS + 5e-7)
            bad++;
        l = nl + 1;
    }
    CHECKF(i == t.n && bad == 0, "%zu of %zu lines, %zu differ from doc_score (worst %g)", i, t.n, bad, worst);
    /* and the caches do something on this document */
    double s0 = score_ppl(""), s1 = tsv_ppl(out, NULL);
    CHECKF(s1 < 0.9 * s0, "caches %g vs static %g", s1, s0);
    /* json output with caches: same numbers */
    char *js = NULL;
    CHECK(run(&js, "%s/neurocache score --model %s %s --format json %s 2>/dev/null", bin_dir(), fixdir, opts,
              docpath) == 0);
    CHECK_STR_CONTAINS(js, "\"logprobs\"");
    free(js);
    free(lp);
    doc_free(d);
    unbounded_cache_free(ub);
    lstm_state_free(s);
    lstm_work_free(w);
    tokens_clear(&t);
    model_free(m);
    free(out);
}

TEST(score_open_vocabulary)
{
    /* "zebra" is outside the fixture vocabulary: closed, it is <unk>; open,
     * it has p_model = 0 and only the caches and the uniform term give it
     * mass -- more after it has been seen */
    char *out = NULL;
    int st = run(&out, "%s/neurocache score --model %s --open-vocab --uniform-mu 0.001 --unbounded --knn 16 "
                       "--unigram-cache 200 --unigram-lambda 0.2 %s 2>/dev/null", bin_dir(), fixdir, docpath);
    CHECK(st == 0);
    double first = NAN, later = 0;
    int nlater = 0;
    for (const char *l = out; l && *l;) {
        const char *nl = strchr(l, '\n');
        if (!nl)
            break;
        if (!strncmp(l, "zebra\t", 6)) {
            double v = strtod(l + 6, NULL);
            if (isnan(first))
                first = v;
            else
                later += v, nlater++;
        }
        l = nl + 1;
    }
    CHECK(nlater >= 5);
    CHECKF(nlater > 0 && later / nlater > first + 3.0, "zebra first %g, later mean %g", first,
           nlater ? later / nlater : NAN);
    free(out);
    /* without the uniform term, the first zebra has probability 0 */
    st = run(&out, "%s/neurocache score --model %s --open-vocab --unbounded --knn 16 %s 2>/dev/null", bin_dir(),
             fixdir, docpath);
    CHECK(st == 0);
    CHECK_STR_CONTAINS(out, "zebra\t-inf");
    free(out);
}

TEST(usage_errors)
{
    static const struct {
        const char *cmd, *args, *msg;
        int status;
    } cases[] = {
        {"score", "--theta 0.5", "--neural-theta needs --neural-size", 2},
        {"score", "--neural-theta 0.5", "--neural-theta needs --neural-size", 2},
        {"score", "--neural-cache 10 --global-norm --lambda 0.1", "with --global-norm use --neural-alpha", 2},
        {"score", "--alpha 1 --neural-cache 10", "--neural-alpha needs --global-norm", 2},
        {"score", "--knn 5", "--knn needs --unbounded", 2},
        {"score", "--unbounded-lambda 0.2", "--unbounded-lambda needs --unbounded", 2},
        {"score", "--unbounded --exact --index /x", "contradict", 2},
        {"score", "--uniform-mu 0.1", "--uniform-mu needs --open-vocab", 2},
        /* the knob table's messages (test_knobs checks them against JSON and config) */
        {"score", "--neural-cache -1", "--neural-size: neural_size = -1 is out of range [0, 1000000]", 2},
        {"score", "--neural-cache 10 --lambda 1.5", "--neural-lambda: neural_lambda = 1.5 is out of range [0, 1]", 2},
        {"score", "--unbounded --kernel cosine", "kernel = 'cosine' is not gaussian or epanechnikov", 2},
        {"score", "--unbounded --knn 99999999", "knn = 99999999 is out of range [1, 16384]", 2},
        {"score", "--memory /nonexistent/m.txt --unbounded", "/nonexistent/m.txt", 1},
        {"score", "--unbounded --index /nonexistent/i.faiss", "/nonexistent/i.faiss", 1},
        {"score", "--memory x.txt", "--memory needs --unbounded", 2},
        {"eval", "--sweep foo=1,2", "--sweep wants KNOB=", 2},
        {"eval", "--sweep knn=0,4", "out of range", 2},
        {"eval", "--sweep knn=4,", "bad value list", 2},
        {"eval", "--out x", "--out needs --sweep", 2},
        {"eval", "--theta 1", "--neural-theta needs --neural-size", 2},
        {"eval", "--row '--neural-cache 5 --bogus 1'", "not a per-row cache option", 2},
        {"eval", "--row '--theta 1'", "--neural-theta needs --neural-size", 2},
        {"eval", "--row '--neural-theta 1'", "--neural-theta needs --neural-size", 2},
        {"eval", "--sweep neural-thata=1,2", "--sweep wants KNOB=", 2},
        /* a misspelt option: one line naming the nearest option (a knob's name,
         * also when the nearest is an older alias), then where the help is */
        {"score", "--neural-sise 5", "unknown option '--neural-sise' (did you mean '--neural-size'?); "
                                     "see 'neurocache score --help'", 2},
        {"score", "--thetaa 0.5", "unknown option '--thetaa' (did you mean '--neural-theta'?)", 2},
        {"eval", "--neural-sise=5", "unknown option '--neural-sise=5' (did you mean '--neural-size'?)", 2},
        {"tune", "--neural-sise 5", "(did you mean '--neural-size'?)", 2},
        {"fit-gate", "--neural-sise 5", "(did you mean '--neural-size'?)", 2},
        {"score", "--formt json", "(did you mean '--format'?)", 2},
        {"score", "--neural 5", "option '--neural' is ambiguous (--neural-size, --neural-theta", 2},
        {"score", "--zzzzzz", "unknown option '--zzzzzz'; see 'neurocache score --help'", 2},
        {"eval", "--row '--memory x --unbounded'", "not a per-row cache option", 2},
        {"tune", "--theta 0.3", "give grids", 2},
        {"tune", "--alphas 1,2", "--alphas needs --global-norm", 2},
        {"tune", "--lambdas 0.1,2", "out of range", 2},
        {"tune", "--neural-cache 10 --global-norm --lambdas 0.1", "use --alphas", 2},
        {"tune", "--unbounded-lambdas 0.1", "needs --unbounded", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        const char *file = strcmp(cases[i].cmd, "tune") ? "" : "--valid";
        int st = run(&out, "%s/neurocache %s --model %s %s %s %s 2>&1 >/dev/null", bin_dir(), cases[i].cmd, fixdir,
                     cases[i].args, file, docpath);
        CHECKF(st == cases[i].status, "%s %s: exit %d, expected %d (%s)", cases[i].cmd, cases[i].args, st,
               cases[i].status, out);
        CHECK_STR_CONTAINS(out, cases[i].msg);
        free(out);
    }
    /* a missing argument: one line, the error and where the help is (not the
     * whole help, which buried it) */
    static const struct {
        const char *args, *line;
    } missing[] = {
        {"eval --model M", "neurocache eval: FILE is required; see 'neurocache eval --help'\n"},
        {"tune --model M", "neurocache tune: --valid FILE is required; see 'neurocache tune --help'\n"},
        {"score F", "neurocache score: --model DIR is required; see 'neurocache score --help'\n"},
        {"score --model M", "neurocache score: FILE is required; see 'neurocache score --help'\n"},
        {"fit-gate --model M", "neurocache fit-gate: --valid FILE is required; see 'neurocache fit-gate --help'\n"},
        {"build-index --model M", "neurocache build-index: --corpus FILE is required; "
                                  "see 'neurocache build-index --help'\n"},
        {"train --out /nonexistent/x", "neurocache train: --train and --out are required (or --resume DIR); "
                                       "see 'neurocache train --help'\n"},
        {"train --train", "neurocache train: option '--train' needs a value; see 'neurocache train --help'\n"},
        {"train --nhidd 5", "neurocache train: unknown option '--nhidd' (did you mean '--nhid'?); "
                            "see 'neurocache train --help'\n"},
        {"migrate --from http://x", "neurocache migrate: --from, --to and --session are required; "
                                    "see 'neurocache migrate --help'\n"},
        {"migrate --sesion x", "neurocache migrate: unknown option '--sesion' (did you mean '--session'?); "
                               "see 'neurocache migrate --help'\n"},
        {"score --model", "neurocache score: option '--model' needs a value; see 'neurocache score --help'\n"},
        {"scroe", "neurocache: unknown command 'scroe' (did you mean 'score'?); see 'neurocache --help'\n"},
        {"", "neurocache: a command is needed (score, eval, tune, fit-gate, dyn-stats, train, build-index, migrate, backup, restore); "
             "see 'neurocache --help'\n"},
    };
    for (size_t i = 0; i < sizeof missing / sizeof *missing; i++) {
        char args[512], *out = NULL;
        /* M = the model, F = the text: a real path each, so only the missing piece is wrong */
        size_t o = 0;
        for (const char *p = missing[i].args; *p && o + 300 < sizeof args; p++) {
            if (*p == 'M' && (p[1] == 0 || p[1] == ' ') && p[-1] == ' ')
                o += (size_t)snprintf(args + o, sizeof args - o, "%s", fixdir);
            else if (*p == 'F' && p[1] == 0 && p[-1] == ' ')
                o += (size_t)snprintf(args + o, sizeof args - o, "%s", docpath);
            else
                args[o++] = *p;
        }
        args[o] = 0;
        CHECKF(run(&out, "%s/neurocache %s 2>&1 >/dev/null", bin_dir(), args) == 2, "%s: exit status", args);
        CHECKF(out && !strcmp(out, missing[i].line), "neurocache %s said '%s', not '%s'", args, out ? out : "",
               missing[i].line);
        free(out);
    }
}

TEST(eval_table_matches_score)
{
    char csv[1200], *out = NULL;
    snprintf(csv, sizeof csv, "%s/eval.csv", tmpdir);
    int st = run(&out, "%s/neurocache eval --model %s --csv %s %s 2>/dev/null", bin_dir(), fixdir, csv, docpath);
    CHECK(st == 0);
    /* default rows */
    const char *names[] = {"static", "unigram N=2000", "neural N=2000", "neural-global N=2000", "unbounded k=1024",
                           "neural N=2000 theta=0.3 lambda=0.1 unbounded"};
    for (int i = 0; i < 6; i++)
        CHECK_STR_CONTAINS(out, names[i]);
    free(out);
    char key[256];
    snprintf(key, sizeof key, "%s,\"static\"", strrchr(docpath, '/') + 1);
    double e_static = csv_value(csv, key, 3);
    snprintf(key, sizeof key, "%s,\"neural N=2000 theta=0.3 lambda=0.1\"", strrchr(docpath, '/') + 1);
    double e_neural = csv_value(csv, key, 3);
    snprintf(key, sizeof key, "%s,\"unbounded k=1024", strrchr(docpath, '/') + 1);
    double e_ub = csv_value(csv, key, 3);
    CHECKF(REL(e_static, score_ppl("")) < TOL_PPL_PATHS, "eval static %g", e_static);
    CHECKF(REL(e_neural, score_ppl("--neural-cache 2000 --theta 0.3 --lambda 0.1")) < TOL_PPL_PATHS, "eval neural %g",
           e_neural);
    CHECKF(REL(e_ub, score_ppl("--unbounded")) < TOL_PPL_PATHS, "eval unbounded %g", e_ub);
    CHECK(csv_value(csv, key, 5) > 0);   /* tokens/s */

    /* rows from the options: each cache alone and the combination */
    const char *o = "--neural-cache 40 --theta 0.7 --lambda 0.2 --unbounded --knn 16 --unbounded-lambda 0.3";
    st = run(&out, "%s/neurocache eval --model %s %s --csv %s %s 2>/dev/null", bin_dir(), fixdir, o, csv, docpath);
    CHECK(st == 0);
    int lines = 0;
    for (char *p = out; (p = strchr(p, '\n')); p++)
        lines++;
    CHECKF(lines == 2 + 4, "%d lines:\n%s", lines, out);   /* header, column names, 4 rows */
    free(out);
    snprintf(key, sizeof key, "%s,\"neural N=40 theta=0.7 lambda=0.2 unbounded", strrchr(docpath, '/') + 1);
    CHECKF(REL(csv_value(csv, key, 3), score_ppl(o)) < TOL_PPL_PATHS, "combination %g", csv_value(csv, key, 3));

    /* --row: the static row and exactly the rows asked for */
    st = run(&out, "%s/neurocache eval --model %s --csv %s --row '--unigram-cache 30 --unigram-lambda 0.2' "
                   "--row '--unbounded --knn 8 --unbounded-lambda 0.4' %s 2>/dev/null", bin_dir(), fixdir, csv, docpath);
    CHECK(st == 0);
    free(out);
    snprintf(key, sizeof key, "%s,\"unigram N=30", strrchr(docpath, '/') + 1);
    CHECK(REL(csv_value(csv, key, 3), score_ppl("--unigram-cache 30 --unigram-lambda 0.2")) < TOL_PPL_PATHS);
    snprintf(key, sizeof key, "%s,\"unbounded k=8", strrchr(docpath, '/') + 1);
    CHECK(REL(csv_value(csv, key, 3), score_ppl("--unbounded --knn 8 --unbounded-lambda 0.4")) < TOL_PPL_PATHS);
}

TEST(eval_sweeps)
{
    char prefix[1200], path[1300], *out = NULL;
    snprintf(prefix, sizeof prefix, "%s/sw-knn", tmpdir);
    int st = run(&out, "%s/neurocache eval --model %s --sweep knn=4,8,16 --out %s %s 2>/dev/null", bin_dir(), fixdir,
                 prefix, docpath);
    CHECK(st == 0);
    free(out);
    snprintf(path, sizeof path, "%s.csv", prefix);
    char key[256];
    const char *base = strrchr(docpath, '/') + 1;
    /* the k=8 row reuses the k=16 search (its first 8 neighbours) */
    snprintf(key, sizeof key, "%s,knn,8,", base);
    double v8 = csv_value(path, key, 3);
    CHECKF(REL(v8, score_ppl("--unbounded --knn 8")) < TOL_PPL_PATHS, "sweep k=8: %g", v8);
    snprintf(key, sizeof key, "%s,knn,4,", base);
    CHECKF(REL(csv_value(path, key, 3), score_ppl("--unbounded --knn 4")) < TOL_PPL_PATHS, "sweep k=4");
    CHECKF(REL(csv_value(path, key, 4), score_ppl("")) < TOL_PPL_PATHS, "static column");
    snprintf(path, sizeof path, "%s.png", prefix);
    CHECK(is_png(path));

    snprintf(prefix, sizeof prefix, "%s/sw-n", tmpdir);
    st = run(&out, "%s/neurocache eval --model %s --sweep neural-cache=10,50,200 --theta 0.5 --lambda 0.2 --out %s %s "
                   "2>/dev/null", bin_dir(), fixdir, prefix, docpath);
    CHECK(st == 0);
    free(out);
    snprintf(path, sizeof path, "%s.csv", prefix);
    snprintf(key, sizeof key, "%s,neural-size,50,", base);   /* the alias swept, the name shown */
    CHECKF(REL(csv_value(path, key, 3), score_ppl("--neural-cache 50 --theta 0.5 --lambda 0.2")) < TOL_PPL_PATHS,
           "sweep N=50");
    snprintf(path, sizeof path, "%s.png", prefix);
    CHECK(is_png(path));
}

/* "best X: perplexity P (...) options: OPTS" -> P and OPTS */
static bool best_line(const char *out, const char *what, double *ppl, char *opts, size_t len)
{
    char key[64];
    snprintf(key, sizeof key, "best %s: perplexity ", what);
    const char *l = strstr(out, key);
    if (!l)
        return false;
    *ppl = strtod(l + strlen(key), NULL);
    const char *o = strstr(l, "options: "), *nl = strchr(l, '\n');
    if (!o || !nl || o > nl)
        return false;
    o += 9;
    snprintf(opts, len, "%.*s", (int)(nl - o), o);
    return true;
}

TEST(tune_best_matches_score)
{
    char prefix[1200], path[1300], *out = NULL, opts[512];
    snprintf(prefix, sizeof prefix, "%s/tune", tmpdir);
    int st = run(&out,
                 "%s/neurocache tune --model %s --valid %s --neural-cache 40 --thetas 0.3,0.7,1.5 --lambdas 0.1,0.2 "
                 "--unbounded --knn 16 --unbounded-lambdas 0.1,0.3,0.5 --out %s 2>/dev/null",
                 bin_dir(), fixdir, docpath, prefix);
    CHECK(st == 0);
    double p = NAN;
    CHECKF(out && best_line(out, "neural", &p, opts, sizeof opts), "%s", out);
    CHECKF(REL(p, score_ppl(opts)) < TOL_PPL_PATHS, "best neural %g vs score %s", p, opts);
    /* the best is the grid's minimum, and a grid point is what score says */
    snprintf(path, sizeof path, "%s-neural.csv", prefix);
    double mn = INFINITY;
    const char *keys[] = {"0.3,0.1,", "0.3,0.2,", "0.7,0.1,", "0.7,0.2,", "1.5,0.1,", "1.5,0.2,"};
    for (int i = 0; i < 6; i++) {
        double v = csv_value(path, keys[i], 2);
        CHECKF(isfinite(v), "grid point %s missing", keys[i]);
        mn = fmin(mn, v);
    }
    /* one number printed twice: %.3f in the summary (<= 5e-4 off), %.6f in the CSV */
    CHECK(fabs(mn - p) <= 5e-4 + 5e-7);
    CHECK(REL(csv_value(path, "0.3,0.2,", 2), score_ppl("--neural-cache 40 --theta 0.3 --lambda 0.2")) < TOL_PPL_PATHS);
    CHECKF(out && best_line(out, "neural+unbounded", &p, opts, sizeof opts), "%s", out);
    CHECKF(REL(p, score_ppl(opts)) < TOL_PPL_PATHS, "best neural+unbounded %g vs score %s", p, opts);
    /* neural lambda x unbounded lambda, jointly: the best is their minimum */
    snprintf(path, sizeof path, "%s-unbounded.csv", prefix);
    mn = INFINITY;
    const char *jkeys[] = {"neural,0.1,0.1,", "neural,0.1,0.3,", "neural,0.1,0.5,",
                           "neural,0.2,0.1,", "neural,0.2,0.3,", "neural,0.2,0.5,"};
    for (int i = 0; i < 6; i++) {
        double v = csv_value(path, jkeys[i], 3);
        CHECKF(isfinite(v), "joint grid point %s missing", jkeys[i]);
        mn = fmin(mn, v);
    }
    CHECKF(fabs(mn - p) <= 5e-4 + 5e-7, "joint minimum %g, best neural+unbounded %g", mn, p);
    CHECKF(out && best_line(out, "unbounded", &p, opts, sizeof opts), "%s", out);
    CHECKF(REL(p, score_ppl(opts)) < TOL_PPL_PATHS, "best unbounded %g vs score %s", p, opts);
    snprintf(path, sizeof path, "%s.png", prefix);
    CHECK(is_png(path));
    free(out);
    /* global normalisation grid */
    st = run(&out, "%s/neurocache tune --model %s --valid %s --neural-cache 40 --global-norm --thetas 0.5,1 "
                   "--alphas -2,0 --no-plot --out %s 2>/dev/null", bin_dir(), fixdir, docpath, prefix);
    CHECK(st == 0);
    CHECKF(out && best_line(out, "neural", &p, opts, sizeof opts), "%s", out);
    CHECK_STR_CONTAINS(cs(opts), "--global-norm --neural-alpha");
    CHECKF(REL(p, score_ppl(opts)) < TOL_PPL_PATHS, "best global %g vs score %s", p, opts);
    free(out);
}

TEST(build_index)
{
    char mdir[1200], idx[1300], *out = NULL;
    snprintf(mdir, sizeof mdir, "%s/model", tmpdir);
    mkdir(mdir, 0755);
    const char *files[] = {"config.json", "vocab.txt", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "cp %s/%s %s/", fixdir, files[i], mdir);
        CHECK(system(cmd) == 0);
    }
    int st = run(&out, "%s/neurocache build-index --model %s --corpus %s --factory IVF8,PQ4np --sample 400 2>&1",
                 bin_dir(), mdir, docpath);
    CHECKF(st == 0, "%s", out);
    CHECK_STR_CONTAINS(out, "training IVF8,PQ4np on 400 of 780");
    free(out);
    snprintf(idx, sizeof idx, "%s/unbounded.faiss", mdir);
    FaissIndex *fi = NULL;
    CHECK(faiss_read_index_fname(idx, 0, &fi) == 0);
    if (fi) {
        CHECK(faiss_Index_is_trained(fi) && faiss_Index_ntotal(fi) == 0 && faiss_Index_d(fi) == 16);
        faiss_Index_free(fi);
    }
    /* score switches to the index --index names (without it the cache
     * trains its own: issue 35) */
    st = run(&out, "%s/neurocache score --model %s --unbounded --knn 8 --switch-at 200 --index %s %s 2>&1 >/dev/null",
             bin_dir(), mdir, idx, docpath);
    CHECK(st == 0);
    CHECK_STR_CONTAINS(out, "IVF index");
    free(out);
    /* two search threads (OpenBLAS on one meanwhile) score the same */
    double ppl_threads[2];
    for (int th = 1; th <= 2; th++) {
        st = run(&out, "%s/neurocache score --model %s --unbounded --knn 8 --switch-at 200 --neural-cache 50 "
                       "--threads %d %s 2>/dev/null", bin_dir(), mdir, th, docpath);
        CHECK(st == 0);
        ppl_threads[th - 1] = tsv_ppl(out, NULL);
        free(out);
    }
    /* not bit-equal: --threads 1 leaves OpenBLAS on its own thread count and
     * --threads 2 puts it on one, and OpenBLAS's threaded GEMV takes each
     * thread's tail rows with another kernel (another summation order) */
    CHECKF(isfinite(ppl_threads[0]) && REL(ppl_threads[0], ppl_threads[1]) < TOL_PPL_PATHS, "--threads 1: %.9g, 2: %.9g",
           ppl_threads[0], ppl_threads[1]);
    st = run(&out, "%s/neurocache score --model %s --unbounded --knn 8 --exact %s 2>&1 >/dev/null", bin_dir(), mdir,
             docpath);
    CHECK(st == 0);
    CHECK_STR_CONTAINS(out, "exact (flat) index");
    free(out);
    /* errors */
    CHECK(run(&out, "%s/neurocache build-index --model %s --corpus %s --factory Bogus99 --out %s/x.faiss 2>&1",
              bin_dir(), mdir, docpath, tmpdir) == 1);
    CHECK_STR_CONTAINS(out, "bad --factory 'Bogus99'");
    free(out);
    CHECK(run(&out, "%s/neurocache build-index --model %s 2>&1", bin_dir(), mdir) == 2);
    CHECK_STR_CONTAINS(out, "--corpus FILE is required");
    free(out);
    CHECK(run(&out, "%s/neurocache build-index --model %s --corpus %s --sample 0 2>&1", bin_dir(), mdir, docpath) == 2);
    CHECK_STR_CONTAINS(out, "--sample");
    free(out);
    CHECK(run(&out, "%s/neurocache build-index --model %s --corpus /nonexistent/c.txt --out %s/y.faiss 2>&1",
              bin_dir(), mdir, tmpdir) == 1);
    CHECK_STR_CONTAINS(out, "/nonexistent/c.txt");
    free(out);
    /* an index of the wrong dimension is refused by score */
    snprintf(idx, sizeof idx, "%s/lstm-1layer-tied", harness_fixtures());
    st = run(&out, "%s/neurocache build-index --model %s --corpus %s --factory IVF4,Flat --sample 300 --out %s/w.faiss "
                   "2>&1", bin_dir(), idx, docpath, tmpdir);
    CHECK(st == 0);
    free(out);
    st = run(&out, "%s/neurocache score --model %s --unbounded --index %s/w.faiss %s 2>&1 >/dev/null", bin_dir(),
             mdir, tmpdir, docpath);
    CHECK(st == 1);
    CHECK_STR_CONTAINS(out, "index dimension 12, model hidden size 16");
    free(out);
}

/* The perplexities eval prints for each fixture model agree across every
 * kernel level this CPU has (NEUROCACHE_SIMD in the child's environment):
 * the levels differ in summation order and exp (tolerance.h). The level
 * the CLI took is the one asked for (its --version says so). */
TEST(eval_agrees_across_simd_levels)
{
    const char *models[] = {"lstm-2layer", "lstm-2layer-f16", "lstm-1layer-tied"};
    const char *levels[] = {"scalar", "avx2", "avx512"};
    const char *rows[] = {"static", "unigram N=2000", "neural N=2000", "neural-global N=2000", "unbounded k=1024",
                          "neural N=2000 theta=0.3 lambda=0.1 unbounded"};
    enum { NROWS = sizeof rows / sizeof rows[0] };
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char mdir[1200];
        snprintf(mdir, sizeof mdir, "%s/%s", harness_fixtures(), models[mi]);
        double first[NROWS];
        int nlevels = 0;
        for (int li = 0; li < 3; li++) {
            char *out = NULL, csv[1300], key[512];
            if (run(&out, "NEUROCACHE_SIMD=%s %s/neurocache --version 2>&1", levels[li], bin_dir()) != 0) {
                free(out);   /* not on this CPU */
                continue;
            }
            char want[64];
            snprintf(want, sizeof want, "simd %s ", levels[li]);
            CHECK_STR_CONTAINS(out, want);
            free(out);
            snprintf(csv, sizeof csv, "%s/levels-%s-%s.csv", tmpdir, models[mi], levels[li]);
            int st = run(&out, "NEUROCACHE_SIMD=%s %s/neurocache eval --model %s --csv %s %s 2>/dev/null", levels[li],
                         bin_dir(), mdir, csv, docpath);
            CHECKF(st == 0, "%s %s: exit %d", models[mi], levels[li], st);
            free(out);
            for (int r = 0; r < NROWS; r++) {
                snprintf(key, sizeof key, "%s,\"%s", strrchr(docpath, '/') + 1, rows[r]);
                double v = csv_value(csv, key, 3);
                CHECKF(isfinite(v), "%s %s: row %s missing", models[mi], levels[li], rows[r]);
                if (nlevels == 0)
                    first[r] = v;
                else
                    CHECKF(REL(v, first[r]) < TOL_PPL_PATHS, "%s %s %s: %.9g vs %s %.9g", models[mi], levels[li],
                           rows[r], v, levels[0], first[r]);
            }
            nlevels++;
        }
        CHECK(nlevels >= 1);
    }
}

int main(void)
{
    snprintf(fixdir, sizeof fixdir, "%s/lstm-2layer", harness_fixtures());
    write_doc();
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(score_caches_match_library);
    RUN(score_open_vocabulary);
    RUN(usage_errors);
    RUN(eval_table_matches_score);
    RUN(eval_sweeps);
    RUN(eval_agrees_across_simd_levels);
    RUN(tune_best_matches_score);
    RUN(build_index);
    unlink(docpath);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return harness_summary();
}
