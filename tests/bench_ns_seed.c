/* bench_ns_seed.c -- writes a namespace of N stored states for the daemon's
 * namespace benchmark (bench_server --namespace), without the HTTP upload's
 * LSTM pass: the hidden states come from a file bench_cache saved
 * (BENCH_STATES: count, then float keys [n, H], then word ids [n]), and go
 * through the store exactly as a document's do (nsstore_add: log, index),
 * then a snapshot is written so that the daemon opens the namespace from it
 * (seconds) instead of replaying the log. The store is opened with the
 * daemon's own options (server/namespaces.c open_store: the model's trained
 * unbounded.faiss, one OpenMP thread).
 *
 * usage: bench_ns_seed MODEL_DIR STATES_FILE NAMESPACE_DIR [N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "nsstore.h"
#include "unbounded_cache.h"

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
    nc_nsstore_opts o = {.dir = argv[3], .model = m, .sync = WAL_SYNC_NONE};
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
    if (nsstore_doc_begin(ns, "seed", 4, &doc, NULL, 0, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_ns_seed: %s\n", err);
        return 1;
    }
    double t0 = now_s();
    const size_t B = 4096;
    for (size_t i = 0; i < want; i += B) {
        size_t b = want - i < B ? want - i : B;
        if (nsstore_add(ns, keys + i * (size_t)H, ids + i, b, doc, i, NULL, err, sizeof err) != NC_OK) {
            fprintf(stderr, "bench_ns_seed: add at %zu: %s\n", i, err);
            return 1;
        }
        if ((i / B) % 32 == 0)
            fprintf(stderr, "\r%zu / %llu (%.0f s)", i + b, (unsigned long long)want, now_s() - t0);
    }
    double secs = 0;
    if (nsstore_snapshot(ns, &secs, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_ns_seed: snapshot: %s\n", err);
        return 1;
    }
    nc_nsstore_stats st;
    nsstore_stats(ns, &st);
    fprintf(stderr, "\n%lld entries (exact %d, %s) added in %.1f s, snapshot %.1f s; disk %.0f MB, memory %.0f MB\n",
            (long long)st.entries, (int)st.exact, st.factory ? st.factory : "-", now_s() - t0, secs,
            (double)st.disk_bytes / 1e6, (double)st.memory_bytes / 1e6);
    nsstore_close(ns);
    model_free(m);
    free(keys);
    free(ids);
    return 0;
}
