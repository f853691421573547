/* test_compact.c -- compact storage of a namespace (store/nsstore.h, issue
 * 26 point 3) and the shared precomputed tables (core/index/pq_tables.h): a
 * compact store logs lists and PQ codes, not keys; its log alone, and a
 * snapshot + its log tail, rebuild the same lists, codes and search results
 * bit for bit; its index holds exactly what a store with keys holds for the
 * same pairs; the log follower hands out codes; what needs keys is refused
 * naming compact storage; indexes of one training read one table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/index_io_c.h>

#include "harness.h"
#include "nsstore.h"
#include "pq_tables.h"
#include "rng.h"

#define HAS(s, sub) CHECKF(strstr((s), (sub)) != NULL, "\"%s\" lacks \"%s\"", (s), (sub))

static nc_model *model;
static int H, V;
static char trained[2][128];   /* two trainings of IVF16,PQ4np on the model's H */

static void scratch(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/nc_test_compact_XXXXXX");
    if (!mkdtemp(dir))
        abort();
}

/* Clustered keys: 16 centres, so that the lists fill unevenly as real
 * states do. */
static void keys_of(uint64_t seed, size_t n, float *k)
{
    nc_rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        unsigned c = (unsigned)(i * 7 % 16);
        for (int j = 0; j < H; j++)
            k[i * H + j] = (float)((c * 13 + j) % 5) - 2.0f + 0.3f * (rng_uniform(&r) * 2 - 1);
    }
}

static int train_index(const char *path, uint64_t seed)
{
    FaissIndex *ix = NULL;
    size_t n = 10240;   /* FAISS wants 39 a centroid */
    float *x = malloc(n * H * sizeof *x);
    keys_of(seed, n, x);
    int rc = faiss_index_factory(&ix, H, "IVF16,PQ4np", METRIC_L2) || faiss_Index_train(ix, (idx_t)n, x) ||
             faiss_write_index_fname(ix, path);
    faiss_Index_free(ix);
    free(x);
    return rc;
}

static int open_store(const char *dir, bool compact, int which, nc_nsstore **ns, char *err, size_t errlen)
{
    nc_nsstore_opts o = {.dir = dir, .model = model, .sync = WAL_SYNC_NONE, .compact = compact};
    unbounded_cache_opts_default(&o.ub, H);
    o.ub.trained_path = trained[which];
    o.ub.switch_at = 1;   /* a store with keys: IVF from its first add, to compare */
    return nsstore_open(&o, ns, NULL, err, errlen);
}

/* n pairs in one document, in adds of 37 (offsets go on across records);
 * every fifth word an open-vocabulary one */
static int add_doc(nc_nsstore *ns, const char *id, size_t n, uint64_t seed)
{
    char err[NC_ERRLEN];
    uint32_t doc;
    if (nsstore_doc_begin(ns, id, strlen(id), &doc, err, sizeof err))
        return -1;
    float *k = malloc(n * H * sizeof *k);
    int *w = malloc(n * sizeof *w);
    keys_of(seed, n, k);
    static const char *oov[] = {"zebra", "quokka", "axolotl"};
    for (size_t i = 0; i < n; i++)
        w[i] = i % 5 == 4 ? wordtable_id(nsstore_words(ns), oov[i % 3], strlen(oov[i % 3]), true)
                          : (int)((seed + i) % (uint64_t)V);
    int rc = 0;
    uint64_t seq = 0;
    for (size_t i = 0; !rc && i < n; i += 37) {
        size_t m = n - i < 37 ? n - i : 37;
        const nsstore_pairs pairs = {.keys = k + i * H, .words = w + i, .n = m, .doc = doc, .off = i};
        rc = nsstore_add(ns, &pairs, &seq, err, sizeof err);
    }
    if (rc)
        fprintf(stderr, "add: %s\n", err);
    free(k);
    free(w);
    return rc;
}

/* What a store answers: every pair's provenance and word, and the
 * neighbours (distances, words, ids) of 8 queries, k 32, nprobe 4 */
typedef struct {
    int64_t n;
    char prov[64 * 1024];
    float d2[8 * 32];
    int w[8 * 32];
    int64_t id[8 * 32];
} answers;

static void answers_of(nc_nsstore *ns, answers *a)
{
    char err[NC_ERRLEN];
    memset(a, 0, sizeof *a);
    nc_unbounded_cache *u = nsstore_unbounded_cache(ns);
    a->n = unbounded_cache_count(u);
    size_t k = 0;
    for (int64_t i = 0; i < a->n && k + 80 < sizeof a->prov; i++) {
        nsstore_provenance pv = {.doc_id = "?", .off = 0, .word = -1};
        nsstore_entry(ns, i, &pv, err, sizeof err);
        const char *s = wordtable_word(nsstore_words(ns), pv.word);
        k += (size_t)snprintf(a->prov + k, sizeof a->prov - k, "%s:%llu:%s\n", pv.doc_id, (unsigned long long)pv.off,
                              s ? s : "?");
    }
    float q[8 * 64];
    keys_of(777, 8, q);
    unbounded_cache_search_ids(u, q, 8, 32, 4, NULL, 0, NC_UB_OPEN, a->d2, a->w, a->id, err, sizeof err);
}

static bool same(const answers *a, const answers *b)
{
    return a->n == b->n && !strcmp(a->prov, b->prov) && !memcmp(a->d2, b->d2, sizeof a->d2) &&
           !memcmp(a->w, b->w, sizeof a->w) && !memcmp(a->id, b->id, sizeof a->id);
}

static long wal_bytes(const char *dir)
{
    nc_nsstore *ns;
    (void)ns;
    char p[256];
    snprintf(p, sizeof p, "%s/wal", dir);
    return (long)wal_disk_bytes(p);
}

TEST(compact_log_and_snapshot_rebuild_bit_for_bit)
{
    char dir[64], kdir[64], err[NC_ERRLEN] = "";
    scratch(dir, sizeof dir);
    scratch(kdir, sizeof kdir);
    nc_nsstore *ns, *ks;
    CHECK(open_store(dir, true, 0, &ns, err, sizeof err) == NC_OK);
    CHECK(open_store(kdir, false, 0, &ks, err, sizeof err) == NC_OK);
    nc_nsstore_stats st;
    nsstore_stats(ns, &st);
    CHECK(st.compact && !st.exact && st.fingerprint != 0);
    CHECK(add_doc(ns, "alpha", 400, 1) == 0 && add_doc(ns, "beta", 300, 2) == 0);
    CHECK(add_doc(ks, "alpha", 400, 1) == 0 && add_doc(ks, "beta", 300, 2) == 0);
    nsstore_stats(ks, &st);
    CHECK(!st.compact && !st.exact);
    answers *a = malloc(sizeof *a), *b = malloc(sizeof *b), *c = malloc(sizeof *c);
    answers_of(ns, a);
    answers_of(ks, b);
    CHECK(a->n == 700 && a->w[0] >= 0);
    /* the same lists and codes as the store that keeps keys (which encodes
     * by faiss_shim_add): the same answers */
    CHECK(same(a, b));
    /* the log: word reference + list + code a pair (4 + 4 + 4 bytes here),
     * the fixed parts and strings of 19 records besides (< 100 bytes each)
     * and two segment headers, against 2H + 4 = 36 bytes a pair with keys */
    long cb = wal_bytes(dir), kb = wal_bytes(kdir);
    CHECKF(cb >= 700 * 12 && cb < 700 * 12 + 21 * 100, "compact log %ld bytes", cb);
    CHECKF(kb >= 700 * 36, "keys log %ld bytes", kb);
    nsstore_close(ks);
    /* the log alone */
    nsstore_close(ns);
    CHECK(open_store(dir, false, 0, &ns, err, sizeof err) == NC_OK);   /* compact: its storage file says so */
    answers_of(ns, c);
    CHECK(same(a, c));
    /* snapshot, then a tail */
    CHECK(nsstore_snapshot(ns, NULL, err, sizeof err) == NC_OK);
    CHECK(add_doc(ns, "gamma", 111, 3) == 0);
    answers_of(ns, a);
    CHECK(a->n == 811);
    nsstore_close(ns);
    CHECK(open_store(dir, true, 0, &ns, err, sizeof err) == NC_OK);
    answers_of(ns, c);
    CHECK(same(a, c));
    nsstore_close(ns);
    free(a);
    free(b);
    free(c);
    nsstore_remove_dir(dir, NULL, 0);
    nsstore_remove_dir(kdir, NULL, 0);
}

TEST(compact_log_follower_gives_codes)
{
    char dir[64], err[NC_ERRLEN] = "";
    scratch(dir, sizeof dir);
    nc_nsstore *ns;
    CHECK(open_store(dir, true, 0, &ns, err, sizeof err) == NC_OK);
    nsstore_retain_log(ns, 0);
    CHECK(add_doc(ns, "one", 50, 5) == 0);
    nc_nslog *l = NULL;
    CHECK(nsstore_log_open(ns, 0, &l, err, sizeof err) == NC_OK);
    nc_nslog_add a;
    int adds = 0, rc;
    size_t pairs = 0;
    while (l && (rc = nsstore_log_next(l, &a, err, sizeof err)) == 1) {
        CHECK(a.keys_f16 == NULL && a.lists && a.codes && a.code_size == 4 && !strcmp(a.doc, "one"));
        CHECK(a.off == pairs);
        for (size_t i = 0; i < a.n; i++) {
            uint32_t li;
            memcpy(&li, (const unsigned char *)a.lists + 4 * i, 4);
            CHECK(li < 16);
        }
        pairs += a.n;
        adds++;
    }
    CHECK(rc == 0 && adds == 2 && pairs == 50);
    nsstore_log_close(l);
    nsstore_close(ns);
    nsstore_remove_dir(dir, NULL, 0);
}

TEST(compact_refusals_name_the_mode)
{
    char dir[64], kdir[64], err[NC_ERRLEN] = "";
    scratch(dir, sizeof dir);
    scratch(kdir, sizeof kdir);
    nc_nsstore *ns;
    /* its codes read with another training's quantizer: refused */
    CHECK(open_store(dir, true, 0, &ns, err, sizeof err) == NC_OK);
    CHECK(add_doc(ns, "one", 40, 1) == 0);
    nsstore_close(ns);
    CHECK(open_store(dir, true, 1, &ns, err, sizeof err) == NC_EFORMAT);
    HAS(err, "compact storage");
    HAS(err, "keeps no keys");
    /* with its own training it opens */
    CHECK(open_store(dir, false, 0, &ns, err, sizeof err) == NC_OK);
    nsstore_close(ns);
    /* a store with keys does not become compact */
    CHECK(open_store(kdir, false, 0, &ns, err, sizeof err) == NC_OK);
    CHECK(add_doc(ns, "one", 10, 1) == 0);
    nsstore_close(ns);
    CHECK(open_store(kdir, true, 0, &ns, err, sizeof err) == NC_ESTATE);
    HAS(err, "cannot become compact");
    nsstore_remove_dir(kdir, NULL, 0);
    /* no trained index, or an exact one: nothing to encode with */
    nc_nsstore_opts o = {.dir = kdir, .model = model, .sync = WAL_SYNC_NONE, .compact = true};
    unbounded_cache_opts_default(&o.ub, H);
    CHECK(nsstore_open(&o, &ns, NULL, err, sizeof err) == NC_EINVAL);
    HAS(err, "compact storage needs a trained index");
    nsstore_remove_dir(kdir, NULL, 0);
    o.ub.trained_path = trained[0];
    o.ub.exact = true;
    CHECK(nsstore_open(&o, &ns, NULL, err, sizeof err) == NC_EINVAL);
    HAS(err, "compact storage keeps no keys");
    /* a cache that keeps keys takes no codes */
    nc_unbounded_cache_opts uo;
    unbounded_cache_opts_default(&uo, H);
    nc_unbounded_cache *u;
    CHECK(unbounded_cache_new(&uo, NULL, &u, err, sizeof err) == NC_OK);
    int64_t list = 0;
    uint8_t code[4] = {0};
    int word = 1;
    nc_ub_coded cd = {.lists = &list, .codes = code, .code_size = 4, .words = &word, .n = 1};
    CHECK(unbounded_cache_add_codes(u, &cd, err, sizeof err) == NC_EINVAL);
    unbounded_cache_free(u);
    /* a list out of range is refused before anything is logged or stored */
    uo.trained_path = trained[0];
    uo.compact = true;
    CHECK(unbounded_cache_new(&uo, NULL, &u, err, sizeof err) == NC_OK);
    list = 16;
    CHECK(unbounded_cache_add_codes(u, &cd, err, sizeof err) == NC_EFORMAT && unbounded_cache_count(u) == 0);
    list = 15;
    CHECK(unbounded_cache_add_codes(u, &cd, err, sizeof err) == NC_OK && unbounded_cache_count(u) == 1);
    unbounded_cache_free(u);
    nsstore_remove_dir(dir, NULL, 0);
    nsstore_remove_dir(kdir, NULL, 0);
}

/* Caches of one training read one precomputed table, and FAISS's own
 * search through it answers as our scan does. */
TEST(one_table_a_training)
{
    char err[NC_ERRLEN] = "";
    int count = -1;
    size_t base = pq_tables_bytes(&count), table = 16 * 4 * 256 * sizeof(float);
    CHECK(base == 0 && count == 0);
    nc_unbounded_cache_opts uo;
    unbounded_cache_opts_default(&uo, H);
    uo.trained_path = trained[0];
    uo.compact = true;
    nc_unbounded_cache *u[3];
    CHECK(unbounded_cache_new(&uo, NULL, &u[0], err, sizeof err) == NC_OK);
    uo.faiss_scan = true;
    CHECK(unbounded_cache_new(&uo, NULL, &u[1], err, sizeof err) == NC_OK);
    CHECK(pq_tables_bytes(&count) == table && count == 1);
    uo.trained_path = trained[1];
    uo.faiss_scan = false;
    CHECK(unbounded_cache_new(&uo, NULL, &u[2], err, sizeof err) == NC_OK);
    CHECK(pq_tables_bytes(&count) == 2 * table && count == 2);
    /* namespace memory counts the shared table once, outside */
    CHECKF(unbounded_cache_memory(u[0]) < table, "%zu bytes", unbounded_cache_memory(u[0]));
    size_t n = 500;
    float *k = malloc(n * H * sizeof *k);
    int *w = malloc(n * sizeof *w);
    keys_of(9, n, k);
    for (size_t i = 0; i < n; i++)
        w[i] = (int)(i % 7);
    CHECK(unbounded_cache_add(u[0], k, w, n, NULL, err, sizeof err) == NC_OK);
    CHECK(unbounded_cache_add(u[1], k, w, n, NULL, err, sizeof err) == NC_OK);
    float q[4 * 64], d0[4 * 20], d1[4 * 20];
    int w0[4 * 20], w1[4 * 20];
    keys_of(31, 4, q);
    CHECK(unbounded_cache_search(u[0], q, 4, 20, 8, NULL, 0, NC_UB_OPEN, d0, w0, err, sizeof err) == NC_OK);
    CHECK(unbounded_cache_search(u[1], q, 4, 20, 8, NULL, 0, NC_UB_OPEN, d1, w1, err, sizeof err) == NC_OK);
    /* the same table and codes, summed in the same order (faiss_shim.h):
     * equal distances but for ties' order; 1e-5 relative covers a float
     * sum of 4 terms of magnitude <= the distance itself */
    int bad = 0;
    for (int i = 0; i < 4 * 20; i++)
        bad += !(w0[i] >= 0 && fabsf(d0[i] - d1[i]) <= 1e-5f * (1.0f + fabsf(d0[i])));
    CHECKF(bad == 0, "%d of 80 neighbours differ", bad);
    /* u[0] searched with our scan (which reads the shared table), u[1] with FAISS's */
    uint64_t nq = 0, codes = 0;
    unbounded_cache_scan_stats(u[0], &nq, &codes);
    CHECK(nq == 4 && codes > 0);
    unbounded_cache_scan_stats(u[1], &nq, &codes);
    CHECK(nq == 0);
    unbounded_cache_free(u[0]);
    CHECK(pq_tables_bytes(&count) == 2 * table && count == 2);
    unbounded_cache_free(u[1]);
    CHECK(pq_tables_bytes(&count) == table && count == 1);
    unbounded_cache_free(u[2]);
    CHECK(pq_tables_bytes(&count) == 0 && count == 0);
    free(k);
    free(w);
}

int main(void)
{
    char path[512], err[NC_ERRLEN];
    snprintf(path, sizeof path, "%s/lstm-2layer", harness_fixtures());
    if (model_load(path, &model, err, sizeof err) != NC_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    H = model->cfg.hidden_size;
    V = model->cfg.vocab_size;
    for (int i = 0; i < 2; i++) {
        snprintf(trained[i], sizeof trained[i], "/tmp/nc_test_compact_%d_%d.faiss", (int)getpid(), i);
        if (train_index(trained[i], 100 + (uint64_t)i)) {
            fprintf(stderr, "cannot train %s\n", trained[i]);
            return 1;
        }
    }
    RUN(compact_log_and_snapshot_rebuild_bit_for_bit);
    RUN(compact_log_follower_gives_codes);
    RUN(compact_refusals_name_the_mode);
    RUN(one_table_a_training);
    for (int i = 0; i < 2; i++)
        unlink(trained[i]);
    model_free(model);
    return harness_summary();
}
