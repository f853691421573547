/* cacheopts.c -- the cache options shared by `score`, `eval` and `tune`. */
#include "cacheopts.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cblas.h>

const char cacheopts_help[] =
    "cache options (all off by default; design §4):\n"
    "  --unigram-cache N       unigram cache over the last N words\n"
    "  --unigram-lambda L      its interpolation weight (default 0.1)\n"
    "  --neural-cache N        continuous cache over the last N (h, word) pairs\n"
    "  --theta T               flatness of the cache distribution (default 0.3)\n"
    "  --lambda L              linear interpolation weight (default 0.1)\n"
    "  --global-norm           global normalisation instead of linear interpolation\n"
    "  --alpha A               global normalisation bias (default 0)\n"
    "  --f16-keys              store neural cache keys as float16\n"
    "  --unbounded             unbounded cache over every earlier pair of the input\n"
    "  --knn K                 neighbours (default 1024)\n"
    "  --nprobe P              IVF lists probed (default 8)\n"
    "  --unbounded-lambda L    interpolation weight (default 0.3)\n"
    "  --exact                 exact (flat) search instead of the IVFPQ index\n"
    "  --kernel gaussian|epanechnikov   kernel (default gaussian)\n"
    "  --index FILE            trained index (default: the model's unbounded.faiss if present)\n"
    "  --switch-at N           pairs kept in the exact index before switching (default 65536)\n"
    "  --threads N             threads of the unbounded cache's searches (FAISS OpenMP;\n"
    "                          OpenBLAS runs on one meanwhile; default 1; 2 on an idle 2-core machine)\n"
    "  --memory FILE           stream FILE into the unbounded cache before scoring\n"
    "  --open-vocab            words outside the model vocabulary get their own ids\n"
    "  --uniform-mu M          interpolate with the uniform distribution (open vocabulary)\n"
    "  --vocab-size-full S     |V_full| for the uniform term (default: V + words seen)\n";

void cacheopts_init(cacheopts *co)
{
    memset(co, 0, sizeof *co);
    cache_params_default(&co->p);
}

bool cacheopts_given(const cacheopts *co, int code)
{
    return code >= CO_UNIGRAM && code < CO_LAST && co->seen[code - CO_UNIGRAM];
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

int cacheopts_parse(cacheopts *co, int code, const char *arg, const char *cmd)
{
    if (code < CO_UNIGRAM || code >= CO_LAST)
        return 0;
    co->seen[code - CO_UNIGRAM] = 1;
    long iv;
    double fv;
    nc_cache_params *p = &co->p;
#define INT(lo, hi, dst, name) do { if (!co_parse_int(arg, lo, hi, &iv)) goto bad; dst = (int)iv; } while (0)
#define FLT(lo, hi, dst) do { if (!co_parse_float(arg, lo, hi, &fv)) goto bad; dst = (float)fv; } while (0)
    switch (code) {
    case CO_UNIGRAM: INT(1, NC_CACHE_MAX_WINDOW, p->unigram_size, ""); break;
    case CO_UNIGRAM_LAMBDA: FLT(0, 1, p->unigram_lambda); break;
    case CO_NEURAL: INT(1, NC_CACHE_MAX_WINDOW, p->neural_size, ""); break;
    case CO_THETA: FLT(0, 1e4, p->neural_theta); break;
    case CO_LAMBDA: FLT(0, 1, p->neural_lambda); break;
    case CO_GLOBAL: p->global_norm = true; break;
    case CO_ALPHA: FLT(-100, 100, p->neural_alpha); break;
    case CO_F16: p->neural_f16 = true; break;
    case CO_UNBOUNDED: p->unbounded = true; break;
    case CO_KNN: INT(1, NC_CACHE_MAX_KNN, p->knn, ""); break;
    case CO_NPROBE: INT(1, NC_CACHE_MAX_NPROBE, p->nprobe, ""); break;
    case CO_UB_LAMBDA: FLT(0, 1, p->unbounded_lambda); break;
    case CO_EXACT: p->exact = true; break;
    case CO_KERNEL:
        if (!strcmp(arg, "gaussian"))
            p->kernel = NC_KERNEL_GAUSSIAN;
        else if (!strcmp(arg, "epanechnikov"))
            p->kernel = NC_KERNEL_EPANECHNIKOV;
        else
            goto bad;
        break;
    case CO_OPEN: p->open_vocab = true; break;
    case CO_MU: FLT(0, 0.999999, p->uniform_mu); break;
    case CO_VFULL: INT(1, 2000000000, p->vocab_size_full, ""); break;
    case CO_INDEX: co->index_path = arg; break;
    case CO_SWITCH_AT:
        if (!co_parse_int(arg, 1, 4000000000L, &iv))
            goto bad;
        co->switch_at = iv;
        break;
    case CO_THREADS: INT(1, 1024, co->threads, ""); break;
    case CO_MEMORY: co->memory_path = arg; break;
    }
#undef INT
#undef FLT
    return 1;
bad:;
    static const char *names[] = {"unigram-cache", "unigram-lambda", "neural-cache", "theta", "lambda",
                                  "global-norm", "alpha", "f16-keys", "unbounded", "knn", "nprobe",
                                  "unbounded-lambda", "exact", "kernel", "open-vocab", "uniform-mu",
                                  "vocab-size-full", "index", "switch-at", "threads", "memory"};
    fprintf(stderr, "neurocache %s: bad value '%s' for --%s\n", cmd, arg, names[code - CO_UNIGRAM]);
    return -1;
}

int cacheopts_finish(cacheopts *co, const char *cmd)
{
    static const struct {
        int opt, needs;
        const char *msg;
    } rules[] = {
        {CO_UNIGRAM_LAMBDA, CO_UNIGRAM, "--unigram-lambda needs --unigram-cache N"},
        {CO_THETA, CO_NEURAL, "--theta needs --neural-cache N"},
        {CO_LAMBDA, CO_NEURAL, "--lambda needs --neural-cache N (for the unbounded cache use --unbounded-lambda)"},
        {CO_GLOBAL, CO_NEURAL, "--global-norm needs --neural-cache N"},
        {CO_ALPHA, CO_GLOBAL, "--alpha needs --global-norm"},
        {CO_F16, CO_NEURAL, "--f16-keys needs --neural-cache N"},
        {CO_KNN, CO_UNBOUNDED, "--knn needs --unbounded"},
        {CO_NPROBE, CO_UNBOUNDED, "--nprobe needs --unbounded"},
        {CO_UB_LAMBDA, CO_UNBOUNDED, "--unbounded-lambda needs --unbounded"},
        {CO_EXACT, CO_UNBOUNDED, "--exact needs --unbounded"},
        {CO_KERNEL, CO_UNBOUNDED, "--kernel needs --unbounded"},
        {CO_INDEX, CO_UNBOUNDED, "--index needs --unbounded"},
        {CO_SWITCH_AT, CO_UNBOUNDED, "--switch-at needs --unbounded"},
        {CO_MEMORY, CO_UNBOUNDED, "--memory needs --unbounded"},
        {CO_MU, CO_OPEN, "--uniform-mu needs --open-vocab"},
        {CO_VFULL, CO_OPEN, "--vocab-size-full needs --open-vocab"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
        if (cacheopts_given(co, rules[i].opt) && !cacheopts_given(co, rules[i].needs)) {
            fprintf(stderr, "neurocache %s: %s\n", cmd, rules[i].msg);
            return 2;
        }
    if (cacheopts_given(co, CO_LAMBDA) && co->p.global_norm) {
        fprintf(stderr, "neurocache %s: --lambda is for linear interpolation; with --global-norm use --alpha\n",
                cmd);
        return 2;
    }
    if (cacheopts_given(co, CO_EXACT) && cacheopts_given(co, CO_INDEX)) {
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
    ubcache_set_threads(co->threads > 0 ? co->threads : 1);
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
                      nc_wordtable *words, nc_ubcache **out, char *err, size_t errlen)
{
    nc_ubcache_opts o;
    ubcache_opts_default(&o, m->cfg.hidden_size);
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
    return ubcache_new(&o, words, out, err, errlen);
}

int co_read_tokens(const nc_model *m, const char *path, nc_tokens *out, char *err, size_t errlen)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    int rc = buf ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "out of memory");
    while (!rc) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                rc = nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) {
            if (ferror(f))
                rc = nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(errno));
            break;
        }
    }
    if (f != stdin)
        fclose(f);
    if (!rc) {
        char e2[NC_ERRLEN];
        rc = tokenize(m, buf, n, true, out, e2, sizeof e2);
        if (rc)
            nc_error(err, errlen, rc, "%s: %s", path, e2);
    }
    free(buf);
    return rc;
}

int co_prepare(const nc_model *m, const nc_tokens *t, bool bos_eos, nc_wordtable *words, nc_doc **out,
               char *err, size_t errlen)
{
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    int rc = (!s || !w) ? nc_error(err, errlen, NC_ENOMEM, "state") : NC_OK;
    if (!rc && bos_eos)
        lstm_step(m, s, m->eos_id, w);
    if (!rc)
        rc = doc_prepare(m, s, bos_eos, t, words, NULL, out, err, errlen);
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

int co_hidden_pass(const nc_model *m, const nc_tokens *toks, nc_wordtable *words, co_hidden_fn fn,
                   void *ctx, bool progress, char *err, size_t errlen)
{
    const size_t C = 4096;
    const int H = m->cfg.hidden_size;
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    hp_pipe p = {.fn = fn, .ctx = ctx};
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    bool alloc_ok = s && w;
    for (int b = 0; b < 2; b++) {
        p.slot[b].h = malloc((C + 1) * (size_t)H * sizeof(float));
        p.slot[b].ids = malloc(C * sizeof(int));
        alloc_ok = alloc_ok && p.slot[b].h && p.slot[b].ids;
    }
    int rc = alloc_ok ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "hidden pass buffers");
    pthread_t th;
    bool started = false;
    if (!rc) {
        lstm_step(m, s, m->eos_id, w);
        started = pthread_create(&th, NULL, hp_consumer, &p) == 0;
        if (!started)
            rc = nc_error(err, errlen, NC_ENOMEM, "hidden pass thread");
    }
    /* the two stages share the cores: one BLAS thread for the LSTM, as the
     * daemon runs it (FAISS's OpenMP count is cacheopts_finish's) */
    int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    double t0 = co_now(), last = t0;
    int b = 0;
    for (size_t j0 = 0; !rc && j0 < toks->n; j0 += C, b ^= 1) {
        size_t nb = toks->n - j0 < C ? toks->n - j0 : C;
        pthread_mutex_lock(&p.lock);
        while (p.ready[b] && !p.rc)
            pthread_cond_wait(&p.cond, &p.lock);   /* slot b still being added */
        rc = p.rc;
        pthread_mutex_unlock(&p.lock);
        if (rc)
            break;
        hp_chunk *c = &p.slot[b];
        /* row 0 = h before the chunk's first token, rows 1..nb = after each */
        memcpy(c->h, lstm_state_top(s), (size_t)H * sizeof(float));
        rc = lstm_forward_seq(m, s, toks->ids + j0, nb, c->h + H, err, errlen);
        for (size_t r = 0; !rc && r < nb; r++) {
            int id = toks->ids[j0 + r];
            if (words && id == m->unk_id && toks->words && toks->words[j0 + r]) {
                id = wordtable_id(words, toks->words[j0 + r], strlen(toks->words[j0 + r]), true);
                if (id < 0)
                    rc = nc_error(err, errlen, NC_ENOMEM, "word table");
            }
            c->ids[r] = id;
        }
        if (rc)
            break;
        c->n = nb;
        pthread_mutex_lock(&p.lock);
        p.ready[b] = 1;
        pthread_cond_broadcast(&p.cond);
        pthread_mutex_unlock(&p.lock);
        double t = co_now();
        if (progress && (t - last > 2.0 || j0 + nb == toks->n)) {
            fprintf(stderr, "  %zu/%zu tokens (%.0f%%), %.0f tokens/s\n", j0 + nb, toks->n,
                    100.0 * (double)(j0 + nb) / (double)toks->n, (double)(j0 + nb) / (t - t0 + 1e-9));
            last = t;
        }
    }
    if (started) {
        pthread_mutex_lock(&p.lock);
        p.done = true;
        pthread_cond_broadcast(&p.cond);
        pthread_mutex_unlock(&p.lock);
        pthread_join(th, NULL);   /* after the last chunk was consumed */
        if (!rc && p.rc)
            rc = nc_error(err, errlen, p.rc, "%s", p.err);
    }
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
    lstm_state_free(s);
    lstm_work_free(w);
    return rc;
}

static int add_to_ub(const float *h, const int *ids, size_t n, void *ctx, char *err, size_t errlen)
{
    return ubcache_add(ctx, h, ids, n, NULL, err, errlen);
}

int cacheopts_fill_memory(const nc_model *m, const char *path, nc_wordtable *words, nc_ubcache *ub,
                          bool progress, char *err, size_t errlen)
{
    nc_tokens t;
    tokens_init(&t);
    int rc = co_read_tokens(m, path, &t, err, errlen);
    if (!rc && progress)
        fprintf(stderr, "memory: streaming %zu tokens of %s into the unbounded cache\n", t.n, path);
    if (!rc)
        rc = co_hidden_pass(m, &t, words, add_to_ub, ub, progress, err, errlen);
    tokens_clear(&t);
    return rc;
}

bool cacheopts_any(const cacheopts *co)
{
    const nc_cache_params *p = &co->p;
    return p->neural_size > 0 || p->unigram_size > 0 || p->unbounded || p->open_vocab;
}

int co_score_cached(const nc_model *m, const cacheopts *co, const nc_tokens *toks, bool bos_eos,
                    double *lp, bool progress, char *err, size_t errlen)
{
    nc_wordtable *words = NULL;
    nc_ubcache *ub = NULL;
    nc_doc *d = NULL;
    int rc = NC_OK;
    if (co->p.open_vocab)
        rc = wordtable_new(m->vocab, &words, err, errlen);
    if (!rc && co->p.unbounded)
        rc = cacheopts_make_ub(co, &co->p, m, words, &ub, err, errlen);
    if (!rc && ub && co->memory_path)
        rc = cacheopts_fill_memory(m, co->memory_path, words, ub, progress, err, errlen);
    if (!rc)
        rc = co_prepare(m, toks, bos_eos, words, &d, err, errlen);
    if (!rc) {
        nc_doc_caches dc = {.ub = ub, .adapt = ub != NULL};
        int blas = co_search_begin(co);
        rc = doc_score(d, &co->p, &dc, 0, lp, err, errlen);
        co_search_end(blas);
    }
    if (!rc && ub && progress)
        fprintf(stderr, "unbounded cache: %lld pairs, %s index\n", (long long)ubcache_count(ub),
                ubcache_is_exact(ub) ? "exact (flat)" : "IVF");
    doc_free(d);
    ubcache_free(ub);
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
        return nc_error(err, errlen, NC_EIO, "gnuplot failed (status %d; is gnuplot installed? make deps)", st);
    return NC_OK;
}
