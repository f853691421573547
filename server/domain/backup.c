/* backup.c -- backups of the daemon's namespaces: taking one (online or of
 * the files), its manifest, verifying and restoring it (backup.h). */
#include "backup.h"
#include "nsbackup.h"
#include "compute.h"
#include "namespaces.h"
#include "nsstore.h"
#include "stream.h"
#include "wal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- the manifest ---------------------------------------------------------- */

static json_t *hex64(uint64_t v)
{
    char b[20];
    snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return json_string(b);
}

/* The manifest's head: format, time, the model and the file formats. */
static json_t *manifest_head(const nc_model *m)
{
    char when[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *model = json_pack("{s:o,s:i,s:i,s:i}", "fingerprint", hex64(model_fingerprint(m)), "vocab_size",
                              m->cfg.vocab_size, "hidden_size", m->cfg.hidden_size, "num_layers", m->cfg.num_layers);
    json_t *formats = json_pack("{s:i,s:i,s:i}", "snapshot", NSSTORE_SNAPSHOT_VERSION, "log", WAL_FORMAT_VERSION,
                                "session_blob", STREAM_BLOB_VERSION);
    return json_pack("{s:s,s:i,s:s,s:s,s:o,s:o,s:[]}", "format", "neurocache-backup", "version",
                     BACKUP_FORMAT_VERSION, "created", when, "neurocache", NC_VERSION, "model", model, "formats",
                     formats, "namespaces");
}

/* One namespace's entry; its files' paths relative to the backup. */
static json_t *manifest_ns(const char *name, const nc_backup_ns *b, uint64_t index_fp)
{
    json_t *files = json_array();
    for (int i = 0; i < b->nfiles; i++) {
        char path[300];
        snprintf(path, sizeof path, "namespaces/%.100s/%.127s", name, b->files[i].path);
        json_array_append_new(files, json_pack("{s:s,s:I,s:I}", "path", path, "size", (json_int_t)b->files[i].size,
                                               "crc32", (json_int_t)b->files[i].crc));
    }
    return json_pack("{s:s,s:s,s:o,s:I,s:I,s:I,s:I,s:I,s:o}", "name", name, "storage", b->compact ? "compact" : "keys",
                     "index_fingerprint", index_fp ? hex64(index_fp) : json_null(), "snapshot_seq",
                     (json_int_t)b->snapshot_seq, "position", (json_int_t)b->position, "entries",
                     (json_int_t)b->entries, "records", (json_int_t)b->records, "bytes", (json_int_t)b->bytes,
                     "files", files);
}

/* Writes j as dir/name atomically: a temporary file fsynced, renamed, the
 * directory fsynced. */
static int write_json_atomic(const char *dir, const char *name, json_t *j, char *err, size_t errlen)
{
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof tmp, "%.1000s/%.1000s.tmp", dir, name);
    snprintf(path, sizeof path, "%.1000s/%.1000s", dir, name);
    char *text = json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS);
    FILE *f = text ? fopen(tmp, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (f && fclose(f) != 0)
        ok = false;
    free(text);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return nc_error(err, errlen, e == ENOSPC ? NC_ENOSPACE : NC_EIO, "%s: %s", path, strerror(e));
    }
    return backup_sync_dir(dir, err, errlen);
}

/* The summary an answer shows: the manifest without the files. */
static json_t *summary_of(json_t *man, const char *dir, double seconds)
{
    json_t *s = json_deep_copy(man);
    size_t i;
    json_t *ns;
    json_array_foreach(json_object_get(s, "namespaces"), i, ns)
        json_object_del(ns, "files");
    json_object_set_new(s, "path", json_string(dir));
    json_object_set_new(s, "seconds", json_real(seconds));
    return s;
}

/* dst and dst/namespaces made; NC_ESTATE when dst exists. */
static int make_dirs(const char *dst, char *err, size_t errlen)
{
    char p[4096];
    snprintf(p, sizeof p, "%.1000s/namespaces", dst);
    if (mkdir(dst, 0755) != 0)
        return nc_error(err, errlen, errno == EEXIST ? NC_ESTATE : NC_EIO, "%s: %s%s", dst, strerror(errno),
                        errno == EEXIST ? " (a backup goes to a new directory)" : "");
    if (mkdir(p, 0755) != 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", p, strerror(errno));
    return NC_OK;
}

/* The end of a backup begun at t0: the manifest in place (success), or
 * dst removed. */
typedef struct {
    const char *dst;
    json_t *man;                  /* stolen */
    double t0;
} backup_end;

static int finish(const backup_end *e, int rc, json_t **summary, char *err, size_t errlen)
{
    const char *dst = e->dst;
    json_t *man = e->man;
    double t0 = e->t0;
    if (!rc) {
        char ns[4096];
        snprintf(ns, sizeof ns, "%.1000s/namespaces", dst);
        rc = backup_sync_dir(ns, err, errlen);
    }
    if (!rc)
        rc = write_json_atomic(dst, BACKUP_MANIFEST, man, err, errlen);
    if (!rc)
        *summary = summary_of(man, dst, nc_now_s() - t0);
    else
        nsstore_remove_dir(dst, NULL, 0);
    json_decref(man);
    return rc;
}

/* ---- online ---------------------------------------------------------------- */

typedef struct {
    const char *dst;
    json_t *list;
    int rc;
    char *err;
    size_t errlen;
} online_run;

static void backup_one(ns_handle *h, void *ctx)
{
    online_run *o = ctx;
    if (o->rc)
        return;
    const char *name = namespaces_name(h);
    nc_nsstore *ns = namespaces_store(h);
    char dir[4096];
    snprintf(dir, sizeof dir, "%.1000s/namespaces/%.1000s", o->dst, name);
    nc_backup_ns b;
    o->rc = nsstore_backup(ns, dir, &b, o->err, o->errlen);
    if (!o->rc) {
        nc_nsstore_stats st;
        nsstore_stats(ns, &st);
        json_array_append_new(o->list, manifest_ns(name, &b, st.fingerprint));
    }
    backup_ns_free(&b);
}

static int backup_take_niced(nc_server *srv, const backup_spec *s, json_t **summary, char *err, size_t errlen);

/* The copy runs on the request's connection thread at the heavy workers'
 * nice value (workguard_nice_thread), as an upload's threads do: reading,
 * checksumming and writing a 1M-pair namespace keeps a core busy for
 * seconds, which predicts (nice 0) must be able to take at once. */
int backup_take(nc_server *srv, const backup_spec *s, json_t **summary, char *err, size_t errlen)
{
    int before;
    pid_t niced = workguard_nice_thread(srv->cfg.worker_nice, &before);
    int rc = backup_take_niced(srv, s, summary, err, errlen);
    /* back for the connection's next request; lowering it needs
     * CAP_SYS_NICE: refused, the thread stays nice until its connection
     * closes (only this client's next requests are slower) */
    if (niced)
        (void)setpriority(PRIO_PROCESS, (id_t)niced, before);
    return rc;
}

static int backup_take_niced(nc_server *srv, const backup_spec *s, json_t **summary, char *err, size_t errlen)
{
    *summary = NULL;
    double t0 = nc_now_s();
    ns_handle *one = NULL;
    if (s->ns) {
        int rc;
        if (!(one = namespaces_acquire_rc(srv, s->ns, false, &rc, err, errlen)))
            return rc ? rc : NC_ENOTFOUND;
    }
    int rc = make_dirs(s->dst, err, errlen);
    if (rc) {
        if (one)
            namespaces_release(srv, one);
        return rc;
    }
    json_t *man = manifest_head(srv->model);
    online_run o = {.dst = s->dst, .list = json_object_get(man, "namespaces"), .err = err, .errlen = errlen};
    if (one) {
        backup_one(one, &o);
        namespaces_release(srv, one);
    } else {
        namespaces_each(srv, backup_one, &o);
    }
    backup_end e = {.dst = s->dst, .man = man, .t0 = t0};
    return finish(&e, o.rc, summary, err, errlen);
}

/* ---- of the files (neurocache backup) -------------------------------------- */

/* The namespace directories of data_dir/namespaces (not those of deleted
 * incarnations), or only ns. */
static bool wanted_dir(const char *name, const char *ns)
{
    return name[0] != '.' && !strstr(name, ".deleted-") && (!ns || !strcmp(name, ns));
}

/* A compact store's training fingerprint (its storage file), 0 with keys. */
static uint64_t storage_fingerprint(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%.1000s/storage", dir);
    FILE *f = fopen(p, "r");
    unsigned long long fp = 0;
    if (f) {
        if (fscanf(f, "compact %16llx", &fp) != 1)
            fp = 0;
        fclose(f);
    }
    return fp;
}

/* One namespace's files; a snapshot or segment pruned by a running daemon
 * meanwhile: its partial copy removed and taken again (a few times). */
static int files_one(const char *src, const char *dst, uint32_t tag, nc_backup_ns *b, char *err, size_t errlen)
{
    int rc = NC_ENOTFOUND;
    for (int attempt = 0; attempt < 5 && rc == NC_ENOTFOUND; attempt++) {
        if (attempt)
            nsstore_remove_dir(dst, NULL, 0);
        backup_ns_free(b);
        rc = backup_dir_copy(src, tag, dst, b, err, errlen);
    }
    return rc;
}

int backup_take_files(const char *data_dir, const nc_model *m, const backup_spec *s, json_t **summary, char *err,
                      size_t errlen)
{
    *summary = NULL;
    double t0 = nc_now_s();
    char root[4096];
    snprintf(root, sizeof root, "%.1000s/namespaces", data_dir);
    DIR *d = opendir(root);
    if (!d)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s (not a data directory?)", root,
                        strerror(errno));
    int rc = make_dirs(s->dst, err, errlen);
    if (rc) {   /* the destination is not ours: left as it is */
        closedir(d);
        return rc;
    }
    json_t *man = manifest_head(m);
    json_t *list = json_object_get(man, "namespaces");
    uint32_t tag = nsstore_model_tag(m);
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        if (!wanted_dir(e->d_name, s->ns))
            continue;
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%.1000s/%.1000s", root, e->d_name);
        snprintf(dst, sizeof dst, "%.1000s/namespaces/%.1000s", s->dst, e->d_name);
        nc_backup_ns b = {0};
        rc = files_one(src, dst, tag, &b, err, errlen);
        if (!rc)
            json_array_append_new(list, manifest_ns(e->d_name, &b, storage_fingerprint(src)));
        backup_ns_free(&b);
    }
    closedir(d);
    if (!rc && s->ns && json_array_size(list) == 0)
        rc = nc_error(err, errlen, NC_ENOTFOUND, "no namespace '%s' in %s", s->ns, root);
    backup_end end = {.dst = s->dst, .man = man, .t0 = t0};
    return finish(&end, rc, summary, err, errlen);
}

/* ---- verify and restore ---------------------------------------------------- */

/* The manifest's head against this build and model m. */
static int check_head(const char *path, json_t *man, const nc_model *m, char *err, size_t errlen)
{
    const char *fmt = json_string_value(json_object_get(man, "format"));
    json_int_t ver = json_integer_value(json_object_get(man, "version"));
    if (!fmt || strcmp(fmt, "neurocache-backup") || ver < 1)
        return nc_error(err, errlen, NC_EFORMAT, "%s: not a neurocache backup manifest", path);
    if (ver > BACKUP_FORMAT_VERSION)
        return nc_error(err, errlen, NC_ESTATE, "%s: backup format version %lld is newer than this build reads "
                        "(version %d): restore it with a later neurocache", path, (long long)ver,
                        BACKUP_FORMAT_VERSION);
    json_t *mo = json_object_get(man, "model");
    const char *fp = json_string_value(json_object_get(mo, "fingerprint"));
    char mine[20];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)model_fingerprint(m));
    if (!fp || strcmp(fp, mine))
        return nc_error(err, errlen, NC_ESTATE,
                        "%s: a backup of another model (fingerprint %s, V=%lld H=%lld L=%lld); this model "
                        "has fingerprint %s (V=%d H=%d L=%d): restore it with the model it was taken with",
                        path, fp ? fp : "?", (long long)json_integer_value(json_object_get(mo, "vocab_size")),
                        (long long)json_integer_value(json_object_get(mo, "hidden_size")),
                        (long long)json_integer_value(json_object_get(mo, "num_layers")), mine,
                        m->cfg.vocab_size, m->cfg.hidden_size, m->cfg.num_layers);
    return NC_OK;
}

/* Every file the manifest lists, against its size and CRC-32. */
static int check_files(const char *dir, json_t *man, char *err, size_t errlen)
{
    size_t i, k;
    json_t *ns, *f;
    json_array_foreach(json_object_get(man, "namespaces"), i, ns) {
        json_array_foreach(json_object_get(ns, "files"), k, f) {
            nc_backup_file bf = {.size = (uint64_t)json_integer_value(json_object_get(f, "size")),
                                 .crc = (uint32_t)json_integer_value(json_object_get(f, "crc32"))};
            const char *p = json_string_value(json_object_get(f, "path"));
            if (!p || strstr(p, ".."))
                return nc_error(err, errlen, NC_EFORMAT, "%s: bad file entry in the manifest", dir);
            snprintf(bf.path, sizeof bf.path, "%s", p);
            int rc = backup_file_check(dir, &bf, err, errlen);
            if (rc)
                return rc == NC_ENOTFOUND ? NC_EFORMAT : rc;
        }
    }
    return NC_OK;
}

int backup_verify(const char *dir, const nc_model *m, json_t **manifest, char *err, size_t errlen)
{
    if (manifest)
        *manifest = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%.1000s/" BACKUP_MANIFEST, dir);
    if (access(path, F_OK) != 0)
        return nc_error(err, errlen, NC_ENOTFOUND, "%s: no manifest: not a backup, or an incomplete one (the "
                        "manifest is written last; a backup interrupted has none)", dir);
    json_error_t je;
    json_t *man = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!man)
        return nc_error(err, errlen, NC_EFORMAT, "%s: %s", path, je.text);
    int rc = check_head(path, man, m, err, errlen);
    if (!rc)
        rc = check_files(dir, man, err, errlen);
    if (!rc && manifest)
        *manifest = man;
    else
        json_decref(man);
    return rc;
}

/* The directories of path below base (path = base/...), made as needed. */
static int make_parents(const char *base, const char *path, char *err, size_t errlen)
{
    char part[4096];
    snprintf(part, sizeof part, "%s", path);
    for (char *s = part + strlen(base) + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(part, 0755) != 0 && errno != EEXIST)
            return nc_error(err, errlen, NC_EIO, "%s: %s", part, strerror(errno));
        *s = '/';
    }
    return NC_OK;
}

/* Copies the listed files of namespace ns from backup from to data_dir
 * (NC_ESTATE, nothing copied, when a namespace of its name is there). */
static int restore_ns(const char *from, const char *data_dir, json_t *ns, char *err, size_t errlen)
{
    const char *name = json_string_value(json_object_get(ns, "name"));
    char dst[4096];
    snprintf(dst, sizeof dst, "%.1000s/namespaces/%.1000s", data_dir, name ? name : "");
    if (!name || strchr(name, '/') || name[0] == '.')
        return nc_error(err, errlen, NC_EFORMAT, "%s: bad namespace name in the manifest", from);
    if (access(dst, F_OK) == 0)
        return nc_error(err, errlen, NC_ESTATE, "%s exists: a backup restores into a namespace of that name "
                        "only when there is none (delete it first, or restore into another data directory)", dst);
    size_t k;
    json_t *f;
    int rc = NC_OK;
    json_array_foreach(json_object_get(ns, "files"), k, f) {
        const char *p = json_string_value(json_object_get(f, "path"));
        char src[4096], to[4096], dir[4096];
        snprintf(src, sizeof src, "%.1000s/%.1000s", from, p);
        snprintf(to, sizeof to, "%.1000s/%.1000s", data_dir, p);
        snprintf(dir, sizeof dir, "%s", to);
        *strrchr(dir, '/') = 0;
        uint64_t size;
        uint32_t crc;
        rc = make_parents(data_dir, to, err, errlen);
        if (!rc)
            rc = backup_copy_file(src, to, &size, &crc, err, errlen);
        if (!rc)
            rc = backup_sync_dir(dir, err, errlen);
        if (rc)
            break;
    }
    /* the mark of a store with the index's own training (nsstore.h) */
    char mark[4096], to[4096];
    snprintf(mark, sizeof mark, "%.1000s/namespaces/%.1000s/" NSSTORE_TRAINING_MARK, from, name);
    snprintf(to, sizeof to, "%.1000s/" NSSTORE_TRAINING_MARK, dst);
    if (!rc && access(mark, F_OK) == 0 && access(dst, F_OK) == 0 && mkdir(to, 0755) != 0 && errno != EEXIST)
        rc = nc_error(err, errlen, NC_EIO, "%s: %s", to, strerror(errno));
    return rc;
}

int backup_restore(const char *from, const char *data_dir, const nc_model *m, json_t **summary, char *err,
                   size_t errlen)
{
    *summary = NULL;
    double t0 = nc_now_s();
    json_t *man;
    int rc = backup_verify(from, m, &man, err, errlen);
    if (rc)
        return rc;
    char root[4096];
    snprintf(root, sizeof root, "%.1000s/namespaces", data_dir);
    if (mkdir(data_dir, 0755) != 0 && errno != EEXIST)
        rc = nc_error(err, errlen, NC_EIO, "%s: %s", data_dir, strerror(errno));
    if (!rc && mkdir(root, 0755) != 0 && errno != EEXIST)
        rc = nc_error(err, errlen, NC_EIO, "%s: %s", root, strerror(errno));
    size_t i;
    json_t *ns;
    /* every name free before anything is copied */
    json_array_foreach(json_object_get(man, "namespaces"), i, ns) {
        char dst[4096];
        snprintf(dst, sizeof dst, "%.1000s/%.1000s", root, json_string_value(json_object_get(ns, "name")));
        if (!rc && access(dst, F_OK) == 0)
            rc = restore_ns(from, data_dir, ns, err, errlen);   /* NC_ESTATE, saying so */
    }
    json_array_foreach(json_object_get(man, "namespaces"), i, ns) {
        if (!rc)
            rc = restore_ns(from, data_dir, ns, err, errlen);
    }
    if (!rc)
        rc = backup_sync_dir(root, err, errlen);
    if (!rc)
        *summary = summary_of(man, data_dir, nc_now_s() - t0);
    json_decref(man);
    return rc;
}

int backup_startup_check(const char *data_dir, const nc_model *m, char *err, size_t errlen)
{
    char path[4096], aside[4096];
    snprintf(path, sizeof path, "%.1000s/" BACKUP_MANIFEST, data_dir);
    if (access(path, F_OK) != 0)
        return NC_OK;
    int rc = backup_verify(data_dir, m, NULL, err, errlen);
    if (rc)
        return rc;
    /* verified once: from now on the daemon writes here, and a data
     * directory is not a backup any more */
    snprintf(aside, sizeof aside, "%.1000s.restored", path);
    if (rename(path, aside) != 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    return backup_sync_dir(data_dir, err, errlen);
}
