/* fuzz_wal.c -- libFuzzer harness for the write-ahead log reader
 * (store/wal.c, wal_replay): the input is one to three log segments
 * (separated by the line "==SEG=="), each written under the name its header
 * claims; wal_replay must refuse corruption with a message or hand out
 * records with consecutive seq numbers, and a second replay of what it left
 * on disk (a torn tail cut) must succeed with the same records and cut
 * nothing more (recovery is idempotent). */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wal.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

#define FWAL_TAG 0x4e43315au

static char fwal_dir[256];

static void fwal_clear(void)
{
    DIR *d = opendir(fwal_dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", fwal_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

static void fwal_cleanup(void)
{
    fwal_clear();
    rmdir(fwal_dir);
}

typedef struct {
    uint64_t next, count, sum;
} fwal_ctx;

static int fwal_record(void *ctx, uint64_t seq, const void *payload, size_t len, char *err, size_t errlen)
{
    fwal_ctx *c = ctx;
    (void)err, (void)errlen;
    if ((c->count > 0 && seq != c->next) || len > WAL_MAX_RECORD)
        abort();
    c->next = seq + 1;
    c->count++;
    const uint8_t *p = payload;
    for (size_t i = 0; i < len; i++)
        c->sum += p[i];
    return 0;
}

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (!fwal_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fwal_dir, sizeof fwal_dir, "%s/nc-fuzz-wal-%d", base, (int)getpid());
        mkdir(fwal_dir, 0700);
        atexit(fwal_cleanup);
    }
    fwal_clear();
    static const char sep[] = "\n==SEG==\n";
    const uint8_t *p = data, *end = data + size;
    for (int i = 0; i < 3 && p <= end; i++) {
        const uint8_t *q = i < 2 ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1) : NULL;
        size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
        /* Named after the first seq its header claims (bytes 8..16). */
        uint64_t first = 1;
        if (n >= 16)
            memcpy(&first, p + 8, 8);
        char name[64], path[600];
        wal_segment_name(first, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", fwal_dir, name);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            abort();
        if (n && write(fd, p, n) != (ssize_t)n)
            abort();
        close(fd);
        if (!q)
            break;
        p = q + sizeof sep - 1;
    }
    char err[NC_ERRLEN] = "";
    fwal_ctx c1 = {0, 0, 0};
    nc_wal_replay_info info;
    const nc_wal_replay_spec s1 = {.dir = fwal_dir, .tag = FWAL_TAG, .fn = fwal_record, .ctx = &c1};
    int rc = wal_replay(&s1, &info, err, sizeof err);
    if (rc != NC_OK) {
        if (!err[0])
            abort();
        return 0;
    }
    if (info.records != c1.count)
        abort();
    /* What recovery left on disk replays again, identically, cutting nothing. */
    fwal_ctx c2 = {0, 0, 0};
    nc_wal_replay_info info2;
    const nc_wal_replay_spec s2 = {.dir = fwal_dir, .tag = FWAL_TAG, .fn = fwal_record, .ctx = &c2};
    rc = wal_replay(&s2, &info2, err, sizeof err);
    if (rc != NC_OK || c2.count != c1.count || c2.sum != c1.sum || info2.truncated ||
        info2.last_seq != info.last_seq)
        abort();
    return 0;
}
