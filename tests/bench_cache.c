/* bench_cache.c -- cost of the unbounded cache against the number of stored
 * states (IVFPQ with k = 1024, nprobe 8, and exact search where it is
 * affordable), and IVFPQ-versus-exact perplexity on >= 100k stored states.
 * Run by scripts/bench_cache.sh; figures go to BENCHMARKS.md ("Caches").
 *
 * usage: bench_cache MODEL INDEX MEMORY_FILES QUERY_FILE [SIZES] [LAMBDA] [NQ] [CHECK_SIZE]
 *   MEMORY_FILES  comma-separated texts whose hidden states fill the memory
 *   QUERY_FILE    text scored against the memory (its first NQ tokens)
 *   SIZES         comma list of stored-state counts (default 10000,100000,1000000)
 *   LAMBDA        unbounded interpolation weight (default 0.3)
 *   NQ            query tokens (default 4000)
 *   CHECK_SIZE    stored states of the IVFPQ-vs-exact check (default 200000; 0 = skip)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cblas.h>

#include "doc.h"
#include "lstm.h"
#include "unbounded_cache.h"
#include "tokenizer.h"
#include "model.h"
#include "gate.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of this process: on a shared machine, wall time measures the
 * neighbours too */
static double cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* BENCH_PERF_CTL=FIFO: perf record -D -1 --control fifo:FIFO samples the
 * scoring passes only (not the LSTM pass over the memory, nor the adds) */
static void perf_ctl(const char *cmd)
{
    const char *path = getenv("BENCH_PERF_CTL");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) {
        fprintf(f, "%s\n", cmd);
        fclose(f);
    }
}

static int read_tokens(const nc_model *m, const char *path, nc_tokens *t)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "bench_cache: %s: cannot open\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    char err[NC_ERRLEN];
    int rc = tokenize_ex(m, buf, got, true, false, t, err, sizeof err);   /* PTB-style text, as written */
    free(buf);
    if (rc)
        fprintf(stderr, "bench_cache: %s: %s\n", path, err);
    return rc;
}

static double ppl_of(const double *lp, size_t n)
{
    double s = 0;
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(lp[i]))
            s += lp[i], c++;
    return exp(-s / (double)c);
}

/* The memory: R real hidden states, then (BENCH_REAL) synthetic ones:
 * state i >= R is real state i % R plus N(0, 0.05^2) noise per coordinate,
 * drawn from a generator seeded by i -- made chunk by chunk as they are
 * added, so 10M stored states need no 10 GB of float32 keys. */
typedef struct {
    const float *keys;            /* [R, H] */
    const int *ids;               /* [R] */
    size_t R;
    int H;
} memory_src;

static void memory_keys(const memory_src *ms, size_t from, size_t n, float *out, int *ids)
{
    const int H = ms->H;
    for (size_t i = from; i < from + n; i++) {
        const float *src = ms->keys + (i % ms->R) * (size_t)H;
        float *dst = out + (i - from) * (size_t)H;
        ids[i - from] = ms->ids[i % ms->R];
        if (i < ms->R) {
            memcpy(dst, src, (size_t)H * sizeof(float));
            continue;
        }
        uint64_t x = 0x9E3779B97F4A7C15ULL * (i + 1);
        for (int j = 0; j < H; j += 2) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            float u1 = (float)((x >> 11) * 0x1.0p-53) + 1e-12f;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            float u2 = (float)((x >> 11) * 0x1.0p-53);
            float r = 0.05f * sqrtf(-2.0f * logf(u1));
            dst[j] = src[j] + r * cosf(6.2831853f * u2);
            if (j + 1 < H)
                dst[j + 1] = src[j + 1] + r * sinf(6.2831853f * u2);
        }
    }
}

static nc_unbounded_cache *make_ub(int H, const char *index, bool exact, const memory_src *ms, size_t n, double *t_add)
{
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, H);
    o.trained_path = exact ? NULL : index;
    o.exact = exact;
    o.switch_at = 1;   /* IVF from the first pair: every size measures the same index type */
    o.faiss_scan = getenv("BENCH_FAISS_SCAN") != NULL;   /* FAISS's scan, not ours: the reference */
    nc_unbounded_cache *u = NULL;
    char err[NC_ERRLEN];
    /* BENCH_INDEX_DIR=DIR: the filled IVF cache of n states is saved in
     * DIR/n by a first run and loaded by the next ones (a sweep of search
     * settings adds the 1M states once) */
    char sdir[1200] = "";
    if (getenv("BENCH_INDEX_DIR") && !exact) {
        snprintf(sdir, sizeof sdir, "%s/%zu", getenv("BENCH_INDEX_DIR"), n);
        double l0 = now();
        if (unbounded_cache_load(&o, NULL, sdir, &u, err, sizeof err) == NC_OK) {
            *t_add = now() - l0;
            fprintf(stderr, "memory: %zu states loaded from %s in %.1f s\n", n, sdir, *t_add);
            return u;
        }
    }
    if (unbounded_cache_new(&o, NULL, &u, err, sizeof err)) {
        fprintf(stderr, "bench_cache: %s\n", err);
        exit(1);
    }
    const size_t chunk = 65536;
    float *kb = malloc(chunk * (size_t)H * sizeof(float));
    int *ib = malloc(chunk * sizeof(int));
    double t_gen = 0, t0 = now();
    for (size_t i = 0; i < n; i += chunk) {
        size_t b = n - i < chunk ? n - i : chunk;
        double g0 = now();
        memory_keys(ms, i, b, kb, ib);
        t_gen += now() - g0;
        if (unbounded_cache_add(u, kb, ib, b, NULL, err, sizeof err)) {
            fprintf(stderr, "bench_cache: %s\n", err);
            exit(1);
        }
        if (n >= 2000000 && (i / chunk) % 16 == 15)
            fprintf(stderr, "  %zu/%zu states added\n", i + b, n);
    }
    *t_add = now() - t0 - t_gen;   /* the adds alone, not making the synthetic states */
    free(kb);
    free(ib);
    if (sdir[0]) {
        mkdir(getenv("BENCH_INDEX_DIR"), 0755);
        if (unbounded_cache_save(u, sdir, err, sizeof err))
            fprintf(stderr, "bench_cache: %s\n", err);
    }
    return u;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench_cache MODEL INDEX MEMORY_FILES QUERY_FILE [SIZES] [LAMBDA] [NQ] [CHECK_SIZE]\n");
        return 2;
    }
    const char *sizes_s = argc > 5 ? argv[5] : "10000,100000,1000000";
    double lambda = argc > 6 ? atof(argv[6]) : 0.3;
    size_t nq = argc > 7 ? (size_t)atol(argv[7]) : 4000;
    size_t check = argc > 8 ? (size_t)atol(argv[8]) : 200000;
    char err[NC_ERRLEN];
    nc_model *m = NULL;
    if (model_load(argv[1], &m, err, sizeof err)) {
        fprintf(stderr, "bench_cache: %s\n", err);
        return 1;
    }
    /* one FAISS thread (as the CLI) unless BENCH_THREADS; with more, OpenBLAS
     * on one thread while scoring, as `--threads` does (cacheopts.c) */
    int search_threads = getenv("BENCH_THREADS") ? atoi(getenv("BENCH_THREADS")) : 1;
    unbounded_cache_set_threads(search_threads);
    int blas_threads = openblas_get_num_threads();
    const int H = m->cfg.hidden_size;
    size_t maxsize = 0;
    for (const char *p = sizes_s; *p;) {
        size_t v = (size_t)atol(p);
        if (v > maxsize)
            maxsize = v;
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    if (check > maxsize)
        maxsize = check;

    /* memory: hidden states of the memory files, in order, up to maxsize */
    size_t have = 0;
    size_t cap_real = getenv("BENCH_REAL") ? (size_t)atol(getenv("BENCH_REAL")) : maxsize;
    if (cap_real == 0 || cap_real > maxsize)
        cap_real = maxsize;
    float *keys = malloc(cap_real * (size_t)H * sizeof(float));
    int *ids = malloc(cap_real * sizeof(int));
    char files[4096];
    snprintf(files, sizeof files, "%s", argv[3]);
    double t0 = now();
    /* BENCH_STATES=FILE: the memory's hidden states saved there by a first
     * run (count, then keys and ids) and read back by the next ones, so that
     * a sweep of settings computes the 1M-token LSTM pass once */
    const char *states_file = getenv("BENCH_STATES");
    FILE *sf = states_file ? fopen(states_file, "rb") : NULL;
    if (sf) {
        uint64_t n0 = 0;
        if (fread(&n0, sizeof n0, 1, sf) == 1 && n0 <= cap_real && fread(keys, sizeof(float) * (size_t)H, n0, sf) == n0 &&
            fread(ids, sizeof(int), n0, sf) == n0)
            have = (size_t)n0;
        fclose(sf);
        fprintf(stderr, "memory: %zu hidden states read from %s\n", have, states_file);
    }
    bool computed = have == 0;
    for (char *save = NULL, *f = computed ? strtok_r(files, ",", &save) : NULL; f && have < cap_real;
         f = strtok_r(NULL, ",", &save)) {
        nc_tokens t;
        tokens_init(&t);
        if (read_tokens(m, f, &t))
            return 1;
        nc_state *s = lstm_state_new(m);
        nc_lstm_work *w = lstm_work_new(m);
        lstm_step(m, s, m->eos_id, w);
        float *h = malloc((4096 + 1) * (size_t)H * sizeof(float));
        for (size_t j0 = 0; j0 < t.n && have < cap_real; j0 += 4096) {
            size_t nb = t.n - j0 < 4096 ? t.n - j0 : 4096;
            memcpy(h, lstm_state_top(s), (size_t)H * sizeof(float));
            lstm_forward_seq(m, s, t.ids + j0, nb, h + H, err, sizeof err);
            size_t take = cap_real - have < nb ? cap_real - have : nb;
            memcpy(keys + have * H, h, take * (size_t)H * sizeof(float));
            memcpy(ids + have, t.ids + j0, take * sizeof(int));
            have += take;
        }
        free(h);
        lstm_state_free(s);
        lstm_work_free(w);
        tokens_clear(&t);
    }
    fprintf(stderr, "memory: %zu hidden states in %.1f s\n", have, now() - t0);
    if (states_file && computed && (sf = fopen(states_file, "wb"))) {
        uint64_t n0 = have;
        if (fwrite(&n0, sizeof n0, 1, sf) != 1 || fwrite(keys, sizeof(float) * (size_t)H, have, sf) != have ||
            fwrite(ids, sizeof(int), have, sf) != have)
            fprintf(stderr, "bench_cache: %s: short write\n", states_file);
        fclose(sf);
    }
    /* BENCH_REAL=R: only R real states are computed, the rest of the
     * memory is synthetic (memory_keys) */
    memory_src ms = {.keys = keys, .ids = ids, .R = have, .H = H};
    if (have < maxsize && have == cap_real && have > 0) {
        fprintf(stderr, "memory: states %zu..%zu synthetic (real + N(0, 0.05^2) noise)\n", have, maxsize);
        have = maxsize;
    }

    /* queries */
    nc_tokens q;
    tokens_init(&q);
    if (read_tokens(m, argv[4], &q))
        return 1;
    if (q.n > nq)
        q.n = nq;
    nc_state *s = lstm_state_new(m);
    nc_lstm_work *w = lstm_work_new(m);
    lstm_step(m, s, m->eos_id, w);
    nc_doc *d = NULL;
    t0 = now();
    double c_prep0 = cpu();
    if (doc_prepare(&(nc_doc_prep){.m = m, .s = s, .has_h = true, .toks = &q}, &d, err, sizeof err)) {
        fprintf(stderr, "bench_cache: %s\n", err);
        return 1;
    }
    double t_lstm = now() - t0, c_lstm = cpu() - c_prep0;
    double *lp = malloc(q.n * sizeof(double)), *lp2 = malloc(q.n * sizeof(double));
    nc_cache_params p;
    cache_params_default(&p);
    p.unbounded = true;
    p.knn = getenv("BENCH_KNN") ? atoi(getenv("BENCH_KNN")) : 1024;
    p.nprobe = getenv("BENCH_NPROBE") ? atoi(getenv("BENCH_NPROBE")) : 8;
    p.unbounded_lambda = (float)lambda;
    nc_doc_caches none = {0};
    double check_ppl[2] = {NAN, NAN};   /* [IVF, exact] when check is one of the sizes */
    double c_st0 = cpu();
    doc_score(d, &p, &none, lp, err, sizeof err);
    double c_static = c_lstm + cpu() - c_st0;   /* the static model: LSTM + decoder, per CPU second */
    double ppl_static = ppl_of(lp, q.n);
    if (getenv("BENCH_NO_ADAPT"))
        printf("(queries not added to the memory: BENCH_NO_ADAPT)\n");
    printf("nprobe %d (BENCH_NPROBE), k %d (BENCH_KNN)\n", p.nprobe, p.knn);
    printf("static model (LSTM pass + decoder): %.0f tokens/CPU-s\n", (double)q.n / c_static);
    printf("query: %zu tokens of %s, static perplexity %.2f, LSTM pass %.2f s (%.0f tokens/s)\n", q.n, argv[4],
           ppl_static, t_lstm, (double)q.n / t_lstm);
    printf("| stored states | index | add (s) | search+add+mixture tokens/s | same, per CPU second | with LSTM tokens/s | perplexity |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|\n");
    fflush(stdout);

    for (const char *ps = sizes_s; ps && *ps;) {
        size_t n = (size_t)atol(ps);
        ps = strchr(ps, ',');
        if (ps)
            ps++;
        if (n > have) {
            printf("| %zu | (only %zu states available) | | | | |\n", n, have);
            continue;
        }
        for (int exact = 0; exact < 2; exact++) {
            if (exact && ((n > 100000 && n != check) || getenv("BENCH_NO_EXACT")))
                continue;   /* exact search over 1M states: only for the IVFPQ-vs-exact check */
            double t_add;
            nc_unbounded_cache *u = make_ub(H, argv[2], exact, &ms, n, &t_add);
            nc_doc_caches dc = {.ub = u, .adapt = !getenv("BENCH_NO_ADAPT")};
            if (!exact) {
                /* the search alone: the same queries, 64 at a time as
                 * doc_score batches them, through the cache's search call
                 * (FAISS + the id-to-word step) without the mixture */
                const size_t B = 64;
                float *sd = malloc(B * (size_t)p.knn * sizeof(float));
                int *sw = malloc(B * (size_t)p.knn * sizeof(int));
                double s0 = cpu();
                for (size_t b0 = 0; b0 < q.n; b0 += B) {
                    size_t nb = q.n - b0 < B ? q.n - b0 : B;
                    if (unbounded_cache_search(u, d->q + b0 * H, nb, p.knn, p.nprobe, NULL, (int)nb, NC_UB_OPEN, sd, sw,
                                               err, sizeof err)) {
                        fprintf(stderr, "bench_cache: %s\n", err);
                        return 1;
                    }
                }
                printf("  search alone (k %d + 64, nprobe %d, blocks of 64): %.0f queries/CPU-s\n", p.knn, p.nprobe,
                       (double)q.n / (cpu() - s0));
                /* one query at a time, as a daemon's predict searches (k,
                 * no extra): the in-process latency of the search call, a
                 * floor under the daemon's predict (not its HTTP path) */
                size_t n1 = q.n < 1000 ? q.n : 1000;
                double *lat = malloc(n1 * sizeof(double));
                s0 = cpu();
                for (size_t i = 0; i < n1; i++) {
                    double w0 = now();
                    unbounded_cache_search(u, d->q + i * H, 1, p.knn, p.nprobe, NULL, 0, NC_UB_OPEN, sd, sw, err,
                                           sizeof err);
                    lat[i] = now() - w0;
                }
                double c1 = cpu() - s0;
                qsort(lat, n1, sizeof *lat, cmp_double);
                printf("  one query per call: %.0f queries/CPU-s, wall latency p50 %.3f ms, p99 %.3f ms\n",
                       (double)n1 / c1, 1e3 * lat[n1 / 2], 1e3 * lat[n1 * 99 / 100]);
                free(lat);
                free(sd);
                free(sw);
            }
            t0 = now();
            double c0 = cpu();
            if (search_threads > 1)
                openblas_set_num_threads(1);
            perf_ctl("enable");
            if (doc_score(d, &p, &dc, lp, err, sizeof err)) {
                fprintf(stderr, "bench_cache: %s\n", err);
                return 1;
            }
            perf_ctl("disable");
            openblas_set_num_threads(blas_threads);
            double ts = now() - t0, tc = cpu() - c0;
            printf("| %zu | %s | %.1f | %.0f | %.0f | %.0f | %.2f |\n", n, exact ? "exact (flat)" : "IVFPQ",
                   t_add, (double)q.n / ts, (double)q.n / tc, (double)q.n / (ts + t_lstm), ppl_of(lp, q.n));
            printf("  whole read (LSTM pass + cache) %.0f tokens/CPU-s = %.1f%% of static\n",
                   (double)q.n / (tc + c_lstm), 100.0 * c_static / (tc + c_lstm));
            printf("  memory: %.1f MB in RAM (unbounded_cache_memory, the trained index's fixed tables included: %.0f B a "
                   "stored state)\n",
                   (double)unbounded_cache_memory(u) / 1e6, (double)unbounded_cache_memory(u) / (double)unbounded_cache_count(u));
            uint64_t sq = 0, sc = 0;
            unbounded_cache_scan_stats(u, &sq, &sc);
            if (sq)
                printf("  our IVFPQ scan: %llu queries, %.0f codes scanned per query\n", (unsigned long long)sq,
                       (double)sc / (double)sq);
            else
                printf("  FAISS searched (BENCH_FAISS_SCAN, or an index our scan does not read)\n");
            unbounded_cache_coarse_stats(u, &sq, &sc);
            if (sq)
                printf("  coarse search (pruned, exact): %llu queries, %.1f exact centroid distances per query\n",
                       (unsigned long long)sq, (double)sc / (double)sq);
            if (n == check)
                check_ppl[exact] = ppl_of(lp, q.n);
            fflush(stdout);
            unbounded_cache_free(u);
            /* BENCH_GATE_SKIPS=T1,T2,...: the same with the model's gate
             * (fit-gate) and adaptive retrieval at each threshold (0 = the
             * gate always searching, -1 = the gate's own threshold); each on
             * a fresh copy of the memory */
            const char *gs = getenv("BENCH_GATE_SKIPS");
            for (const char *q2 = gs; !exact && q2 && *q2 && m->gate;) {
                double thr = atof(q2);
                q2 = strchr(q2, ',');
                if (q2)
                    q2++;
                nc_cache_params pg = p;
                pg.gate = true;
                pg.gate_skip = (float)thr;
                u = make_ub(H, argv[2], false, &ms, n, &t_add);
                nc_doc_caches gc = {.ub = u, .adapt = !getenv("BENCH_NO_ADAPT")};
                t0 = now();
                c0 = cpu();
                if (search_threads > 1)
                    openblas_set_num_threads(1);
                if (doc_score(d, &pg, &gc, lp2, err, sizeof err)) {
                    fprintf(stderr, "bench_cache: %s\n", err);
                    return 1;
                }
                openblas_set_num_threads(blas_threads);
                ts = now() - t0;
                tc = cpu() - c0;
                size_t tot = gc.searched + gc.skipped;
                printf("| %zu | IVFPQ, gate, skip below %.3g: %.1f%% skipped | %.1f | %.0f | %.0f | %.0f | %.2f |\n", n,
                       gate_threshold(m->gate, &pg), tot ? 100.0 * (double)gc.skipped / (double)tot : 0.0, t_add,
                       (double)q.n / ts, (double)q.n / tc, (double)q.n / (ts + t_lstm), ppl_of(lp2, q.n));
                fflush(stdout);
                unbounded_cache_free(u);
            }
        }
    }

    if (check > 0 && !isnan(check_ppl[0]) && !isnan(check_ppl[1])) {
        printf("\nIVFPQ vs exact on %zu stored states (+ the query's own), k=1024, lambda=%g, %zu query tokens:\n"
               "  exact %.3f, IVFPQ nprobe %d %.3f: %+.2f%% (static %.3f)\n",
               check, lambda, q.n, check_ppl[1], p.nprobe, check_ppl[0],
               100.0 * (check_ppl[0] / check_ppl[1] - 1.0), ppl_static);
    } else if (check > 0 && check <= have) {
        double pp[2], t_add;
        for (int exact = 0; exact < 2; exact++) {
            nc_unbounded_cache *u = make_ub(H, argv[2], exact, &ms, check, &t_add);
            nc_doc_caches dc = {.ub = u, .adapt = true};
            if (doc_score(d, &p, &dc, exact ? lp2 : lp, err, sizeof err)) {
                fprintf(stderr, "bench_cache: %s\n", err);
                return 1;
            }
            pp[exact] = ppl_of(exact ? lp2 : lp, q.n);
            unbounded_cache_free(u);
        }
        printf("\nIVFPQ vs exact on %zu stored states (+ the query's own), k=1024, lambda=%g, %zu query tokens:\n"
               "  exact %.3f, IVF4096,PQ32 nprobe 8 %.3f: %+.2f%% (static %.3f)\n",
               check, lambda, q.n, pp[1], pp[0], 100.0 * (pp[0] / pp[1] - 1.0), ppl_static);
    }
    free(lp);
    free(lp2);
    free(keys);
    free(ids);
    doc_free(d);
    lstm_state_free(s);
    lstm_work_free(w);
    tokens_clear(&q);
    model_free(m);
    return 0;
}
