/* namespaces.h -- the daemon's namespaces: a registry of durable namespace
 * stores (store/nsstore.h) under data_dir/namespaces/<name>, recovered at
 * start-up (before /ready turns 200), snapshotted periodically by a
 * background thread and once at shutdown, and the pieces sessions use:
 * binding a session to its namespace, feed with "adapt" (logged, durable
 * before the answer) and predict with "explain". The endpoints are the
 * API's (api_namespaces.h), document uploads are uploads.h's; whoever
 * must know of every store opened (replication) listens through
 * nc_server.namespace_opened. */
#ifndef NC_SERVER_NAMESPACES_H
#define NC_SERVER_NAMESPACES_H

#include <jansson.h>

#include "nsstore.h"
#include "server.h"
#include "sessions.h"

typedef struct ns_registry ns_registry;
typedef struct ns_handle ns_handle;

/* Creates srv->namespaces and recovers every namespace found in
 * data_dir/namespaces (an empty data_dir = a private temporary directory,
 * not durable, removed at exit). Returns 0, or -1 with a message naming the
 * namespace and the file at fault. Starts the snapshot thread. */
int namespaces_init(nc_server *srv, char *err, size_t errlen);
/* Stops the snapshot thread, snapshots every namespace, closes them. */
void namespaces_shutdown(nc_server *srv);

/* A held namespace (opened, or created when create). NULL with a message
 * (bad name, I/O error...). Release once. */
ns_handle *namespaces_acquire(nc_server *srv, const char *name, bool create, char *err, size_t errlen);
/* The same, with the failure's NC_ code in *rc: NC_EINVAL a bad name,
 * NC_ENOTFOUND no such namespace, else opening its store's (NC_EIO,
 * NC_ENOSPACE, NC_EFORMAT, NC_ENOMEM). */
ns_handle *namespaces_acquire_rc(nc_server *srv, const char *name, bool create, int *rc, char *err, size_t errlen);
/* The same, a new namespace made with compact storage when c->compact
 * (nsstore.h; an existing one keeps its storage: compare
 * nsstore_stats.compact). c->created says whether it was made now. */
typedef struct {
    const char *name;
    bool create, compact;
    bool created;                 /* out */
    int rc;                       /* out: as namespaces_acquire_rc's */
} ns_create;
ns_handle *namespaces_create(nc_server *srv, ns_create *c, char *err, size_t errlen);
/* Whether the namespace name exists with compact storage. */
bool namespaces_compact(nc_server *srv, const char *name);
/* Deletes a namespace's live incarnation (its store is retired and its
 * directory moves aside, removed when the last handle goes; sessions bound
 * to it answer 410 namespace_deleted from now on). born_by: only an
 * incarnation born at or before it (a tombstone applied), 0 = whichever
 * lives. tombstone non-NULL: a deletion made here, announced to the other
 * replicas (nc_server.namespace_deleted, under the registry's lock) and
 * its tombstone stored there (0 without replication). 0 with *entries and
 * *incarnation (both optional) of what was deleted, or -1 with a message
 * (no such namespace, or none of that age). */
int namespaces_delete(nc_server *srv, const char *name, uint64_t born_by, int64_t *entries, uint64_t *incarnation,
                      uint64_t *tombstone, char *err, size_t errlen);
void namespaces_release(nc_server *srv, ns_handle *r);
nc_nsstore *namespaces_store(ns_handle *r);
const char *namespaces_name(const ns_handle *r);

/* Incarnations. A namespace deleted and created again under its name is a
 * new incarnation: a new store in a new directory, and a new number. With
 * replication it is the store's "birth" (ms at its creation, kept in its
 * marker, compared by the replicas with the deletions' tombstones); without,
 * the time it was opened in this run of the daemon (sessions, which bind to
 * it, do not outlive the run). Numbers only grow. A handle stays bound to the
 * incarnation it was acquired on: once that is deleted, namespaces_live is
 * false for good and its store is retired (nsstore_retire: every write is
 * refused), whatever is created under the name later. */
uint64_t namespaces_incarnation(const ns_handle *r);
bool namespaces_live(const ns_handle *r);
/* Whether s is bound to an incarnation deleted since (the API answers
 * 410 namespace_deleted; s->ns_ref is immutable, no lock needed). */
bool namespaces_session_deleted(const nc_session *s);

/* Calls fn(handle, ctx) for every live namespace, each held meanwhile (the
 * registry is not locked during the calls). */
void namespaces_each(nc_server *srv, void (*fn)(ns_handle *, void *), void *ctx);

/* Counters of /metrics: pairs added to a namespace (documents, feed with
 * adapt), documents streamed in. */
void namespaces_count_added(nc_server *srv, uint64_t tokens);
void namespaces_count_document(nc_server *srv);

/* sessions.c binder: holds the namespace of a new session. */
int namespaces_bind_session(void *ctx, const char *ns, nc_unbounded_cache **ub, void **ref, char *err,
                            size_t errlen);
void namespaces_unbind_session(void *ctx, void *ref);

/* Feed with adapt on session s (its lock held): runs stream_feed with the
 * pairs logged under the session's document ("session:<id>"); *seq receives
 * the last log record to sync (namespaces_sync, after unlocking). */
int namespaces_feed_adapt(nc_server *srv, nc_session *s, const nc_tokens *t, double *logprobs,
                          uint64_t *seq, char *err, size_t errlen);
int namespaces_sync(nc_session *s, uint64_t seq, char *err, size_t errlen);

/* "explain" of predict (session lock held): for each of the k predicted
 * words ids[i], the stored pairs that gave it the most cache weight. Returns
 * a new array of k arrays (NULL on ENOMEM). */
json_t *namespaces_explain(nc_session *s, const int *ids, size_t k);

/* Prometheus lines of the namespaces, appended to text (realloc'ed). */
char *namespaces_metrics(nc_server *srv, char *text);

#endif
