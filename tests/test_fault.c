/* test_fault.c -- fault simulation (core/fault.h) walked over the model load,
 * model save and tokenizer paths, SQLite style: for N = 1, 2, ... make the
 * N-th allocation / read / write / fsync fail, check the operation fails
 * cleanly (error code, message, nothing half-built handed out, files on disk
 * unchanged) and that it succeeds with the same result once the fault is
 * gone; the walk ends at the first N the operation never reaches. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault.h"
#include "harness.h"
#include "model.h"
#include "tokenizer.h"

/* The walk stops here even if the operation still reaches N (a bound on
 * test time, never reached by the fixtures: each walk checks it ended). */
#define WALK_MAX 5000

static char fixture[1024];
static char scratch[] = "/tmp/nc_fault_XXXXXX";

/* A cheap fingerprint of every weight, to compare loads. */
static double model_sum(const nc_model *m)
{
    const nc_model_config *c = &m->cfg;
    double s = 0;
    size_t V = (size_t)c->vocab_size, E = (size_t)c->embedding_size, H = (size_t)c->hidden_size;
    for (size_t i = 0; i < V * E; i++) s += m->encoder[i] * (double)((i % 7) + 1);
    for (size_t i = 0; i < V * H; i++) s += m->decoder_w[i] * (double)((i % 5) + 1);
    for (size_t i = 0; i < V; i++) s += m->decoder_b[i];
    for (int k = 0; k < c->num_layers; k++) {
        size_t in = (size_t)m->layers[k].input_size;
        for (size_t i = 0; i < 4 * H * in; i++) s += m->layers[k].w_ih[i] * (double)((i % 3) + 1);
        for (size_t i = 0; i < 4 * H * H; i++) s += m->layers[k].w_hh[i];
        for (size_t i = 0; i < 4 * H; i++) s += m->layers[k].b_sum[i];
    }
    return s;
}

/* Loads dir under fault kind armed at n. Returns the number of hits; *rc the
 * load's result (the model is checked and freed here). */
static long load_with_fault(const char *dir, nc_fault_kind kind, long n, int flags, double want_sum,
                            int *rc_out)
{
    nc_model *m = (nc_model *)0x1;
    char err[NC_ERRLEN] = "";
    nc_fault_arm(kind, n, flags);
    int rc = model_load(dir, &m, err, sizeof err);
    long hits = nc_fault_hits(kind);
    nc_fault_disarm();
    *rc_out = rc;
    if (hits == 0) {
        CHECKF(rc == NC_OK, "%s:%ld: load failed without a fault: %s", nc_fault_name(kind), n, err);
        if (rc == NC_OK)
            CHECK_NEAR(model_sum(m), want_sum, 1e-9);
    } else {
        CHECKF(rc != NC_OK && m == NULL, "%s:%ld: a failed load must fail and hand out nothing (rc %d)",
               nc_fault_name(kind), n, rc);
        CHECKF(err[0] != 0, "%s:%ld: no error message", nc_fault_name(kind), n);
        if (kind == NC_FAULT_READ)
            CHECKF(rc == NC_EIO || rc == NC_ENOTFOUND, "read:%ld: rc %d (%s)", n, rc, err);
    }
    if (rc == NC_OK)
        model_free(m);
    return hits;
}

/* Walks N over one fault kind during model_load: every N fails cleanly, and
 * the next clean load gives the same weights. */
static void walk_load(nc_fault_kind kind, double want_sum, long *points)
{
    long n;
    for (n = 1; n <= WALK_MAX; n++) {
        int rc;
        long hits = load_with_fault(fixture, kind, n, 0, want_sum, &rc);
        /* Recovery: the fault is gone, the load is whole again. */
        nc_model *m = NULL;
        char err[NC_ERRLEN] = "";
        int rc2 = model_load(fixture, &m, err, sizeof err);
        CHECKF(rc2 == NC_OK, "%s:%ld: load after the fault failed: %s", nc_fault_name(kind), n, err);
        if (rc2 == NC_OK) {
            CHECK_NEAR(model_sum(m), want_sum, 1e-9);
            model_free(m);
        }
        if (hits == 0)
            break;
    }
    CHECKF(n <= WALK_MAX, "%s walk did not end", nc_fault_name(kind));
    *points = n - 1;
    fprintf(stderr, "        model_load: %ld %s fault points\n", *points, nc_fault_name(kind));
}

TEST(load_alloc_walk)
{
    nc_model *m = NULL;
    char err[NC_ERRLEN] = "";
    CHECK(model_load(fixture, &m, err, sizeof err) == NC_OK);
    if (!m)
        return;
    double want = model_sum(m);
    model_free(m);
    long points = 0;
    walk_load(NC_FAULT_ALLOC, want, &points);
    /* config, vocab words, uthash, layers, header JSON, buffers: dozens. */
    CHECKF(points >= 50, "only %ld allocation points: is the hook wired in?", points);
}

TEST(load_read_walk)
{
    nc_model *m = NULL;
    char err[NC_ERRLEN] = "";
    CHECK(model_load(fixture, &m, err, sizeof err) == NC_OK);
    if (!m)
        return;
    double want = model_sum(m);
    int V = m->cfg.vocab_size;
    model_free(m);
    long points = 0;
    walk_load(NC_FAULT_READ, want, &points);
    /* fopen(config) + fopen(vocab) + V getlines + the EOF getline + open +
     * mmap of the safetensors file. */
    CHECKF(points == V + 5, "read points %ld, expected %d", points, V + 5);
}

/* A persistent fault (every call from the N-th) also fails cleanly. */
TEST(load_alloc_persistent)
{
    nc_model *m = NULL;
    char err[NC_ERRLEN] = "";
    CHECK(model_load(fixture, &m, err, sizeof err) == NC_OK);
    if (!m)
        return;
    double want = model_sum(m);
    model_free(m);
    int failed = 0;
    for (long n = 1; n <= 400; n += 7) {
        int rc;
        long hits = load_with_fault(fixture, NC_FAULT_ALLOC, n, NC_FAULT_PERSIST, want, &rc);
        if (hits > 0) failed++;
        if (hits == 0) break;
    }
    CHECK(failed > 3);
}

static int read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)n + 1);
    size_t got = fread(*buf, 1, (size_t)n, f);
    fclose(f);
    *len = got;
    return got == (size_t)n ? 0 : -1;
}

static int same_file(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t xl = 0, yl = 0;
    int same = read_file(a, &x, &xl) == 0 && read_file(b, &y, &yl) == 0 && xl == yl && memcmp(x, y, xl) == 0;
    free(x);
    free(y);
    return same;
}

/* model_save over an existing model directory with write / fsync / alloc
 * faults: the save fails with NC_EIO (or ENOMEM), and what is on disk is
 * still the previous, complete model (temp files + rename), with no
 * temporary file left behind. */
static void walk_save(nc_fault_kind kind)
{
    nc_model *m = NULL;
    char err[NC_ERRLEN] = "";
    CHECK(model_load(fixture, &m, err, sizeof err) == NC_OK);
    if (!m)
        return;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/save-%s", scratch, nc_fault_name(kind));
    /* The previous model: the same weights saved as F16 (different bytes). */
    CHECK(model_save(m, dir, true, err, sizeof err) == NC_OK);
    char old[1100], now[1100];
    snprintf(old, sizeof old, "%s/old.safetensors", scratch);
    snprintf(now, sizeof now, "%s/model.safetensors", dir);
    rename(now, old);
    CHECK(model_save(m, dir, true, err, sizeof err) == NC_OK);
    long n;
    for (n = 1; n <= WALK_MAX; n++) {
        err[0] = 0;
        nc_fault_arm(kind, n, 0);
        int rc = model_save(m, dir, false, err, sizeof err);
        long hits = nc_fault_hits(kind);
        nc_fault_disarm();
        if (hits == 0) {
            CHECKF(rc == NC_OK, "%s:%ld: save failed without a fault: %s", nc_fault_name(kind), n, err);
            break;
        }
        CHECKF(rc == NC_EIO || rc == NC_ENOMEM, "%s:%ld: rc %d (%s)", nc_fault_name(kind), n, rc, err);
        CHECKF(err[0] != 0, "%s:%ld: no message", nc_fault_name(kind), n);
        /* A failure before the first rename leaves the old model whole;
         * one between renames leaves a whole file of either save in each
         * place, which still loads (F32 and F16 hold the same F16 values). */
        nc_model *back = NULL;
        char err2[NC_ERRLEN] = "";
        CHECKF(model_load(dir, &back, err2, sizeof err2) == NC_OK, "%s:%ld: model on disk broken: %s",
               nc_fault_name(kind), n, err2);
        model_free(back);
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s/model.safetensors.tmp", dir);
        CHECKF(access(tmp, F_OK) != 0, "%s:%ld: temporary file left behind", nc_fault_name(kind), n);
    }
    CHECKF(n > 1 && n <= WALK_MAX, "%s: save walk reached %ld", nc_fault_name(kind), n);
    fprintf(stderr, "        model_save: %ld %s fault points\n", n - 1, nc_fault_name(kind));
    /* Recovered: the last save went through and reads back as F32. */
    CHECK(!same_file(old, now));
    nc_model *back = NULL;
    CHECK(model_load(dir, &back, err, sizeof err) == NC_OK);
    if (back) {
        CHECK_NEAR(model_sum(back), model_sum(m), 1e-9);
        model_free(back);
    }
    model_free(m);
}

TEST(save_write_walk) { walk_save(NC_FAULT_WRITE); }
TEST(save_fsync_walk) { walk_save(NC_FAULT_FSYNC); }

/* tokenize under allocation faults: NC_ENOMEM and nothing appended. */
TEST(tokenize_alloc_walk)
{
    nc_model *m = NULL;
    char err[NC_ERRLEN] = "";
    CHECK(model_load(fixture, &m, err, sizeof err) == NC_OK);
    if (!m)
        return;
    /* 300 words: the token arrays grow past their first 256 slots. */
    char text[4096] = "";
    for (int i = 0; i < 300; i++)
        strcat(text, i % 20 == 19 ? "the\n" : "a ");
    nc_tokens ref;
    tokens_init(&ref);
    CHECK(tokenize(m, text, strlen(text), true, &ref, err, sizeof err) == NC_OK);
    long n;
    for (n = 1; n <= WALK_MAX; n++) {
        nc_tokens t;
        tokens_init(&t);
        CHECK(tokens_push(&t, 0, "x", 1, 0) == NC_OK);   /* already there: must survive */
        nc_fault_arm(NC_FAULT_ALLOC, n, 0);
        int rc = tokenize(m, text, strlen(text), true, &t, err, sizeof err);
        long hits = nc_fault_hits(NC_FAULT_ALLOC);
        nc_fault_disarm();
        if (hits == 0) {
            CHECK(rc == NC_OK && t.n == ref.n + 1);
            tokens_clear(&t);
            break;
        }
        CHECKF(rc == NC_ENOMEM && t.n == 1 && strcmp(t.words[0], "x") == 0,
               "alloc:%ld: rc %d, %zu tokens left", n, rc, t.n);
        /* Recovery on the same token list. */
        rc = tokenize(m, text, strlen(text), true, &t, err, sizeof err);
        CHECK(rc == NC_OK && t.n == ref.n + 1);
        if (rc == NC_OK && t.n == ref.n + 1)
            CHECK(t.ids[ref.n] == ref.ids[ref.n - 1]);
        tokens_clear(&t);
    }
    CHECKF(n > (long)ref.n && n <= WALK_MAX, "tokenize walk: %ld points for %zu tokens", n - 1, ref.n);
    tokens_clear(&ref);
    model_free(m);
}

/* The counters only count opted-in threads, and specs parse strictly. */
TEST(spec_and_threads)
{
    CHECK(nc_fault_from_spec("alloc:3") == 0);
    CHECK(nc_fault_from_spec("write:2+,fsync:1") == 0);
    CHECK(nc_fault_from_spec("") == 0);
    CHECK(nc_fault_from_spec(NULL) == 0);
    CHECK(nc_fault_from_spec("alloc") == -1);
    CHECK(nc_fault_from_spec("alloc:0") == -1);
    CHECK(nc_fault_from_spec("alloc:x") == -1);
    CHECK(nc_fault_from_spec("disk:1") == -1);
    CHECK(nc_fault_from_spec("alloc:1;read:2") == -1);
    nc_fault_disarm();

    /* persistent write fault from the spec, every thread */
    CHECK(nc_fault_from_spec("write:2+") == 0);
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f) {
        CHECK(nc_fwrite("a", 1, 1, f) == 1);
        errno = 0;
        CHECK(nc_fwrite("b", 1, 1, f) == 0 && errno == ENOSPC);
        CHECK(nc_fwrite("c", 1, 1, f) == 0);
        fclose(f);
    }
    CHECK(nc_fault_hits(NC_FAULT_WRITE) == 2);
    nc_fault_disarm();
    CHECK(nc_fwrite("d", 1, 0, stdout) == 0);   /* disarmed: plain fwrite */

    /* a thread that did not opt in is not counted */
    nc_fault_thread(false);
    nc_fault_arm(NC_FAULT_ALLOC, 1, 0);
    void *p = nc_malloc(16);
    CHECK(p != NULL && nc_fault_calls(NC_FAULT_ALLOC) == 0);
    free(p);
    nc_fault_thread(true);
    p = nc_malloc(16);
    CHECK(p == NULL && nc_fault_hits(NC_FAULT_ALLOC) == 1);
    p = nc_alloc(16);
    CHECK(p != NULL);   /* the 2nd call: only the 1st fails */
    nc_free(p);
    nc_fault_disarm();
}

int main(void)
{
    snprintf(fixture, sizeof fixture, "%s/lstm-2layer", harness_fixtures());
    if (!mkdtemp(scratch)) {
        perror("mkdtemp");
        return 1;
    }
    /* jansson is deliberately NOT routed through the hook: under a failed
     * allocation its lexer (Debian's 2.14) stops on assert(0) in
     * lex_scan_string instead of returning an error, so only the core's own
     * allocations are walked. */
    nc_fault_thread(true);
    RUN(spec_and_threads);
    RUN(load_alloc_walk);
    RUN(load_read_walk);
    RUN(load_alloc_persistent);
    RUN(save_write_walk);
    RUN(save_fsync_walk);
    RUN(tokenize_alloc_walk);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    if (system(cmd) != 0) { /* best effort */ }
    return harness_summary();
}
