/* namespaces.c -- the registry of durable namespaces (namespaces.h):
 * opening, recovery, deletion, the snapshot thread, feed with adapt,
 * explain and the namespaces' metrics. */
#include "namespaces.h"
#include "components.h"
#include "pq_tables.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

#include "metrics.h"
#include "slog.h"

#define NS_NAME_MAX 64
#define EXPLAIN_PER_WORD 3

struct ns_handle {
    char name[NS_NAME_MAX];
    char dir[1200];
    nc_nsstore *store;
    uint64_t incarnation;         /* namespaces_incarnation (immutable) */
    int refs;
    bool removed;                 /* deleted: directory removed at last release; set under the
                                     registry lock, read atomically (namespaces_live) */
    bool heal_failing;            /* snapshot thread's: a failed nsstore_heal was logged */
    UT_hash_handle hh;
};

struct ns_registry {
    pthread_mutex_t lock;
    ns_handle *by_name;
    char root[1100];              /* data_dir/namespaces */
    char tmp_root[1100];          /* private temporary data_dir, removed at exit */
    char trained[1200];           /* model's unbounded.faiss, "" = none */
    const nc_model *m;
    nc_wal_sync sync;
    int period;
    pthread_t thread;
    bool thread_started, stop;
    pthread_cond_t cond;
    double recovery_s;
    _Atomic uint64_t adapt_tokens, documents, snapshots, snapshot_failures;
    char factory[128];
    long switch_at;
    bool train_self;
    bool own_training;
    int train_nice;               /* [server] worker_nice: trainings run below predicts */
    double recall_target;
    int train_delay_ms;           /* tests: NEUROCACHE_TEST_TRAIN_DELAY_MS, a pause at each phase */
    uint64_t (*opened)(void *ctx, const char *name, nc_nsstore *store);   /* nc_server.namespace_opened */
    uint64_t (*deleted)(void *ctx, const char *name);                     /* nc_server.namespace_deleted */
    void *opened_ctx;
    uint64_t last_incarnation;    /* the newest issued here (registry lock) */
    bool create_compact;          /* the storage of the store open_store creates (registry lock) */
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* namespaces_delete moves a deleted incarnation's directory to
 * "<name>.deleted-<time>" until its last handle goes: no namespace may be
 * named so, and recovery finishes such a removal a crash interrupted. */
#define DELETED_MARK ".deleted-"

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= NS_NAME_MAX || s[0] == '.' || strstr(s, DELETED_MARK))
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return false;
    return true;
}

/* Opens the store in dir into *out and names its incarnation *inc
 * (registry lock held, or at start-up). */
static int open_store(ns_registry *g, const char *dir, nc_nsstore **out, uint64_t *inc, nc_nsstore_recovery *info,
                      char *err, size_t errlen)
{
    nc_nsstore_opts o = {.dir = dir, .model = g->m, .sync = g->sync, .compact = g->create_compact};
    unbounded_cache_opts_default(&o.ub, g->m->cfg.hidden_size);
    o.ub.trained_path = g->trained[0] ? g->trained : NULL;
    o.ub.factory = g->factory[0] ? g->factory : NULL;
    o.ub.train_self = g->train_self;
    o.ub.own_training = g->own_training;
    o.ub.train_nice = g->train_nice;
    o.ub.recall_target = g->recall_target;
    o.ub.train_delay_ms = g->train_delay_ms;
    if (g->switch_at > 0)
        o.ub.switch_at = g->switch_at;
    /* FAISS's OpenMP threads compete with the request threads for the
     * cores (design §6): a search of one query is not worth a team */
    o.ub.omp_threads = 1;
    int rc = nsstore_open(&o, out, info, err, errlen);
    *inc = 0;
    if (rc == NC_OK && g->opened) {
        /* e.g. replication (Redis) publishes this store's adds from now on;
         * its birth of the store is the incarnation the replicas share */
        const char *slash = strrchr(dir, '/');
        *inc = g->opened(g->opened_ctx, slash ? slash + 1 : dir, *out);
    }
    if (rc == NC_OK && *inc == 0) {
        /* Nobody shares it (no replication): named for this run of the
         * daemon, the time it was opened, later than any issued before --
         * sessions, which bind to it, do not outlive the run either, and no
         * file write is added to creating a namespace. */
        *inc = wall_ms();
        if (*inc <= g->last_incarnation)
            *inc = g->last_incarnation + 1;
    }
    if (rc == NC_OK && *inc > g->last_incarnation)
        g->last_incarnation = *inc;
    return rc;
}

/* ---- registry -------------------------------------------------------------- */

ns_handle *namespaces_acquire(nc_server *srv, const char *name, bool create, char *err, size_t errlen)
{
    int rc;
    return namespaces_acquire_rc(srv, name, create, &rc, err, errlen);
}

ns_handle *namespaces_acquire_rc(nc_server *srv, const char *name, bool create, int *rc, char *err, size_t errlen)
{
    ns_create c = {.name = name, .create = create};
    ns_handle *r = namespaces_create(srv, &c, err, errlen);
    *rc = c.rc;
    return r;
}

bool namespaces_compact(nc_server *srv, const char *name)
{
    char err[NC_ERRLEN];
    ns_handle *r = srv->namespaces ? namespaces_acquire(srv, name, false, err, sizeof err) : NULL;
    bool c = r && nsstore_is_compact(r->store);
    namespaces_release(srv, r);
    return c;
}

/* The registry's one look-up-or-open under its lock, with the
 * failure's code and message for each way it can fail */
ns_handle *namespaces_create(nc_server *srv, ns_create *c, char *err, size_t errlen)
{
    ns_registry *g = srv->namespaces;
    const char *name = c->name;
    const bool create = c->create;
    int *rc = &c->rc;
    *rc = NC_OK;
    c->created = false;
    if (!g) {
        snprintf(err, errlen, "namespaces are not available yet");
        *rc = NC_ESTATE;
        return NULL;
    }
    if (!valid_name(name)) {
        snprintf(err, errlen, "namespace name must be 1-63 characters of [A-Za-z0-9_.-], not starting with '.' "
                 "nor holding '" DELETED_MARK "'");
        *rc = NC_EINVAL;
        return NULL;
    }
    pthread_mutex_lock(&g->lock);
    ns_handle *r;
    HASH_FIND_STR(g->by_name, name, r);
    if (!r && create) {
        r = calloc(1, sizeof *r);
        char e2[NC_ERRLEN] = "";
        if (r) {
            snprintf(r->name, sizeof r->name, "%s", name);
            snprintf(r->dir, sizeof r->dir, "%.1000s/%.63s", g->root, name);
            struct stat before;
            bool fresh = stat(r->dir, &before) != 0;
            g->create_compact = c->compact;
            *rc = open_store(g, r->dir, &r->store, &r->incarnation, NULL, e2, sizeof e2);
            g->create_compact = false;
            if (*rc != NC_OK && fresh && c->compact)
                /* what a failed compact creation made must not come back at
                 * the next start-up as an empty namespace with keys (one with
                 * keys stays as it always did: test_fault_injection's walks) */
                nsstore_remove_dir(r->dir, NULL, 0);
            if (*rc != NC_OK) {
                snprintf(err, errlen, "namespace '%s': %s", name, e2);
                free(r);
                r = NULL;
            } else {
                HASH_ADD_STR(g->by_name, name, r);
                c->created = true;
                slog(SLOG_INFO, "namespace created", json_pack("{s:s,s:s,s:I,s:s}", "namespace", name, "dir", r->dir,
                                                               "incarnation", (json_int_t)r->incarnation, "storage",
                                                               c->compact ? "compact" : "keys"));
            }
        } else {
            snprintf(err, errlen, "out of memory");
            *rc = NC_ENOMEM;
        }
    } else if (!r) {
        snprintf(err, errlen, "no namespace '%s'", name);
        *rc = NC_ENOTFOUND;
    }
    if (r)
        r->refs++;
    pthread_mutex_unlock(&g->lock);
    return r;
}

static void ref_destroy(ns_handle *r)
{
    nsstore_close(r->store);
    if (r->removed) {
        char err[NC_ERRLEN] = "";
        if (nsstore_remove_dir(r->dir, err, sizeof err) != NC_OK)
            slog(SLOG_WARN, "namespace removal", json_pack("{s:s,s:s}", "namespace", r->name, "error", err));
    }
    free(r);
}

void namespaces_release(nc_server *srv, ns_handle *r)
{
    if (!r)
        return;
    ns_registry *g = srv->namespaces;
    pthread_mutex_lock(&g->lock);
    bool destroy = --r->refs == 0 && r->removed;
    pthread_mutex_unlock(&g->lock);
    if (destroy)
        ref_destroy(r);
}

nc_nsstore *namespaces_store(ns_handle *r)
{
    return r->store;
}

const char *namespaces_name(const ns_handle *r)
{
    return r->name;
}

uint64_t namespaces_incarnation(const ns_handle *r)
{
    return r->incarnation;
}

bool namespaces_live(const ns_handle *r)
{
    return !__atomic_load_n(&r->removed, __ATOMIC_ACQUIRE);
}

bool namespaces_session_deleted(const nc_session *s)
{
    return s->ns_ref && !namespaces_live(s->ns_ref);
}

int namespaces_bind_session(void *ctx, const char *ns, nc_unbounded_cache **ub, void **ref, char *err,
                            size_t errlen)
{
    nc_server *srv = ctx;
    int rc = NC_OK;
    ns_handle *r = namespaces_acquire_rc(srv, ns && ns[0] ? ns : "default", true, &rc, err, errlen);
    if (!r)
        return rc != NC_OK ? rc : NC_EINVAL;   /* the code tells a full disk from an I/O error */
    *ub = nsstore_unbounded_cache(r->store);
    *ref = r;
    return 0;
}

void namespaces_unbind_session(void *ctx, void *ref)
{
    namespaces_release(ctx, ref);
}

/* ---- snapshots -------------------------------------------------------------- */

static void snapshot_one(ns_registry *g, ns_handle *r, const char *why)
{
    char err[NC_ERRLEN] = "";
    double secs = 0;
    nc_nsstore_stats st;
    nsstore_stats(r->store, &st);
    if (st.last_seq == st.snapshot_seq)
        return;   /* nothing new */
    if (nsstore_snapshot(r->store, &secs, err, sizeof err) != NC_OK) {
        g->snapshot_failures++;
        slog(SLOG_ERROR, "snapshot failed", json_pack("{s:s,s:s}", "namespace", r->name, "error", err));
        return;
    }
    g->snapshots++;
    slog(SLOG_INFO, "snapshot", json_pack("{s:s,s:s,s:I,s:f}", "namespace", r->name, "reason", why,
                                           "entries", (json_int_t)st.entries, "seconds", secs));
}

/* Holds every live namespace (so none is freed meanwhile) and calls fn. */
static void for_each(ns_registry *g, void (*fn)(ns_registry *, ns_handle *, void *), void *arg)
{
    pthread_mutex_lock(&g->lock);
    int n = HASH_COUNT(g->by_name), i = 0;
    ns_handle **all = calloc((size_t)n + 1, sizeof *all), *r, *tmp;
    HASH_ITER(hh, g->by_name, r, tmp) {
        if (all && !r->removed) {
            r->refs++;
            all[i++] = r;
        }
    }
    pthread_mutex_unlock(&g->lock);
    for (int j = 0; j < i; j++)
        fn(g, all[j], arg);
    pthread_mutex_lock(&g->lock);
    ns_handle *dead[64];
    int nd = 0;
    for (int j = 0; j < i; j++)
        if (--all[j]->refs == 0 && all[j]->removed && nd < 64)
            dead[nd++] = all[j];
    pthread_mutex_unlock(&g->lock);
    for (int j = 0; j < nd; j++)
        ref_destroy(dead[j]);
    free(all);
}

typedef struct {
    void (*fn)(ns_handle *, void *);
    void *ctx;
} each_call;

static void each_one(ns_registry *g, ns_handle *r, void *arg)
{
    (void)g;
    each_call *c = arg;
    if (namespaces_live(r))   /* not one deleted since for_each held it */
        c->fn(r, c->ctx);
}

void namespaces_each(nc_server *srv, void (*fn)(ns_handle *, void *), void *ctx)
{
    each_call c = {fn, ctx};
    if (srv->namespaces)
        for_each(srv->namespaces, each_one, &c);
}

static void snapshot_if_due(ns_registry *g, ns_handle *r, void *arg)
{
    (void)arg;
    if (!namespaces_live(r))
        return;   /* deleted since for_each held it: retired, nothing to write */
    if (nsstore_log_broken(r->store)) {
        /* a write or fsync error stopped the log (writes answer 503 with
         * Retry-After): once a snapshot of memory and a new segment can be
         * written, they are accepted again -- tried every second */
        char err[NC_ERRLEN] = "";
        double secs = 0;
        if (nsstore_heal(r->store, &secs, err, sizeof err) != NC_OK) {
            if (!r->heal_failing)
                slog(SLOG_ERROR, "log still unusable", json_pack("{s:s,s:s}", "namespace", r->name, "error", err));
            r->heal_failing = true;
        } else {
            r->heal_failing = false;
            slog(SLOG_WARN, "log restarted after a write error",
                 json_pack("{s:s,s:f}", "namespace", r->name, "snapshot_seconds", secs));
        }
        return;
    }
    nc_nsstore_stats st;
    nsstore_stats(r->store, &st);
    if (g->period > 0 && st.snapshot_age >= g->period)
        snapshot_one(g, r, "periodic");
}

static void *snapshot_thread(void *p)
{
    ns_registry *g = p;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g->cond, &g->lock, &ts);
        if (g->stop)
            break;
        pthread_mutex_unlock(&g->lock);
        for_each(g, snapshot_if_due, NULL);
        pthread_mutex_lock(&g->lock);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* ---- start-up and shutdown -------------------------------------------------- */

static int mkdir_p(const char *path)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Opens the namespace directory dir (named name) into the registry, logging
 * what recovery found. 0, or -1 with a message naming the namespace. */
static int recover_one(ns_registry *g, const char *name, const char *dir, char *err, size_t errlen)
{
    ns_handle *r = calloc(1, sizeof *r);
    nc_nsstore_recovery info;
    char e2[2 * NC_ERRLEN] = "";
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(r->name, sizeof r->name, "%.63s", name);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    int orc = open_store(g, dir, &r->store, &r->incarnation, &info, e2, sizeof e2);
    if (orc == NC_ENOSPACE) {
        /* nothing is wrong with what is on disk: recovery only needs
         * room for a new log segment (test_diskfull) */
        snprintf(err, errlen, "namespace '%s': no room to reopen its log: %s; free space on the data "
                 "directory's file system and start again (nothing was lost)", r->name, e2);
        free(r);
        return -1;
    }
    if (orc != NC_OK) {
        snprintf(err, errlen, "namespace '%s' cannot be recovered: %s", r->name, e2);
        free(r);
        return -1;
    }
    HASH_ADD_STR(g->by_name, name, r);
    if (info.warning[0])
        slog(SLOG_WARN, "namespace recovered with a warning",
             json_pack("{s:s,s:s}", "namespace", r->name, "warning", info.warning));
    slog(SLOG_INFO, "namespace recovered",
         json_pack("{s:s,s:I,s:I,s:I,s:f}", "namespace", r->name, "entries", (json_int_t)info.entries,
                   "snapshot_seq", (json_int_t)info.snapshot_seq, "records_replayed",
                   (json_int_t)info.records_replayed, "seconds", info.seconds));
    return 0;
}

/* Recovery: every namespace directory under g->root. 0, or -1 with a
 * message (the first namespace that cannot be recovered). */
static int recover_all(ns_registry *g, char *err, size_t errlen)
{
    double t0 = nc_now_s();
    DIR *d = opendir(g->root);
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && d && (e = readdir(d))) {
        char dir[1200];
        if (strstr(e->d_name, DELETED_MARK)) {
            /* a deleted incarnation whose removal a crash cut short: it
             * must not come back as a namespace (nor be replicated) */
            snprintf(dir, sizeof dir, "%.1000s/%.150s", g->root, e->d_name);
            char err[NC_ERRLEN] = "";
            if (nsstore_remove_dir(dir, err, sizeof err) != NC_OK)
                slog(SLOG_WARN, "deleted namespace not removed", json_pack("{s:s,s:s}", "dir", dir, "error", err));
            else
                slog(SLOG_INFO, "deleted namespace removed", json_pack("{s:s}", "dir", dir));
            continue;
        }
        if (!valid_name(e->d_name))
            continue;
        snprintf(dir, sizeof dir, "%.1000s/%.63s", g->root, e->d_name);
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        rc = recover_one(g, e->d_name, dir, err, errlen);
    }
    if (d)
        closedir(d);
    g->recovery_s = nc_now_s() - t0;
    return rc;
}

/* The registry's settings from the configuration, and its root directory
 * (data_dir/namespaces, created; a private temporary data_dir when none is
 * set). 0, or -1 with a message. */
static int registry_setup(ns_registry *g, const nc_server *srv, char *err, size_t errlen)
{
    g->m = srv->model;
    g->sync = (nc_wal_sync)srv->cfg.fsync_mode;
    g->period = srv->cfg.snapshot_period_s;
    g->switch_at = srv->cfg.index_switch_at;
    g->train_self = srv->cfg.index_train_self;
    g->own_training = srv->cfg.index_own_training;
    g->train_nice = srv->cfg.worker_nice;
    g->recall_target = srv->cfg.index_recall_target;
    const char *delay = getenv("NEUROCACHE_TEST_TRAIN_DELAY_MS");
    g->train_delay_ms = delay ? atoi(delay) : 0;
    g->opened = srv->namespace_opened;
    g->deleted = srv->namespace_deleted;
    g->opened_ctx = srv->namespace_opened_ctx;
    snprintf(g->factory, sizeof g->factory, "%s", srv->cfg.index_factory);
    const char *data = srv->cfg.data_dir;
    if (!data[0]) {
        snprintf(g->tmp_root, sizeof g->tmp_root, "/tmp/neurocached-XXXXXX");
        if (!mkdtemp(g->tmp_root)) {
            snprintf(err, errlen, "cannot create a temporary data directory: %s", strerror(errno));
            return -1;
        }
        data = g->tmp_root;
        slog(SLOG_WARN, "no data_dir: namespaces are not durable",
             json_pack("{s:s}", "directory", g->tmp_root));
    }
    snprintf(g->root, sizeof g->root, "%.1000s/namespaces", data);
    if (mkdir_p(g->root) != 0) {
        snprintf(err, errlen, "option 'data_dir': cannot create '%s': %s", g->root, strerror(errno));
        return -1;
    }
    snprintf(g->trained, sizeof g->trained, "%.1000s/unbounded.faiss", srv->cfg.model);
    if (access(g->trained, R_OK) != 0)
        g->trained[0] = 0;
    return 0;
}

int namespaces_init(nc_server *srv, char *err, size_t errlen)
{
    ns_registry *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    if (registry_setup(g, srv, err, errlen) != 0) {
        pthread_cond_destroy(&g->cond);
        pthread_mutex_destroy(&g->lock);
        free(g);
        return -1;
    }
    int rc = recover_all(g, err, errlen);
    srv->namespaces = g;
    if (rc != 0) {
        namespaces_shutdown(srv);
        return -1;
    }
    /* also with periodic snapshots off: the thread restarts broken logs */
    if (pthread_create(&g->thread, NULL, snapshot_thread, g) == 0)
        g->thread_started = true;
    return 0;
}

static void snapshot_shutdown(ns_registry *g, ns_handle *r, void *arg)
{
    if (namespaces_live(r))
        snapshot_one(g, r, arg);
}

void namespaces_shutdown(nc_server *srv)
{
    ns_registry *g = srv->namespaces;
    if (!g)
        return;
    if (g->thread_started) {
        pthread_mutex_lock(&g->lock);
        g->stop = true;
        pthread_cond_broadcast(&g->cond);
        pthread_mutex_unlock(&g->lock);
        pthread_join(g->thread, NULL);
    }
    if (!g->tmp_root[0])
        for_each(g, snapshot_shutdown, (void *)"shutdown");
    ns_handle *r, *tmp;
    HASH_ITER(hh, g->by_name, r, tmp) {
        HASH_DEL(g->by_name, r);
        ref_destroy(r);   /* sessions were freed before */
    }
    if (g->tmp_root[0])
        nsstore_remove_dir(g->tmp_root, NULL, 0);
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->lock);
    free(g);
    srv->namespaces = NULL;
}

/* ---- feed with adapt, explain ------------------------------------------------ */

int namespaces_feed_adapt(nc_server *srv, nc_session *s, const nc_tokens *t, double *logprobs,
                          uint64_t *seq, char *err, size_t errlen)
{
    ns_handle *r = s->ns_ref;
    *seq = 0;
    if (!r)
        return stream_feed(s->stream, t, false, logprobs, err, errlen);
    if (!s->ns_doc_set) {
        char id[128];
        snprintf(id, sizeof id, "session:%s", s->id);
        int rc = nsstore_doc_begin(r->store, id, strlen(id), &s->ns_doc, err, errlen);
        if (rc)
            return rc;
        s->ns_doc_set = true;
    }
    nsstore_set_context(r->store, s->ns_doc, (uint64_t)stream_position(s->stream));
    int rc = stream_feed(s->stream, t, true, logprobs, err, errlen);
    *seq = nsstore_context_seq();
    nsstore_clear_context();
    if (rc == NC_OK)
        srv->namespaces->adapt_tokens += t->n;
    return rc;
}

int namespaces_sync(nc_session *s, uint64_t seq, char *err, size_t errlen)
{
    ns_handle *r = s->ns_ref;
    return r ? nsstore_sync(r->store, seq, err, errlen) : NC_OK;
}

/* namespaces_explain's own name for a handle, kept while the core's
 * restructuring (issue 16) rewrites that function; nothing else uses it. */


/* Formats what stream_explain returns (core computes the weights with the
 * mixture's own functions), each entry under its row's name: pairs stored
 * in the session by their token position, pairs of the namespace store
 * (the row's entries_in_store) with their provenance from it. */
json_t *namespaces_explain(nc_session *s, const int *ids, size_t k)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < k; i++)
        json_array_append_new(out, json_array());
    ns_handle *r = s->ns_ref;
    nc_explain_entry *e = malloc((k ? k : 1) * NC_EXPLAIN_ROWS * EXPLAIN_PER_WORD * sizeof *e);
    int *cnt = malloc((k ? k : 1) * sizeof *cnt);
    char err[NC_ERRLEN];
    if (!out || !e || !cnt || k == 0 ||
        stream_explain(s->stream, ids, k, EXPLAIN_PER_WORD, e, cnt, err, sizeof err) != NC_OK)
        goto done;
    for (size_t i = 0; i < k; i++) {
        json_t *list = json_array_get(out, i);
        for (int j = 0; j < cnt[i]; j++) {
            const nc_explain_entry *x = &e[i * NC_EXPLAIN_ROWS * EXPLAIN_PER_WORD + j];
            char snip[512];
            nsstore_provenance pv;
            json_t *o;
            const char *src = nc_component_rows[x->source]->name;
            if (!nc_component_rows[x->source]->entries_in_store) {
                o = json_pack("{s:s,s:I,s:f}", "source", src, "position", (json_int_t)x->at, "weight",
                              x->weight);
            } else if (!r) {
                continue;
            } else if (nsstore_entry(r->store, x->at, &pv, err, sizeof err) == NC_OK) {
                nsstore_snippet(r->store, x->at, 8, 4, snip, sizeof snip);
                o = json_pack("{s:s,s:s,s:I,s:I,s:f,s:f,s:s}", "source", src, "document", pv.doc_id, "offset",
                              (json_int_t)pv.off, "entry", (json_int_t)x->at, "weight", x->weight, "distance",
                              x->distance, "snippet", snip);
            } else {
                o = json_pack("{s:s,s:I,s:f,s:f}", "source", src, "entry", (json_int_t)x->at, "weight",
                              x->weight, "distance", x->distance);
            }
            json_array_append_new(list, o);
        }
    }
done:
    free(e);
    free(cnt);
    return out;
}

void namespaces_count_added(nc_server *srv, uint64_t tokens)
{
    srv->namespaces->adapt_tokens += tokens;
}

void namespaces_count_document(nc_server *srv)
{
    srv->namespaces->documents++;
}

/* ---- metrics ------------------------------------------------------------------ */

typedef struct {
    const char *name, *type, *help;
} metric_def;

static const metric_def ns_metrics[] = {
    {"neurocache_namespace_entries", "gauge", "pairs in the namespace's unbounded cache"},
    {"neurocache_namespace_words", "gauge", "open-vocabulary words of the namespace"},
    {"neurocache_namespace_wal_bytes", "gauge", "bytes of write-ahead log on disk"},
    {"neurocache_namespace_disk_bytes", "gauge", "bytes on disk (log and snapshots)"},
    {"neurocache_namespace_memory_bytes", "gauge", "bytes in memory (index, values, words, provenance)"},
    {"neurocache_namespace_fsyncs_total", "counter", "fsync calls of the log since start"},
    {"neurocache_namespace_snapshot_age_seconds", "gauge", "seconds since the last snapshot (or start)"},
    {"neurocache_namespace_snapshot_duration_seconds", "gauge", "duration of the last snapshot"},
    {"neurocache_namespace_index_nlist", "gauge", "lists of the namespace's IVF index (0 while exact)"},
    {"neurocache_namespace_index_imbalance", "gauge", "imbalance factor of its lists, nlist sum n_i^2 / N^2 (1 = balanced)"},
    {"neurocache_namespace_index_nprobe", "gauge", "lists a search with the default nprobe probes (chosen at training)"},
    {"neurocache_namespace_index_recall", "gauge", "recall measured at the last training at that nprobe (-1 = none)"},
    {"neurocache_namespace_index_trainings_total", "counter", "trainings of the namespace's own index completed"},
    {"neurocache_namespace_index_training_in_progress", "gauge", "1 while a training runs"},
    {"neurocache_namespace_index_training_progress", "gauge", "share done of the phase of the training in progress"},
    {"neurocache_namespace_index_training_seconds", "gauge", "duration of the last completed training"},
};

char *namespaces_metrics(nc_server *srv, char *text)
{
    ns_registry *g = srv->namespaces;
    if (!text || !g)
        return text;
    metrics_text b = {text, strlen(text), strlen(text) + 1, 0};
    pthread_mutex_lock(&g->lock);
    int n = HASH_COUNT(g->by_name), cnt = 0;
    nc_nsstore_stats *st = calloc((size_t)n + 1, sizeof *st);
    char (*names)[NS_NAME_MAX] = calloc((size_t)n + 1, sizeof *names);
    ns_handle *r, *tmp;
    /* stats are read under the registry lock: a namespace cannot be freed
     * meanwhile (frees happen after unlinking, under this lock) */
    HASH_ITER(hh, g->by_name, r, tmp) {
        if (st && names && !r->removed) {
            nsstore_stats(r->store, &st[cnt]);
            snprintf(names[cnt], NS_NAME_MAX, "%s", r->name);
            cnt++;
        }
    }
    pthread_mutex_unlock(&g->lock);
    for (size_t m = 0; m < sizeof ns_metrics / sizeof ns_metrics[0]; m++) {
        metrics_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", ns_metrics[m].name, ns_metrics[m].help, ns_metrics[m].name,
                       ns_metrics[m].type);
        for (int i = 0; i < cnt; i++) {
            double v = 0;
            switch (m) {
            case 0: v = (double)st[i].entries; break;
            case 1: v = st[i].words; break;
            case 2: v = (double)st[i].wal_bytes; break;
            case 3: v = (double)st[i].disk_bytes; break;
            case 4: v = (double)st[i].memory_bytes; break;
            case 5: v = (double)st[i].fsyncs; break;
            case 6: v = st[i].snapshot_age; break;
            case 7: v = st[i].snapshot_seconds; break;
            case 8: v = (double)st[i].train.nlist; break;
            case 9: v = st[i].train.imbalance; break;
            case 10: v = st[i].train.nprobe; break;
            case 11: v = st[i].train.recall; break;
            case 12: v = (double)st[i].train.trainings; break;
            case 13: v = st[i].train.phase != NC_UB_TRAIN_IDLE; break;
            case 14: v = st[i].train.progress; break;
            default: v = st[i].train.last_seconds; break;
            }
            metrics_printf(&b, "%s{namespace=\"%s\"} %.17g\n", ns_metrics[m].name, names[i], v);
        }
    }
    metrics_printf(&b, "# HELP neurocache_namespaces namespaces open\n# TYPE neurocache_namespaces gauge\n"
                       "neurocache_namespaces %d\n", cnt);
    int ntables = 0;
    size_t tables = pq_tables_bytes(&ntables);
    metrics_printf(&b, "# HELP neurocache_index_tables_bytes precomputed IVF-PQ tables, one a training, shared by "
                       "its namespaces (not in their memory_bytes)\n# TYPE neurocache_index_tables_bytes gauge\n"
                       "neurocache_index_tables_bytes %zu\n", tables);
    metrics_printf(&b, "# HELP neurocache_recovery_seconds time spent recovering namespaces at start-up\n"
                       "# TYPE neurocache_recovery_seconds gauge\nneurocache_recovery_seconds %.6f\n", g->recovery_s);
    metrics_printf(&b, "# HELP neurocache_adapt_tokens_total tokens added to unbounded caches (documents and feed)\n"
                       "# TYPE neurocache_adapt_tokens_total counter\nneurocache_adapt_tokens_total %llu\n",
                   (unsigned long long)g->adapt_tokens);
    metrics_printf(&b, "# HELP neurocache_documents_total documents streamed into namespaces\n"
                       "# TYPE neurocache_documents_total counter\nneurocache_documents_total %llu\n",
                   (unsigned long long)g->documents);
    metrics_printf(&b, "# HELP neurocache_snapshots_total snapshots written\n# TYPE neurocache_snapshots_total counter\n"
                       "neurocache_snapshots_total %llu\n", (unsigned long long)g->snapshots);
    metrics_printf(&b, "# HELP neurocache_snapshot_failures_total snapshots that failed\n"
                       "# TYPE neurocache_snapshot_failures_total counter\nneurocache_snapshot_failures_total %llu\n",
                   (unsigned long long)g->snapshot_failures);
    free(st);
    free(names);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- deletion ------------------------------------------------------------------ */

int namespaces_delete(nc_server *srv, const char *name, uint64_t born_by, int64_t *entries, uint64_t *incarnation,
                      uint64_t *tombstone, char *err, size_t errlen)
{
    ns_registry *g = srv->namespaces;
    ns_handle *r = namespaces_acquire(srv, name, false, err, errlen);
    if (!r)
        return -1;
    nc_nsstore_stats st;
    nsstore_stats(r->store, &st);
    pthread_mutex_lock(&g->lock);
    if (r->removed || (born_by && r->incarnation > born_by)) {
        /* a concurrent deletion took it out between our acquire and here
         * (HASH_DEL twice would corrupt the table), or the incarnation
         * under the name is younger than the tombstone being applied */
        pthread_mutex_unlock(&g->lock);
        namespaces_release(srv, r);
        snprintf(err, errlen, "no namespace '%s'%s", name, r->removed ? "" : " of that incarnation");
        return -1;
    }
    HASH_DEL(g->by_name, r);
    /* the tombstone is made before the lock goes: any incarnation created
     * under the name from now on is born after it (replication_attach) */
    uint64_t tomb = tombstone && g->deleted ? g->deleted(g->opened_ctx, name) : 0;
    if (tombstone)
        *tombstone = tomb;
    __atomic_store_n(&r->removed, true, __ATOMIC_RELEASE);
    /* No write of this incarnation may land under the path from here on:
     * a snapshot or marker write in progress finishes first (and moves
     * aside with the directory), later ones, adds and documents are
     * refused -- the path may soon be a new incarnation's. Sessions bound
     * to it answer 410 namespace_deleted (namespaces_session_deleted). */
    nsstore_retire(r->store);
    /* the directory moves aside at once so the name can be reused */
    char aside[1200];
    snprintf(aside, sizeof aside, "%.1150s.deleted-%ld", r->dir, (long)time(NULL));
    if (rename(r->dir, aside) == 0)
        snprintf(r->dir, sizeof r->dir, "%s", aside);
    pthread_mutex_unlock(&g->lock);
    slog(SLOG_INFO, "namespace deleted", json_pack("{s:s,s:I,s:I}", "namespace", name, "entries",
                                                   (json_int_t)st.entries, "incarnation", (json_int_t)r->incarnation));
    if (incarnation)
        *incarnation = r->incarnation;
    namespaces_release(srv, r);
    if (entries)
        *entries = st.entries;
    return 0;
}
