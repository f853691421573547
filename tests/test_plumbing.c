/* test_plumbing.c -- the shared plumbing of core/: the growable buffer
 * (buf.h), crash-safe file replacement (atomicfile.h) and CRC-sealed binary
 * records (binio.h), each against a plain reference and under injected
 * allocation / read / write / fsync faults (fault.h). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "slurp.h"
#include "atomicfile.h"
#include "binio.h"
#include "buf.h"
#include "fault.h"
#include "harness.h"
#include "nc_common.h"
#include "nsstore.h"
#include "proto.h"
#include "rng.h"

/* A walk over fault points stops here even if the operation still reaches
 * N (each walk checks it ended before). */
#define WALK_MAX 200

static char scratch[] = "/tmp/nc_plumbing_XXXXXX";

static void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
    nc_rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rng_next(&r) >> 56);
}

static int file_is(const char *path, const void *want, size_t len)
{
    size_t n = 0;
    unsigned char *b = (unsigned char *)slurp_file(path, &n);
    int same = b && n == len && memcmp(b, want, len) == 0;
    free(b);
    return same;
}

/* Entries of dir whose name contains ".tmp" (a temporary left behind). */
static int tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, ".tmp") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* ---- buf ------------------------------------------------------------------ */

/* Appends of every size from 0 to 300 bytes build the same bytes as a flat
 * copy; the buffer stays NUL-terminated; printf past the current capacity
 * formats the whole text; detach hands over exactly the bytes. */
TEST(buf_appends_match_a_flat_copy)
{
    enum { N = 300 };
    static unsigned char src[N * (N + 1) / 2], ref[sizeof src];
    fill_random(src, sizeof src, 7);
    nc_buf b = NC_BUF_INIT;
    size_t k = 0;
    int bad = 0;
    for (size_t n = 0; n <= N - 1; n++) {
        bad += buf_append(&b, src + k, n) != NC_OK;
        memcpy(ref + k, src + k, n);
        k += n;
        bad += b.len != k || b.cap < k + 1 || b.data[b.len] != 0;
    }
    CHECK(bad == 0 && !b.oom);
    CHECK(b.len == k && memcmp(b.data, ref, k) == 0);
    buf_clear(&b);
    CHECK(b.len == 0 && b.data && b.data[0] == 0);
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    char want[6000];
    snprintf(want, sizeof want, "<%s|%d|%.3f>", big, -42, 2.5);
    CHECK(buf_printf(&b, "<%s|%d", big, -42) == NC_OK && buf_printf(&b, "|%.3f>", 2.5) == NC_OK);
    CHECK(b.len == strlen(want) && strcmp(b.data, want) == 0);
    size_t len = 0;
    char *d = buf_detach(&b, &len);
    CHECK(d && len == strlen(want) && strcmp(d, want) == 0);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    free(d);
    d = buf_detach(&b, &len);
    CHECK(d && len == 0 && d[0] == 0);   /* an empty buffer detaches as "" */
    free(d);
    buf_free(&b);
    buf_free(NULL);
}

/* A failed growth freezes the buffer (later appends fail too, the bytes
 * held stay as they were) until it is cleared. */
TEST(buf_out_of_memory_is_sticky)
{
    nc_buf b = NC_BUF_INIT;
    CHECK(buf_append(&b, "abc", 3) == NC_OK);
    char big[4096] = {0};
    nc_fault_thread(true);
    nc_fault_arm(NC_FAULT_ALLOC, 1, 0);
    int rc = buf_append(&b, big, sizeof big);
    long hits = nc_fault_hits(NC_FAULT_ALLOC);
    nc_fault_disarm();
    nc_fault_thread(false);
    CHECK(hits == 1 && rc == NC_ENOMEM && b.oom);
    CHECK(buf_append(&b, "d", 1) == NC_ENOMEM && buf_printf(&b, "%d", 1) == NC_ENOMEM);
    CHECK(b.len == 3 && memcmp(b.data, "abc", 4) == 0);
    CHECK(buf_detach(&b, NULL) == NULL && b.data == NULL);
    CHECK(buf_append(&b, "e", 1) == NC_OK && b.len == 1);
    buf_clear(&b);
    CHECK(!b.oom);
    buf_free(&b);
}

/* A file read whole equals its bytes (larger than one read); a missing one
 * is NC_ENOTFOUND; every injected read fault is NC_EIO naming the file. */
TEST(buf_read_file_and_its_faults)
{
    char path[600], err[NC_ERRLEN] = "";
    snprintf(path, sizeof path, "%s/read.bin", scratch);
    size_t n = 300000;
    unsigned char *src = malloc(n);
    fill_random(src, n, 11);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(src, 1, n, f) == n && fclose(f) == 0);
    nc_buf b = NC_BUF_INIT;
    CHECK(buf_append(&b, "head", 4) == NC_OK);
    CHECK(buf_read_file(&b, path, err, sizeof err) == NC_OK);
    CHECK(b.len == n + 4 && memcmp(b.data, "head", 4) == 0 && memcmp(b.data + 4, src, n) == 0);
    buf_free(&b);
    char missing[700];
    snprintf(missing, sizeof missing, "%s/none", scratch);
    CHECK(buf_read_file(&b, missing, err, sizeof err) == NC_ENOTFOUND);
    CHECKF(strstr(err, missing) != NULL, "%s", err);
    buf_free(&b);
    long k, failed = 0;
    nc_fault_thread(true);
    for (k = 1; k <= WALK_MAX; k++) {
        err[0] = 0;
        nc_fault_arm(NC_FAULT_READ, k, 0);
        int rc = buf_read_file(&b, path, err, sizeof err);
        long hits = nc_fault_hits(NC_FAULT_READ);
        nc_fault_disarm();
        if (hits == 0) {
            CHECKF(rc == NC_OK && b.len == n && memcmp(b.data, src, n) == 0, "read:%ld: rc %d (%s)", k, rc, err);
            break;
        }
        CHECKF(rc == NC_EIO && strstr(err, path), "read:%ld: rc %d (%s)", k, rc, err);
        failed++;
        buf_free(&b);
    }
    nc_fault_thread(false);
    fprintf(stderr, "        buf_read_file: %ld read fault points\n", failed);
    /* the open and at least the reads of a 300 kB file in 64 kB pieces */
    CHECK(failed >= 3 && k <= WALK_MAX);
    buf_free(&b);
    free(src);
}

/* ---- atomicfile ------------------------------------------------------------ */

/* Writing creates, rewriting replaces, nothing temporary stays behind; a
 * file opened and aborted leaves the old content. */
TEST(atomicfile_replaces_whole)
{
    char path[600], err[NC_ERRLEN] = "";
    snprintf(path, sizeof path, "%s/af/target.txt", scratch);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/af", scratch);
    CHECK(mkdir(dir, 0755) == 0);
    CHECK(atomicfile_write(path, "first\n", 6, err, sizeof err) == NC_OK && file_is(path, "first\n", 6));
    CHECK(atomicfile_write(path, "second, longer\n", 15, err, sizeof err) == NC_OK);
    CHECK(file_is(path, "second, longer\n", 15));
    nc_atomicfile a;
    CHECK(atomicfile_open(&a, path, err, sizeof err) == NC_OK && a.f);
    if (a.f) {
        fprintf(a.f, "third");
        CHECK(tmp_files(dir) == 1);
        atomicfile_abort(&a);
    }
    CHECK(file_is(path, "second, longer\n", 15) && tmp_files(dir) == 0);
    /* a writer's own failure is passed through and nothing is replaced */
    CHECK(atomicfile_open(&a, path, err, sizeof err) == NC_OK);
    fprintf(a.f, "fourth");
    snprintf(err, sizeof err, "the writer's message");
    CHECK(atomicfile_commit(&a, NC_EFORMAT, err, sizeof err) == NC_EFORMAT);
    CHECK(strcmp(err, "the writer's message") == 0);
    CHECK(file_is(path, "second, longer\n", 15) && tmp_files(dir) == 0);
    /* a directory that does not exist */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/no/such/file", scratch);
    CHECK(atomicfile_write(bad, "x", 1, err, sizeof err) == NC_EIO);
    CHECKF(strstr(err, "cannot create") != NULL, "%s", err);
    /* a file in the current directory (no slash in the name) */
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL && chdir(dir) == 0);
    CHECK(atomicfile_write("plain.txt", "p", 1, err, sizeof err) == NC_OK && file_is("plain.txt", "p", 1));
    CHECK(chdir(cwd) == 0);
}

/* Every write and fsync fault fails the replacement with NC_EIO and a
 * message, and leaves the old content and no temporary file. */
static void walk_atomicfile(nc_fault_kind kind)
{
    char dir[600], path[700], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/walk-%s", scratch, nc_fault_name(kind));
    snprintf(path, sizeof path, "%s/t.bin", dir);
    CHECK(mkdir(dir, 0755) == 0);
    static unsigned char old[5000], new[9000];
    fill_random(old, sizeof old, 1);
    fill_random(new, sizeof new, 2);
    CHECK(atomicfile_write(path, old, sizeof old, err, sizeof err) == NC_OK);
    long k, failed = 0;
    nc_fault_thread(true);
    for (k = 1; k <= WALK_MAX; k++) {
        err[0] = 0;
        nc_fault_arm(kind, k, 0);
        int rc = atomicfile_write(path, new, sizeof new, err, sizeof err);
        long hits = nc_fault_hits(kind);
        nc_fault_disarm();
        if (hits == 0) {
            CHECKF(rc == NC_OK && file_is(path, new, sizeof new), "%s:%ld: rc %d (%s)", nc_fault_name(kind), k,
                   rc, err);
            break;
        }
        CHECKF(rc == NC_EIO && err[0], "%s:%ld: rc %d (%s)", nc_fault_name(kind), k, rc, err);
        /* an fsync of the directory fails after the rename: new content */
        CHECKF(file_is(path, old, sizeof old) || (kind == NC_FAULT_FSYNC && file_is(path, new, sizeof new)),
               "%s:%ld: the target holds neither version", nc_fault_name(kind), k);
        CHECKF(tmp_files(dir) == 0, "%s:%ld: a temporary file was left", nc_fault_name(kind), k);
        if (file_is(path, new, sizeof new))
            CHECK(atomicfile_write(path, old, sizeof old, err, sizeof err) == NC_OK);
        failed++;
    }
    nc_fault_thread(false);
    fprintf(stderr, "        atomicfile_write: %ld %s fault points\n", failed, nc_fault_name(kind));
    /* write: creating and writing; fsync: the file and the directory */
    CHECK(failed >= 2 && k <= WALK_MAX);
}

TEST(atomicfile_write_walk) { walk_atomicfile(NC_FAULT_WRITE); }
TEST(atomicfile_fsync_walk) { walk_atomicfile(NC_FAULT_FSYNC); }

/* ---- binio ------------------------------------------------------------------ */

static void put_fields(binio_writer *w, const unsigned char *blob, size_t n)
{
    binio_put(w, "MAGIC123", 8);
    binio_put_u32(w, 0xdeadbeefu);
    binio_put_i32(w, -7);
    binio_put_f32(w, 0.1f);
    binio_put_u64(w, 0x0123456789abcdefull);
    binio_put_u32(w, (uint32_t)n);
    binio_put(w, blob, n);
}

/* Fields written to a buffer and to a file give the same bytes, sealed by
 * zlib's CRC-32, and read back equal; the reader refuses any flipped byte
 * and any read past the end. */
TEST(binio_round_trip_and_damage)
{
    unsigned char blob[1000];
    fill_random(blob, sizeof blob, 3);
    nc_buf b = NC_BUF_INIT;
    binio_writer w;
    binio_writer_buf(&w, &b);
    put_fields(&w, blob, sizeof blob);
    CHECK(binio_seal(&w) == NC_OK);
    size_t want = 8 + 4 + 4 + 4 + 8 + 4 + sizeof blob + 4;
    CHECK(b.len == want);
    char path[600];
    snprintf(path, sizeof path, "%s/rec.bin", scratch);
    FILE *f = fopen(path, "wb");
    binio_writer_file(&w, f);
    put_fields(&w, blob, sizeof blob);
    CHECK(binio_seal(&w) == NC_OK);
    CHECK(f && fclose(f) == 0);
    CHECK(file_is(path, b.data, b.len));
    binio_reader r;
    CHECK(binio_open(&r, b.data, b.len, 8));
    CHECK(binio_get_u32(&r) == 0xdeadbeefu && binio_get_i32(&r) == -7 && binio_get_f32(&r) == 0.1f);
    CHECK(binio_get_u64(&r) == 0x0123456789abcdefull);
    uint32_t n = binio_get_u32(&r);
    CHECK(n == sizeof blob && binio_left(&r) == sizeof blob);
    const void *p = binio_take(&r, n);
    CHECK(p && memcmp(p, blob, n) == 0 && binio_done(&r));
    /* past the end: zeros, and the reader stays bad */
    CHECK(binio_get_u32(&r) == 0 && r.bad && !binio_done(&r) && binio_left(&r) == 0);
    CHECK(binio_take(&r, 0) == NULL);
    /* every flipped byte (magic, fields, trailer) is caught */
    int missed = 0;
    for (size_t i = 0; i < b.len; i++) {
        b.data[i] ^= 0x10;
        missed += binio_open(&r, b.data, b.len, 8);
        b.data[i] ^= 0x10;
    }
    CHECK(missed == 0);
    CHECK(!binio_open(&r, b.data, b.len - 1, 8) && !binio_open(&r, b.data, 11, 8) && !binio_open(&r, NULL, 0, 0));
    /* a record read short of its end is not done */
    CHECK(binio_open(&r, b.data, b.len, 8) && binio_get_u32(&r) == 0xdeadbeefu && !binio_done(&r));
    buf_free(&b);
}

/* The trailer is the standard CRC-32 (the check value of "123456789" is
 * 0xcbf43926), so the files stay readable by zlib's crc32. */
TEST(binio_trailer_is_crc32)
{
    nc_buf b = NC_BUF_INIT;
    binio_writer w;
    binio_writer_buf(&w, &b);
    binio_put(&w, "123456789", 9);
    CHECK(binio_seal(&w) == NC_OK && b.len == 13);
    uint32_t crc = 0;
    if (b.len == 13)
        memcpy(&crc, b.data + 9, 4);
    CHECK(crc == 0xcbf43926u);
    /* continued over pieces: the same as in one go */
    CHECK(binio_crc32(binio_crc32(0, "1234", 4), "56789", 5) == 0xcbf43926u);
    CHECK(binio_crc32(0, "123456789", 9) == 0xcbf43926u && binio_crc32(7, "", 0) == 7);
    buf_free(&b);
}

/* A failed write (a full buffer, a failing file) makes the seal fail. */
TEST(binio_write_failures)
{
    nc_buf b = NC_BUF_INIT;
    binio_writer w;
    binio_writer_buf(&w, &b);
    binio_put_u32(&w, 1);
    nc_fault_thread(true);
    nc_fault_arm(NC_FAULT_ALLOC, 1, 0);
    char big[8192] = {0};
    binio_put(&w, big, sizeof big);
    nc_fault_disarm();
    binio_put_u32(&w, 2);
    CHECK(w.bad && binio_seal(&w) == NC_ENOMEM);
    buf_free(&b);
    char path[600];
    snprintf(path, sizeof path, "%s/fail.bin", scratch);
    FILE *f = fopen(path, "wb");
    binio_writer_file(&w, f);
    binio_put_u32(&w, 1);
    nc_fault_arm(NC_FAULT_WRITE, 1, 0);
    binio_put_u32(&w, 2);
    long hits = nc_fault_hits(NC_FAULT_WRITE);
    nc_fault_disarm();
    nc_fault_thread(false);
    CHECK(hits == 1 && binio_seal(&w) == NC_EIO);
    if (f)
        fclose(f);
}

/* proto_predict_body writes the bytes proto_dump gives for the object
 * json_pack builds: words with every kind of escape (and one not UTF-8,
 * which json_pack leaves out), reals of every shape %.12g takes (integral,
 * exponents of one to three digits, both signs), "consumed" or not. */
TEST(predict_body_is_jansson_to_the_byte)
{
    const char *words[] = {"the", "\"q\"", "back\\slash", "tab\there", "nl\n\r\b\f", "\x01\x1f ctl",
                           "caf\xc3\xa9 \xe2\x80\xa8", "bad\xff", "a/b", ""};
    const double probs[] = {0.120285265148, 1.0, 0.0, 1e-5, 1.5e-300, 3.0517578125e-05, 123456789012345.0,
                            0.1, 2.5e+100, 1e22};
    const size_t n = sizeof words / sizeof *words;
    proto_prediction pred[sizeof words / sizeof *words];
    for (size_t i = 0; i < n; i++)
        pred[i] = (proto_prediction){words[i], (int)i * 977 - 3, probs[i]};
    for (int with = 0; with < 2; with++) {
        for (size_t k = 0; k <= n; k += n) {
            json_t *preds = json_array();
            for (size_t i = 0; i < k; i++)
                json_array_append_new(preds, json_pack("{s:s,s:i,s:f}", "word", pred[i].word, "id", pred[i].id,
                                                       "prob", pred[i].prob));
            json_t *o = json_pack("{s:o,s:I,s:I}", "predictions", preds, "vocab_size", (json_int_t)10000,
                                  "position", (json_int_t)-1);
            if (with)
                json_object_set_new(o, "consumed", json_integer(7));
            size_t la = 0, lb = 0;
            char *a = proto_dump(o, &la), *b = proto_predict_body(pred, k, 10000, -1, with ? 7 : -1, &lb);
            CHECKF(a && b && la == lb && !memcmp(a, b, la), "k %zu consumed %d:\n%s%s", k, with, a, b);
            free(a);
            free(b);
            json_decref(o);
        }
    }
}

int main(void)
{
    if (!mkdtemp(scratch)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(buf_appends_match_a_flat_copy);
    RUN(buf_out_of_memory_is_sticky);
    RUN(buf_read_file_and_its_faults);
    RUN(atomicfile_replaces_whole);
    RUN(atomicfile_write_walk);
    RUN(atomicfile_fsync_walk);
    RUN(binio_round_trip_and_damage);
    RUN(binio_trailer_is_crc32);
    RUN(binio_write_failures);
    RUN(predict_body_is_jansson_to_the_byte);
    nsstore_remove_dir(scratch, NULL, 0);
    return harness_summary();
}
