/* bench_ns_seed.c -- writes a namespace of N stored states for the daemon's
 * namespace benchmark (bench_server --namespace), without the HTTP upload's
 * LSTM pass: the hidden states come from a file bench_cache saved
 * (BENCH_STATES: count, then float keys [n, H], then word ids [n]), and go
 * through the store exactly as a document's do (nsstore_add: log, index),
 * then a snapshot is written so that the daemon opens the namespace from it
 * (seconds) instead of replaying the log. The store is opened with the
 * daemon's own options (server/domain/namespaces.c open_store: the model's trained
 * unbounded.faiss, one OpenMP thread).
 *
 * BENCH_COMPACT=1 makes the namespace with compact storage (nsstore.h).
 * It prints the bytes a pair takes: the log's (before the snapshot), the
 * snapshot's, the store's memory_bytes and the process's RSS growth over
 * the adds. BENCH_REOPEN=k then opens the namespace k times at once from
 * its snapshot and prints the RSS each open adds (the precomputed table of
 * the index's training is shared: core/index/pq_tables.h).
 *
 * usage: bench_ns_seed MODEL_DIR STATES_FILE NAMESPACE_DIR [N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "pq_tables.h"
#include "nsstore.h"
#include "unbounded_cache.h"

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            v = atol(line + 6);
    if (f)
        fclose(f);
    return v;
}

static uint64_t dir_size(const char *dir, const char *sub)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "du -sb --apparent-size %s/%s 2>/dev/null | cut -f1", dir, sub);
    FILE *p = popen(cmd, "r");
    unsigned long long b = 0;
    if (p && fscanf(p, "%llu", &b) != 1)
        b = 0;
    if (p)
        pclose(p);
    return b;
}

/* BENCH_REOPEN=k: the namespace opened k times at once from its snapshot */
static void reopen(const nc_nsstore_opts *o, int k)
{
    nc_nsstore **ns = calloc((size_t)k, sizeof *ns);
    char err[NC_ERRLEN];
    long r0 = rss_kb();
    for (int i = 0; i < k; i++) {
        long before = rss_kb();
        if (nsstore_open(o, &ns[i], NULL, err, sizeof err) != NC_OK) {
            fprintf(stderr, "bench_ns_seed: reopen: %s\n", err);
            break;
        }
        int tables = 0;
        size_t tb = pq_tables_bytes(&tables);
        fprintf(stderr, "open %d: RSS +%.1f MB (%.1f MB in all); shared tables %d, %.1f MB\n", i + 1,
                (rss_kb() - before) / 1024.0, (rss_kb() - r0) / 1024.0, tables, tb / 1048576.0);
    }
    for (int i = 0; i < k; i++)
        nsstore_close(ns[i]);
    free(ns);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_ns_seed MODEL_DIR STATES_FILE NAMESPACE_DIR [N]\n");
        return 2;
    }
    char err[NC_ERRLEN], trained[1200];
    nc_model *m = NULL;
    if (model_load(argv[1], &m, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_ns_seed: %s\n", err);
        return 1;
    }
    const int H = m->cfg.hidden_size;
    FILE *f = fopen(argv[2], "rb");
    uint64_t n = 0;
    if (!f || fread(&n, sizeof n, 1, f) != 1) {
        fprintf(stderr, "bench_ns_seed: cannot read %s\n", argv[2]);
        return 1;
    }
    uint64_t want = argc > 4 ? strtoull(argv[4], NULL, 10) : n;
    if (want > n) want = n;
    float *keys = malloc((size_t)n * (size_t)H * sizeof *keys);
    int *ids = malloc((size_t)n * sizeof *ids);
    if (!keys || !ids || fread(keys, sizeof(float) * (size_t)H, n, f) != n || fread(ids, sizeof(int), n, f) != n) {
        fprintf(stderr, "bench_ns_seed: short read of %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    nc_nsstore_opts o = {.dir = argv[3], .model = m, .sync = WAL_SYNC_NONE,
                         .compact = getenv("BENCH_COMPACT") && atoi(getenv("BENCH_COMPACT")) > 0};
    unbounded_cache_opts_default(&o.ub, H);
    snprintf(trained, sizeof trained, "%s/unbounded.faiss", argv[1]);
    FILE *t = fopen(trained, "rb");
    if (t) { fclose(t); o.ub.trained_path = trained; }
    o.ub.omp_threads = 1;
    nc_nsstore *ns = NULL;
    if (nsstore_open(&o, &ns, NULL, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_ns_seed: %s\n", err);
        return 1;
    }
    uint32_t doc;
    long rss0 = rss_kb();
    if (nsstore_doc_begin(ns, "seed", 4, &doc, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_ns_seed: %s\n", err);
        return 1;
    }
    double t0 = now_s();
    const size_t B = 4096;
    for (size_t i = 0; i < want; i += B) {
        size_t b = want - i < B ? want - i : B;
        const nsstore_pairs pairs = {.keys = keys + i * (size_t)H, .words = ids + i, .n = b, .doc = doc, .off = i};
        if (nsstore_add(ns, &pairs, NULL, err, sizeof err) != NC_OK) {
            fprintf(stderr, "bench_ns_seed: add at %zu: %s\n", i, err);
            return 1;
        }
        if ((i / B) % 32 == 0)
            fprintf(stderr, "\r%zu / %llu (%.0f s)", i + b, (unsigned long long)want, now_s() - t0);
    }
    double secs = 0, added_s = now_s() - t0;
    long rss1 = rss_kb();
    uint64_t wal = dir_size(argv[3], "wal");
    if (nsstore_snapshot(ns, &secs, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_ns_seed: snapshot: %s\n", err);
        return 1;
    }
    nc_nsstore_stats st;
    nsstore_stats(ns, &st);
    fprintf(stderr, "\n%lld entries (exact %d, %s, %s storage) added in %.1f s, snapshot %.1f s; disk %.0f MB, memory %.0f MB\n",
            (long long)st.entries, (int)st.exact, st.factory ? st.factory : "-", st.compact ? "compact" : "keys",
            added_s, secs, (double)st.disk_bytes / 1e6, (double)st.memory_bytes / 1e6);
    int tables = 0;
    size_t tb = pq_tables_bytes(&tables);
    double np = (double)st.entries;
    uint64_t snap = dir_size(argv[3], "snap-*");
    fprintf(stderr, "bytes a pair: log %.1f (%.1f MB), snapshot %.1f (%.1f MB), memory_bytes %.1f (%.1f MB, "
            "the shared table apart: %d, %.1f MB), RSS growth over the adds %.1f (%.1f MB)\n",
            (double)wal / np, wal / 1e6, (double)snap / np, snap / 1e6, (double)st.memory_bytes / np,
            st.memory_bytes / 1e6, tables, tb / 1e6, (double)(rss1 - rss0) * 1024.0 / np, (rss1 - rss0) / 1024.0);
    nsstore_close(ns);
    free(keys);
    keys = NULL;
    if (getenv("BENCH_REOPEN"))
        reopen(&o, atoi(getenv("BENCH_REOPEN")));
    model_free(m);
    free(ids);
    return 0;
}
