/* cacheopts.c -- the cache options shared by `score`, `eval` and `tune`. */
#include "cacheopts.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cblas.h>

#include "buf.h"
#include "components.h"
#include "stream.h"
#include "suggest.h"

static char help_text[6144];

/* The CLI's own cache options, after the knobs (codes CO_INDEX...). */
static const struct option own_cache_opts[] = {
    {"index", required_argument, NULL, CO_INDEX},
    {"switch-at", required_argument, NULL, CO_SWITCH_AT},
    {"threads", required_argument, NULL, CO_THREADS},
    {"memory", required_argument, NULL, CO_MEMORY},
    {"no-normalize", no_argument, NULL, CO_NO_NORMALIZE},
};

/* A cache option's name by its getopt code: the knob's flag, or the CLI's own. */
static const char *code_name(int code)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    if (code > CO_FIRST && code - CO_FIRST - 1 < (int)n)
        return k[code - CO_FIRST - 1].flag;
    for (size_t i = 0; i < sizeof own_cache_opts / sizeof *own_cache_opts; i++)
        if (own_cache_opts[i].val == code)
            return own_cache_opts[i].name;
    return "?";
}

void cacheopts_options(const struct option *own, struct option *out)
{
    size_t o = 0, n, rows = 0, aliases = 0;
    const nc_cache_knob *k = cache_knobs(&n);
    while (own && own[rows].name)
        rows++;
    for (size_t i = 0; i < n; i++)
        aliases += k[i].alias != NULL;
    if (rows + n + aliases + sizeof own_cache_opts / sizeof *own_cache_opts + 1 > CACHEOPTS_MAX)
        abort();   /* a command with more options than the table holds: a programming error */
    for (; o < rows; o++)
        out[o] = own[o];
    for (size_t i = 0; i < n; i++) {
        int has_arg = k[i].type == NC_KNOB_BOOL ? no_argument : required_argument;
        out[o++] = (struct option){k[i].flag, has_arg, NULL, CO_FIRST + 1 + (int)i};
        if (k[i].alias)
            out[o++] = (struct option){k[i].alias, has_arg, NULL, CO_FIRST + 1 + (int)i};
    }
    for (size_t i = 0; i < sizeof own_cache_opts / sizeof *own_cache_opts; i++)
        out[o++] = own_cache_opts[i];
    out[o] = (struct option){NULL, 0, NULL, 0};
}

static void build_help(void)
{
    size_t n, o = 0;
    const nc_cache_knob *k = cache_knobs(&n);
#define ADD(...) do { if (o < sizeof help_text) o += (size_t)snprintf(help_text + o, sizeof help_text - o, __VA_ARGS__); } while (0)
    ADD("cache options (all off by default; design §4; each is the JSON/config knob\n"
        "of the same name with '-' for '_'; older names in brackets still work):\n");
    for (size_t i = 0; i < n; i++) {
        char opt[64];
        snprintf(opt, sizeof opt, "--%s%s", k[i].flag,
                 k[i].type == NC_KNOB_BOOL ? "" : k[i].type == NC_KNOB_INT ? " N" : k[i].type == NC_KNOB_KERNEL ? " K" : " X");
        ADD("  %-22s %s", opt, k[i].doc);
        if (k[i].type == NC_KNOB_INT || k[i].type == NC_KNOB_FLOAT)
            ADD(" [%g, %g]", k[i].min, k[i].max);
        if (k[i].type != NC_KNOB_BOOL)
            ADD(" (default %s)", k[i].def);
        if (k[i].alias)
            ADD(" [--%s]", k[i].alias);
        ADD("\n");
    }
    ADD("  --index FILE           trained index (default: the model's unbounded.faiss if present)\n"
        "  --switch-at N          pairs kept in the exact index before switching (default 65536)\n"
        "  --threads N            threads of the unbounded cache's searches (FAISS OpenMP;\n"
        "                         OpenBLAS runs on one meanwhile; default 1; 2 on an idle 2-core machine)\n"
        "  --memory FILE          stream FILE into the unbounded cache before scoring\n"
        "  --no-normalize         FILE is already in the model's text conventions: split on white space\n"
        "                         only, eos per line (docs/normalisation.md)\n");
#undef ADD
}

const char *cacheopts_help(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_help);
    return help_text;
}

void cacheopts_init(cacheopts *co)
{
    memset(co, 0, sizeof *co);
    cache_params_default(&co->p);
}

void cacheopts_start(cacheopts *co)
{
    cacheopts_init(co);
    opterr = 0;   /* the command prints its own messages */
    optind = 1;
}

bool cacheopts_given(const cacheopts *co, int code)
{
    return code > CO_FIRST && code < CO_LAST && co->seen[code - CO_FIRST];
}

int co_usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "neurocache %s: %s; see 'neurocache %s --help'\n", cmd, msg, cmd);
    return 2;
}

/* The knob an option row sets (under its name or its alias), NULL for another option. */
static const nc_cache_knob *option_knob(const struct option *o)
{
    return o->val > CO_FIRST && o->val < CO_INDEX ? cache_knob_by_flag(o->name) : NULL;
}

const char *co_suggest_option(const struct option *opts, const char *arg)
{
    char word[64];
    size_t len = strcspn(arg, "=");
    while (len > 0 && *arg == '-')
        arg++, len--;
    snprintf(word, sizeof word, "%.*s", (int)len, arg);
    nc_suggest s;
    suggest_init(&s, word);
    for (size_t i = 0; opts[i].name; i++) {
        const nc_cache_knob *k = option_knob(&opts[i]);
        suggest_offer_as(&s, opts[i].name, k ? k->flag : opts[i].name);
    }
    return suggest_best(&s);
}

int co_bad_option(const char *cmd, const struct option *opts, int code, char **argv)
{
    const char *arg = argv[optind - 1];
    if (code == ':')
        return co_usage_error(cmd, "option '%s' needs a value", arg);
    /* an unknown option: getopt_long takes unique prefixes, so a prefix of
     * several is ambiguous rather than unknown */
    if (!strncmp(arg, "--", 2) && arg[2]) {
        size_t len = strcspn(arg + 2, "="), nm = 0;
        char list[256] = "";
        for (size_t i = 0; opts[i].name; i++) {
            const nc_cache_knob *k = option_knob(&opts[i]);
            if (k && strcmp(k->flag, opts[i].name))
                continue;   /* an alias: its knob is listed under its name */
            if (!strncmp(opts[i].name, arg + 2, len)) {
                nm++;
                size_t o = strlen(list);
                snprintf(list + o, sizeof list - o, "%s--%s", o ? ", " : "", opts[i].name);
            }
        }
        if (nm > 1)
            return co_usage_error(cmd, "option '%s' is ambiguous (%s)", arg, list);
    }
    const char *near = co_suggest_option(opts, arg);
    if (near)
        return co_usage_error(cmd, "unknown option '%s' (did you mean '--%s'?)", arg, near);
    return co_usage_error(cmd, "unknown option '%s'", arg);
}

bool co_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool co_parse_float(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int co_parse_list(const char *s, double **out)
{
    *out = NULL;
    int n = 0, cap = 0;
    const char *p = s;
    double *v = NULL;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char buf[64];
        double x;
        if (len == 0 || len >= sizeof buf) {
            free(v);
            return -1;
        }
        memcpy(buf, p, len);
        buf[len] = '\0';
        if (!co_parse_float(buf, -1e9, 1e9, &x)) {
            free(v);
            return -1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            double *nv = realloc(v, (size_t)cap * sizeof(double));
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[n++] = x;
        p += len + (e ? 1 : 0);
        if (e && !*p) {
            free(v);
            return -1;
        }
    }
    if (n == 0)
        return -1;
    *out = v;
    return n;
}

double co_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double co_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* Set once by the command's option loop, before any file is read. */
static bool co_normalize = true;
/* co_read_tokens prints each file's unknown-word rate (score prints its own
 * beside its perplexity) */
bool co_report_unk = true;

int co_parse_normalize(int code)
{
    if (code != CO_NO_NORMALIZE)
        return 0;
    co_normalize = false;
    return 1;
}

int cacheopts_parse(cacheopts *co, int code, const char *arg, const char *cmd)
{
    if (co_parse_normalize(code))
        return 1;
    if (code <= CO_FIRST || code >= CO_LAST)
        return 0;
    co->seen[code - CO_FIRST] = 1;
    size_t nknobs;
    const nc_cache_knob *knobs = cache_knobs(&nknobs);
    if (code - CO_FIRST - 1 < (int)nknobs) {   /* a knob: the table parses and checks it */
        const nc_cache_knob *k = &knobs[code - CO_FIRST - 1];
        char err[NC_ERRLEN];
        if (cache_knob_set_text(&co->p, k, k->type == NC_KNOB_BOOL ? "true" : arg, err, sizeof err) == NC_OK)
            return 1;
        fprintf(stderr, "neurocache %s: --%s: %s\n", cmd, k->flag, err);
        return -1;
    }
    long iv;
    switch (code) {
    case CO_INDEX: co->index_path = arg; break;
    case CO_SWITCH_AT:
        if (!co_parse_int(arg, 1, 4000000000L, &iv))
            goto bad;
        co->switch_at = iv;
        break;
    case CO_THREADS:
        if (!co_parse_int(arg, 1, 1024, &iv))
            goto bad;
        co->threads = (int)iv;
        break;
    case CO_MEMORY: co->memory_path = arg; break;
    }
    return 1;
bad:
    fprintf(stderr, "neurocache %s: bad value '%s' for --%s\n", cmd, arg, code_name(code));
    return -1;
}

int cacheopts_finish(cacheopts *co, const char *cmd)
{
    /* option opt needs option needs (its cache); the message is built from
     * the names, with what needs wants for a value and a hint */
    static const struct {
        int opt, needs;
        const char *value, *hint;
    } rules[] = {
        {CO_KNOB_unigram_lambda, CO_KNOB_unigram_size, " N", ""},
        {CO_KNOB_neural_theta, CO_KNOB_neural_size, " N", ""},
        {CO_KNOB_neural_lambda, CO_KNOB_neural_size, " N", " (for the unbounded cache use --unbounded-lambda)"},
        {CO_KNOB_global_norm, CO_KNOB_neural_size, " N", ""},
        {CO_KNOB_neural_alpha, CO_KNOB_global_norm, "", ""},
        {CO_KNOB_neural_f16, CO_KNOB_neural_size, " N", ""},
        {CO_KNOB_knn, CO_KNOB_unbounded, "", ""},
        {CO_KNOB_nprobe, CO_KNOB_unbounded, "", ""},
        {CO_KNOB_unbounded_lambda, CO_KNOB_unbounded, "", ""},
        {CO_KNOB_exact, CO_KNOB_unbounded, "", ""},
        {CO_KNOB_kernel, CO_KNOB_unbounded, "", ""},
        {CO_INDEX, CO_KNOB_unbounded, "", ""},
        {CO_SWITCH_AT, CO_KNOB_unbounded, "", ""},
        {CO_MEMORY, CO_KNOB_unbounded, "", ""},
        {CO_KNOB_uniform_mu, CO_KNOB_open_vocab, "", ""},
        {CO_KNOB_vocab_size_full, CO_KNOB_open_vocab, "", ""},
        {CO_KNOB_gate_skip, CO_KNOB_gate, "", ""},
    };
    for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
        if (cacheopts_given(co, rules[i].opt) && !cacheopts_given(co, rules[i].needs)) {
            fprintf(stderr, "neurocache %s: --%s needs --%s%s%s\n", cmd, code_name(rules[i].opt),
                    code_name(rules[i].needs), rules[i].value, rules[i].hint);
            return 2;
        }
    if (cacheopts_given(co, CO_KNOB_neural_lambda) && co->p.global_norm) {
        fprintf(stderr, "neurocache %s: --neural-lambda is for linear interpolation; with --global-norm use --neural-alpha\n",
                cmd);
        return 2;
    }
    if (cacheopts_given(co, CO_KNOB_exact) && cacheopts_given(co, CO_INDEX)) {
        fprintf(stderr, "neurocache %s: --exact and --index contradict each other\n", cmd);
        return 2;
    }
    char err[NC_ERRLEN];
    if (cache_params_validate(&co->p, err, sizeof err) != NC_OK) {
        fprintf(stderr, "neurocache %s: %s\n", cmd, err);
        return 2;
    }
    /* One FAISS thread unless asked: searches come in blocks of 64 queries,
     * where OpenMP's fork/join costs more than it saves, and with the cores
     * busy (a training run, the other scorer) its spin-waiting threads made
     * `score --unbounded` 60x slower (170 vs 9,900 tokens/s, BENCHMARKS.md). */
    unbounded_cache_set_threads(co->threads > 0 ? co->threads : 1);
    return 0;
}

int co_search_begin(const cacheopts *co)
{
    int saved = openblas_get_num_threads();
    if (co->threads > 1)
        openblas_set_num_threads(1);
    return saved;
}

void co_search_end(int saved)
{
    openblas_set_num_threads(saved);
}

int cacheopts_make_ub(const cacheopts *co, const nc_cache_params *p, const nc_model *m,
                      nc_wordtable *words, nc_unbounded_cache **out, char *err, size_t errlen)
{
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, m->cfg.hidden_size);
    char path[1200];
    o.exact = p->exact;
    if (!p->exact) {
        if (co->index_path) {
            o.trained_path = co->index_path;
        } else {
            snprintf(path, sizeof path, "%s/unbounded.faiss", m->dir);
            if (m->dir[0] && access(path, R_OK) == 0)
                o.trained_path = path;
        }
    }
    if (co->switch_at > 0)
        o.switch_at = co->switch_at;
    o.nprobe = p->nprobe;
    /* the daemon's lifecycle (unbounded_cache.h): the cache trains its own
     * index at --switch-at and as it grows -- in the adding thread, so that
     * a run's numbers never depend on timing; --index FILE asks for that
     * training instead */
    o.own_training = !co->index_path;
    o.train_sync = true;
    return unbounded_cache_new(&o, words, out, err, errlen);
}

double co_unk_rate(const nc_model *m, const nc_tokens *t, size_t *unk)
{
    *unk = tokens_count_unk(m, t, 0);
    return t->n ? 100.0 * (double)*unk / (double)t->n : 0.0;
}

int co_read_tokens(const nc_model *m, const char *path, nc_tokens *out, char *err, size_t errlen)
{
    nc_buf text = NC_BUF_INIT;
    int rc = strcmp(path, "-") ? buf_read_file(&text, path, err, errlen)
                               : buf_read_stream(&text, stdin, "standard input", err, errlen);
    if (!rc) {
        char e2[NC_ERRLEN];
        size_t n0 = out->n, unk;
        rc = tokenize_ex(m, text.data ? text.data : "", text.len, true, co_normalize, out, e2, sizeof e2);
        if (rc)
            nc_error(err, errlen, rc, "%s: %s", path, e2);
        /* every perplexity a command prints comes with the rate of <unk>
         * behind it (an <unk>-heavy text flatters it: docs/normalisation.md) */
        /* words and offsets are NULL when the caller keeps no strings
         * (and an empty file leaves ids NULL): no offset into NULL */
        nc_tokens mine = {out->ids ? out->ids + n0 : NULL, out->words ? out->words + n0 : NULL,
                          out->offsets ? out->offsets + n0 : NULL, out->n - n0, out->n - n0, NULL};
        double rate = rc ? 0 : co_unk_rate(m, &mine, &unk);
        if (!rc && co_report_unk)
            fprintf(stderr, "%s: %zu tokens (%s), %zu unknown words (%.2f%%)\n", path, mine.n,
                    co_normalize && m->cfg.text.declared ? "normalised to the model's text conventions"
                                                         : "split on white space",
                    unk, rate);
    }
    buf_free(&text);
    return rc;
}

int co_prepare(const co_text *x, nc_doc **out, char *err, size_t errlen)
{
    return co_prepare_ex(x, x->m->gate != NULL, out, err, errlen);
}

int co_prepare_ex(const co_text *x, bool vocab_stats, nc_doc **out, char *err, size_t errlen)
{
    const nc_model *m = x->m;
    const bool bos_eos = x->bos_eos;
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    int rc = (!s || !w) ? nc_error(err, errlen, NC_ENOMEM, "state") : NC_OK;
    if (!rc && bos_eos)
        lstm_step(m, s, m->eos_id, w);
    const nc_doc_prep in = {
        .m = m, .s = s, .has_h = bos_eos, .toks = x->toks, .words = x->words, .vocab_stats = vocab_stats};
    if (!rc)
        rc = doc_prepare(&in, out, err, errlen);
    lstm_state_free(s);
    lstm_work_free(w);
    return rc;
}

double co_ppl(const double *lp, size_t len, size_t *n)
{
    double sum = 0;
    size_t c = 0;
    for (size_t i = 0; i < len; i++)
        if (!isnan(lp[i])) {
            sum += lp[i];
            c++;
        }
    if (n)
        *n = c;
    return c ? exp(-sum / (double)c) : NAN;
}

/* One chunk of the hidden pass: rows h[0..n] (row 0 = h before the first
 * token) and the cache ids of the n tokens. */
typedef struct {
    float *h;
    int *ids;
    size_t n;
} hp_chunk;

/* The consumer side of co_hidden_pass: calls fn on the chunks in order, in
 * its own thread, while the caller's thread runs the LSTM over the next
 * chunk -- the two-stage pipeline an upload to the daemon runs (its upload
 * worker), so that --memory streams at upload speed: with the model's IVF
 * index the adds (coarse assignment + PQ encoding) cost as much as the LSTM. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    hp_chunk slot[2];
    int ready[2];                 /* slot filled, waiting for fn */
    bool done;                    /* producer finished (or failed) */
    int rc;                       /* fn's first failure */
    char err[NC_ERRLEN];
    co_hidden_fn fn;
    void *ctx;
} hp_pipe;

static void *hp_consumer(void *arg)
{
    hp_pipe *p = arg;
    for (int b = 0;; b ^= 1) {
        pthread_mutex_lock(&p->lock);
        while (!p->ready[b] && !p->done)
            pthread_cond_wait(&p->cond, &p->lock);
        bool have = p->ready[b];
        pthread_mutex_unlock(&p->lock);
        if (!have)
            return NULL;
        int rc = p->fn(p->slot[b].h, p->slot[b].ids, p->slot[b].n, p->ctx, p->err, sizeof p->err);
        pthread_mutex_lock(&p->lock);
        p->ready[b] = 0;
        if (rc && !p->rc)
            p->rc = rc;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        if (rc)
            return NULL;
    }
}

/* Waits until the consumer is done with slot b; the consumer's error, if any. */
static int hp_wait_slot(hp_pipe *p, int b)
{
    pthread_mutex_lock(&p->lock);
    while (p->ready[b] && !p->rc)
        pthread_cond_wait(&p->cond, &p->lock);   /* slot b still being added */
    int rc = p->rc;
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* Hands slot b, holding n tokens, to the consumer. */
static void hp_publish(hp_pipe *p, int b, size_t n)
{
    p->slot[b].n = n;
    pthread_mutex_lock(&p->lock);
    p->ready[b] = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

/* Tells the consumer no chunk follows and waits for it (after the last
 * chunk was consumed); the consumer's error if rc was fine. */
static int hp_stop_consumer(hp_pipe *p, pthread_t th, int rc, char *err, size_t errlen)
{
    pthread_mutex_lock(&p->lock);
    p->done = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(th, NULL);
    if (!rc && p->rc)
        rc = nc_error(err, errlen, p->rc, "%s", p->err);
    return rc;
}

/* The producer side: the model, its running state and the tokens. */
typedef struct {
    const nc_model *m;
    nc_state *s;
    const nc_tokens *toks;
    nc_wordtable *words;   /* open vocabulary: ids for the unk words (NULL: off) */
} hp_producer;

/* Runs the LSTM over tokens j0..j0+nb into chunk c: row 0 = h before the
 * chunk's first token, rows 1..nb = after each; the tokens' cache ids. */
static int hp_fill_chunk(const hp_producer *pr, size_t j0, size_t nb, hp_chunk *c, char *err, size_t errlen)
{
    const nc_model *m = pr->m;
    const nc_tokens *toks = pr->toks;
    const int H = m->cfg.hidden_size;
    memcpy(c->h, lstm_state_top(pr->s), (size_t)H * sizeof(float));
    int rc = lstm_forward_seq(m, pr->s, toks->ids + j0, nb, c->h + H, err, errlen);
    for (size_t r = 0; !rc && r < nb; r++) {
        int id = toks->ids[j0 + r];
        if (pr->words && id == m->unk_id && toks->words && toks->words[j0 + r]) {
            id = wordtable_id(pr->words, toks->words[j0 + r], strlen(toks->words[j0 + r]), true);
            if (id < 0)
                rc = nc_error(err, errlen, NC_ENOMEM, "word table");
        }
        c->ids[r] = id;
    }
    return rc;
}

/* The producer's loop: chunks of C tokens into the two slots in turn. */
static int hp_produce(hp_pipe *p, const hp_producer *pr, size_t C, bool progress, char *err, size_t errlen)
{
    const nc_tokens *toks = pr->toks;
    double t0 = co_now(), last = t0;
    int rc = NC_OK, b = 0;
    for (size_t j0 = 0; !rc && j0 < toks->n; j0 += C, b ^= 1) {
        size_t nb = toks->n - j0 < C ? toks->n - j0 : C;
        rc = hp_wait_slot(p, b);
        if (!rc)
            rc = hp_fill_chunk(pr, j0, nb, &p->slot[b], err, errlen);
        if (rc)
            break;
        hp_publish(p, b, nb);
        double t = co_now();
        if (progress && (t - last > 2.0 || j0 + nb == toks->n)) {
            fprintf(stderr, "  %zu/%zu tokens (%.0f%%), %.0f tokens/s\n", j0 + nb, toks->n,
                    100.0 * (double)(j0 + nb) / (double)toks->n, (double)(j0 + nb) / (t - t0 + 1e-9));
            last = t;
        }
    }
    return rc;
}

int co_hidden_pass(const co_text *x, co_hidden_fn fn, void *ctx, bool progress, char *err, size_t errlen)
{
    const nc_model *m = x->m;
    const nc_tokens *toks = x->toks;
    const size_t C = 4096;
    const int H = m->cfg.hidden_size;
    hp_producer pr = {.m = m, .s = lstm_state_new(m), .toks = toks, .words = x->words};
    nc_lstm_work *w = lstm_work_new(m);
    hp_pipe p = {.fn = fn, .ctx = ctx};
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    bool alloc_ok = pr.s && w;
    for (int b = 0; b < 2; b++) {
        p.slot[b].h = malloc((C + 1) * (size_t)H * sizeof(float));
        p.slot[b].ids = malloc(C * sizeof(int));
        alloc_ok = alloc_ok && p.slot[b].h && p.slot[b].ids;
    }
    int rc = alloc_ok ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "hidden pass buffers");
    pthread_t th;
    bool started = false;
    if (!rc) {
        lstm_step(m, pr.s, m->eos_id, w);
        started = pthread_create(&th, NULL, hp_consumer, &p) == 0;
        if (!started)
            rc = nc_error(err, errlen, NC_ENOMEM, "hidden pass thread");
    }
    /* the two stages share the cores: one BLAS thread for the LSTM, as the
     * daemon runs it (FAISS's OpenMP count is cacheopts_finish's) */
    int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    double t0 = co_now();
    if (!rc)
        rc = hp_produce(&p, &pr, C, progress, err, errlen);
    if (started)
        rc = hp_stop_consumer(&p, th, rc, err, errlen);
    openblas_set_num_threads(blas);
    if (!rc && progress && toks->n)
        fprintf(stderr, "  stored in %.2f s (%.0f tokens/s)\n", co_now() - t0,
                (double)toks->n / (co_now() - t0 + 1e-9));
    for (int k = 0; k < 2; k++) {
        free(p.slot[k].h);
        free(p.slot[k].ids);
    }
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    lstm_state_free(pr.s);
    lstm_work_free(w);
    return rc;
}

static int add_to_ub(const float *h, const int *ids, size_t n, void *ctx, char *err, size_t errlen)
{
    return unbounded_cache_add(ctx, h, ids, n, NULL, err, errlen);
}

int cacheopts_fill_memory(const nc_model *m, const char *path, nc_wordtable *words, nc_unbounded_cache *ub,
                          bool progress, char *err, size_t errlen)
{
    nc_tokens t;
    tokens_init(&t);
    int rc = co_read_tokens(m, path, &t, err, errlen);
    if (!rc && progress)
        fprintf(stderr, "memory: streaming %zu tokens of %s into the unbounded cache\n", t.n, path);
    if (!rc)
        rc = co_hidden_pass(&(co_text){.m = m, .toks = &t, .words = words}, add_to_ub, ub, progress, err, errlen);
    tokens_clear(&t);
    return rc;
}

/* A mixture row past the model's on (component.h on), or what changes the
 * model's own term: global normalisation (a cache inside it, model_term.c),
 * the open vocabulary's ids, dynamic evaluation. */
bool cacheopts_any(const cacheopts *co)
{
    const nc_cache_params *p = &co->p;
    return (components_on(p) & ~(1u << NC_COMP_MODEL)) != 0 || p->global_norm || p->open_vocab ||
           p->dyn_lr > 0.0f;
}

int co_score_stream(const co_text *x, const nc_cache_params *p, nc_unbounded_cache *ub, double *lp, char *err,
                    size_t errlen)
{
    nc_stream *s = NULL;
    int rc = stream_new(x->m, p, ub, x->words, x->bos_eos, &s, err, errlen);
    if (!rc)
        rc = stream_feed(s, x->toks, ub != NULL, lp, err, errlen);
    stream_free(s);
    return rc;
}

int co_score_cached(const co_text *x, const cacheopts *co, double *lp, bool progress, char *err, size_t errlen)
{
    const nc_model *m = x->m;
    nc_wordtable *words = NULL;
    nc_unbounded_cache *ub = NULL;
    nc_doc *d = NULL;
    int rc = NC_OK;
    if (co->p.open_vocab)
        rc = wordtable_new(m->vocab, &words, err, errlen);
    if (!rc && co->p.unbounded)
        rc = cacheopts_make_ub(co, &co->p, m, words, &ub, err, errlen);
    if (!rc && ub && co->memory_path)
        rc = cacheopts_fill_memory(m, co->memory_path, words, ub, progress, err, errlen);
    if (!rc && co->p.dyn_lr > 0.0f) {
        int blas = co_search_begin(co);
        rc = co_score_stream(&(co_text){m, x->toks, x->bos_eos, words}, &co->p, ub, lp, err, errlen);
        co_search_end(blas);
    } else if (!rc) {
        rc = co_prepare(&(co_text){m, x->toks, x->bos_eos, words}, &d, err, errlen);
    }
    if (!rc && d) {
        nc_doc_caches dc = {.ub = ub, .adapt = ub != NULL};
        int blas = co_search_begin(co);
        rc = doc_score(d, &co->p, &dc, lp, err, errlen);
        co_search_end(blas);
        if (!rc && progress && dc.searched + dc.skipped > 0)
            fprintf(stderr, "gate: %zu of %zu unbounded searches skipped (%.1f%%)\n", dc.skipped,
                    dc.searched + dc.skipped, 100.0 * (double)dc.skipped / (double)(dc.searched + dc.skipped));
    }
    if (!rc && ub && progress)
        fprintf(stderr, "unbounded cache: %lld pairs, %s index\n", (long long)unbounded_cache_count(ub),
                unbounded_cache_is_exact(ub) ? "exact (flat)" : "IVF");
    doc_free(d);
    unbounded_cache_free(ub);
    wordtable_free(words);
    return rc;
}

int co_gnuplot(const char *script, char *err, size_t errlen)
{
    FILE *g = popen("gnuplot 2>&1", "w");
    if (!g)
        return nc_error(err, errlen, NC_EIO, "cannot run gnuplot: %s", strerror(errno));
    fputs(script, g);
    int st = pclose(g);
    if (st != 0)
        return nc_error(err, errlen, NC_EIO, "gnuplot failed (status %d; is gnuplot installed? apt-get install gnuplot-nox, or make deps-test)", st);
    return NC_OK;
}
