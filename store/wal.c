/* wal.c -- write-ahead log: checksummed records in segment files, group
 * commit, torn-tail truncation on replay. */
#include "wal.h"
#include "atomicfile.h"
#include "binio.h"
#include "buf.h"
#include "fault.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#define SEG_MAGIC "NCWAL001"
#define SEG_HDR 24
#define REC_MAGIC 0x5257434eu   /* "NCWR" little-endian */
#define REC_HDR 24

struct nc_wal {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    char dir[1024];
    uint32_t tag;
    nc_wal_sync mode;
    int fd;
    uint64_t seg_first;           /* first seq of the current segment */
    uint64_t last_seq, synced_seq;
    uint64_t bytes, fsyncs;
    bool syncing;                 /* a group-commit leader is in fdatasync */
    bool broken;                  /* a write failed: the tail is unknown */
    int broken_rc;                /* what appends then fail with: NC_EIO, or NC_ENOSPACE */
    bool tail_unknown;            /* broken by a failed write or fsync (not at open) */
    char broken_msg[256];
};

void wal_segment_name(uint64_t s, char *buf, size_t len)
{
    NC_ASSERT(buf && len >= 25, "wal_segment_name: %zu bytes for a 24-character name", len);
    snprintf(buf, len, "wal-%016llx.log", (unsigned long long)s);
}

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t rec_crc(const unsigned char *hdr, const unsigned char *payload, size_t len)
{
    /* length and seq (bytes 4..16 of the header), then the payload */
    return binio_crc32(binio_crc32(0, hdr + 4, 12), payload, len);
}

/* ---- listing segments --------------------------------------------------- */

typedef struct {
    uint64_t *first;
    int n, cap;
} seglist;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int list_segments(const char *dir, seglist *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return NC_OK;
        return nc_error(err, errlen, NC_EIO, "%s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    int rc = NC_OK;
    while ((e = readdir(d))) {
        unsigned long long s;
        char tail[8];
        if (strlen(e->d_name) != 24 || sscanf(e->d_name, "wal-%16llx%7s", &s, tail) != 2 ||
            strcmp(tail, ".log") != 0)
            continue;
        if (l->n == l->cap) {
            int c = l->cap ? 2 * l->cap : 16;
            uint64_t *p = realloc(l->first, (size_t)c * sizeof *p);
            if (!p) {
                rc = nc_error(err, errlen, NC_ENOMEM, "segment list");
                break;
            }
            l->first = p;
            l->cap = c;
        }
        l->first[l->n++] = s;
    }
    closedir(d);
    if (l->n > 1)
        qsort(l->first, (size_t)l->n, sizeof *l->first, cmp_u64);
    return rc;
}

uint64_t wal_oldest_seq(const char *dir)
{
    NC_ASSERT(dir, "wal_oldest_seq: no directory");
    seglist l;
    if (list_segments(dir, &l, NULL, 0) != NC_OK) {
        free(l.first);
        return 0;
    }
    uint64_t s = l.n ? l.first[0] : 0;
    free(l.first);
    return s;
}

/* ---- replay --------------------------------------------------------------- */

/* Is there a complete, valid record at p[0..n) (any seq)? */
static bool valid_record_at(const unsigned char *p, size_t n)
{
    if (n < REC_HDR || rd32(p) != REC_MAGIC)
        return false;
    uint32_t len = rd32(p + 4);
    if (len > WAL_MAX_RECORD || len > n - REC_HDR)
        return false;
    return rd32(p + 16) == rec_crc(p, p + REC_HDR, len);
}

/* What wal_replay carries from segment to segment. */
typedef struct {
    const nc_wal_replay_spec *spec;
    nc_wal_replay_info *info;
    uint64_t expect;              /* the next record's seq */
} replay_run;

/* One segment file, mapped: its path, bytes, and whether it is the log's
 * last (the only one whose bad tail may be cut). */
typedef struct {
    const char *path;
    const unsigned char *m;
    size_t size;
    bool last;
} mapped_segment;

/* Replays one mapped segment of r's log; r->expect: the next seq (updated).
 * Returns rc; *cut = valid length if the tail must be truncated, else
 * (size_t)-1. */
static int replay_segment(replay_run *r, const mapped_segment *seg, size_t *cut, char *err, size_t errlen)
{
    nc_wal_replay_info *info = r->info;
    const char *path = seg->path;
    const unsigned char *m = seg->m;
    const size_t size = seg->size;
    *cut = (size_t)-1;
    size_t off = SEG_HDR;
    while (off < size) {
        const unsigned char *rec = m + off;
        size_t left = size - off;
        const char *why = NULL;
        uint32_t len = 0;
        if (left < REC_HDR)
            why = "incomplete record header";
        else if (rd32(rec) != REC_MAGIC)
            why = "bad record magic";
        else if ((len = rd32(rec + 4)) > WAL_MAX_RECORD)
            why = "implausible record length";
        else if (len > left - REC_HDR)
            why = "record runs past the end of the file";
        else if (rd32(rec + 16) != rec_crc(rec, rec + REC_HDR, len))
            why = "checksum mismatch";
        if (why) {
            /* torn tail or corruption? a crash only tears the end: if any
             * valid record follows, the damage is in the middle */
            bool later = false;
            for (size_t o = off + 1; o + REC_HDR <= size && !later; o++)
                if (m[o] == 'N' && valid_record_at(m + o, size - o))
                    later = true;
            if (!seg->last || later)
                return nc_error(err, errlen, NC_EFORMAT,
                                "%.300s: corrupt record at byte %zu (%s) with valid records after it; "
                                "refusing to guess (restore the file or remove the namespace)",
                                path, off, why);
            snprintf(info->warning, sizeof info->warning,
                     "%.300s: torn final record at byte %zu (%s): %zu bytes truncated", path, off, why,
                     size - off);
            info->truncated = true;
            *cut = off;
            return NC_OK;
        }
        uint64_t seq = rd64(rec + 8);
        if (seq != r->expect)
            return nc_error(err, errlen, NC_EFORMAT, "%s: record at byte %zu has seq %llu, expected %llu",
                            path, off, (unsigned long long)seq, (unsigned long long)r->expect);
        if (seq > r->spec->after && r->spec->fn) {
            int rc = r->spec->fn(r->spec->ctx, seq, rec + REC_HDR, len, err, errlen);
            if (rc)
                return rc;
            info->records++;
        }
        info->last_seq = seq;
        r->expect++;
        off += REC_HDR + len;
    }
    return NC_OK;
}

/* Whether the segment header at m (SEG_HDR bytes) is of a log format newer
 * than this build's ("NCWAL" + 3 digits > 1): then err names both versions.
 * Such a log is refused whole, never read as ours nor truncated. */
static bool wal_newer_version(const unsigned char *m, const char *path, char *err, size_t errlen)
{
    if (memcmp(m, "NCWAL", 5) != 0 || !isdigit(m[5]) || !isdigit(m[6]) || !isdigit(m[7]))
        return false;
    int v = (m[5] - '0') * 100 + (m[6] - '0') * 10 + (m[7] - '0');
    if (v <= WAL_FORMAT_VERSION)
        return false;
    nc_error(err, errlen, NC_ESTATE, "%s: log format version %d is newer than this build reads (version %d): "
             "written by a later neurocache; serve this data directory with it", path, v, WAL_FORMAT_VERSION);
    return true;
}

/* The header of segment path (mapped at m) against its name (first), the
 * model's tag and the seq the previous segment ended at. */
static int check_segment_header(const char *path, const unsigned char *m, uint64_t first, const replay_run *r,
                                char *err, size_t errlen)
{
    if (wal_newer_version(m, path, err, errlen))
        return NC_ESTATE;
    if (memcmp(m, SEG_MAGIC, 8) != 0 || rd32(m + 20) != (uint32_t)crc32(0L, m, 20))
        return nc_error(err, errlen, NC_EFORMAT, "%s: bad segment header (not a neurocache log, or corrupt)", path);
    if (rd64(m + 8) != first)
        return nc_error(err, errlen, NC_EFORMAT, "%s: header says first seq %llu, the name %llu", path,
                        (unsigned long long)rd64(m + 8), (unsigned long long)first);
    if (rd32(m + 16) != r->spec->tag)
        return nc_error(err, errlen, NC_EFORMAT,
                        "%s: log written for another model (tag %08x, expected %08x); the namespace "
                        "belongs to that model: serve it with that model, or give this one another "
                        "data directory",
                        path, rd32(m + 16), r->spec->tag);
    if (first != r->expect)
        return nc_error(err, errlen, NC_EFORMAT, "%s: starts at seq %llu but the previous segment ends at %llu",
                        path, (unsigned long long)first, (unsigned long long)(r->expect - 1));
    return NC_OK;
}

/* Replays the segment of r's log that starts at first (the last one:
 * opened read-write, its torn tail cut). *end set when it is an empty last
 * segment left by a crash, now removed: the replay ends there. */
static int replay_file(replay_run *r, uint64_t first, bool last, bool *end, char *err, size_t errlen)
{
    char name[64], path[1200];
    wal_segment_name(first, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", r->spec->dir, name);
    int fd = nc_open(path, last ? O_RDWR : O_RDONLY, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int rc = nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    size_t size = (size_t)st.st_size;
    if (size < SEG_HDR) {
        /* a crash right after creating the last segment: nothing in it */
        if (last && ftruncate(fd, 0) == 0) {
            close(fd);
            unlink(path);
            *end = true;
            return NC_OK;
        }
        close(fd);
        return nc_error(err, errlen, NC_EFORMAT, "%s: %zu bytes, shorter than a segment header", path, size);
    }
    unsigned char *m = nc_mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        int rc = nc_error(err, errlen, NC_EIO, "%s: mmap: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    int rc = check_segment_header(path, m, first, r, err, errlen);
    size_t cut = (size_t)-1;
    if (!rc) {
        const mapped_segment seg = {.path = path, .m = m, .size = size, .last = last};
        rc = replay_segment(r, &seg, &cut, err, errlen);
    }
    munmap(m, size);
    if (!rc && cut != (size_t)-1) {
        if (ftruncate(fd, (off_t)cut) != 0 || fsync(fd) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: truncating the torn tail: %s", path, strerror(errno));
        size = cut;
    }
    r->info->bytes += size;
    r->info->segments++;
    close(fd);
    return rc;
}

int wal_replay(const nc_wal_replay_spec *s, nc_wal_replay_info *info, char *err, size_t errlen)
{
    NC_ASSERT(s, "wal_replay: no s");
    const char *dir = s->dir;
    const uint64_t after = s->after;
    nc_wal_replay_info dummy;
    if (!info)
        info = &dummy;
    memset(info, 0, sizeof *info);
    seglist l;
    int rc = list_segments(dir, &l, err, errlen);
    if (rc)
        return rc;
    info->last_seq = after;
    if (l.n == 0) {
        free(l.first);
        if (after > 0)
            return nc_error(err, errlen, NC_ENOTFOUND, "%s: no log segment, the log does not reach back to seq %llu",
                            dir, (unsigned long long)(after + 1));
        return NC_OK;
    }
    uint64_t expect = l.first[0];
    if (expect == 0) {
        /* seq numbers start at 1: "expect - 1" below would wrap to 2^64-1
         * (found by fuzz_wal: a short segment named ...0000.log gave
         * last_seq 18446744073709551615) */
        free(l.first);
        return nc_error(err, errlen, NC_EFORMAT, "%s: a log segment starts at seq 0 (seq numbers start at 1)", dir);
    }
    if (l.first[0] > after + 1) {
        free(l.first);
        return nc_error(err, errlen, NC_ENOTFOUND, "%s: the log starts at seq %llu and does not reach back to %llu",
                        dir, (unsigned long long)expect, (unsigned long long)(after + 1));
    }
    /* Segments wholly before after + 1 are covered by the caller's
     * snapshot and not read: after a failed fsync one may have lost its
     * tail on disk, and the log went on in a new segment once a snapshot
     * covered it (wal_restart). */
    int i0 = 0;
    while (i0 + 1 < l.n && l.first[i0 + 1] <= after + 1)
        i0++;
    expect = l.first[i0];
    info->last_seq = expect - 1 > after ? expect - 1 : after;
    replay_run r = {.spec = s, .info = info, .expect = expect};
    bool end = false;
    for (int i = i0; i < l.n && !rc && !end; i++)
        rc = replay_file(&r, l.first[i], i == l.n - 1, &end, err, errlen);
    free(l.first);
    return rc;
}

/* ---- writing ---------------------------------------------------------------- */

/* errno values that mean "the disk (or the process's quota) is full":
 * the client may retry once there is room (HTTP 507), nothing is lost. */
static bool no_room(int e)
{
    return e == ENOSPC || e == EFBIG || e == EDQUOT;
}

static int write_all(int fd, const struct iovec *iov, int n)
{
    struct iovec v[4];
    memcpy(v, iov, (size_t)n * sizeof *v);
    int i = 0;
    while (i < n) {
        ssize_t w = nc_writev(fd, v + i, n - i);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        size_t left = (size_t)w;
        while (i < n && left >= v[i].iov_len) {
            left -= v[i].iov_len;
            i++;
        }
        if (i < n) {
            v[i].iov_base = (char *)v[i].iov_base + left;
            v[i].iov_len -= left;
        }
    }
    return 0;
}

/* Creates segment first (truncating a leftover empty one of that name). */
static int open_segment(nc_wal *w, uint64_t first, char *err, size_t errlen)
{
    char name[64], path[1200];
    wal_segment_name(first, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    int fd = nc_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return nc_error(err, errlen, no_room(errno) ? NC_ENOSPACE : NC_EIO, "%s: %s", path, strerror(errno));
    unsigned char h[SEG_HDR];
    memcpy(h, SEG_MAGIC, 8);
    memcpy(h + 8, &first, 8);
    memcpy(h + 16, &w->tag, 4);
    uint32_t c = (uint32_t)crc32(0L, h, 20);
    memcpy(h + 20, &c, 4);
    struct iovec v = {h, SEG_HDR};
    if (write_all(fd, &v, 1) != 0 || nc_fdatasync(fd) != 0 || atomicfile_sync_dir(w->dir) != 0) {
        int e = errno;
        close(fd);
        return nc_error(err, errlen, no_room(e) ? NC_ENOSPACE : NC_EIO, "%s: %s", path, strerror(e));
    }
    w->fd = fd;
    w->seg_first = first;
    return NC_OK;
}

int wal_open(const nc_wal_open_spec *s, nc_wal **out, char *err, size_t errlen)
{
    NC_ASSERT(s, "wal_open: no s");
    const char *dir = s->dir;
    const uint64_t next_seq = s->next_seq;
    *out = NULL;
    if (s->stopped)
        *s->stopped = false;
    if (next_seq == 0)
        return nc_error(err, errlen, NC_EINVAL, "log seq numbers start at 1");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return nc_error(err, errlen, NC_EIO, "%s: %s", dir, strerror(errno));
    nc_wal *w = calloc(1, sizeof *w);
    if (!w)
        return nc_error(err, errlen, NC_ENOMEM, "log");
    if ((size_t)snprintf(w->dir, sizeof w->dir, "%s", dir) >= sizeof w->dir) {
        free(w);
        return nc_error(err, errlen, NC_EINVAL, "log directory path too long");
    }
    w->tag = s->tag;
    w->mode = s->mode;
    w->fd = -1;
    w->last_seq = w->synced_seq = next_seq - 1;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    int rc = open_segment(w, next_seq, err, errlen);
    if (rc == NC_ENOSPACE && s->stopped) {
        /* no room for a segment header: open stopped, as after a failed
         * write for lack of room; wal_restart makes the segment later */
        w->broken = true;
        w->broken_rc = NC_ENOSPACE;
        snprintf(w->broken_msg, sizeof w->broken_msg, "no room for a new log segment (%s)", err);
        *s->stopped = true;
        rc = NC_OK;
    }
    if (rc) {
        wal_close(w);
        return rc;
    }
    *out = w;
    return NC_OK;
}


void wal_close(nc_wal *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    while (w->syncing)
        pthread_cond_wait(&w->cond, &w->lock);
    if (w->fd >= 0) {
        if (w->mode != WAL_SYNC_NONE)
            nc_fdatasync(w->fd);
        close(w->fd);
    }
    pthread_mutex_unlock(&w->lock);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

int wal_append(nc_wal *w, const void *payload, size_t len, uint64_t *seq, char *err, size_t errlen)
{
    NC_ASSERT(w && (payload || len == 0), "wal_append: log %p, payload %p of %zu bytes", (void *)w, payload, len);
    if (len > WAL_MAX_RECORD)
        return nc_error(err, errlen, NC_EINVAL, "log record of %zu bytes (limit %u)", len, WAL_MAX_RECORD);
    unsigned char h[REC_HDR];
    uint32_t magic = REC_MAGIC, l32 = (uint32_t)len, zero = 0;
    pthread_mutex_lock(&w->lock);
    if (w->broken) {
        pthread_mutex_unlock(&w->lock);
        return nc_error(err, errlen, w->broken_rc, "log unusable after an earlier write error: %s", w->broken_msg);
    }
    uint64_t s = w->last_seq + 1;
    memcpy(h, &magic, 4);
    memcpy(h + 4, &l32, 4);
    memcpy(h + 8, &s, 8);
    uint32_t c = rec_crc(h, payload, len);
    memcpy(h + 16, &c, 4);
    memcpy(h + 20, &zero, 4);
    struct iovec v[2] = {{h, REC_HDR}, {(void *)payload, len}};
    off_t end = lseek(w->fd, 0, SEEK_END);
    if (write_all(w->fd, v, 2) != 0) {
        int e = errno;
        /* Part of the record may be in the file. Cut it off so the log can
         * go on once the cause (a full disk) goes away; the record was
         * never acknowledged. If the cut fails too, later records would
         * follow garbage, so the log stops here (recovery truncates it). */
        if (end >= 0 && ftruncate(w->fd, end) == 0) {
            pthread_mutex_unlock(&w->lock);
            return nc_error(err, errlen, no_room(e) ? NC_ENOSPACE : NC_EIO,
                            "%s: writing the log: %s (record dropped)", w->dir, strerror(e));
        }
        w->broken = true;
        w->tail_unknown = true;
        w->broken_rc = no_room(e) ? NC_ENOSPACE : NC_EIO;
        snprintf(w->broken_msg, sizeof w->broken_msg, "%s", strerror(e));
        pthread_mutex_unlock(&w->lock);
        return nc_error(err, errlen, no_room(e) ? NC_ENOSPACE : NC_EIO, "%s: writing the log: %s", w->dir,
                        w->broken_msg);
    }
    NC_ASSERT(s == w->last_seq + 1, "wal_append: record %llu after %llu", (unsigned long long)s,
              (unsigned long long)w->last_seq);
    w->last_seq = s;
    w->bytes += REC_HDR + len;
    pthread_mutex_unlock(&w->lock);
    if (seq)
        *seq = s;
    return NC_OK;
}

int wal_sync(nc_wal *w, uint64_t seq, char *err, size_t errlen)
{
    NC_ASSERT(w, "wal_sync: no log");
    pthread_mutex_lock(&w->lock);
    NC_ASSERT(seq <= w->last_seq || w->broken, "wal_sync: record %llu not appended (last %llu)",
              (unsigned long long)seq, (unsigned long long)w->last_seq);
    if (w->mode == WAL_SYNC_NONE) {
        pthread_mutex_unlock(&w->lock);
        return NC_OK;
    }
    if (w->mode == WAL_SYNC_EACH) {
        /* the baseline: every request pays its own fsync, one at a time */
        int r = w->broken ? -1 : nc_fdatasync(w->fd);
        int e = errno;
        if (r == 0) {
            w->synced_seq = w->last_seq;
            w->fsyncs++;
        } else if (!w->broken) {
            w->broken = true;
            w->tail_unknown = true;
            w->broken_rc = no_room(e) ? NC_ENOSPACE : NC_EIO;   /* a file system that allocates late */
            snprintf(w->broken_msg, sizeof w->broken_msg, "fdatasync: %s", strerror(e));
        }
        pthread_mutex_unlock(&w->lock);
        return r == 0 ? NC_OK : nc_error(err, errlen, w->broken_rc, "%s: %s", w->dir, w->broken_msg);
    }
    /* group commit: one leader syncs everything written so far; callers
     * arriving meanwhile wait and are usually covered by it */
    while (w->synced_seq < seq && !w->broken) {
        if (w->syncing) {
            pthread_cond_wait(&w->cond, &w->lock);
            continue;
        }
        w->syncing = true;
        uint64_t target = w->last_seq;
        int fd = w->fd;
        pthread_mutex_unlock(&w->lock);
        int r = nc_fdatasync(fd);
        int e = errno;
        pthread_mutex_lock(&w->lock);
        w->syncing = false;
        w->fsyncs++;
        if (r == 0) {
            if (target > w->synced_seq)
                w->synced_seq = target;
        } else {
            /* after a failed fsync the page cache state is unknown
             * (the "fsyncgate" lesson): stop rather than retry */
            w->broken = true;
            w->tail_unknown = true;
            w->broken_rc = no_room(e) ? NC_ENOSPACE : NC_EIO;   /* a file system that allocates late */
            snprintf(w->broken_msg, sizeof w->broken_msg, "fdatasync: %s", strerror(e));
        }
        pthread_cond_broadcast(&w->cond);
    }
    int rc = w->synced_seq >= seq ? NC_OK
                                   : nc_error(err, errlen, w->broken_rc, "%s: %s", w->dir, w->broken_msg);
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int wal_rotate(nc_wal *w, uint64_t *last_seq, char *err, size_t errlen)
{
    NC_ASSERT(w, "wal_rotate: no w");
    pthread_mutex_lock(&w->lock);
    while (w->syncing)
        pthread_cond_wait(&w->cond, &w->lock);
    int rc = NC_OK;
    if (w->broken)
        rc = nc_error(err, errlen, w->broken_rc, "log unusable: %s", w->broken_msg);
    else if (w->last_seq + 1 == w->seg_first)
        ;   /* the current segment is empty: keep it */
    else if (nc_fdatasync(w->fd) != 0) {
        /* as in wal_sync: the tail's state is unknown from here on */
        w->broken = true;
        w->tail_unknown = true;
        int e = errno;
        w->broken_rc = no_room(e) ? NC_ENOSPACE : NC_EIO;
        snprintf(w->broken_msg, sizeof w->broken_msg, "fdatasync: %s", strerror(e));
        rc = nc_error(err, errlen, w->broken_rc, "%s: %s", w->dir, w->broken_msg);
    } else {
        w->fsyncs++;
        w->synced_seq = w->last_seq;
        int old = w->fd;
        uint64_t old_first = w->seg_first;
        if ((rc = open_segment(w, w->last_seq + 1, err, errlen)) == NC_OK) {
            close(old);
        } else {
            w->fd = old;
            w->seg_first = old_first;
        }
    }
    if (last_seq)
        *last_seq = w->last_seq;
    pthread_mutex_unlock(&w->lock);
    return rc;
}

bool wal_broken(nc_wal *w, uint64_t *last_seq, bool *tail_unknown)
{
    NC_ASSERT(w, "wal_broken: no w");
    pthread_mutex_lock(&w->lock);
    bool b = w->broken;
    if (last_seq)
        *last_seq = w->last_seq;
    if (tail_unknown)
        *tail_unknown = w->tail_unknown;
    pthread_mutex_unlock(&w->lock);
    return b;
}

int wal_restart(nc_wal *w, uint64_t last_seq, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->lock);
    while (w->syncing)
        pthread_cond_wait(&w->cond, &w->lock);
    int rc = NC_OK;
    if (!w->broken || w->last_seq != last_seq) {
        rc = nc_error(err, errlen, NC_ESTATE, "%s: restart of a log that is %s", w->dir,
                      !w->broken ? "not broken" : "past the snapshot");
    } else {
        /* the broken segment is only read from here on (recovery skips it
         * when the snapshot covers it); if it holds no record it has this
         * very name and is truncated */
        int old = w->fd;
        uint64_t old_first = w->seg_first;
        if ((rc = open_segment(w, last_seq + 1, err, errlen)) == NC_OK) {
            if (old >= 0 && old != w->fd)
                close(old);
            w->broken = false;
            w->tail_unknown = false;
            w->broken_msg[0] = 0;
            w->synced_seq = last_seq;
        } else {
            w->fd = old;
            w->seg_first = old_first;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

int wal_prune(const char *dir, uint64_t upto, char *err, size_t errlen)
{
    NC_ASSERT(dir, "wal_prune: no directory");
    seglist l;
    int rc = list_segments(dir, &l, err, errlen);
    if (rc)
        return rc;
    int removed = 0;
    /* segment i holds [first_i, first_{i+1}); the last one is being written */
    for (int i = 0; i + 1 < l.n; i++) {
        if (l.first[i + 1] - 1 > upto)
            break;
        char name[64], path[1200];
        wal_segment_name(l.first[i], name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (unlink(path) != 0) {
            rc = nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
            break;
        }
        removed++;
    }
    free(l.first);
    if (removed)
        atomicfile_sync_dir(dir);
    return rc ? rc : removed;
}

void wal_stats(nc_wal *w, nc_wal_stats *st)
{
    NC_ASSERT(w, "wal_stats: no w");
    pthread_mutex_lock(&w->lock);
    st->last_seq = w->last_seq;
    st->synced_seq = w->synced_seq;
    st->bytes = w->bytes;
    st->fsyncs = w->fsyncs;
    pthread_mutex_unlock(&w->lock);
}

uint64_t wal_disk_bytes(const char *dir)
{
    seglist l;
    if (list_segments(dir, &l, NULL, 0))
        return 0;
    uint64_t b = 0;
    for (int i = 0; i < l.n; i++) {
        char name[64], path[1200];
        struct stat st;
        wal_segment_name(l.first[i], name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (stat(path, &st) == 0)
            b += (uint64_t)st.st_size;
    }
    free(l.first);
    return b;
}

uint64_t wal_durable_seq(nc_wal *w)
{
    NC_ASSERT(w, "wal_durable_seq: no w");
    pthread_mutex_lock(&w->lock);
    uint64_t s = w->mode == WAL_SYNC_NONE ? w->last_seq : w->synced_seq;
    pthread_mutex_unlock(&w->lock);
    return s;
}

/* ---- following a log ---------------------------------------------------------- */

struct nc_wal_reader {
    char dir[1024];
    uint32_t tag;
    int fd;                       /* segment being read, -1 = none yet */
    uint64_t seg_first;
    uint64_t file_off;            /* of the next record in fd */
    uint64_t file_seq;            /* seq of the record at file_off */
    uint64_t pos;                 /* last record handed out (or skipped: <= after) */
    nc_buf rec;                   /* payload of the record handed out */
};

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = nc_pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -1 : 0;
        got += (size_t)r;
    }
    return 1;
}

/* Opens the segment holding seq want (the newest starting at or before
 * it) and checks its header. NC_ENOTFOUND when no segment reaches back. */
static int reader_seek_segment(nc_wal_reader *r, uint64_t want, char *err, size_t errlen)
{
    seglist l;
    int rc = list_segments(r->dir, &l, err, errlen);
    if (rc)
        return rc;
    int k = -1;
    for (int i = 0; i < l.n; i++)
        if (l.first[i] <= want)
            k = i;
    uint64_t first = k >= 0 ? l.first[k] : 0;
    uint64_t oldest = l.n ? l.first[0] : 0;
    free(l.first);
    if (k < 0)
        return nc_error(err, errlen, NC_ENOTFOUND, "%s: the log %s does not reach back to seq %llu", r->dir,
                        oldest ? "starts later and" : "is empty and", (unsigned long long)want);
    if (r->fd >= 0 && first == r->seg_first)
        return NC_OK;   /* already there */
    char name[64], path[1200];
    wal_segment_name(first, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", r->dir, name);
    int fd = nc_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", path, strerror(errno));
    unsigned char h[SEG_HDR];
    int got = pread_all(fd, h, SEG_HDR, 0);
    if (got < 0) {
        int e = errno;
        close(fd);
        return nc_error(err, errlen, NC_EIO, "%s: reading the segment header: %s", path, strerror(e));
    }
    if (got > 0 && wal_newer_version(h, path, err, errlen)) {
        close(fd);
        return NC_ESTATE;
    }
    if (got == 0 || memcmp(h, SEG_MAGIC, 8) != 0 || rd32(h + 20) != (uint32_t)crc32(0L, h, 20) ||
        rd64(h + 8) != first || rd32(h + 16) != r->tag) {
        close(fd);
        return nc_error(err, errlen, NC_EFORMAT, "%s: bad segment header", path);
    }
    if (r->fd >= 0)
        close(r->fd);
    r->fd = fd;
    r->seg_first = first;
    r->file_off = SEG_HDR;
    r->file_seq = first;
    return NC_OK;
}

int wal_reader_open(const char *dir, uint32_t tag, uint64_t after, nc_wal_reader **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    nc_wal_reader *r = calloc(1, sizeof *r);
    if (!r)
        return nc_error(err, errlen, NC_ENOMEM, "log reader");
    if ((size_t)snprintf(r->dir, sizeof r->dir, "%s", dir) >= sizeof r->dir) {
        free(r);
        return nc_error(err, errlen, NC_EINVAL, "log directory path too long");
    }
    r->tag = tag;
    r->fd = -1;
    r->pos = after;
    int rc = reader_seek_segment(r, after + 1, err, errlen);
    if (rc) {
        wal_reader_close(r);
        return rc;
    }
    *out = r;
    return NC_OK;
}

/* Record want cannot be read from its segment (why). If a later segment
 * starts after it -- the log went on in a new segment after a failed fsync
 * cut this one's tail (wal_restart) -- the reader moves there and says
 * which records it passed over (NC_ENOTFOUND): a follower must not stay
 * stuck on them forever. Else NC_EFORMAT. */
static int reader_skip(nc_wal_reader *r, uint64_t want, const char *why, char *err, size_t errlen)
{
    seglist l;
    uint64_t next = 0, at = r->seg_first;
    if (list_segments(r->dir, &l, NULL, 0) == NC_OK) {
        for (int i = 0; i < l.n && !next; i++)
            if (l.first[i] > want)
                next = l.first[i];
        free(l.first);
    }
    if (!next || reader_seek_segment(r, next, NULL, 0) != NC_OK || r->seg_first != next)
        return nc_error(err, errlen, NC_EFORMAT, "%s: record %llu of segment %llu %s", r->dir,
                        (unsigned long long)want, (unsigned long long)at, why);
    r->pos = next - 1;
    return nc_error(err, errlen, NC_ENOTFOUND,
                    "%s: records %llu-%llu passed over: record %llu of segment %llu %s, and the log goes on "
                    "in a later segment (cut short by a failed fsync?)", r->dir, (unsigned long long)want,
                    (unsigned long long)(next - 1), (unsigned long long)want, (unsigned long long)at, why);
}

int wal_reader_next(nc_wal_reader *r, uint64_t upto, nc_wal_record *rec, char *err, size_t errlen)
{
    NC_ASSERT(r, "wal_reader_next: no r");
    while (r->pos < upto) {
        uint64_t want = r->pos + 1;
        unsigned char h[REC_HDR];
        int got = pread_all(r->fd, h, REC_HDR, r->file_off);
        if (got < 0)
            return nc_error(err, errlen, NC_EIO, "%s: reading the log: %s", r->dir, strerror(errno));
        if (got == 0) {
            /* end of this segment: the record is in the next one */
            uint64_t before = r->seg_first;
            int rc = reader_seek_segment(r, want, err, errlen);
            if (rc)
                return rc;
            if (r->seg_first == before)
                return reader_skip(r, want, "is missing (the segment ends first)", err, errlen);
            continue;
        }
        uint32_t l = rd32(h + 4);
        if (rd32(h) != REC_MAGIC || l > WAL_MAX_RECORD || rd64(h + 8) != r->file_seq)
            return reader_skip(r, want, "follows a bad record header", err, errlen);
        if (r->file_seq < want) {
            /* before the position (opening in the middle of a segment) */
            r->file_off += REC_HDR + l;
            r->file_seq++;
            continue;
        }
        buf_clear(&r->rec);
        if (buf_reserve(&r->rec, l) != NC_OK)
            return nc_error(err, errlen, NC_ENOMEM, "log record of %u bytes", l);
        got = l ? pread_all(r->fd, r->rec.data, l, r->file_off + REC_HDR) : 1;
        if (got < 0)
            return nc_error(err, errlen, NC_EIO, "%s: record %llu: %s", r->dir, (unsigned long long)want,
                            strerror(errno));
        if (got == 0 || rd32(h + 16) != rec_crc(h, (const unsigned char *)r->rec.data, l))
            return reader_skip(r, want, got == 0 ? "is cut short" : "fails its checksum", err, errlen);
        r->file_off += REC_HDR + l;
        r->file_seq++;
        r->pos = want;
        rec->seq = want;
        rec->payload = r->rec.data;
        rec->len = l;
        return 1;
    }
    return 0;
}

uint64_t wal_reader_position(const nc_wal_reader *r)
{
    NC_ASSERT(r, "wal_reader_position: no r");
    return r->pos;
}

void wal_reader_close(nc_wal_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    buf_free(&r->rec);
    free(r);
}
