/* bench_growth.c -- the growth curve of issue 35: one memory of real mixed
 * text streamed into one unbounded cache that trains its own index (the
 * daemon's and the CLI's default lifecycle, default knobs: knn 1024,
 * nprobe 0 = the index's own), read at several sizes on held-out text of
 * each kind, side by side with the static model (tokens per CPU-second,
 * same process) and with the model's fixed unbounded.faiss read at k 1024,
 * nprobe 8 (perplexity). Run by scripts/bench_growth.sh; figures go to
 * BENCHMARKS.md ("The unbounded cache's own training: the growth curve").
 *
 * usage: bench_growth MODEL MEMORY_FILES QUERY_FILES SIZES
 *   MEMORY_FILES  comma-separated texts whose hidden states fill the memory, in order
 *   QUERY_FILES   comma-separated held-out texts (their first BENCH_NQ tokens, default 2000)
 *   SIZES         comma list of stored pairs at which to read (ascending; one
 *                 past the memory's pairs reads all of them)
 * BENCH_STATES=FILE caches the memory's hidden states (float16) between runs;
 * BENCH_CACHES=DIR keeps each size's caches (snapshot and keys, DIR/own-N,
 * DIR/fixed-N) and reads them back in later runs instead of growing them
 * (the reads' experiments without the 1.75M adds and trainings again);
 * BENCH_NO_FIXED=1 skips the model's fixed index; BENCH_NPROBES=8,16,...
 * and BENCH_KNN=K read the own index again with those nprobes and k (rows
 * marked "np N, k K": an experiment's, beside the default's); BENCH_EXACT=1
 * also grows an exact (flat) cache of the same pairs and reads it at the
 * default k: the perplexity no index of these pairs can better (the oracle
 * row "exact"); BENCH_RECALL=1 prints the own index's recall at each
 * nprobe of a ladder, measured as its training measures it (256 held-out
 * keys spread over [T/2, T), T the pairs it was trained on, each searching
 * the ids before it: the share of the exact 32 nearest among the 1,024
 * found), for choosing index_recall_target. Neural + unbounded: the
 * neural cache of 2,000 pairs (eval's row) and the unbounded cache, every
 * other knob at its default; the queries are not added (the memory is the
 * same for every kind at a size). BENCH_REPEAT=R reads each kind R times
 * beside R static passes and reports the least CPU of each (A/B of small
 * changes on a noisy machine). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "cache_params.h"
#include "doc.h"
#include "lstm.h"
#include "model.h"
#include "tokenizer.h"
#include "unbounded_cache.h"
#include "vmath.h"

static double cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int read_tokens(const nc_model *m, const char *path, nc_tokens *t)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    char err[NC_ERRLEN];
    int rc = tokenize_ex(m, buf, got, true, false, t, err, sizeof err);   /* PTB-style text, as written */
    free(buf);
    if (rc)
        fprintf(stderr, "%s: %s\n", path, err);
    return rc ? 1 : 0;
}

typedef struct {
    const char *name;
    nc_tokens t;
    nc_doc *d;
    double c_lstm, c_static, ppl_static;
} query;

static double ppl_of(const double *lp, size_t n)
{
    double s = 0;
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(lp[i]))
            s += lp[i], c++;
    return exp(-s / (double)c);
}

/* The static pass of q: its LSTM states (q->d) and the static model's CPU
 * seconds (LSTM pass + decoder) */
static int static_pass(const nc_model *m, query *q, double *lp)
{
    char err[NC_ERRLEN];
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    lstm_step(m, s, m->eos_id, w);
    doc_free(q->d);
    q->d = NULL;
    double c0 = cpu();
    int rc = doc_prepare(&(nc_doc_prep){.m = m, .s = s, .has_h = true, .toks = &q->t}, &q->d, err, sizeof err);
    q->c_lstm = cpu() - c0;
    nc_cache_params p;
    cache_params_default(&p);
    nc_doc_caches none = {0};
    double c1 = cpu();
    if (!rc)
        rc = doc_score(q->d, &p, &none, lp, err, sizeof err);
    q->c_static = q->c_lstm + cpu() - c1;
    q->ppl_static = ppl_of(lp, q->t.n);
    lstm_state_free(s);
    lstm_work_free(w);
    if (rc)
        fprintf(stderr, "bench_growth: %s\n", err);
    return rc;
}

/* The hidden states of the memory files, in order, up to max, as float16
 * (2 H bytes a pair), with their words; from BENCH_STATES when it holds them */
static size_t memory_states(const nc_model *m, const char *files_s, size_t max, uint16_t *keys, int *ids)
{
    const int H = m->cfg.hidden_size;
    const char *sfile = getenv("BENCH_STATES");
    FILE *sf = sfile ? fopen(sfile, "rb") : NULL;
    uint64_t n0 = 0;
    /* (a file of fewer states than max holds all the memory files have) */
    if (sf && fread(&n0, 8, 1, sf) == 1 && n0 > 0) {
        size_t take = n0 < max ? (size_t)n0 : max;
        if (fread(keys, 2 * (size_t)H, take, sf) == take && fseek(sf, 8 + (long)(n0 * 2 * (size_t)H), SEEK_SET) == 0 &&
            fread(ids, sizeof(int), take, sf) == take) {
            fclose(sf);
            fprintf(stderr, "memory: %zu states from %s\n", take, sfile);
            return take;
        }
    }
    if (sf)
        fclose(sf);
    char files[4096], err[NC_ERRLEN];
    snprintf(files, sizeof files, "%s", files_s);
    size_t have = 0;
    float *h = malloc((4096 + 1) * (size_t)H * sizeof(float));
    double t0 = now();
    for (char *save = NULL, *f = strtok_r(files, ",", &save); f && have < max; f = strtok_r(NULL, ",", &save)) {
        nc_tokens t;
        tokens_init(&t);
        if (read_tokens(m, f, &t))
            exit(1);
        nc_state *s = lstm_state_new(m);
        nc_lstm_work *w = lstm_work_new(m);
        lstm_step(m, s, m->eos_id, w);
        for (size_t j0 = 0; j0 < t.n && have < max; j0 += 4096) {
            size_t nb = t.n - j0 < 4096 ? t.n - j0 : 4096, take = max - have < nb ? max - have : nb;
            memcpy(h, lstm_state_top(s), (size_t)H * sizeof(float));
            lstm_forward_seq(m, s, t.ids + j0, nb, h + H, err, sizeof err);
            vm_float_to_half(h, keys + have * (size_t)H, take * (size_t)H);   /* h_{t-1} keys word t */
            memcpy(ids + have, t.ids + j0, take * sizeof(int));
            have += take;
        }
        fprintf(stderr, "memory: %s, %zu states so far, %.0f s\n", f, have, now() - t0);
        lstm_state_free(s);
        lstm_work_free(w);
        tokens_clear(&t);
    }
    free(h);
    if (sfile && (sf = fopen(sfile, "wb"))) {
        n0 = have;
        if (fwrite(&n0, 8, 1, sf) != 1 || fwrite(keys, 2 * (size_t)H, have, sf) != have ||
            fwrite(ids, sizeof(int), have, sf) != have)
            fprintf(stderr, "bench_growth: %s: short write\n", sfile);
        fclose(sf);
    }
    return have;
}

static char fixed_path[1200];

static nc_unbounded_cache_opts cache_opts(const nc_model *m, bool own)
{
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, m->cfg.hidden_size);
    snprintf(fixed_path, sizeof fixed_path, "%s/unbounded.faiss", m->dir);
    o.own_training = own;
    o.train_sync = true;   /* the CLI's: trainings at the same sizes every run */
    o.trained_path = own ? NULL : fixed_path;
    o.key_f16 = true;      /* as the daemon stores them */
    o.omp_threads = 1;
    /* BENCH_OWN_FACTORY: the own training's code named (say IVF4096,PQ16np,
     * the 8-bit code of the same 16 bytes), for a side-by-side run */
    if (own && getenv("BENCH_OWN_FACTORY"))
        o.factory = getenv("BENCH_OWN_FACTORY");
    /* BENCH_SWITCH_AT: the first training there (then at each 4x) */
    if (own && getenv("BENCH_SWITCH_AT"))
        o.switch_at = atol(getenv("BENCH_SWITCH_AT"));
    return o;
}

static nc_unbounded_cache *make_cache(const nc_model *m, bool own, bool exact)
{
    nc_unbounded_cache_opts o = cache_opts(m, own);
    o.exact = exact;
    nc_unbounded_cache *u = NULL;
    char err[NC_ERRLEN];
    if (unbounded_cache_new(&o, NULL, &u, err, sizeof err)) {
        fprintf(stderr, "bench_growth: %s\n", err);
        exit(1);
    }
    return u;
}

/* BENCH_CACHES: *u replaced by the saved cache of `at` pairs when there is
 * one (true), else false; save: *u saved there (its keys too). */
static bool cache_kept(const nc_model *m, bool own, size_t at, nc_unbounded_cache **u, bool save)
{
    const char *dir = getenv("BENCH_CACHES");
    if (!dir || !*u)
        return false;
    char d[1200], keys[1300], err[NC_ERRLEN];
    snprintf(d, sizeof d, "%s/%s-%zu", dir, own ? "own" : "fixed", at);
    snprintf(keys, sizeof keys, "%s/keys.f16", d);
    int64_t n = 0;
    if (save) {
        if (unbounded_cache_save(*u, d, err, sizeof err) || (own && unbounded_cache_keys_sync(*u, keys, &n, err,
                                                                                             sizeof err)))
            fprintf(stderr, "bench_growth: keeping %s: %s\n", d, err);
        return true;
    }
    nc_unbounded_cache_opts o = cache_opts(m, own);
    nc_unbounded_cache *l = NULL;
    if (access(d, F_OK) != 0 || unbounded_cache_load(&o, NULL, d, &l, err, sizeof err))
        return false;
    if (own && unbounded_cache_keys_read(l, keys, unbounded_cache_count(l), err, sizeof err)) {
        fprintf(stderr, "bench_growth: %s: %s\n", keys, err);
        unbounded_cache_free(l);
        return false;
    }
    fprintf(stderr, "%s: read back (%lld pairs)\n", d, (long long)unbounded_cache_count(l));
    unbounded_cache_free(*u);
    *u = l;
    return true;
}

/* Adds states [from, to) to u; CPU seconds spent (trainings included) */
static double grow(nc_unbounded_cache *u, const uint16_t *keys, const int *ids, size_t from, size_t to, int H)
{
    const size_t chunk = 512;   /* an upload's batch */
    float *kb = malloc(chunk * (size_t)H * sizeof(float));
    char err[NC_ERRLEN];
    double c0 = cpu();
    for (size_t i = from; i < to; i += chunk) {
        size_t b = to - i < chunk ? to - i : chunk;
        vm_half_to_float(keys + i * (size_t)H, kb, b * (size_t)H);
        if (unbounded_cache_add(u, kb, ids + i, b, NULL, err, sizeof err)) {
            fprintf(stderr, "bench_growth: %s\n", err);
            exit(1);
        }
    }
    free(kb);
    return cpu() - c0;
}

/* One read of q with u: perplexity, CPU seconds of the whole read (the
 * LSTM pass + the caches and the mixture) */
static int read_parts = 3;   /* 1 neural, 2 unbounded: BENCH_PARTS's rows */

static double read_knn(const query *q, nc_unbounded_cache *u, int nprobe, int knn, double *lp, double *c_read)
{
    nc_cache_params p;
    cache_params_default(&p);
    p.unbounded = (read_parts & 2) != 0;
    p.neural_size = read_parts & 1 ? 2000 : 0;
    if (nprobe > 0)
        p.nprobe = nprobe;
    if (knn > 0)
        p.knn = knn;
    nc_doc_caches dc = {.ub = u, .adapt = false};
    char err[NC_ERRLEN];
    double c0 = cpu();
    if (doc_score(q->d, &p, &dc, lp, err, sizeof err)) {
        fprintf(stderr, "bench_growth: %s\n", err);
        exit(1);
    }
    *c_read = q->c_lstm + cpu() - c0;
    return ppl_of(lp, q->t.n);
}

static double read_with(const query *q, nc_unbounded_cache *u, int nprobe, double *lp, double *c_read)
{
    return read_knn(q, u, nprobe, 0, lp, c_read);
}

/* BENCH_RECALL: the own index's recall at each nprobe of a ladder, by the
 * measure its training chose nprobe by (unbounded_cache_recall_at) */
static void print_recall(nc_unbounded_cache *own, size_t at)
{
    nc_ub_train_stats st;
    unbounded_cache_train_stats(own, &st);
    const int64_t T = st.trained_on;
    if (!getenv("BENCH_RECALL") || T <= 0)
        return;
    static const int ladder[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 13, 14, 16, 24, 32};
    printf("|  | recall of the index trained on %lld pairs (nlist %lld) at nprobe", (long long)T, (long long)st.nlist);
    char err[NC_ERRLEN];
    for (size_t r = 0; r < sizeof ladder / sizeof *ladder; r++) {
        double rec;
        if (unbounded_cache_recall_at(own, ladder[r], &rec, err, sizeof err)) {
            fprintf(stderr, "bench_growth: %s\n", err);
            break;
        }
        printf(" %d: %.3f", ladder[r], rec);
    }
    printf(" (at %zu pairs) |\n|  | imbalance over the ids below", at);
    for (int64_t c = T; c <= (int64_t)at; c += T / 2)
        printf(" %lld: %.2f", (long long)c, unbounded_cache_imbalance_below(own, c));
    printf(" |\n");
}

/* BENCH_NPROBES / BENCH_KNN: the own index read again with each (main) */
static void read_experiments(const query *q, nc_unbounded_cache *own, size_t at, double pf, double *lp)
{
    const char *nps = getenv("BENCH_NPROBES");
    int knn = getenv("BENCH_KNN") ? atoi(getenv("BENCH_KNN")) : 0;
    for (read_parts = 1; getenv("BENCH_PARTS") && read_parts <= 2; read_parts++) {
        double c, po = read_knn(q, own, 0, 0, lp, &c), n = (double)q->t.n;
        printf("| %zu | %s | %s alone | %.0f | %.0f | %.1f%% | %.1f | %.2f |  |  |\n", at, q->name,
               read_parts == 1 ? "neural" : "unbounded", n / q->c_static, n / c, 100.0 * q->c_static / c, 1e6 * c / n,
               po);
    }
    read_parts = 3;
    if (!nps && knn <= 0)
        return;
    char list[256];
    snprintf(list, sizeof list, "%s", nps ? nps : "0");
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        double c;
        double po = read_knn(q, own, atoi(t), knn, lp, &c);
        double n = (double)q->t.n;
        printf("| %zu | %s | np %s, k %d | %.0f | %.0f | %.1f%% | %.1f | %.2f | %.2f | %+.2f%% |\n", at, q->name, t,
               knn > 0 ? knn : 1024, n / q->c_static, n / c, 100.0 * q->c_static / c, 1e6 * c / n, po, pf,
               100.0 * (po / pf - 1.0));
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench_growth MODEL MEMORY_FILES QUERY_FILES SIZES\n");
        return 2;
    }
    char err[NC_ERRLEN];
    nc_model *m = NULL;
    if (model_load(argv[1], &m, err, sizeof err)) {
        fprintf(stderr, "bench_growth: %s\n", err);
        return 1;
    }
    unbounded_cache_set_threads(1);
    const int H = m->cfg.hidden_size;
    size_t sizes[32], ns = 0;
    for (const char *p = argv[4]; *p && ns < 32;) {
        sizes[ns++] = (size_t)atol(p);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    size_t max = sizes[ns - 1];
    uint16_t *keys = malloc(max * (size_t)H * 2);
    int *ids = malloc(max * sizeof(int));
    size_t have = memory_states(m, argv[2], max, keys, ids);
    size_t nq = getenv("BENCH_NQ") ? (size_t)atol(getenv("BENCH_NQ")) : 2000;
    query qs[8];
    int nqf = 0;
    char qfiles[4096];
    snprintf(qfiles, sizeof qfiles, "%s", argv[3]);
    double *lp = NULL;
    for (char *save = NULL, *f = strtok_r(qfiles, ",", &save); f && nqf < 8; f = strtok_r(NULL, ",", &save)) {
        query *q = &qs[nqf++];
        *q = (query){.name = strrchr(f, '/') ? strrchr(f, '/') + 1 : f};
        tokens_init(&q->t);
        if (read_tokens(m, f, &q->t))
            return 1;
        if (q->t.n > nq)
            q->t.n = nq;
        lp = realloc(lp, q->t.n * sizeof(double));
        if (static_pass(m, q, lp))
            return 1;
    }
    const bool fixed_too = !getenv("BENCH_NO_FIXED");
    const int repeat = getenv("BENCH_REPEAT") && atoi(getenv("BENCH_REPEAT")) > 1 ? atoi(getenv("BENCH_REPEAT")) : 1;
    nc_unbounded_cache *own = make_cache(m, true, false), *fixed = fixed_too ? make_cache(m, false, false) : NULL;
    nc_unbounded_cache *exact = getenv("BENCH_EXACT") ? make_cache(m, false, true) : NULL;
    printf("| pairs | query | own index: nlist, nprobe (recall) | static tokens/CPU-s | neural+unbounded tokens/CPU-s | "
           "ratio | CPU ms / 1k tokens | perplexity own | fixed k1024/np8 | own vs fixed |\n");
    printf("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    size_t at = 0;
    double add_own = 0, add_fixed = 0;
    for (size_t i = 0; i < ns && at < have; i++) {
        if (sizes[i] > have)   /* the last size: all the memory there is (1,715,033 pairs of the three texts) */
            sizes[i] = have;
        if (!cache_kept(m, true, sizes[i], &own, false)) {
            add_own += grow(own, keys, ids, at, sizes[i], H);
            cache_kept(m, true, sizes[i], &own, true);
        }
        if (exact)
            grow(exact, keys, ids, at, sizes[i], H);
        if (fixed && !cache_kept(m, false, sizes[i], &fixed, false)) {
            add_fixed += grow(fixed, keys, ids, at, sizes[i], H);
            cache_kept(m, false, sizes[i], &fixed, true);
        }
        at = sizes[i];
        nc_ub_train_stats st;
        unbounded_cache_train_stats(own, &st);
        fprintf(stderr, "%zu pairs: adds %.1f CPU-s own (trainings: %llu, last %.1f s), %.1f fixed\n", at, add_own,
                (unsigned long long)st.trainings, st.last_seconds, add_fixed);
        for (int k = 0; k < nqf; k++) {
            query *q = &qs[k];
            /* the static model again beside each read: a ratio of one
             * moment; BENCH_REPEAT=R: the least CPU of R pairs of them
             * (a shared machine's noise only ever adds) */
            double c_own = INFINITY, c_static = INFINITY, po = NAN;
            for (int r = 0; r < repeat; r++) {
                double c;
                static_pass(m, q, lp);
                c_static = fmin(c_static, q->c_static);
                po = read_with(q, own, 0, lp, &c);
                c_own = fmin(c_own, c);
            }
            q->c_static = c_static;
            double c_fix = 0, pf = NAN;
            if (fixed)
                pf = read_with(q, fixed, 8, lp, &c_fix);
            double n = (double)q->t.n;
            printf("| %zu | %s | %lld, %d (%.3f) | %.0f | %.0f | %.1f%% | %.1f | %.2f | %.2f | %+.2f%% |\n", at, q->name,
                   (long long)st.nlist, st.nprobe, st.recall, n / q->c_static, n / c_own, 100.0 * q->c_static / c_own,
                   1e6 * c_own / n, po, pf, 100.0 * (po / pf - 1.0));
            fflush(stdout);
            read_experiments(q, own, at, pf, lp);
            if (exact) {
                double ce, pe = read_with(q, exact, 0, lp, &ce);
                printf("| %zu | %s | exact | %.0f | %.0f | %.1f%% | %.1f | %.2f | %.2f | %+.2f%% |\n", at, q->name,
                       n / q->c_static, n / ce, 100.0 * q->c_static / ce, 1e6 * ce / n, pe, pf, 100.0 * (pe / pf - 1.0));
                fflush(stdout);
            }
        }
        print_recall(own, at);
        printf("|  | own index: imbalance %.2f, trainings %llu, last %.1f s, memory %.0f B a pair |  |  |  |  |  |  |  |  |\n",
               st.imbalance, (unsigned long long)st.trainings, st.last_seconds,
               (double)unbounded_cache_memory(own) / (double)at);
        fflush(stdout);
    }
    unbounded_cache_free(own);
    unbounded_cache_free(fixed);
    unbounded_cache_free(exact);
    return 0;
}
