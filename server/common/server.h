/* server.h -- the daemon's shared state, handed to every handler. */
#ifndef NC_SERVER_SERVER_H
#define NC_SERVER_SERVER_H

#include <stdatomic.h>

#include "config.h"
#include "model.h"
#include "workguard.h"

/* A session id's or a namespace name's bytes with its NUL: the session
 * table's (domain) and the API keys' records of them (net) alike. */
#define SESSION_ID_MAX 64

struct nc_nsstore;
struct sessions;

typedef struct nc_server {
    nc_server_config cfg;
    nc_cache_params cache_defaults;   /* from the [cache] options */
    nc_model *model;                  /* NULL until loaded */
    struct sessions *sessions;        /* sessions.h; NULL until the model is loaded */
    struct ns_registry *namespaces;   /* namespaces.h; NULL until recovered */
    struct migration *migration;      /* peers, model fingerprint (migrate.h); NULL until the model is loaded */
    struct batcher *batcher;          /* predict batching (batcher.h); NULL = predict inline */
    struct workpool *pool;            /* workers of heavy requests (workguard.h) */
    atomic_int ready;                 /* model loaded */
    atomic_int draining;              /* SIGTERM received */
    atomic_long inflight;             /* requests between first and completed callback */
    int port;                         /* bound port */
    struct MHD_Daemon *mhd;
    struct http_acceptor *acceptor;   /* accepts connections for mhd (http.c) */
    struct upload_registry *uploads;  /* uploads in progress (uploads.h) */
    struct replication *replication;  /* Redis publisher and applier (replication.h); NULL = off */
    struct auth_table *auth;          /* API keys (auth.h); NULL = none: every request allowed */
    /* Called by the namespace registry for every store it opens or creates,
     * before any add, with namespace_opened_ctx (replication attaches its
     * publisher); set before namespaces_init, NULL = nobody listens. It
     * returns the store's incarnation as it knows it (replication's birth,
     * ms), 0 = none: the registry then keeps its own (namespaces.h). */
    uint64_t (*namespace_opened)(void *ctx, const char *name, struct nc_nsstore *store);
    /* Called by the registry when a namespace is deleted here, under its
     * lock (before the name can be created again), with the same ctx:
     * returns the deletion's tombstone (replication's; 0 = none). */
    uint64_t (*namespace_deleted)(void *ctx, const char *name);
    void *namespace_opened_ctx;
    /* The net tier's ways into the domain (design §1: net never names the
     * domain's modules; main.c wires these before http_start). run_heavy
     * runs fn(arg) for a heavy request on the worker pool (workpool_run's
     * contract, its wp_result as an int); session_namespace copies the
     * namespace of session id into ns ("" for none) and says whether the
     * session exists (auth's checks). */
    int (*run_heavy)(struct nc_server *srv, workguard *g, int fd, bool admitted, void (*fn)(void *), void *arg);
    bool (*session_namespace)(struct nc_server *srv, const char *id, char *ns, size_t nslen);
} nc_server;

#endif
