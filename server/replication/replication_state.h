/* replication_state.h -- the state of a replica's replication, shared by
 * replication.c and its publisher and applier threads: the per-namespace
 * entries, the marker and tombstone files, the Redis helpers. Not for use
 * outside the replication files (the public face is replication.h). */
#ifndef NC_SERVER_REPLICATION_STATE_H
#define NC_SERVER_REPLICATION_STATE_H

#include "nsstore.h"
#include "server.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "namespaces.h"

/* The publisher and applier's state (srv->replication; NULL when option
 * `redis` is empty). */
typedef struct replication replication;

#define MAX_NS 256
#define BATCH_ENTRIES 256                   /* XADDs per pipeline */
#define BATCH_BYTES ((size_t)8 << 20)       /* ...or this much key data */
#define MARKER_FILE "replication-state"     /* in the namespace's directory */
#define MARKER_HEAD "neurocache-replication 1"
#define MARKER_EVERY_MS 100                 /* marker writes per namespace, at most */
#define DELETES_FILE "replication-deletes"  /* in data_dir: tombstones not yet in Redis */
#define TOMBS_FILE "replication-tombstones" /* in data_dir: every tombstone known here */
#define EPOCH_FILE "replication-epoch"      /* in data_dir: the Redis data set published into */
#define RETAIN_MS (600.0 * 1000)            /* published log records kept this long (retain_point) */
#define RETAIN_MARKS 9

/* Highest origin seq applied from one incarnation of a namespace on one
 * origin replica: a republished entry at or below it is a duplicate. */
typedef struct {
    char origin[16];
    uint64_t birth, seq;
} hwm_t;

typedef struct {
    replication *rep;             /* the one it belongs to (for the log observer) */
    char name[SESSION_ID_MAX];
    /* applier thread only */
    char last_id[64];             /* last applied (or skipped) stream id */
    bool loaded;                  /* last_id and hw recovered from the store (pos_load) */
    bool warned;                  /* "namespace unavailable" logged */
    hwm_t *hw;
    int nhw, hwcap;
    /* under rep->lock */
    uint64_t tomb;                /* newest deletion of the name known (ms), 0 = none */
    bool reset;                   /* deleted here: the applier forgets its position */
    unsigned gen;                 /* attachments of a store under this name */
    uint64_t birth;               /* the attached store's incarnation (ms), 0 = none */
    uint64_t published;           /* marker on disk: local adds <= it are in Redis */
    bool dirty;                   /* local adds since the publisher last looked */
    /* publisher thread only */
    nc_nslog *log;                /* follower of the attached store's log */
    unsigned log_gen;
    uint64_t pub_pos;             /* published, maybe not yet in the marker (also
                                     under rep->lock: the metrics read it) */
    double marker_at;
    bool announced;               /* in the namespace set, on this connection */
    struct { double t; uint64_t pos; } marks[RETAIN_MARKS];   /* retain_point's samples */
    int nmarks;
    bool log_warned;
} ns_state;

typedef struct {
    char name[SESSION_ID_MAX];
    uint64_t t;
} pending_del;

struct replication {
    bool on;
    nc_server *srv;
    char host[256];
    int port;
    char prefix[128];
    long maxlen;
    char tag[16];
    uint64_t model_fp;            /* model_fingerprint: weights, not only the vocabulary */
    int H;
    char deletes_path[1200];      /* "" = not durable (no data_dir) */
    char tombs_path[1200], epoch_path[1200];   /* "" = not durable */
    char epoch[40];               /* publisher thread: Redis's epoch key as last seen, "" = never */
    bool no_marker;               /* test hook: the marker never advances on disk */
    int publish_delay_ms;         /* test hook: a pause after each batch Redis acknowledged */
    pthread_t pub, app;
    pthread_mutex_t lock;         /* ns table, pending deletes */
    pthread_cond_t cond;
    atomic_int stop;
    atomic_int tombs_loaded;      /* the applier has read the tombstones once */
    ns_state ns[MAX_NS];
    int nns;
    pending_del *dels;
    int ndels, delcap;
    /* counters */
    atomic_ullong published_entries, published_tokens, duplicate_entries;
    atomic_ullong applied_entries, applied_tokens, refused_entries, redis_errors;
    atomic_llong last_lag_ms, max_lag_ms;
    atomic_int connected_pub, connected_app;
};

/* Set while the applier adds remote pairs: the observer ignores them
 * (replication_applier.c). */
extern __thread int replication_applying;

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* replication_state.c: the marker, tombstones not yet in Redis, the
 * namespace table, the Redis connection */

/* The marker of a namespace directory: its incarnation and how far its log
 * is published. 1 read, 0 absent, -1 unreadable or corrupt (err says). */
int replication_marker_read(const char *dir, uint64_t *birth, uint64_t *published, char *err, size_t errlen);
int replication_marker_write(const char *dir, uint64_t birth, uint64_t published, char *err, size_t errlen);
/* The tombstones this replica has not yet put in Redis (rep->lock held). */
void replication_deletes_save(replication *rep);
void replication_deletes_add(replication *rep, const char *name, uint64_t t);
void replication_deletes_load(replication *rep);
/* Every tombstone known here (rep->ns[].tomb), kept in data_dir so that a
 * restarted replica can give them back to a Redis that lost its data
 * (rep->lock held for save; load at set-up). */
void replication_tombs_save(replication *rep);
void replication_tombs_load(replication *rep);
/* The entry of name, or NULL (rep->lock held). */
ns_state *replication_ns_find(replication *rep, const char *name);
/* The entry of name, created when absent (rep->lock held); NULL when full. */
ns_state *replication_ns_get(replication *rep, const char *name);
redisContext *replication_connect_redis(replication *rep, atomic_int *flag);
void replication_stream_key(replication *rep, const char *ns, char *out, size_t cap);
/* Reads n pipelined replies; 0 when all succeeded. */
int replication_read_replies(redisContext *c, int n);
/* Calls fn(rep, s, store, birth, gen, ctx) for every namespace with a
 * store attached, held meanwhile (fn checks s->gen == gen under rep->lock
 * before it trusts s: the store may be deleted and created again). */
void replication_each_store(replication *rep, void (*fn)(replication *, ns_state *, nc_nsstore *, uint64_t, unsigned,
                                                          void *), void *ctx);
/* Log records of the attached stores not yet published (or passed over:
 * DOC records, entries applied from others), whatever Redis's state. */
uint64_t replication_unpublished_records(replication *rep);

/* the threads (replication_publisher.c, replication_applier.c); arg is the replication */
void *replication_publisher(void *arg);
void *replication_applier(void *arg);

#endif
