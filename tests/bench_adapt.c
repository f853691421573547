/* bench_adapt.c -- online adaptation benchmarks of the namespace store
 * (store/nsstore.h), without HTTP (scripts/bench_adapt.sh runs the daemon
 * end to end):
 *
 *   bench_adapt fsync MODEL [SECONDS]
 *       durable adds from 8 threads (20 pairs each, like feed with adapt):
 *       requests/s with an fsync per request vs group commit vs none
 *   bench_adapt recovery MODEL CORPUS TOKENS [TRAINED_INDEX]
 *       a namespace of TOKENS pairs (the model's hidden states over CORPUS):
 *       recovery time from the log alone and from a snapshot
 *   bench_adapt predict MODEL CORPUS TRAINED_INDEX SIZES...
 *       latency of a session's predict reading the unbounded cache (k 1024,
 *       nprobe 8) holding SIZES pairs (e.g. 100000 1000000 10000000); sizes
 *       beyond the corpus's states are synthetic: copies of the encoded
 *       entries merged into one IVF index (faiss merge_from)
 */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/clone_index_c.h>
#include <faiss/c_api/index_io_c.h>
#include <zlib.h>

#include "stream.h"
#include "cache_params.h"
#include "lstm.h"
#include "tokenizer.h"
#include "nsstore.h"
#include "rng.h"

static nc_model *model;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *err)
{
    fprintf(stderr, "bench_adapt: %s: %s\n", what, err);
    exit(1);
}

static nc_nsstore *open_ns(const char *dir, nc_wal_sync sync, const char *trained, nc_nsstore_recovery *info)
{
    nc_nsstore_opts o = {.dir = dir, .model = model, .sync = sync};
    unbounded_cache_opts_default(&o.ub, model->cfg.hidden_size);
    o.ub.trained_path = trained;
    o.ub.exact = trained == NULL;
    nc_nsstore *ns;
    char err[NC_ERRLEN];
    if (nsstore_open(&o, &ns, info, err, sizeof err))
        die(dir, err);
    return ns;
}

static void rmdir_all(const char *d)
{
    nsstore_remove_dir(d, NULL, 0);
}

/* ---- fsync modes ------------------------------------------------------ */

typedef struct {
    nc_nsstore *ns;
    double until;
    long requests;
    int id;
} fs_arg;

static void *fs_worker(void *p)
{
    fs_arg *a = p;
    const int H = model->cfg.hidden_size, n = 20;
    float *k = malloc((size_t)n * H * sizeof *k);
    int w[20];
    nc_rng r;
    rng_seed(&r, (uint64_t)a->id + 1);
    char err[NC_ERRLEN], id[32];
    uint32_t doc;
    snprintf(id, sizeof id, "session:%d", a->id);
    if (nsstore_doc_begin(a->ns, id, strlen(id), &doc, err, sizeof err))
        die("doc", err);
    uint64_t off = 0;
    while (now() < a->until) {
        for (int i = 0; i < n * H; i++)
            k[i] = rng_uniform(&r);
        for (int i = 0; i < n; i++)
            w[i] = (int)(rng_uniform(&r) * (float)(model->cfg.vocab_size - 1));
        uint64_t seq;
        const nsstore_pairs pairs = {.keys = k, .words = w, .n = (size_t)n, .doc = doc, .off = off};
        if (nsstore_add(a->ns, &pairs, &seq, err, sizeof err) ||
            nsstore_sync(a->ns, seq, err, sizeof err))
            die("add", err);
        off += (uint64_t)n;
        a->requests++;
    }
    free(k);
    return NULL;
}

static int bench_fsync(double secs)
{
    static const char *names[] = {"group commit", "fsync per request", "no fsync"};
    static const nc_wal_sync modes[] = {WAL_SYNC_GROUP, WAL_SYNC_EACH, WAL_SYNC_NONE};
    printf("durable adds: 8 threads, 20 pairs (H=%d) per request, %.0f s each\n", model->cfg.hidden_size, secs);
    printf("| mode | requests/s | pairs/s | fsyncs/s | requests per fsync |\n|---|---:|---:|---:|---:|\n");
    for (int m = 0; m < 3; m++) {
        char dir[] = "/tmp/nc-bench-fsync-XXXXXX";
        if (!mkdtemp(dir))
            return 1;
        nc_nsstore *ns = open_ns(dir, modes[m], NULL, NULL);
        pthread_t th[8];
        fs_arg a[8];
        double t0 = now();
        for (int i = 0; i < 8; i++) {
            a[i] = (fs_arg){ns, t0 + secs, 0, i};
            pthread_create(&th[i], NULL, fs_worker, &a[i]);
        }
        long req = 0;
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            req += a[i].requests;
        }
        double dt = now() - t0;
        nc_nsstore_stats st;
        nsstore_stats(ns, &st);
        printf("| %s | %.0f | %.0f | %.0f | %.1f |\n", names[m], req / dt, 20.0 * req / dt, st.fsyncs / dt,
               st.fsyncs ? (double)req / (double)st.fsyncs : 0.0);
        fflush(stdout);
        nsstore_close(ns);
        rmdir_all(dir);
    }
    return 0;
}

/* ---- hidden states of a corpus ------------------------------------------ */

typedef struct {
    float *keys;                  /* [n, H]: h before token j */
    int *ids;                     /* [n] token j */
    size_t n;
} states;

static states corpus_states(const char *path, size_t max_tokens)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die(path, "cannot open (corpora are read from ../shared/data)");
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    size_t r;
    while ((r = fread(text + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap)
            text = realloc(text, cap *= 2);
    }
    fclose(f);
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN];
    if (tokenize_ex(model, text, len, true, false, &t, err, sizeof err))   /* PTB text, as written */
        die(path, err);
    free(text);
    states s;
    s.n = t.n < max_tokens ? t.n : max_tokens;
    const int H = model->cfg.hidden_size;
    s.keys = malloc((s.n + 1) * (size_t)H * sizeof(float));
    s.ids = malloc(s.n * sizeof(int));
    nc_state *st = lstm_state_new(model);
    nc_lstm_work *w = lstm_work_new(model);
    lstm_step(model, st, model->eos_id, w);
    memcpy(s.keys, lstm_state_top(st), (size_t)H * sizeof(float));
    double t0 = now();
    for (size_t j0 = 0; j0 < s.n; j0 += 4096) {
        size_t nb = s.n - j0 < 4096 ? s.n - j0 : 4096;
        if (lstm_forward_seq(model, st, t.ids + j0, nb, s.keys + (j0 + 1) * H, err, sizeof err))
            die("lstm", err);
    }
    memcpy(s.ids, t.ids, s.n * sizeof(int));
    fprintf(stderr, "bench_adapt: %zu hidden states of %s in %.1f s (%.0f tokens/s through the LSTM alone)\n", s.n,
            path, now() - t0, s.n / (now() - t0));
    lstm_state_free(st);
    lstm_work_free(w);
    tokens_clear(&t);
    return s;
}

/* ---- recovery ------------------------------------------------------------- */

static int bench_recovery(const char *corpus, size_t tokens, const char *trained)
{
    states s = corpus_states(corpus, tokens);
    char dir[] = "/tmp/nc-bench-recovery-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    const int H = model->cfg.hidden_size;
    nc_nsstore *ns = open_ns(dir, WAL_SYNC_GROUP, trained, NULL);
    char err[NC_ERRLEN];
    uint32_t doc;
    if (nsstore_doc_begin(ns, "corpus", 6, &doc, err, sizeof err))
        die("doc", err);
    double t0 = now();
    uint64_t seq = 0;
    for (size_t j0 = 0; j0 < s.n; j0 += 512) {
        size_t nb = s.n - j0 < 512 ? s.n - j0 : 512;
        const nsstore_pairs pairs = {.keys = s.keys + j0 * H, .words = s.ids + j0, .n = nb, .doc = doc, .off = j0};
        if (nsstore_add(ns, &pairs, &seq, err, sizeof err))
            die("add", err);
    }
    if (nsstore_sync(ns, seq, err, sizeof err))
        die("sync", err);
    double t_add = now() - t0;
    nc_nsstore_stats st;
    nsstore_stats(ns, &st);
    nsstore_close(ns);
    printf("namespace of %zu pairs (H=%d, %s index): added and logged in %.1f s (%.0f pairs/s), log %.1f MB\n", s.n, H,
           trained ? "IVF-PQ" : "exact flat", t_add, s.n / t_add, st.wal_bytes / 1048576.0);
    nc_nsstore_recovery info;
    ns = open_ns(dir, WAL_SYNC_GROUP, trained, &info);
    printf("| recovery from | pairs | seconds | seconds per million pairs |\n|---|---:|---:|---:|\n");
    printf("| log only (%llu records replayed) | %lld | %.2f | %.2f |\n", (unsigned long long)info.records_replayed,
           (long long)info.entries, info.seconds, info.seconds * 1e6 / (double)s.n);
    double snap;
    if (nsstore_snapshot(ns, &snap, err, sizeof err))
        die("snapshot", err);
    nsstore_stats(ns, &st);
    nsstore_close(ns);
    ns = open_ns(dir, WAL_SYNC_GROUP, trained, &info);
    printf("| snapshot (written in %.2f s, %.1f MB on disk with the log) | %lld | %.2f | %.2f |\n", snap,
           st.disk_bytes / 1048576.0, (long long)info.entries, info.seconds, info.seconds * 1e6 / (double)s.n);
    nsstore_close(ns);
    rmdir_all(dir);
    free(s.keys);
    free(s.ids);
    return 0;
}

/* ---- predict latency ------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Writes an unbounded_cache snapshot directory (index.faiss, values.bin, words.txt)
 * holding idx with value ids vals (unbounded_cache_load's format). */
static void write_cache_dir(const char *dir, FaissIndex *idx, const int *vals, size_t n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/index.faiss", dir);
    if (faiss_write_index_fname(idx, p))
        die(p, "faiss_write_index");
    snprintf(p, sizeof p, "%s/values.bin", dir);
    FILE *f = fopen(p, "wb");
    uint64_t n64 = n;
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)vals, (uInt)(n * sizeof(int)));
    if (!f || fwrite("NCUBVAL1", 1, 8, f) != 8 || fwrite(&n64, 8, 1, f) != 1 || fwrite(vals, sizeof(int), n, f) != n ||
        fwrite(&crc, 4, 1, f) != 1)
        die(p, "write");
    fclose(f);
    snprintf(p, sizeof p, "%s/words.txt", dir);
    f = fopen(p, "w");
    if (f)
        fclose(f);
}

static int bench_predict(const char *corpus, const char *trained, int nsizes, char **sizes)
{
    size_t maxn = 0;
    for (int i = 0; i < nsizes; i++)
        if ((size_t)atoll(sizes[i]) > maxn)
            maxn = (size_t)atoll(sizes[i]);
    states s = corpus_states(corpus, maxn);
    const int H = model->cfg.hidden_size;
    char err[NC_ERRLEN];
    /* one IVF-PQ index holding every real state, encoded once */
    FaissIndex *base = NULL;
    if (faiss_read_index_fname(trained, 0, &base))
        die(trained, "cannot read the trained index");
    faiss_Index_reset(base);
    double t0 = now();
    for (size_t j0 = 0; j0 < s.n; j0 += 65536) {
        size_t nb = s.n - j0 < 65536 ? s.n - j0 : 65536;
        if (faiss_Index_add(base, (idx_t)nb, s.keys + j0 * H))
            die("faiss add", "failed");
    }
    fprintf(stderr, "bench_adapt: %zu states encoded into the IVF-PQ index in %.1f s\n", s.n, now() - t0);
    nc_cache_params p;
    cache_params_default(&p);
    p.unbounded = true;
    p.knn = 1024;
    p.nprobe = 8;
    p.open_vocab = false;
    printf("predict with the unbounded cache (k=%d, nprobe %d, index from %s), one session, one thread\n", p.knn,
           p.nprobe, trained);
    printf("| pairs | kind | median ms | p90 ms | p99 ms | predicts/s |\n|---|---|---:|---:|---:|---:|\n");
    for (int si = 0; si < nsizes; si++) {
        size_t want = (size_t)atoll(sizes[si]);
        FaissIndex *idx = NULL;
        size_t have = 0;
        if (want <= s.n) {
            /* a prefix of the real states */
            if (faiss_read_index_fname(trained, 0, &idx))
                die(trained, "read");
            faiss_Index_reset(idx);
            if (faiss_IndexIVF_copy_subset_to((FaissIndexIVF *)base, (FaissIndexIVF *)idx, 0, 0, (idx_t)want))
                die("copy_subset_to", "failed");
            have = want;
        } else {
            /* synthetic: copies of the real entries' codes merged */
            if (faiss_clone_index(base, &idx))
                die("clone", "failed");
            have = s.n;
            while (have + s.n <= want) {
                FaissIndex *c = NULL;
                if (faiss_clone_index(base, &c) || faiss_IndexIVF_merge_from((FaissIndexIVF *)idx, (FaissIndexIVF *)c, (idx_t)have))
                    die("merge", "failed");
                faiss_Index_free(c);
                have += s.n;
            }
        }
        int *vals = malloc(have * sizeof(int));
        for (size_t i = 0; i < have; i++)
            vals[i] = s.ids[i % s.n];
        char dir[] = "/tmp/nc-bench-predict-XXXXXX";
        if (!mkdtemp(dir))
            return 1;
        write_cache_dir(dir, idx, vals, have);
        faiss_Index_free(idx);
        free(vals);
        nc_unbounded_cache_opts o;
        unbounded_cache_opts_default(&o, H);
        o.omp_threads = 1;
        nc_unbounded_cache *ub;
        if (unbounded_cache_load(&o, NULL, dir, &ub, err, sizeof err))
            die(dir, err);
        rmdir_all(dir);
        nc_stream *st;
        if (stream_new(model, &p, ub, NULL, true, &st, err, sizeof err))
            die("stream", err);
        /* predict after each token of a held-out stretch */
        nc_tokens t;
        tokens_init(&t);
        const int reps = 200;
        double *lat = malloc(reps * sizeof *lat);
        nc_dist d;
        dist_init(&d);
        for (int i = 0; i < reps; i++) {
            tokens_clear(&t);
            int id = s.ids[(size_t)(i * 7919) % s.n];
            tokens_push(&t, id, vocab_word(model->vocab, id), strlen(vocab_word(model->vocab, id)), 0);
            if (stream_feed(st, &t, false, NULL, err, sizeof err))
                die("feed", err);
            double a = now();
            if (stream_predict(st, false, &d, err, sizeof err))
                die("predict", err);
            lat[i] = (now() - a) * 1e3;
        }
        qsort(lat, reps, sizeof *lat, cmp_d);
        double tot = 0;
        for (int i = 0; i < reps; i++)
            tot += lat[i];
        printf("| %zu | %s | %.2f | %.2f | %.2f | %.0f |\n", have, want <= s.n ? "hidden states of the corpus" : "synthetic (copies)",
               lat[reps / 2], lat[reps * 9 / 10], lat[reps * 99 / 100], reps / (tot / 1e3));
        fflush(stdout);
        free(lat);
        dist_free(&d);
        tokens_clear(&t);
        stream_free(st);
        unbounded_cache_free(ub);
    }
    faiss_Index_free(base);
    free(s.keys);
    free(s.ids);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_adapt fsync|recovery|predict MODEL ... (see the source's header)\n");
        return 2;
    }
    char err[NC_ERRLEN];
    if (model_load(argv[2], &model, err, sizeof err))
        die(argv[2], err);
    /* one BLAS and one OpenMP thread, as the daemon runs them (design §6):
     * with the cores shared, spinning worker threads cost far more than
     * they bring */
    openblas_set_num_threads(1);
    unbounded_cache_set_threads(1);
    int rc = 2;
    if (strcmp(argv[1], "fsync") == 0)
        rc = bench_fsync(argc > 3 ? atof(argv[3]) : 3.0);
    else if (strcmp(argv[1], "recovery") == 0 && argc >= 5)
        rc = bench_recovery(argv[3], (size_t)atoll(argv[4]), argc > 5 ? argv[5] : NULL);
    else if (strcmp(argv[1], "predict") == 0 && argc >= 6)
        rc = bench_predict(argv[3], argv[4], argc - 5, argv + 5);
    else
        fprintf(stderr, "bench_adapt: bad arguments\n");
    model_free(model);
    return rc;
}
