/* nsbackup.c -- point-in-time copies of namespaces: a snapshot's files and
 * the log records after it up to one position (nsbackup.h). */
#include "nsbackup.h"
#include "fault.h"
#include "nsstore_internal.h"
#include "wal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define COPY_CHUNK (1u << 20)

void backup_ns_free(nc_backup_ns *b)
{
    if (!b)
        return;
    free(b->files);
    b->files = NULL;
    b->nfiles = 0;
}

static int add_file(nc_backup_ns *b, const char *rel, uint64_t size, uint32_t crc, char *err, size_t errlen)
{
    nc_backup_file *f = nc_realloc(b->files, (size_t)(b->nfiles + 1) * sizeof *f);
    if (!f)
        return nc_error(err, errlen, NC_ENOMEM, "backup: file list");
    b->files = f;
    f += b->nfiles++;
    snprintf(f->path, sizeof f->path, "%s", rel);
    f->size = size;
    f->crc = crc;
    b->bytes += size;
    return NC_OK;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = nc_write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A copy is written back as it goes, WRITE_BEHIND bytes at a time, and
 * its pages dropped once on disk: left to the final fsync, a 600 MB copy
 * was one burst of writeback (0.53 GB in a second, the system time of both
 * cores up by half) under the readers of the namespace, and its pages
 * would crowd the page cache the daemon's own files use. */
#define WRITE_BEHIND (8u << 20)

typedef struct {
    uint64_t submitted;           /* [0, submitted) asked to be written back */
    uint64_t dropped;             /* [0, dropped) on disk and out of the cache */
} write_behind;

static void write_behind_step(int out, uint64_t written, write_behind *wb)
{
    if (written - wb->submitted < WRITE_BEHIND)
        return;
    /* the previous range is on its way by now: wait for it, drop it */
    if (wb->submitted > wb->dropped) {
        (void)sync_file_range(out, (off_t)wb->dropped, (off_t)(wb->submitted - wb->dropped),
                              SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        (void)posix_fadvise(out, (off_t)wb->dropped, (off_t)(wb->submitted - wb->dropped), POSIX_FADV_DONTNEED);
        wb->dropped = wb->submitted;
    }
    (void)sync_file_range(out, (off_t)wb->submitted, (off_t)(written - wb->submitted), SYNC_FILE_RANGE_WRITE);
    wb->submitted = written;
}

/* Reads fd to its end: size and CRC-32, and a copy into out (-1 = none). */
static int stream_file(int fd, int out, uint64_t *size, uint32_t *crc)
{
    write_behind wb = {0, 0};
    unsigned char *buf = nc_malloc(COPY_CHUNK);
    if (!buf)
        return NC_ENOMEM;
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t total = 0;
    int rc = NC_OK;
    for (;;) {
        ssize_t r = nc_read(fd, buf, COPY_CHUNK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = NC_EIO;
            break;
        }
        if (r == 0)
            break;
        c = crc32(c, buf, (uInt)r);
        total += (uint64_t)r;
        if (out >= 0 && write_all(out, buf, (size_t)r) != 0) {
            rc = errno == ENOSPC || errno == EDQUOT ? NC_ENOSPACE : NC_EIO;
            break;
        }
        if (out >= 0)
            write_behind_step(out, total, &wb);
    }
    free(buf);
    *size = total;
    *crc = (uint32_t)c;
    return rc;
}

int backup_copy_file(const char *src, const char *dst, uint64_t *size, uint32_t *crc, char *err, size_t errlen)
{
    int in = nc_open(src, O_RDONLY | O_CLOEXEC, 0);
    if (in < 0)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", src, strerror(errno));
    int out = nc_open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
        int e = errno;
        close(in);
        return nc_error(err, errlen, NC_EIO, "%s: %s", dst, strerror(e));
    }
    int rc = stream_file(in, out, size, crc);
    if (rc == NC_OK && nc_fsync(out) != 0)
        rc = errno == ENOSPC ? NC_ENOSPACE : NC_EIO;
    if (rc == NC_OK)   /* on disk: the rest of its pages out of the cache */
        (void)posix_fadvise(out, 0, 0, POSIX_FADV_DONTNEED);
    int e = errno;
    close(in);
    if (close(out) != 0 && rc == NC_OK)
        rc = NC_EIO, e = errno;
    if (rc)
        return nc_error(err, errlen, rc, "copying %s to %s: %s", src, dst, rc == NC_ENOMEM ? "out of memory"
                                                                             : strerror(e));
    return NC_OK;
}

int backup_sync_dir(const char *dir, char *err, size_t errlen)
{
    int fd = nc_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", dir, strerror(errno));
    int rc = nc_fsync(fd) == 0 ? NC_OK : nc_error(err, errlen, NC_EIO, "fsync %s: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

int backup_file_check(const char *dir, const nc_backup_file *f, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%.1000s/%.1000s", dir, f->path);
    int fd = nc_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", path, strerror(errno));
    uint64_t size;
    uint32_t crc;
    int rc = stream_file(fd, -1, &size, &crc);
    close(fd);
    if (rc)
        return nc_error(err, errlen, rc, "%s: cannot be read", path);
    if (size != f->size)
        return nc_error(err, errlen, NC_EFORMAT, "%s: %llu bytes, the backup's manifest says %llu (damaged backup)",
                        path, (unsigned long long)size, (unsigned long long)f->size);
    if (crc != f->crc)
        return nc_error(err, errlen, NC_EFORMAT, "%s: checksum mismatch (damaged backup)", path);
    return NC_OK;
}

/* The copy of file name from src to dst, listed as rel. */
static int copy_listed(const char *src, const char *dst, const char *rel, nc_backup_ns *b, char *err,
                       size_t errlen)
{
    uint64_t size;
    uint32_t crc;
    int rc = backup_copy_file(src, dst, &size, &crc, err, errlen);
    return rc ? rc : add_file(b, rel, size, crc, err, errlen);
}

/* The pairs snapshot dir's MANIFEST counts ("entries N"). */
static int snapshot_entries(const char *sdir, uint64_t *entries, char *err, size_t errlen)
{
    char p[4096], line[256];
    snprintf(p, sizeof p, "%.1000s/MANIFEST", sdir);
    FILE *f = fopen(p, "r");
    if (!f)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", p, strerror(errno));
    unsigned long long e = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "entries %llu", &e) == 1;
    fclose(f);
    *entries = e;
    return found ? NC_OK : nc_error(err, errlen, NC_EFORMAT, "%s: no entries line", p);
}

/* Every file of snapshot seq of src into dst/snap-<seq>/ (whatever files
 * a snapshot holds: they are immutable once the snapshot is in place). */
static int copy_snapshot(const char *src, uint64_t seq, const char *dst, nc_backup_ns *b, char *err, size_t errlen)
{
    char name[64], sdir[4096], ddir[4096];
    snprintf(name, sizeof name, "snap-%016llx", (unsigned long long)seq);
    snprintf(sdir, sizeof sdir, "%.1000s/%.1000s", src, name);
    snprintf(ddir, sizeof ddir, "%.1000s/%.1000s", dst, name);
    int rc = snapshot_entries(sdir, &b->entries, err, errlen);
    if (rc)
        return rc;
    if (mkdir(ddir, 0755) != 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", ddir, strerror(errno));
    DIR *d = opendir(sdir);
    if (!d)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", sdir, strerror(errno));
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char from[4096], to[4096], rel[128];
        snprintf(from, sizeof from, "%.1000s/%.1000s", sdir, e->d_name);
        snprintf(to, sizeof to, "%.1000s/%.1000s", ddir, e->d_name);
        snprintf(rel, sizeof rel, "%.1000s/%.60s", name, e->d_name);
        rc = copy_listed(from, to, rel, b, err, errlen);
    }
    closedir(d);
    b->snapshot_seq = seq;
    return rc ? rc : backup_sync_dir(ddir, err, errlen);
}

/* What a log copy reads and where it goes. */
typedef struct {
    const char *src;              /* namespace directory */
    uint32_t tag;
    uint64_t after;               /* the snapshot's seq */
    uint64_t upto;                /* the position; UINT64_MAX: to the last whole record */
    const char *dst;
    nc_backup_ns *b;
} log_copy;

/* The pairs an ADD or ADD_CODES record (ids [first, first + n),
 * nsstore_internal.h layout) adds to the `have` counted before it. A
 * snapshot may already hold the first pairs of the records logged after
 * its position (recovery skips them: recovery.c, "already in the
 * snapshot"); counted again, the manifest said 6-20 pairs more than its
 * namespace restored to (the endurance run of 2026-12-07 14:43, six
 * backups of namespaces written while they were taken). */
static uint64_t record_new_pairs(const nc_wal_record *r, uint64_t have)
{
    const unsigned char *p = r->payload;
    if (r->len < REC_HEAD || (p[0] != REC_ADD && p[0] != REC_ADD_CODES))
        return 0;
    nsstore_rec_head h;
    nsstore_rec_head_fields(p, &h);
    const uint64_t from = h.first > 0 ? (uint64_t)h.first : 0, end = from + h.n;
    return end > have ? end - (from > have ? from : have) : 0;
}

/* Reads the records c->after+1..c->upto through the reader and appends
 * them to a new log in c->dst/wal (same seqs), synced. */
static int copy_records(const log_copy *c, nc_wal_reader *r, nc_wal *w, char *err, size_t errlen)
{
    uint64_t last = c->after;
    int rc = NC_OK;
    for (;;) {
        nc_wal_record rec;
        int got = wal_reader_next(r, c->upto, &rec, err, errlen);
        if (got == 0)
            break;
        if (got < 0) {
            /* a log another process writes (or a torn one) ends at its
             * last whole record: the reader finds nothing after it */
            rc = c->upto == UINT64_MAX && got == NC_EFORMAT ? NC_OK : got;
            break;
        }
        uint64_t seq;
        if ((rc = wal_append(w, rec.payload, rec.len, &seq, err, errlen)))
            break;
        if (seq != rec.seq) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: log record %llu where %llu was expected", c->src,
                          (unsigned long long)rec.seq, (unsigned long long)seq);
            break;
        }
        c->b->entries += record_new_pairs(&rec, c->b->entries);
        c->b->records++;
        last = seq;
    }
    if (!rc && c->upto != UINT64_MAX && last != c->upto)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: the log ends at record %llu, before %llu", c->src,
                      (unsigned long long)last, (unsigned long long)c->upto);
    if (!rc && last > c->after)
        rc = wal_sync(w, last, err, errlen);
    c->b->position = last;
    return rc;
}

static int copy_log(const log_copy *c, char *err, size_t errlen)
{
    char swal[4096], dwal[4096], seg[64], rel[128], path[4096];
    snprintf(swal, sizeof swal, "%.1000s/wal", c->src);
    snprintf(dwal, sizeof dwal, "%.1000s/wal", c->dst);
    nc_wal_reader *r = NULL;
    int rc = wal_reader_open(swal, c->tag, c->after, &r, err, errlen);
    if (rc)
        return rc;
    nc_wal *w = NULL;
    nc_wal_open_spec os = {.dir = dwal, .tag = c->tag, .next_seq = c->after + 1, .mode = WAL_SYNC_GROUP};
    rc = wal_open(&os, &w, err, errlen);
    if (!rc)
        rc = copy_records(c, r, w, err, errlen);
    wal_close(w);
    wal_reader_close(r);
    if (rc)
        return rc;
    wal_segment_name(c->after + 1, seg, sizeof seg);
    snprintf(rel, sizeof rel, "wal/%.1000s", seg);
    snprintf(path, sizeof path, "%.1000s/%.1000s", c->dst, rel);
    int fd = nc_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    uint64_t size;
    uint32_t crc;
    rc = stream_file(fd, -1, &size, &crc);
    close(fd);
    if (rc)
        return nc_error(err, errlen, rc, "%s: cannot be read back", path);
    rc = add_file(c->b, rel, size, crc, err, errlen);
    return rc ? rc : backup_sync_dir(dwal, err, errlen);
}

/* The storage file of a compact store, if src has one. */
static int copy_storage(const char *src, const char *dst, nc_backup_ns *b, char *err, size_t errlen)
{
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%.1000s/" STORAGE_FILE, src);
    snprintf(to, sizeof to, "%.1000s/" STORAGE_FILE, dst);
    if (access(from, F_OK) != 0)
        return NC_OK;
    b->compact = true;
    return copy_listed(from, to, STORAGE_FILE, b, err, errlen);
}

/* The keys kept for the index's own training (KEYS_FILE), when the store
 * has them: append-only, and at least the snapshot's pairs long once its
 * manifest is in place (the snapshot syncs them first); recovery reads the
 * snapshot's count of them and cuts the rest, so a copy taken while a later
 * snapshot appends is as good. Without it a restored namespace would keep
 * the index it has and never train again. */
static int copy_keys(const char *src, const char *dst, bool snap, nc_backup_ns *b, char *err, size_t errlen)
{
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%.1000s/" KEYS_FILE, src);
    snprintf(to, sizeof to, "%.1000s/" KEYS_FILE, dst);
    if (snap && access(from, F_OK) == 0) {
        int rc = copy_listed(from, to, KEYS_FILE, b, err, errlen);
        if (rc)
            return rc;
    }
    /* and the mark of a store with the index's own training (nsstore.h):
     * an empty directory, not a listed file; restore makes it again */
    snprintf(from, sizeof from, "%.1000s/" NSSTORE_TRAINING_MARK, src);
    snprintf(to, sizeof to, "%.1000s/" NSSTORE_TRAINING_MARK, dst);
    if (access(from, F_OK) == 0 && mkdir(to, 0755) != 0 && errno != EEXIST)
        return nc_error(err, errlen, NC_EIO, "%s: %s", to, strerror(errno));
    return NC_OK;
}

/* The copy itself: dst made, storage, snapshot snap (0 = none), its keys, log. */
static int copy_namespace(const log_copy *c, uint64_t snap, char *err, size_t errlen)
{
    if (mkdir(c->dst, 0755) != 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", c->dst, strerror(errno));
    int rc = copy_storage(c->src, c->dst, c->b, err, errlen);
    if (!rc && snap)
        rc = copy_snapshot(c->src, snap, c->dst, c->b, err, errlen);
    if (!rc)
        rc = copy_keys(c->src, c->dst, snap != 0, c->b, err, errlen);
    if (!rc)
        rc = copy_log(c, err, errlen);
    return rc ? rc : backup_sync_dir(c->dst, err, errlen);
}

int nsstore_backup(nc_nsstore *ns, const char *dst, nc_backup_ns *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    /* snap_lock: no snapshot is written or pruned (nor a heal, nor a
     * retirement) while the files are copied; adds and reads go on */
    pthread_mutex_lock(&ns->snap_lock);
    int rc = nsstore_check_live(ns, err, errlen);
    if (!rc)
        rc = nsstore_snapshot_trained_locked(ns, err, errlen);
    if (!rc) {
        log_copy c = {.src = ns->dir, .tag = ns->tag, .after = ns->snap_seq, .upto = nsstore_durable_seq(ns),
                      .dst = dst, .b = out};
        rc = copy_namespace(&c, ns->snap_seq, err, errlen);
    }
    pthread_mutex_unlock(&ns->snap_lock);
    return rc;
}

int backup_dir_copy(const char *src, uint32_t tag, const char *dst, nc_backup_ns *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    uint64_t *snaps = NULL;
    int n = 0;
    int rc = nsstore_snapshot_list(src, &snaps, &n, false);
    if (rc)
        return nc_error(err, errlen, rc, "%s: cannot list snapshots", src);
    uint64_t snap = 0;
    for (int i = 0; i < n && !snap; i++) {
        char m[4096];
        snprintf(m, sizeof m, "%.1000s/snap-%016llx/MANIFEST", src, (unsigned long long)snaps[i]);
        if (access(m, R_OK) == 0)
            snap = snaps[i];
    }
    free(snaps);
    log_copy c = {.src = src, .tag = tag, .after = snap, .upto = UINT64_MAX, .dst = dst, .b = out};
    return copy_namespace(&c, snap, err, errlen);
}
