/* test_wal.c -- the write-ahead log: round trip, torn tails truncated, flipped
 * bytes refused, segments and pruning, group commit under concurrency, a
 * follower reading the log while it is written. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault.h"
#include "harness.h"
#include "nsstore.h"
#include "rng.h"
#include "wal.h"

#define TAG 0x1234abcdu
#define HAS(s, sub) CHECKF(strstr((s), (sub)) != NULL, "\"%s\" lacks \"%s\"", (s), (sub))

/* The calls in the tests' argument order: wal.h takes them as specs. */
static int replay(const char *dir, uint32_t tag, uint64_t after, wal_record_fn fn, void *ctx,
                  nc_wal_replay_info *info, char *err, size_t errlen)
{
    const nc_wal_replay_spec s = {.dir = dir, .tag = tag, .after = after, .fn = fn, .ctx = ctx};
    return wal_replay(&s, info, err, errlen);
}

static int open_wal(const char *dir, uint32_t tag, uint64_t next_seq, nc_wal_sync mode, nc_wal **out, char *err,
                    size_t errlen)
{
    const nc_wal_open_spec s = {.dir = dir, .tag = tag, .next_seq = next_seq, .mode = mode};
    return wal_open(&s, out, err, errlen);
}

static int reader_next(nc_wal_reader *r, uint64_t upto, uint64_t *seq, const void **payload, size_t *len,
                       char *err, size_t errlen)
{
    nc_wal_record rec = {0};
    int rc = wal_reader_next(r, upto, &rec, err, errlen);
    *seq = rec.seq, *payload = rec.payload, *len = rec.len;
    return rc;
}

static void scratch(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/nc_test_wal_XXXXXX");
    if (!mkdtemp(dir))
        abort();
}

/* record i: length 1 + (i * 37) % 300 bytes, byte j = (i * 7 + j) & 255 */
static size_t rec_len(uint64_t i) { return 1 + (size_t)(i * 37) % 300; }
static void rec_fill(uint64_t i, unsigned char *b)
{
    for (size_t j = 0; j < rec_len(i); j++)
        b[j] = (unsigned char)((i * 7 + j) & 255);
}

typedef struct {
    uint64_t n, first, bad;
} check_ctx;

static int check_rec(void *ctx, uint64_t seq, const void *p, size_t len, char *err, size_t errlen)
{
    check_ctx *c = ctx;
    unsigned char b[400];
    (void)err, (void)errlen;
    if (c->n == 0)
        c->first = seq;
    rec_fill(seq, b);
    if (len != rec_len(seq) || memcmp(b, p, len) != 0)
        c->bad++;
    c->n++;
    return 0;
}

static int write_log(const char *dir, uint64_t from, uint64_t to, nc_wal_sync mode)
{
    nc_wal *w;
    char err[NC_ERRLEN];
    if (open_wal(dir, TAG, from, mode, &w, err, sizeof err))
        return -1;
    unsigned char b[400];
    uint64_t seq = 0;
    for (uint64_t i = from; i <= to; i++) {
        rec_fill(i, b);
        if (wal_append(w, b, rec_len(i), &seq, err, sizeof err) || seq != i)
            return -1;
    }
    int rc = wal_sync(w, seq, err, sizeof err);
    wal_close(w);
    return rc;
}

static void seg_path(const char *dir, uint64_t first, char *out, size_t n)
{
    char name[64];
    wal_segment_name(first, name, sizeof name);
    snprintf(out, n, "%s/%s", dir, name);
}

static long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

static void flip_byte(const char *p, long off)
{
    int fd = open(p, O_RDWR);
    unsigned char c;
    if (fd < 0 || pread(fd, &c, 1, off) != 1)
        abort();
    c ^= 0x5a;
    if (pwrite(fd, &c, 1, off) != 1)
        abort();
    close(fd);
}

TEST(round_trip)
{
    char dir[64], err[NC_ERRLEN] = "";
    scratch(dir, sizeof dir);
    CHECK(write_log(dir, 1, 500, WAL_SYNC_GROUP) == 0);
    check_ctx c = {0};
    nc_wal_replay_info info;
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 500 && c.bad == 0 && c.first == 1);
    CHECK(info.last_seq == 500 && !info.truncated && info.segments == 1);
    /* only records after 'after' are handed out */
    memset(&c, 0, sizeof c);
    CHECK(replay(dir, TAG, 420, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 80 && c.first == 421 && info.last_seq == 500);
    /* another model's tag is refused */
    CHECK(replay(dir, TAG + 1, 0, check_rec, &c, &info, err, sizeof err) == NC_EFORMAT);
    HAS(err, "another model");
    /* continuing the log: a new segment at 501 */
    CHECK(write_log(dir, 501, 600, WAL_SYNC_EACH) == 0);
    memset(&c, 0, sizeof c);
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 600 && c.bad == 0 && info.segments == 2);
    nsstore_remove_dir(dir, NULL, 0);
}

TEST(torn_tail_truncated)
{
    char dir[64], err[NC_ERRLEN] = "", p[256];
    scratch(dir, sizeof dir);
    CHECK(write_log(dir, 1, 100, WAL_SYNC_NONE) == 0);
    seg_path(dir, 1, p, sizeof p);
    long full = file_size(p);
    /* cut in the middle of the last record (100 has 1 + 3700 % 300 = 101 bytes) */
    CHECK(truncate(p, full - 50) == 0);
    check_ctx c = {0};
    nc_wal_replay_info info;
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 99 && c.bad == 0 && info.truncated && info.last_seq == 99);
    HAS(info.warning, "torn final record");
    CHECK(file_size(p) == full - 24 - (long)rec_len(100));
    /* the log continues cleanly after the cut */
    CHECK(write_log(dir, 100, 120, WAL_SYNC_GROUP) == 0);
    memset(&c, 0, sizeof c);
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 120 && c.bad == 0 && !info.truncated);
    /* garbage after the last record (zeros from a crashed extension) */
    seg_path(dir, 100, p, sizeof p);
    long sz = file_size(p);
    CHECK(truncate(p, sz + 4096) == 0);
    memset(&c, 0, sizeof c);
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 120 && info.truncated && file_size(p) == sz);
    /* a byte flipped inside the last record is indistinguishable from a
     * torn write: truncated with a warning */
    flip_byte(p, sz - 3);
    memset(&c, 0, sizeof c);
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 119 && c.bad == 0 && info.truncated);
    HAS(info.warning, "checksum mismatch");
    nsstore_remove_dir(dir, NULL, 0);
}

TEST(flipped_byte_in_the_middle_refused)
{
    char dir[64], err[NC_ERRLEN] = "", p[256];
    scratch(dir, sizeof dir);
    CHECK(write_log(dir, 1, 200, WAL_SYNC_NONE) == 0);
    seg_path(dir, 1, p, sizeof p);
    long full = file_size(p);
    /* every region of a record: header magic, length, seq, crc, payload */
    long offs[] = {24, 24 + 4, 24 + 9, 24 + 17, 24 + 24 + 1, full / 2, full / 3 + 7};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        flip_byte(p, offs[i]);
        check_ctx c = {0};
        nc_wal_replay_info info;
        err[0] = 0;
        int rc = replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err);
        CHECKF(rc == NC_EFORMAT, "flip at %ld: rc %d", offs[i], rc);
        HAS(err, p);
        CHECK(file_size(p) == full);   /* nothing truncated */
        flip_byte(p, offs[i]);         /* restore */
    }
    check_ctx c = {0};
    CHECK(replay(dir, TAG, 0, check_rec, &c, NULL, err, sizeof err) == NC_OK && c.n == 200);
    /* a bad segment header */
    flip_byte(p, 3);
    CHECK(replay(dir, TAG, 0, check_rec, &c, NULL, err, sizeof err) == NC_EFORMAT);
    HAS(err, "bad segment header");
    flip_byte(p, 3);
    /* a missing record between segments (a gap) */
    CHECK(write_log(dir, 202, 210, WAL_SYNC_NONE) == 0);
    CHECK(replay(dir, TAG, 0, check_rec, &c, NULL, err, sizeof err) == NC_EFORMAT);
    HAS(err, "previous segment ends at 200");
    nsstore_remove_dir(dir, NULL, 0);
}

TEST(rotate_and_prune)
{
    char dir[64], err[NC_ERRLEN] = "";
    scratch(dir, sizeof dir);
    nc_wal *w;
    CHECK(open_wal(dir, TAG, 1, WAL_SYNC_GROUP, &w, err, sizeof err) == NC_OK);
    unsigned char b[400];
    uint64_t seq = 0, last = 0;
    for (uint64_t i = 1; i <= 300; i++) {
        rec_fill(i, b);
        CHECK(wal_append(w, b, rec_len(i), &seq, err, sizeof err) == NC_OK);
        if (i % 100 == 0) {
            CHECK(wal_rotate(w, &last, err, sizeof err) == NC_OK);
            CHECK(last == i);
        }
    }
    CHECK(wal_rotate(w, &last, err, sizeof err) == NC_OK);   /* empty: no new segment */
    nc_wal_stats st;
    wal_stats(w, &st);
    CHECK(st.last_seq == 300 && st.synced_seq == 300);
    wal_close(w);
    check_ctx c = {0};
    nc_wal_replay_info info;
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 300 && c.bad == 0 && info.segments == 4);
    /* prune what a snapshot at 150 covers: only the first segment [1,100] */
    CHECK(wal_prune(dir, 150, err, sizeof err) == 1);
    memset(&c, 0, sizeof c);
    CHECK(replay(dir, TAG, 150, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECK(c.n == 150 && c.first == 151);
    /* the log no longer reaches back to 1 */
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_ENOTFOUND);
    HAS(err, "does not reach back");
    /* the last segment is never pruned */
    CHECK(wal_prune(dir, 1000, err, sizeof err) == 2);
    CHECK(replay(dir, TAG, 300, check_rec, &c, &info, err, sizeof err) == NC_OK);
    nsstore_remove_dir(dir, NULL, 0);
}

typedef struct {
    nc_wal *w;
    int id, n, failures;
} writer_arg;

static void *writer(void *p)
{
    writer_arg *a = p;
    char err[NC_ERRLEN];
    for (int i = 0; i < a->n; i++) {
        unsigned char b[64];
        memset(b, a->id, sizeof b);
        b[0] = (unsigned char)i;
        uint64_t seq;
        if (wal_append(a->w, b, sizeof b, &seq, err, sizeof err) || wal_sync(a->w, seq, err, sizeof err))
            a->failures++;
        nc_wal_stats st;
        wal_stats(a->w, &st);
        if (st.synced_seq < seq)
            a->failures++;   /* acknowledged before durable */
    }
    return NULL;
}

static int count_by_writer(void *ctx, uint64_t seq, const void *p, size_t len, char *err, size_t errlen)
{
    int *counts = ctx;
    const unsigned char *b = p;
    (void)seq, (void)err, (void)errlen;
    if (len == 64 && b[1] < 4)
        counts[b[1]]++;
    return 0;
}

TEST(group_commit_concurrent)
{
    for (int mode = WAL_SYNC_GROUP; mode <= WAL_SYNC_EACH; mode++) {
        char dir[64], err[NC_ERRLEN] = "";
        scratch(dir, sizeof dir);
        nc_wal *w;
        CHECK(open_wal(dir, TAG, 1, (nc_wal_sync)mode, &w, err, sizeof err) == NC_OK);
        pthread_t th[4];
        writer_arg a[4];
        for (int i = 0; i < 4; i++) {
            a[i] = (writer_arg){w, i, 50, 0};
            pthread_create(&th[i], NULL, writer, &a[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            CHECK(a[i].failures == 0);
        }
        nc_wal_stats st;
        wal_stats(w, &st);
        CHECK(st.last_seq == 200 && st.synced_seq == 200);
        /* group commit never needs more fsyncs than syncs; per-request mode
         * makes exactly one per sync (the segment header's is not counted) */
        CHECK(st.fsyncs <= 200);
        if (mode == WAL_SYNC_EACH)
            CHECK(st.fsyncs == 200);
        fprintf(stderr, "    %s: 200 synced appends, %llu fsyncs\n", mode == WAL_SYNC_GROUP ? "group" : "each",
                (unsigned long long)st.fsyncs);
        wal_close(w);
        int counts[4] = {0};
        CHECK(replay(dir, TAG, 0, count_by_writer, counts, NULL, err, sizeof err) == NC_OK);
        CHECK(counts[0] == 50 && counts[1] == 50 && counts[2] == 50 && counts[3] == 50);
        nsstore_remove_dir(dir, NULL, 0);
    }
}

TEST(bad_arguments)
{
    char dir[64], err[NC_ERRLEN] = "";
    scratch(dir, sizeof dir);
    nc_wal *w = NULL;
    CHECK(open_wal(dir, TAG, 0, WAL_SYNC_GROUP, &w, err, sizeof err) == NC_EINVAL && !w);
    CHECK(open_wal("/proc/nonexistent/x", TAG, 1, WAL_SYNC_GROUP, &w, err, sizeof err) == NC_EIO);
    CHECK(open_wal(dir, TAG, 1, WAL_SYNC_GROUP, &w, err, sizeof err) == NC_OK);
    uint64_t seq;
    CHECK(wal_append(w, "x", (size_t)WAL_MAX_RECORD + 1, &seq, err, sizeof err) == NC_EINVAL);
    CHECK(wal_sync(w, 0, err, sizeof err) == NC_OK);
    wal_close(w);
    wal_close(NULL);
    /* an empty directory is an empty log; a missing one too */
    check_ctx c = {0};
    CHECK(replay(dir, TAG, 0, check_rec, &c, NULL, err, sizeof err) == NC_OK && c.n == 0);
    CHECK(replay("/tmp/nc_no_such_wal_dir", TAG, 0, check_rec, &c, NULL, err, sizeof err) == NC_OK);
    nsstore_remove_dir(dir, NULL, 0);
}

/* A full file system (here RLIMIT_FSIZE, which cuts a write short and then
 * fails it with EFBIG, as ENOSPC does): the append fails, the partial record
 * is cut off, and once there is room again the log goes on where it was. */
TEST(write_failure_mid_record_then_room_again)
{
    char dir[64], err[NC_ERRLEN] = "", p[256];
    scratch(dir, sizeof dir);
    nc_wal *w;
    CHECK(open_wal(dir, TAG, 1, WAL_SYNC_NONE, &w, err, sizeof err) == NC_OK);
    unsigned char b[400];
    uint64_t seq = 0;
    for (uint64_t i = 1; i <= 10; i++) {
        rec_fill(i, b);
        CHECK(wal_append(w, b, rec_len(i), &seq, err, sizeof err) == NC_OK);
    }
    seg_path(dir, 1, p, sizeof p);
    long before = file_size(p);
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (rlim_t)before + 30;   /* room for part of record 11 only */
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    rec_fill(11, b);
    int rc = wal_append(w, b, rec_len(11), &seq, err, sizeof err);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, prev);
    CHECKF(rc == NC_ENOSPACE, "append past the limit: rc %d (%s)", rc, err);
    CHECKF(strstr(err, "record dropped") != NULL, "error: %s", err);
    CHECKF(file_size(p) == before, "partial record left: %ld bytes, expected %ld", file_size(p), before);
    for (uint64_t i = 11; i <= 20; i++) {
        rec_fill(i, b);
        CHECK(wal_append(w, b, rec_len(i), &seq, err, sizeof err) == NC_OK && seq == i);
    }
    CHECK(wal_sync(w, seq, err, sizeof err) == NC_OK);
    wal_close(w);
    check_ctx c = {0};
    nc_wal_replay_info info;
    CHECK(replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err) == NC_OK);
    CHECKF(c.n == 20 && c.bad == 0 && c.first == 1, "replayed %zu records (%zu bad)", (size_t)c.n, (size_t)c.bad);
    nsstore_remove_dir(dir, NULL, 0);
}

/* Reads up to upto with r; checks each record; returns how many. */
static int follow(nc_wal_reader *r, uint64_t upto, uint64_t *last, int *bad)
{
    char err[NC_ERRLEN] = "";
    uint64_t seq;
    const void *p;
    size_t len;
    int n = 0, rc;
    unsigned char b[400];
    while ((rc = reader_next(r, upto, &seq, &p, &len, err, sizeof err)) == 1) {
        rec_fill(seq, b);
        if (seq != *last + 1 || len != rec_len(seq) || memcmp(b, p, len) != 0)
            (*bad)++;
        *last = seq;
        n++;
    }
    if (rc < 0) {
        fprintf(stderr, "follow: %s\n", err);
        (*bad)++;
    }
    return n;
}

/* As follow, but stops at the first error and leaves its message in err. */
static int follow_until_error(nc_wal_reader *r, uint64_t upto, uint64_t *last, int *bad, char *err,
                              size_t errlen)
{
    uint64_t seq;
    const void *p;
    size_t len;
    int n = 0;
    unsigned char b[400];
    err[0] = 0;
    while (reader_next(r, upto, &seq, &p, &len, err, errlen) == 1) {
        rec_fill(seq, b);
        if (seq != *last + 1 || len != rec_len(seq) || memcmp(b, p, len) != 0)
            (*bad)++;
        *last = seq;
        n++;
    }
    return n;
}

/* A follower (replication's publisher) reads a log while it is written:
 * only up to the bound it is given, across segment rotations, from the
 * middle of a segment, with the segments behind it pruned; a log pruned
 * past its position is NC_ENOTFOUND. */
TEST(reader_follows_writer)
{
    char dir[64], err[NC_ERRLEN] = "";
    scratch(dir, sizeof dir);
    nc_wal *w;
    CHECK(open_wal(dir, TAG, 1, WAL_SYNC_GROUP, &w, err, sizeof err) == NC_OK);
    nc_wal_reader *r = NULL;
    CHECK(wal_reader_open(dir, TAG, 0, &r, err, sizeof err) == NC_OK);
    if (!r) return;
    unsigned char b[400];
    uint64_t seq = 0, last = 0, rot;
    int bad = 0;
    CHECK(follow(r, wal_durable_seq(w), &last, &bad) == 0);
    for (uint64_t i = 1; i <= 50; i++) {
        rec_fill(i, b);
        CHECK(wal_append(w, b, rec_len(i), &seq, err, sizeof err) == NC_OK);
    }
    /* appended, not yet durable: nothing to read */
    CHECK(wal_durable_seq(w) == 0);
    CHECK(follow(r, wal_durable_seq(w), &last, &bad) == 0);
    CHECK(wal_sync(w, 50, err, sizeof err) == NC_OK && wal_durable_seq(w) == 50);
    CHECK(follow(r, 30, &last, &bad) == 30 && wal_reader_position(r) == 30);
    CHECK(follow(r, wal_durable_seq(w), &last, &bad) == 20 && last == 50);
    /* two rotations; the follower crosses them */
    for (uint64_t i = 51; i <= 200; i++) {
        rec_fill(i, b);
        CHECK(wal_append(w, b, rec_len(i), &seq, err, sizeof err) == NC_OK);
        if (i == 80 || i == 150)
            CHECK(wal_rotate(w, &rot, err, sizeof err) == NC_OK);
    }
    CHECK(wal_sync(w, 200, err, sizeof err) == NC_OK);
    CHECK(follow(r, 120, &last, &bad) == 70);
    /* segments wholly behind it go: it reads on */
    CHECK(wal_prune(dir, 80, err, sizeof err) == 1);
    CHECK(follow(r, wal_durable_seq(w), &last, &bad) == 80 && last == 200);
    CHECK(bad == 0);
    wal_reader_close(r);
    /* opened in the middle of a segment */
    CHECK(wal_reader_open(dir, TAG, 100, &r, err, sizeof err) == NC_OK);
    last = 100;
    CHECK(follow(r, 200, &last, &bad) == 100 && bad == 0);
    wal_reader_close(r);
    /* before what is left: refused, saying so */
    CHECK(wal_reader_open(dir, TAG, 10, &r, err, sizeof err) == NC_ENOTFOUND && r == NULL);
    HAS(err, "does not reach back");
    /* mode none: durable as soon as written */
    wal_close(w);
    CHECK(open_wal(dir, TAG, 201, WAL_SYNC_NONE, &w, err, sizeof err) == NC_OK);
    rec_fill(201, b);
    CHECK(wal_append(w, b, rec_len(201), &seq, err, sizeof err) == NC_OK);
    CHECK(wal_durable_seq(w) == 201);
    wal_close(w);
    wal_reader_close(NULL);
    nsstore_remove_dir(dir, NULL, 0);
}

/* A flipped byte under the follower is an error naming the record, never
 * a record handed out. */
TEST(reader_refuses_corruption)
{
    char dir[64], err[NC_ERRLEN] = "", path[200];
    scratch(dir, sizeof dir);
    CHECK(write_log(dir, 1, 10, WAL_SYNC_GROUP) == 0);
    seg_path(dir, 1, path, sizeof path);
    flip_byte(path, file_size(path) - 3);   /* in record 10's payload */
    nc_wal_reader *r = NULL;
    CHECK(wal_reader_open(dir, TAG, 0, &r, err, sizeof err) == NC_OK);
    uint64_t last = 0;
    int bad = 0;
    if (r) {
        CHECK(follow(r, 9, &last, &bad) == 9 && bad == 0);
        uint64_t seq;
        const void *p;
        size_t len;
        CHECK(reader_next(r, 10, &seq, &p, &len, err, sizeof err) == NC_EFORMAT);
        HAS(err, "record 10");
    }
    wal_reader_close(r);
    CHECK(wal_reader_open(dir, TAG + 1, 0, &r, err, sizeof err) == NC_EFORMAT);
    nsstore_remove_dir(dir, NULL, 0);
}

/* After a failed fsync the log goes on in a new segment (wal_restart)
 * while the old one may have lost its tail: a follower passes over the
 * lost records, saying which, and reads on. */
TEST(reader_passes_a_lost_tail)
{
    char dir[64], err[NC_ERRLEN] = "", path[200];
    scratch(dir, sizeof dir);
    CHECK(write_log(dir, 1, 5, WAL_SYNC_GROUP) == 0);
    seg_path(dir, 1, path, sizeof path);
    CHECK(truncate(path, file_size(path) - 3) == 0);   /* record 5 cut short */
    CHECK(write_log(dir, 6, 8, WAL_SYNC_GROUP) == 0);
    nc_wal_reader *r = NULL;
    CHECK(wal_reader_open(dir, TAG, 0, &r, err, sizeof err) == NC_OK);
    uint64_t last = 0, seq;
    int bad = 0;
    const void *p;
    size_t len;
    if (r) {
        for (uint64_t i = 1; i <= 4; i++)
            CHECK(reader_next(r, 8, &seq, &p, &len, err, sizeof err) == 1 && seq == i);
        CHECK(reader_next(r, 8, &seq, &p, &len, err, sizeof err) == NC_ENOTFOUND);
        HAS(err, "records 5-5 passed over");
        CHECK(wal_reader_position(r) == 5);
        last = 5;
        CHECK(follow(r, 8, &last, &bad) == 3 && bad == 0 && last == 8);
    }
    wal_reader_close(r);
    nsstore_remove_dir(dir, NULL, 0);
}

/* The log in two segments (records 1-6 and 7-12), as a crash-free run
 * leaves it. */
static void two_segments(char *dir, size_t n, char *seg2, size_t n2)
{
    scratch(dir, n);
    CHECK(write_log(dir, 1, 6, WAL_SYNC_GROUP) == 0);
    CHECK(write_log(dir, 7, 12, WAL_SYNC_GROUP) == 0);
    seg_path(dir, 7, seg2, n2);
}

/* Injected read faults (fault.h) reach the follower's every read -- the
 * segment opens and each record's header and payload: each is NC_EIO
 * naming the error, hands out nothing wrong, and the reader keeps its place
 * (reading on once the fault is gone gives every record once, in order). */
TEST(reader_read_faults)
{
    char dir[64], seg2[200], err[NC_ERRLEN];
    two_segments(dir, sizeof dir, seg2, sizeof seg2);
    long k, failed = 0;
    nc_fault_thread(true);
    for (k = 1; k <= 100; k++) {
        nc_wal_reader *r = NULL;
        CHECK(wal_reader_open(dir, TAG, 0, &r, err, sizeof err) == NC_OK);
        if (!r)
            break;
        uint64_t last = 0;
        int bad = 0;
        nc_fault_arm(NC_FAULT_READ, k, 0);
        int n = follow_until_error(r, 12, &last, &bad, err, sizeof err);
        long hits = nc_fault_hits(NC_FAULT_READ);
        nc_fault_disarm();
        if (hits == 0) {
            CHECKF(n == 12 && bad == 0, "read:%ld: %d records without a fault (%s)", k, n, err);
            wal_reader_close(r);
            break;
        }
        failed++;
        CHECKF(n < 12 && bad == 0 && strstr(err, strerror(EIO)), "read:%ld: %d records, then: %s", k, n, err);
        CHECKF(wal_reader_position(r) == last, "read:%ld: position %llu after record %llu", k,
               (unsigned long long)wal_reader_position(r), (unsigned long long)last);
        int more = follow_until_error(r, 12, &last, &bad, err, sizeof err);
        CHECKF(n + more == 12 && last == 12 && bad == 0, "read:%ld: %d + %d records after the fault (%s)", k, n,
               more, err);
        wal_reader_close(r);
    }
    nc_fault_thread(false);
    fprintf(stderr, "        wal_reader_next: %ld read fault points\n", failed);
    /* 12 headers and 12 payloads, the second segment's open and header */
    CHECK(failed >= 26 && k <= 100);
    nsstore_remove_dir(dir, NULL, 0);
}

/* Injected read faults reach recovery (wal_replay): every one refuses
 * with NC_EIO and a message and never cuts the log (a read error is not a
 * torn tail); once the fault is gone every record replays. */
TEST(replay_read_faults)
{
    char dir[64], seg1[200], seg2[200], err[NC_ERRLEN];
    two_segments(dir, sizeof dir, seg2, sizeof seg2);
    seg_path(dir, 1, seg1, sizeof seg1);
    long size1 = file_size(seg1), size2 = file_size(seg2);
    long k, failed = 0;
    nc_fault_thread(true);
    for (k = 1; k <= 100; k++) {
        check_ctx c = {0};
        nc_wal_replay_info info;
        err[0] = 0;
        nc_fault_arm(NC_FAULT_READ, k, 0);
        int rc = replay(dir, TAG, 0, check_rec, &c, &info, err, sizeof err);
        long hits = nc_fault_hits(NC_FAULT_READ);
        nc_fault_disarm();
        if (hits == 0) {
            CHECKF(rc == NC_OK && c.n == 12 && c.bad == 0, "read:%ld: rc %d, %llu records (%s)", k, rc,
                   (unsigned long long)c.n, err);
            break;
        }
        failed++;
        CHECKF(rc == NC_EIO && strstr(err, strerror(EIO)) && c.bad == 0 && !info.truncated,
               "read:%ld: rc %d (%s)", k, rc, err);
        CHECKF(file_size(seg1) == size1 && file_size(seg2) == size2, "read:%ld: the log was cut", k);
    }
    nc_fault_thread(false);
    fprintf(stderr, "        wal_replay: %ld read fault points\n", failed);
    /* the first segment's open and mapping (the second opens read-write) */
    CHECK(failed >= 2 && k <= 100);
    check_ctx c = {0};
    CHECK(replay(dir, TAG, 0, check_rec, &c, NULL, err, sizeof err) == NC_OK && c.n == 12 && c.bad == 0);
    nsstore_remove_dir(dir, NULL, 0);
}

int main(void)
{
    RUN(round_trip);
    RUN(torn_tail_truncated);
    RUN(flipped_byte_in_the_middle_refused);
    RUN(rotate_and_prune);
    RUN(group_commit_concurrent);
    RUN(bad_arguments);
    RUN(write_failure_mid_record_then_room_again);
    RUN(reader_follows_writer);
    RUN(reader_refuses_corruption);
    RUN(reader_passes_a_lost_tail);
    RUN(reader_read_faults);
    RUN(replay_read_faults);
    return harness_summary();
}
