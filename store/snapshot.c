/* snapshot.c -- a namespace's snapshots: writing one (files, MANIFEST,
 * pruning the log it covers), verifying and loading one, healing a broken
 * log, and removing a namespace directory. */
#include "nsstore_internal.h"
#include "fault.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define PROV_MAGIC "NCPROV01"
#define DOCS_MAGIC "NCDOCS01"
/* Version 2 (issue 35) adds train.txt (the own training's state) and a
 * "keys N" line: the store's keys file held the f16 keys of N >= entries
 * pairs, fsynced, when the manifest was written. Version 1 manifests (the
 * five files, no keys) still load. */
#define MANIFEST_HEAD "neurocache-snapshot 2"
#define MANIFEST_HEAD_V1 "neurocache-snapshot 1"

static const char *const snap_files[] = {"index.faiss", "values.bin", "words.txt", "prov.bin", "docs.bin", "train.txt"};
#define NSNAPFILES 6
#define NSNAPFILES_V1 5

/* ---- files ------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int nsstore_remove_dir(const char *dir, char *err, size_t errlen)
{
    NC_ASSERT(dir && dir[0], "nsstore_remove_dir: no directory");
    struct stat st;
    if (stat(dir, &st) != 0)
        return errno == ENOENT ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", dir, strerror(errno));
    if (nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return nc_error(err, errlen, NC_EIO, "removing %s: %s", dir, strerror(errno));
    return NC_OK;
}

static int fsync_path(const char *path, bool is_dir)
{
    int fd = open(path, is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0)
        return -1;
    int r = nc_fsync(fd);
    close(fd);
    return r;
}

/* size and crc32 of a whole file */
static int file_crc(const char *path, uint64_t *size, uint32_t *crc, char *err, size_t errlen)
{
    int fd = nc_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", path, strerror(errno));
    static __thread unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t n = 0;
    ssize_t r;
    while ((r = nc_read(fd, buf, sizeof buf)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(e));
        }
        c = crc32(c, buf, (uInt)r);
        n += (uint64_t)r;
    }
    close(fd);
    *size = n;
    *crc = (uint32_t)c;
    return NC_OK;
}

static int write_file(const char *path, const void *a, size_t alen, const void *b, size_t blen,
                      const void *c, size_t clen, char *err, size_t errlen)
{
    FILE *f = nc_fopen(path, "wb");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    bool ok = (!alen || nc_fwrite(a, 1, alen, f) == alen) && (!blen || nc_fwrite(b, 1, blen, f) == blen) &&
              (!clen || nc_fwrite(c, 1, clen, f) == clen) && fflush(f) == 0 && nc_fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    return ok ? NC_OK : nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(e));
}

/* ---- snapshots ------------------------------------------------------------------ */

static int write_prov(nc_nsstore *ns, const char *path, uint64_t count, char *err, size_t errlen)
{
    pthread_rwlock_rdlock(&ns->meta);
    int rc = NC_OK;
    if (count > ns->nprov)
        rc = nc_error(err, errlen, NC_ESTATE, "snapshot of %llu pairs, %zu with provenance",
                      (unsigned long long)count, ns->nprov);
    unsigned char hdr[16];
    memcpy(hdr, PROV_MAGIC, 8);
    memcpy(hdr + 8, &count, 8);
    if (!rc)
        rc = write_file(path, hdr, 16, ns->prov_doc, count * 4, ns->prov_off, count * 4, err, errlen);
    pthread_rwlock_unlock(&ns->meta);
    return rc;
}

static int write_docs(nc_nsstore *ns, const char *path, char *err, size_t errlen)
{
    pthread_rwlock_rdlock(&ns->meta);
    size_t len = 12;
    for (uint32_t i = 0; i < ns->ndocs; i++)
        len += 4 + strlen(ns->doc_ids[i]);
    unsigned char *b = malloc(len);
    int rc = b ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "documents");
    if (b) {
        memcpy(b, DOCS_MAGIC, 8);
        memcpy(b + 8, &ns->ndocs, 4);
        size_t k = 12;
        for (uint32_t i = 0; i < ns->ndocs; i++) {
            uint32_t l = (uint32_t)strlen(ns->doc_ids[i]);
            memcpy(b + k, &l, 4);
            memcpy(b + k + 4, ns->doc_ids[i], l);
            k += 4 + l;
        }
    }
    pthread_rwlock_unlock(&ns->meta);
    if (b)
        rc = write_file(path, b, len, NULL, 0, NULL, 0, err, errlen);
    free(b);
    return rc;
}

/* The whole file at path, NUL-terminated (free() it). */
static int read_whole(const char *path, unsigned char **out, size_t *len, char *err, size_t errlen)
{
    nc_buf b = NC_BUF_INIT;
    int rc = buf_read_file(&b, path, err, errlen);
    if (rc) {
        buf_free(&b);
        return rc;
    }
    *out = (unsigned char *)buf_detach(&b, len);
    return *out ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
}

static uint64_t values_count(const char *path)
{
    FILE *f = nc_fopen(path, "rb");
    uint64_t n = 0;
    char magic[8];
    if (f) {
        if (nc_fread(magic, 1, 8, f) != 8 || nc_fread(&n, 8, 1, f) != 1)
            n = 0;
        fclose(f);
    }
    return n;
}

/* Snapshot dirs "snap-<16 hex>" in descending seq order. */
int nsstore_snapshot_list(const char *dir, uint64_t **out, int *n, bool cleanup_tmp)
{
    NC_ASSERT(dir && out && n, "nsstore_snapshot_list: dir %p, out %p, n %p", (const void *)dir, (void *)out,
              (void *)n);
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? NC_OK : NC_EIO;
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d))) {
        unsigned long long s;
        char rest[32] = "";
        if (strncmp(e->d_name, "snap-", 5) != 0)
            continue;
        int got = sscanf(e->d_name + 5, "%16llx%31s", &s, rest);
        if (got == 2 && strcmp(rest, ".tmp") == 0 && cleanup_tmp) {
            char p[1200];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            nsstore_remove_dir(p, NULL, 0);   /* an interrupted snapshot */
            continue;
        }
        if (got != 1 || strlen(e->d_name) != 21)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *p = realloc(*out, (size_t)cap * sizeof *p);
            if (!p) {
                closedir(d);
                return NC_ENOMEM;
            }
            *out = p;
        }
        (*out)[(*n)++] = s;
    }
    closedir(d);
    /* descending */
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && (*out)[j] > (*out)[j - 1]; j--) {
            uint64_t t = (*out)[j];
            (*out)[j] = (*out)[j - 1];
            (*out)[j - 1] = t;
        }
    return NC_OK;
}

void nsstore_snapshot_path(const nc_nsstore *ns, uint64_t seq, const char *suffix, char *buf, size_t len)
{
    NC_ASSERT(ns && suffix && buf && len > 0, "nsstore_snapshot_path: no namespace, suffix or buffer");
    snprintf(buf, len, "%s/snap-%016llx%s", ns->dir, (unsigned long long)seq, suffix);
}

/* Writes snapshot S of the current state (snap_lock held) and, once it is
 * durable, drops what it makes unnecessary. */
/* tmp/MANIFEST of snapshot S (C entries): each file fsynced, its size and
 * checksum, then the manifest's own checksum. */
static int write_manifest(const char *tmp, uint64_t S, uint64_t C, int64_t keys, char *err, size_t errlen)
{
    int rc = NC_OK;
    char p[1300];
    char man[2048];
    size_t k = (size_t)snprintf(man, sizeof man, "%s\nseq %llu\nentries %llu\nkeys %lld\n", MANIFEST_HEAD,
                                (unsigned long long)S, (unsigned long long)C, (long long)keys);
    for (int i = 0; !rc && i < NSNAPFILES; i++) {
        uint64_t size;
        uint32_t crc;
        snprintf(p, sizeof p, "%s/%s", tmp, snap_files[i]);
        if (fsync_path(p, false) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: fsync: %s", p, strerror(errno));
        if (!rc)
            rc = file_crc(p, &size, &crc, err, errlen);
        if (!rc)
            k += (size_t)snprintf(man + k, sizeof man - k, "file %s %llu %08x\n", snap_files[i],
                                  (unsigned long long)size, crc);
    }
    if (!rc) {
        k += (size_t)snprintf(man + k, sizeof man - k, "crc %08x\n", (uint32_t)crc32(0L, (const Bytef *)man, (uInt)k));
        snprintf(p, sizeof p, "%s/MANIFEST", tmp);
        rc = write_file(p, man, k, NULL, 0, NULL, 0, err, errlen);
    }
    return rc;
}

/* After snapshot S: keeps it and the previous one (with the log since the
 * previous one), so a snapshot found corrupt later can be rebuilt, and
 * every log segment a follower (replication) still has to read. */
static void prune_after_snapshot(nc_nsstore *ns, uint64_t S)
{
    char p[1300];
    uint64_t keep_from = ns->snap_seq;   /* previous snapshot, 0 = none */
    uint64_t *snaps;
    int nsn;
    if (nsstore_snapshot_list(ns->dir, &snaps, &nsn, false) == NC_OK) {
        for (int i = 0; i < nsn; i++)
            if (snaps[i] < keep_from || (keep_from == 0 && snaps[i] < S)) {
                nsstore_snapshot_path(ns, snaps[i], "", p, sizeof p);
                nsstore_remove_dir(p, NULL, 0);
            }
        free(snaps);
    }
    /* ...and every segment a follower (replication) still has to
     * read: its records may exist nowhere else yet */
    uint64_t upto = keep_from, ret = __atomic_load_n(&ns->retain, __ATOMIC_ACQUIRE);
    if (ret < upto)
        upto = ret;
    if (upto > 0)
        wal_prune(ns->waldir, upto, NULL, 0);
}

/* The trainings of the namespace's own index the newest snapshot does not
 * hold: a snapshot is due for them even when nothing was logged since (a
 * restart, or a backup's restore, would otherwise begin from the index
 * before them and train again: 10 minutes at 1M pairs). */
static bool trained_since_snapshot(nc_nsstore *ns)
{
    nc_ub_train_stats st;
    unbounded_cache_train_stats(ns->ub, &st);
    return st.trainings != ns->snap_trainings;
}

/* Writes snapshot S: a new position, or S again (nothing logged since it,
 * the index trained since): then the snapshot before it and the log since
 * that one stay, as they did, for a crash between the two directories. */
static int write_snapshot(nc_nsstore *ns, uint64_t S, double t0, char *err, size_t errlen)
{
    int rc = NC_OK;
    nc_ub_train_stats st;   /* read before the save: a training completed meanwhile is one more snapshot later */
    unbounded_cache_train_stats(ns->ub, &st);
    char tmp[1200], fin[1200], p[1300];
    nsstore_snapshot_path(ns, S, ".tmp", tmp, sizeof tmp);
    nsstore_snapshot_path(ns, S, "", fin, sizeof fin);
    if (!rc)
        nsstore_remove_dir(tmp, NULL, 0);
    /* index + values (+ words) under the cache's read lock: consistent with
     * each other; pairs added meanwhile are in the log after S and are
     * skipped by id on replay */
    if (!rc)
        rc = unbounded_cache_save(ns->ub, tmp, err, errlen);
    uint64_t C = 0;
    if (!rc) {
        snprintf(p, sizeof p, "%s/values.bin", tmp);
        C = values_count(p);
        snprintf(p, sizeof p, "%s/words.txt", tmp);
        /* closed-vocabulary caches write no words file: make an empty one */
        if (access(p, F_OK) != 0)
            rc = write_file(p, NULL, 0, NULL, 0, NULL, 0, err, errlen);
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/prov.bin", tmp);
        rc = write_prov(ns, p, C, err, errlen);
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/docs.bin", tmp);
        rc = write_docs(ns, p, err, errlen);
    }
    /* the keys kept for training, up to at least C, durable before the
     * manifest that counts on them */
    int64_t keys = 0;
    if (!rc) {
        snprintf(p, sizeof p, "%s/" KEYS_FILE, ns->dir);
        rc = unbounded_cache_keys_sync(ns->ub, p, &keys, err, errlen);
    }
    if (!rc)
        rc = write_manifest(tmp, S, C, keys, err, errlen);
    if (!rc && fsync_path(tmp, true) != 0)
        rc = nc_error(err, errlen, NC_EIO, "%s: fsync: %s", tmp, strerror(errno));
    if (!rc) {
        nsstore_remove_dir(fin, NULL, 0);
        if (rename(tmp, fin) != 0 || fsync_path(ns->dir, true) != 0)
            rc = nc_error(err, errlen, NC_EIO, "%s: %s", fin, strerror(errno));
    }
    if (rc) {
        nsstore_remove_dir(tmp, NULL, 0);
    } else {
        if (S != ns->snap_seq) {
            prune_after_snapshot(ns, S);
            ns->prev_snap_seq = ns->snap_seq;
        }
        ns->snap_trainings = st.trainings;
        /* stored atomically: nsstore_stats reads them without snap_lock */
        double now = nc_now_s(), secs = now - t0;
        __atomic_store_n(&ns->snap_seq, S, __ATOMIC_RELEASE);
        __atomic_store(&ns->snap_time, &now, __ATOMIC_RELEASE);
        __atomic_store(&ns->snap_secs, &secs, __ATOMIC_RELEASE);
    }
    return rc;
}

int nsstore_snapshot(nc_nsstore *ns, double *seconds, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_snapshot: no namespace");
    pthread_mutex_lock(&ns->snap_lock);
    double t0 = nc_now_s();
    uint64_t S;
    int rc = nsstore_check_live(ns, err, errlen);
    if (!rc)
        rc = wal_rotate(ns->wal, &S, err, errlen);
    if (!rc && S == ns->snap_seq && !trained_since_snapshot(ns)) {
        double now = nc_now_s();   /* nothing logged nor trained since the last snapshot */
        __atomic_store(&ns->snap_time, &now, __ATOMIC_RELEASE);
    }
    else if (!rc)
        rc = write_snapshot(ns, S, t0, err, errlen);
    pthread_mutex_unlock(&ns->snap_lock);
    if (seconds)
        *seconds = nc_now_s() - t0;
    return rc;
}

int nsstore_snapshot_trained_locked(nc_nsstore *ns, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_snapshot_trained_locked: no namespace");
    if (!trained_since_snapshot(ns))
        return NC_OK;
    uint64_t S;
    int rc = wal_rotate(ns->wal, &S, err, errlen);
    return rc ? rc : write_snapshot(ns, S, nc_now_s(), err, errlen);
}

bool nsstore_log_broken(nc_nsstore *ns)
{
    NC_ASSERT(ns && ns->wal, "nsstore_log_broken: no namespace log");
    return wal_broken(ns->wal, NULL, NULL);
}

int nsstore_heal(nc_nsstore *ns, double *seconds, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_heal: no namespace");
    pthread_mutex_lock(&ns->snap_lock);
    double t0 = nc_now_s();
    uint64_t S;
    int rc = nsstore_check_live(ns, err, errlen);
    /* While the log is broken no add gets in (the add hook's append fails
     * first), so memory holds exactly the records up to S: a snapshot of
     * it covers them, whatever the failed fsync lost of the segment. */
    bool tail_unknown = true;
    if (!rc && wal_broken(ns->wal, &S, &tail_unknown)) {
        /* a log opened stopped on a full disk has every record whole on
         * disk: it needs only its new segment, not room for a snapshot */
        if (tail_unknown && S != ns->snap_seq)
            rc = write_snapshot(ns, S, t0, err, errlen);
        if (!rc)
            rc = wal_restart(ns->wal, S, err, errlen);
    }
    pthread_mutex_unlock(&ns->snap_lock);
    if (seconds)
        *seconds = nc_now_s() - t0;
    return rc;
}

/* Verifies a snapshot's MANIFEST (version 1 or 2) and files; *entries and
 * *keys (the pairs the keys file held; -1 for version 1) from it. */
static int verify_snapshot(const char *sdir, uint64_t seq, uint64_t *entries, int64_t *keys, char *err, size_t errlen)
{
    char p[1300];
    snprintf(p, sizeof p, "%s/MANIFEST", sdir);
    unsigned char *b;
    size_t len;
    int rc = read_whole(p, &b, &len, err, errlen);
    if (rc)   /* missing = incomplete snapshot; an I/O error is not corruption */
        return rc == NC_EIO || rc == NC_ENOMEM ? rc : NC_EFORMAT;
    char *man = (char *)b;   /* NUL-terminated */
    int version = 0;
    if (sscanf(man, "neurocache-snapshot %d\n", &version) == 1 && version > NSSTORE_SNAPSHOT_VERSION) {
        /* a later build's: refused whole, never set aside as corrupt */
        free(man);
        return nc_error(err, errlen, NC_ESTATE, "%s: snapshot format version %d is newer than this build reads "
                        "(version %d): written by a later neurocache; serve this data directory with it", p,
                        version, NSSTORE_SNAPSHOT_VERSION);
    }
    char *crcline = strstr(man, "crc ");
    unsigned crc = 0;
    unsigned long long s = 0, e = 0;
    long long k = -1;
    const bool v1 = strncmp(man, MANIFEST_HEAD_V1 "\n", strlen(MANIFEST_HEAD_V1) + 1) == 0;
    const bool v2 = strncmp(man, MANIFEST_HEAD "\n", strlen(MANIFEST_HEAD) + 1) == 0;
    const size_t hl = strlen(MANIFEST_HEAD) + 1;   /* (the same length for both) */
    if (!crcline || sscanf(crcline, "crc %8x", &crc) != 1 ||
        crc != (uint32_t)crc32(0L, (const Bytef *)man, (uInt)(crcline - man)) || !(v1 || v2) ||
        (v1 && sscanf(man + hl, "seq %llu\nentries %llu", &s, &e) != 2) ||
        (v2 && (sscanf(man + hl, "seq %llu\nentries %llu\nkeys %lld", &s, &e, &k) != 3 || k < 0)) || s != seq) {
        free(man);
        return nc_error(err, errlen, NC_EFORMAT, "%s: corrupt snapshot manifest (checksum mismatch)", p);
    }
    *keys = k;
    const int nfiles = v1 ? NSNAPFILES_V1 : NSNAPFILES;
    for (int i = 0; !rc && i < nfiles; i++) {
        char key[64];
        snprintf(key, sizeof key, "file %s ", snap_files[i]);
        char *line = strstr(man, key);
        unsigned long long size;
        unsigned fcrc;
        if (!line || sscanf(line + strlen(key), "%llu %8x", &size, &fcrc) != 2) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: no entry for %s", p, snap_files[i]);
            break;
        }
        char fp[1400];
        uint64_t asize;
        uint32_t acrc;
        snprintf(fp, sizeof fp, "%s/%s", sdir, snap_files[i]);
        if ((rc = file_crc(fp, &asize, &acrc, err, errlen)))
            rc = rc == NC_EIO ? rc : NC_EFORMAT;
        else if (asize != size)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: %llu bytes, the snapshot manifest says %llu (corrupt snapshot)",
                          fp, (unsigned long long)asize, size);
        else if (acrc != fcrc)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: checksum mismatch (corrupt snapshot file)", fp);
    }
    free(man);
    *entries = e;
    return rc;
}
/* The keys kept for training (an IVF index holds none) of a snapshot of
 * entries pairs: from the keys file when its manifest says the file held
 * them all (keys >= entries); else (version 1, or a namespace without its
 * own training) the cache keeps the index it has. */
static int load_keys(nc_nsstore *ns, const char *sdir, uint64_t entries, int64_t keys, char *err, size_t errlen)
{
    if (keys < 0 || (uint64_t)keys < entries || unbounded_cache_is_exact(ns->ub))
        return NC_OK;
    char p[1300];
    snprintf(p, sizeof p, "%s/" KEYS_FILE, ns->dir);
    int rc = unbounded_cache_keys_read(ns->ub, p, (int64_t)entries, err, errlen);
    if (rc == NC_ENOTFOUND)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: holds the keys of fewer than the %llu pairs of %s", p,
                      (unsigned long long)entries, sdir);
    return rc;
}

/* The documents of snapshot dir sdir (docs.bin) pushed into ns. */
static int load_docs(nc_nsstore *ns, const char *sdir, char *err, size_t errlen)
{
    char p[1300];
    unsigned char *b = NULL;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/docs.bin", sdir);
    int rc = read_whole(p, &b, &len, err, errlen);
    if (!rc) {
        uint32_t nd = 0;
        if (len < 12 || memcmp(b, DOCS_MAGIC, 8) != 0)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: not a documents file", p);
        else
            memcpy(&nd, b + 8, 4);
        size_t k = 12;
        for (uint32_t i = 0; !rc && i < nd; i++) {
            uint32_t l = 0;
            if (len - k < 4 || (memcpy(&l, b + k, 4), l > len - k - 4) || !nsstore_valid_doc_id((const char *)b + k + 4, l))
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: bad document %u", p, i);
            else
                rc = nsstore_doc_push(ns, (const char *)b + k + 4, l, err, errlen);
            k += 4 + (rc ? 0 : l);
        }
    }
    free(b);
    return rc;
}

/* The provenance of the snapshot's entries pairs (prov.bin) into ns, each
 * pair counted in its document (load_docs first). */
static int load_prov(nc_nsstore *ns, const char *sdir, uint64_t entries, char *err, size_t errlen)
{
    char p[1300];
    unsigned char *b = NULL;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/prov.bin", sdir);
    int rc = read_whole(p, &b, &len, err, errlen);
    if (!rc) {
        uint64_t n = 0;
        if (len < 16 || memcmp(b, PROV_MAGIC, 8) != 0 || (memcpy(&n, b + 8, 8), n != entries) ||
            len != 16 + 8 * n)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: not the provenance of %llu pairs", p,
                          (unsigned long long)entries);
        else {
            ns->prov_doc = malloc((n ? n : 1) * 4);
            ns->prov_off = malloc((n ? n : 1) * 4);
            if (!ns->prov_doc || !ns->prov_off)
                rc = nc_error(err, errlen, NC_ENOMEM, "provenance");
            else {
                memcpy(ns->prov_doc, b + 16, n * 4);
                memcpy(ns->prov_off, b + 16 + n * 4, n * 4);
                ns->nprov = ns->provcap = n;
                for (uint64_t i = 0; !rc && i < n; i++) {
                    uint32_t d = ns->prov_doc[i];
                    if (d == NSSTORE_NO_DOC)
                        continue;
                    if (d >= ns->ndocs)
                        rc = nc_error(err, errlen, NC_EFORMAT, "%s: pair %llu of unknown document %u", p,
                                      (unsigned long long)i, d);
                    else
                        ns->doc_pairs[d]++;
                }
            }
        }
    }
    free(b);
    return rc;
}

/* Loads snapshot seq into ns (fresh word table and cache). */
int nsstore_snapshot_load(nc_nsstore *ns, uint64_t seq, char *err, size_t errlen)
{
    NC_ASSERT(ns, "nsstore_snapshot_load: no namespace (snapshot %llu)", (unsigned long long)seq);
    char sdir[1200];
    nsstore_snapshot_path(ns, seq, "", sdir, sizeof sdir);
    uint64_t entries = 0;
    int64_t keys = -1;
    int rc = verify_snapshot(sdir, seq, &entries, &keys, err, errlen);
    if (!rc)
        rc = wordtable_new(ns->m->vocab, &ns->words, err, errlen);
    if (!rc)
        rc = unbounded_cache_load(&ns->ubo, ns->words, sdir, &ns->ub, err, errlen);
    if (!rc && (uint64_t)unbounded_cache_count(ns->ub) != entries)
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: %lld pairs, the manifest says %llu", sdir,
                      (long long)unbounded_cache_count(ns->ub), (unsigned long long)entries);
    if (!rc)
        rc = load_keys(ns, sdir, entries, keys, err, errlen);
    if (!rc)
        rc = load_docs(ns, sdir, err, errlen);
    if (!rc)
        rc = load_prov(ns, sdir, entries, err, errlen);
    if (!rc) {
        nc_ub_train_stats st;   /* the trainings it holds: one more is a snapshot due */
        unbounded_cache_train_stats(ns->ub, &st);
        ns->snap_trainings = st.trainings;
    }
    if (rc) {
        unbounded_cache_free(ns->ub);
        wordtable_free(ns->words);
        ns->ub = NULL;
        ns->words = NULL;
        nsstore_free_meta(ns);
    }
    return rc;
}
