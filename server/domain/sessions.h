/* sessions.h -- the sessions table: per-session predictor (core/session/stream.h)
 * behind a mutex, ids from getrandom, idle TTL, a maximum count and a memory
 * budget. */
#ifndef NC_SERVER_SESSIONS_H
#define NC_SERVER_SESSIONS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uthash.h>

#include "server.h"
#include "stream.h"

typedef struct nc_session {
    char id[SESSION_ID_MAX];
    char ns[SESSION_ID_MAX];      /* namespace ("" = none; next issue) */
    pthread_mutex_t lock;         /* serialises requests on this session */
    nc_stream *stream;            /* guarded by lock */
    nc_cache_params params;       /* as created (immutable) */
    void *ns_ref;                 /* held namespace (namespaces.h), NULL = none */
    void (*ns_unbind)(void *ctx, void *ref);
    void *ns_ctx;
    uint32_t ns_doc;              /* its document in the namespace (feed adapt) */
    bool ns_doc_set;              /* guarded by lock */
    size_t reserved;              /* bytes charged to the budget */
    double created;               /* wall clock, seconds */
    /* guarded by the table lock: */
    int refs;
    bool removed;
    bool moved;                   /* removed by sessions_hand_over: it lives on elsewhere */
    double last_used;             /* monotonic seconds */
    UT_hash_handle hh;
} nc_session;

typedef struct sessions sessions;

typedef enum {
    SESS_OK = 0,
    SESS_ENOTFOUND,
    SESS_EEXIST,                  /* a client-chosen id already in use */
    SESS_ELIMIT,                  /* max_sessions reached */
    SESS_EMEMORY,                 /* the budget would be exceeded */
    SESS_EINVAL,                  /* stream creation refused the params */
    SESS_ENOMEM,
    SESS_ESTORAGE,                /* the namespace's log could not be opened: I/O error */
    SESS_ENOSPACE,                /* ... for lack of disk space */
} sessions_rc;

/* m is borrowed and must outlive the table. tag: replica tag put in ids
 * ("" = none). ttl_s: idle seconds before eviction; budget: bytes. */
sessions *sessions_new(const nc_model *m, int max_sessions, int ttl_s, size_t budget,
                       const char *tag);
/* Frees every session (none may be acquired any more). NULL allowed. */
void sessions_free(sessions *t);

/* What a session is made of. */
typedef struct {
    const char *id;           /* a client-chosen id, or NULL for a random one */
    const char *ns;           /* its namespace ("" none) */
    const nc_cache_params *p; /* its settings */
    nc_stream *stream;        /* sessions_adopt: the ready stream (an imported state); else NULL */
    void *ns_ref;             /* sessions_adopt: stream's namespace reference from sessions_bind, or NULL */
} nc_session_spec;

/* Creates a session (fresh stream of sp->p started with eos, design §3,
 * bound to sp->ns; sp->stream and ns_ref NULL) and returns it acquired: the
 * caller releases it with sessions_release. err gets a message on failure. */
sessions_rc sessions_create(sessions *t, const nc_session_spec *sp, nc_session **out, char *err, size_t errlen);

/* As sessions_create, with sp->stream ready and built on sp->ns_ref: both
 * are taken over in every case (released on failure). */
sessions_rc sessions_adopt(sessions *t, const nc_session_spec *sp, nc_session **out, char *err, size_t errlen);

/* The table's binder (sessions_set_binder) for a stream built by the caller:
 * *ub the namespace's unbounded cache (NULL for ns "" or no binder), *ref
 * released by sessions_unbind (NULL allowed) unless handed to
 * sessions_adopt. 0 or the binder's negative NC_ code with a message. */
int sessions_bind(sessions *t, const char *ns, nc_unbounded_cache **ub, void **ref, char *err, size_t errlen);
void sessions_unbind(sessions *t, void *ref);

/* Whether s was deleted, evicted or handed over since it was acquired (a
 * request that waited for s->lock checks this before using s->stream). */
bool sessions_removed(sessions *t, nc_session *s);

/* The replica tag given to sessions_new ("" = none). */
const char *sessions_tag(const sessions *t);

/* A snapshot of the ids in the table: *ids malloc'ed (free()), *n entries.
 * Returns 0 or -1 (out of memory). */
int sessions_ids(sessions *t, char (**ids)[SESSION_ID_MAX], size_t *n);

/* Namespace binding: bind(ctx, ns, &ub, &ref, ...) is called for every
 * session created from scratch and gives the namespace's unbounded cache
 * (the stream adapts into it and reads it) and a reference released with
 * unbind(ctx, ref) when the session is freed. bind returns 0 or a negative
 * NC_ code with a message (the creation then fails with SESS_ESTORAGE for
 * NC_EIO, SESS_ENOSPACE for NC_ENOSPACE, else SESS_ENOMEM). */
void sessions_set_binder(sessions *t,
                         int (*bind)(void *ctx, const char *ns, nc_unbounded_cache **ub, void **ref,
                                     char *err, size_t errlen),
                         void (*unbind)(void *ctx, void *ref), void *ctx);

/* Looks a session up and holds it (it cannot be freed until released, even if
 * deleted or evicted meanwhile). NULL when absent. The caller then locks
 * s->lock around any use of s->stream. */
nc_session *sessions_acquire(sessions *t, const char *id);
/* Drops the hold, refreshes the idle clock; frees a removed session when the
 * last hold goes. */
void sessions_release(sessions *t, nc_session *s);

/* Removes a session (freed once no request holds it). SESS_ENOTFOUND. */
sessions_rc sessions_delete(sessions *t, const char *id);
/* The same for a session that lives on elsewhere (handed to a peer, or
 * replaced by an imported copy): a request that waited for it learns it
 * moved (sessions_moved), not that it is gone. */
sessions_rc sessions_hand_over(sessions *t, const char *id);
/* Whether s was removed by sessions_hand_over (read as sessions_removed). */
bool sessions_moved(sessions *t, nc_session *s);

/* Removes sessions idle for longer than the TTL and not in use; returns how
 * many. Called by the janitor thread. */
int sessions_evict_idle(sessions *t);

/* Count, and bytes charged to the budget. */
void sessions_stats(sessions *t, long *count, size_t *bytes);

/* Budget charge of a session with params p (state + windows at full size). */
size_t sessions_estimate(const nc_model *m, const nc_cache_params *p);


#endif
