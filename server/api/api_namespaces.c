/* api_namespaces.c -- the namespace endpoints (api_namespaces.h): list,
 * inspect, delete, the document list and the streaming document upload
 * (the pipeline is uploads.h's, the registry namespaces.h's). */
#include "api_namespaces.h"

#include <errno.h>
#include <microhttpd.h>
#include <sys/stat.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_errors.h"
#include "backup.h"
#include "slog.h"
#include "metrics.h"
#include "namespaces.h"
#include "uploads.h"

/* The uploads in progress into r, as GET /v1/namespaces/{ns} shows them. */
static json_t *uploads_json(nc_server *srv, ns_handle *r)
{
    json_t *a = json_array();
    upload_status *up = NULL;
    size_t n = uploads_in_progress(srv, r, &up);
    for (size_t i = 0; i < n; i++) {
        const upload_status *p = &up[i];
        json_array_append_new(a, json_pack("{s:s,s:I,s:I,s:I,s:f,s:f}", "document", p->document, "documents",
                                           (json_int_t)p->documents, "bytes_received", (json_int_t)p->bytes,
                                           "tokens_added", (json_int_t)p->tokens_added, "seconds", p->seconds,
                                           "tokens_per_second",
                                           p->seconds > 0 ? (double)p->tokens_added / p->seconds : 0.0));
    }
    free(up);
    return a;
}

/* Bytes a stored pair takes, in memory (the shared precomputed table
 * apart: pq_tables.h) and on disk (log + snapshots), over the namespace's
 * pairs; 0 while it has none. */
static json_t *per_entry_json(const nc_nsstore_stats *st)
{
    double n = st->entries > 0 ? (double)st->entries : 0.0;
    return json_pack("{s:f,s:f}", "memory", n > 0 ? (double)st->memory_bytes / n : 0.0, "disk",
                     n > 0 ? (double)st->disk_bytes / n : 0.0);
}

/* The index's own training (docs/namespaces.md "The index's own
 * training"): what it searches, what was measured at its last training,
 * and the one in progress. */
static json_t *training_json(const nc_nsstore_stats *st)
{
    const nc_ub_train_stats *t = &st->train;
    json_t *o = json_pack("{s:b,s:b,s:I,s:f,s:I,s:I,s:I,s:f,s:I}", "own", t->own, "keys", t->keys,
                          "nlist", (json_int_t)t->nlist, "imbalance", t->imbalance, "trainings",
                          (json_int_t)t->trainings, "trained_on", (json_int_t)t->trained_on, "next_at",
                          (json_int_t)t->next_at, "recall_target", t->recall_target, "failures",
                          (json_int_t)t->failures);
    if (!o)
        return NULL;
    json_object_set_new(o, "recall", t->recall >= 0.0 ? json_real(t->recall) : json_null());
    json_object_set_new(o, "last_seconds", t->trainings ? json_real(t->last_seconds) : json_null());
    json_object_set_new(o, "in_progress",
                        t->phase == NC_UB_TRAIN_IDLE
                            ? json_null()
                            : json_pack("{s:s,s:I,s:f}", "phase", unbounded_cache_phase_name(t->phase), "target",
                                        (json_int_t)t->target, "progress", t->progress));
    return o;
}

static json_t *ns_json(nc_server *srv, ns_handle *r)
{
    nc_nsstore_stats st;
    nsstore_stats(namespaces_store(r), &st);
    char fp[24];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)st.fingerprint);
    char idx[160];
    if (st.exact)
        snprintf(idx, sizeof idx, "Flat");
    else if (st.train.trained_on > 0)   /* its own training's shape */
        snprintf(idx, sizeof idx, "IVF%lld,PQ (own)", (long long)st.train.nlist);
    else
        snprintf(idx, sizeof idx, "%s", st.factory ? st.factory : "IVF");
    json_t *o = json_pack("{s:s,s:I,s:I,s:i,s:I,s:{s:s,s:b,s:i},s:I,s:I,s:I,s:{s:I,s:I,s:f,s:f},s:I,s:o}", "name",
                     namespaces_name(r), "incarnation", (json_int_t)namespaces_incarnation(r),
                     "entries", (json_int_t)st.entries, "words", st.words, "documents", (json_int_t)st.docs,
                     "index", "type", idx, "exact", st.exact, "nprobe", st.nprobe,
                     "disk_bytes", (json_int_t)st.disk_bytes, "wal_bytes", (json_int_t)st.wal_bytes,
                     "memory_bytes", (json_int_t)st.memory_bytes,
                     "log", "last_seq", (json_int_t)st.last_seq, "synced_seq", (json_int_t)st.synced_seq,
                     "snapshot_age", st.snapshot_age, "snapshot_seconds", st.snapshot_seconds,
                     "fsyncs", (json_int_t)st.fsyncs, "uploads", uploads_json(srv, r));
    if (o) {
        json_object_set_new(o, "storage", json_string(st.compact ? "compact" : "keys"));
        json_object_set_new(o, "bytes_per_entry", per_entry_json(&st));
        json_t *ix = json_object_get(o, "index");
        if (ix && st.fingerprint)
            json_object_set_new(ix, "fingerprint", json_string(fp));
        if (ix)
            json_object_set_new(ix, "training", training_json(&st));
    }
    return o;
}

/* PUT /v1/namespaces/{ns} {"storage": "keys" | "compact"}: creates the
 * namespace with that storage (201), or finds it made with it (200); one
 * made with the other storage is 409 (storage is fixed at creation). */
void api_h_ns_create(nc_server *srv, http_request *req, http_response *resp)
{
    const char *storage = "keys", *key;
    json_t *v;
    json_object_foreach(req->json, key, v) {
        if (strcmp(key, "storage") != 0) {
            http_reply_error(resp, API_UNKNOWN_FIELD, "unknown field '%s' (a namespace takes \"storage\")", key);
            return;
        }
        if (!json_is_string(v) || (strcmp(json_string_value(v), "keys") && strcmp(json_string_value(v), "compact"))) {
            http_reply_error(resp, API_OUT_OF_RANGE, "field 'storage' must be \"keys\" or \"compact\"");
            return;
        }
        storage = json_string_value(v);
    }
    char err[NC_ERRLEN] = "";
    ns_create c = {.name = req->params[0], .create = true, .compact = !strcmp(storage, "compact")};
    ns_handle *r = namespaces_create(srv, &c, err, sizeof err);
    if (!r) {
        http_reply_error(resp, api_error_from_namespace(c.rc), "%s", err);
        return;
    }
    nc_nsstore_stats st;
    nsstore_stats(namespaces_store(r), &st);
    if (st.compact != c.compact)
        http_reply_error(resp, API_CONFLICT, "namespace '%s' exists with %s storage, fixed at its creation: delete it "
                         "first to make it %s", c.name, st.compact ? "compact" : "keys", storage);
    else
        http_reply_json(resp, c.created ? 201 : 200, ns_json(srv, r));
    namespaces_release(srv, r);
}

typedef struct {
    nc_server *srv;
    json_t *list;
} ns_list;

static void list_one(ns_handle *r, void *ctx)
{
    ns_list *l = ctx;
    json_array_append_new(l->list, ns_json(l->srv, r));
}

void api_h_ns_list(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    ns_list l = {srv, json_array()};
    namespaces_each(srv, list_one, &l);
    http_reply_json(resp, 200, json_pack("{s:o}", "namespaces", l.list));
}

void api_h_ns_get(nc_server *srv, http_request *req, http_response *resp)
{
    char err[NC_ERRLEN] = "";
    ns_handle *r = namespaces_acquire(srv, req->params[0], false, err, sizeof err);
    if (!r) {
        http_reply_error(resp, API_NOT_FOUND, "%s", err);
        return;
    }
    http_reply_json(resp, 200, ns_json(srv, r));
    namespaces_release(srv, r);
}

void api_h_ns_delete(nc_server *srv, http_request *req, http_response *resp)
{
    const char *name = req->params[0];
    const char *confirm = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "confirm");
    if (!confirm || strcmp(confirm, name) != 0) {
        http_reply_error(resp, API_CONFIRMATION_REQUIRED,
                         "deleting namespace '%s' removes every document streamed into it: confirm with "
                         "?confirm=%s", name, name);
        return;
    }
    char err[NC_ERRLEN] = "";
    int64_t entries = 0;
    uint64_t incarnation = 0, tomb = 0;
    /* The other replicas delete it too (its tombstone: replication.h;
     * none without Redis). */
    if (namespaces_delete(srv, name, 0, &entries, &incarnation, &tomb, err, sizeof err) != 0) {
        http_reply_error(resp, API_NOT_FOUND, "%s", err);
        return;
    }
    json_t *o = json_pack("{s:s,s:b,s:I,s:I}", "name", name, "deleted", 1, "entries", (json_int_t)entries,
                          "incarnation", (json_int_t)incarnation);
    if (o && tomb)
        json_object_set_new(o, "tombstone", json_integer((json_int_t)tomb));
    http_reply_json(resp, 200, o);
}

void api_h_ns_docs_list(nc_server *srv, http_request *req, http_response *resp)
{
    char err[NC_ERRLEN] = "";
    ns_handle *r = namespaces_acquire(srv, req->params[0], false, err, sizeof err);
    if (!r) {
        http_reply_error(resp, API_NOT_FOUND, "%s", err);
        return;
    }
    json_t *a = json_array();
    uint32_t n = nsstore_doc_count(namespaces_store(r));
    for (uint32_t i = 0; i < n; i++) {
        char id[1100];
        uint64_t pairs = 0;
        if (nsstore_doc_info(namespaces_store(r), i, id, sizeof id, &pairs) == NC_OK)
            json_array_append_new(a, json_pack("{s:s,s:I}", "id", id, "tokens", (json_int_t)pairs));
    }
    namespaces_release(srv, r);
    http_reply_json(resp, 200, json_pack("{s:s,s:o}", "namespace", req->params[0], "documents", a));
}

/* The upload of this request, opened on its first piece (the namespace
 * from the path, plain text or NDJSON from its Content-Type, a plain
 * document's id from ?id=, ?normalize=false for text already in the
 * model's conventions); NULL when out of memory. */
static upload *request_upload(nc_server *srv, http_request *req)
{
    if (!req->user) {
        const char *ct = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        const char *id = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "id");
        const char *norm = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "normalize");
        req->user = upload_open(srv, req->params[0], ct, id, norm);
        if (req->user)
            req->user_free = upload_free;
    }
    return req->user;
}

void api_h_ns_documents(nc_server *srv, http_request *req, http_response *resp)
{
    upload *u = request_upload(srv, req);
    if (!resp) {
        if (u)
            upload_chunk(u, req->chunk, req->chunk_len);
        return;   /* without u: answered 500 at the end */
    }
    if (!u) {
        http_reply_error(resp, API_INTERNAL, "out of memory");
        return;
    }
    upload_result res;
    if (upload_finish(u, &res) != 0) {
        http_reply_error(resp, res.code, "%s (%llu documents, %llu tokens were added before this)", res.msg,
                         (unsigned long long)res.documents, (unsigned long long)res.tokens_added);
        return;
    }
    metrics_add_tokens_fed(res.tokens_added);
    http_reply_json(resp, 200, json_pack("{s:s,s:I,s:I,s:O,s:I,s:I}", "namespace", res.ns, "documents",
                                         (json_int_t)res.documents, "tokens_added", (json_int_t)res.tokens_added,
                                         "ids", res.ids, "entries", (json_int_t)res.entries, "incarnation",
                                         (json_int_t)res.incarnation));
}

/* ---- backup ------------------------------------------------------------------ */

static bool backup_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 100 || s[0] == '.')
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-' || *s == '.'))
            return false;
    return true;
}

/* {"name": backup name (default backup-<UTC time>), "namespace": one} into
 * *name (a default made) and *ns (NULL = all); false with the error sent. */
static bool backup_args(http_request *req, http_response *resp, char *name, size_t len, const char **ns)
{
    const char *key;
    json_t *v;
    *ns = NULL;
    name[0] = 0;
    json_object_foreach(req->json, key, v) {
        if (strcmp(key, "name") && strcmp(key, "namespace")) {
            http_reply_error(resp, API_UNKNOWN_FIELD, "unknown field '%s' (name, namespace)", key);
            return false;
        }
        if (!json_is_string(v)) {
            http_reply_error(resp, API_INVALID_TYPE, "'%s' must be a string", key);
            return false;
        }
        if (!strcmp(key, "namespace"))
            *ns = json_string_value(v);
        else
            snprintf(name, len, "%s", json_string_value(v));
    }
    if (name[0] && !backup_name_ok(name)) {
        http_reply_error(resp, API_OUT_OF_RANGE, "'name' must be 1-100 characters of [A-Za-z0-9_.-], not "
                         "starting with '.'");
        return false;
    }
    if (!name[0]) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char when[32];
        strftime(when, sizeof when, "%Y%m%dT%H%M%S", &tm);
        snprintf(name, len, "backup-%s.%03ldZ", when, ts.tv_nsec / 1000000);
    }
    return true;
}

void api_h_backup(nc_server *srv, http_request *req, http_response *resp)
{
    char name[128], dir[1400], err[NC_ERRLEN] = "";
    const char *ns;
    if (!backup_args(req, resp, name, sizeof name, &ns))
        return;
    if (!srv->cfg.data_dir[0]) {
        http_reply_error(resp, API_CONFLICT, "no data_dir: the namespaces are not durable, nothing to back up");
        return;
    }
    snprintf(dir, sizeof dir, "%.1000s/backups", srv->cfg.data_dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        http_reply_error(resp, API_STORAGE_UNAVAILABLE, "%s: %s", dir, strerror(errno));
        return;
    }
    snprintf(dir, sizeof dir, "%.1000s/backups/%s", srv->cfg.data_dir, name);
    backup_spec s = {.dst = dir, .ns = ns};
    json_t *summary = NULL;
    int rc = backup_take(srv, &s, &summary, err, sizeof err);
    if (rc) {
        http_reply_error(resp, rc == NC_ESTATE ? API_CONFLICT : api_error_from_namespace(rc), "backup: %s", err);
        return;
    }
    json_object_set_new(summary, "name", json_string(name));
    slog(SLOG_INFO, "backup taken", json_pack("{s:s,s:O}", "path", dir, "seconds", json_object_get(summary, "seconds")));
    http_reply_json(resp, 200, summary);
}
