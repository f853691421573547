/* replication.c -- namespaces shared by replicas through Redis Streams
 * (replication.h tells how): attaching stores, deleting namespaces, start
 * and stop, and the metrics. The shared state (markers, tombstones, the
 * namespace table, Redis helpers) is in replication_state.c; the publisher
 * thread (local adds -> Redis) in replication_publisher.c; the applier
 * thread (Redis -> local stores) in replication_applier.c. */
#include "replication.h"
#include "replication_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slog.h"

/* Observer of a store's logged adds: only wakes the publisher, which reads
 * the adds back from the log once they are durable. */
static void on_local_add(void *ctx, nc_nsstore *ns, uint32_t doc, uint64_t off, const float *keys,
                         const int *words, size_t n)
{
    (void)ns, (void)doc, (void)off, (void)keys, (void)words, (void)n;
    ns_state *s = ctx;
    replication *rep = s->rep;
    if (replication_applying) return;
    pthread_mutex_lock(&rep->lock);
    s->dirty = true;
    pthread_cond_signal(&rep->cond);
    pthread_mutex_unlock(&rep->lock);
}

uint64_t replication_attach(void *ctx, const char *ns_name, nc_nsstore *store)
{
    replication *rep = ctx;
    if (!rep || !rep->on || !store)
        return 0;
    /* The incarnation and position of the store, from its marker; a store
     * without one is new (its whole log is to publish) or older than the
     * marker (written by a version that published from memory, or while
     * replication was off: taken as published). */
    const char *dir = nsstore_dir(store);
    char err[NC_ERRLEN] = "";
    uint64_t birth = 0, published = 0;
    int m = replication_marker_read(dir, &birth, &published, err, sizeof err);
    nc_nsstore_stats st;
    nsstore_stats(store, &st);
    if (m < 0)
        slog(SLOG_WARN, "replication: marker unreadable; the namespace's log is taken as published",
             json_pack("{s:s,s:s}", "namespace", ns_name, "error", err));
    pthread_mutex_lock(&rep->lock);
    ns_state *s = replication_ns_get(rep, ns_name);
    if (m <= 0) {
        birth = (uint64_t)now_ms();
        if (s && birth <= s->tomb) birth = s->tomb + 1;   /* after any deletion of the name */
        published = m == 0 && st.entries == 0 ? 0 : st.last_seq;
    }
    if (s) {
        s->gen++;
        s->birth = birth;
        s->published = published;
        s->pub_pos = published;
        s->dirty = true;
    }
    pthread_cond_signal(&rep->cond);
    pthread_mutex_unlock(&rep->lock);
    if (!s) {
        slog(SLOG_WARN, "replication: too many namespaces; not replicated", json_pack("{s:s}", "namespace", ns_name));
        return 0;
    }
    if (m <= 0 && replication_marker_write(dir, birth, published, err, sizeof err) != 0)
        slog(SLOG_ERROR, "replication: cannot write the marker", json_pack("{s:s,s:s}", "namespace", ns_name, "error", err));
    /* Segments holding unpublished records outlive snapshots, and so do
     * the published ones for a while (retain_point): everything the log
     * holds now, until this store's follower is RETAIN_MS old. */
    nsstore_retain_log(store, 0);
    nsstore_set_observer(store, on_local_add, s);
    return birth;
}

uint64_t replication_namespace_deleted(void *ctx, const char *ns_name)
{
    replication *rep = ctx;
    if (!rep || !rep->on)
        return 0;
    /* The tombstone: a time after the deleted incarnation's birth (so the
     * other replicas skip its entries and drop their copies, even those
     * down now) and before any later one's (replication_attach). Recorded
     * on disk before the answer, published by the publisher. */
    pthread_mutex_lock(&rep->lock);
    ns_state *s = replication_ns_get(rep, ns_name);
    uint64_t t = (uint64_t)now_ms();
    if (s) {
        if (t <= s->birth) t = s->birth + 1;
        if (t <= s->tomb) t = s->tomb + 1;
        s->tomb = t;
        s->birth = 0;
        s->reset = true;
        replication_tombs_save(rep);
    }
    replication_deletes_add(rep, ns_name, t);
    replication_deletes_save(rep);
    pthread_cond_signal(&rep->cond);
    pthread_mutex_unlock(&rep->lock);
    return t;
}

/* ---- set-up ------------------------------------------------------------------- */

/* "host:port" (or "redis://host:port") into rep->host and rep->port. 0, or
 * -1 with a message. */
static int parse_redis(replication *rep, const char *url, char *err, size_t errlen)
{
    const char *u = url;
    if (!strncmp(u, "redis://", 8)) u += 8;
    const char *colon = strrchr(u, ':');
    rep->port = 6379;
    size_t hl = colon ? (size_t)(colon - u) : strlen(u);
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (*end || p <= 0 || p > 65535) {
            snprintf(err, errlen, "option 'redis': '%s' is not host:port", url);
            return -1;
        }
        rep->port = (int)p;
    }
    if (hl == 0 || hl >= sizeof rep->host) {
        snprintf(err, errlen, "option 'redis': '%s' is not host:port", url);
        return -1;
    }
    memcpy(rep->host, u, hl);
    rep->host[hl] = 0;
    return 0;
}

static void replication_free(replication *rep)
{
    if (!rep)
        return;
    for (int i = 0; i < rep->nns; i++)
        free(rep->ns[i].hw);
    free(rep->dels);
    pthread_cond_destroy(&rep->cond);
    pthread_mutex_destroy(&rep->lock);
    free(rep);
}

/* The settings of rep from the configuration and the test hooks. 0, or -1
 * with a message. */
static int replication_setup(replication *rep, nc_server *srv, char *err, size_t errlen)
{
    if (!srv->cfg.replica_tag[0]) {
        snprintf(err, errlen, "option 'redis' needs option 'replica_tag' (the origin of what this replica publishes)");
        return -1;
    }
    if (parse_redis(rep, srv->cfg.redis, err, errlen) != 0)
        return -1;
    rep->srv = srv;
    snprintf(rep->prefix, sizeof rep->prefix, "%s", srv->cfg.redis_prefix);
    rep->maxlen = srv->cfg.redis_maxlen;
    snprintf(rep->tag, sizeof rep->tag, "%s", srv->cfg.replica_tag);
    rep->model_fp = model_fingerprint(srv->model);
    rep->H = srv->model->cfg.hidden_size;
    rep->deletes_path[0] = 0;
    if (srv->cfg.data_dir[0])
        snprintf(rep->deletes_path, sizeof rep->deletes_path, "%.1000s/%s", srv->cfg.data_dir, DELETES_FILE);
    replication_deletes_load(rep);
    rep->tombs_path[0] = rep->epoch_path[0] = 0;
    if (srv->cfg.data_dir[0]) {
        snprintf(rep->tombs_path, sizeof rep->tombs_path, "%.1000s/%s", srv->cfg.data_dir, TOMBS_FILE);
        snprintf(rep->epoch_path, sizeof rep->epoch_path, "%.1000s/%s", srv->cfg.data_dir, EPOCH_FILE);
    }
    replication_tombs_load(rep);
    FILE *ef = rep->epoch_path[0] ? fopen(rep->epoch_path, "r") : NULL;
    if (ef) {
        if (!fgets(rep->epoch, sizeof rep->epoch, ef)) rep->epoch[0] = 0;
        rep->epoch[strcspn(rep->epoch, "\n")] = 0;
        fclose(ef);
    }
    /* Test hook (tests/test_replication.c): the publisher never records its
     * progress, so a restart publishes the whole log again -- what a crash
     * between an XADD and the marker does to the last batch. */
    const char *nm = getenv("NEUROCACHE_TEST_REPLICATION_NO_MARKER");
    rep->no_marker = nm && nm[0] == '1';
    /* Test hook: widens the window in which a namespace is deleted and
     * created again while a batch of its old store is in flight. */
    const char *delay = getenv("NEUROCACHE_TEST_REPLICATION_PUBLISH_DELAY_MS");
    rep->publish_delay_ms = delay ? atoi(delay) : 0;
    return 0;
}

int replication_start(nc_server *srv, char *err, size_t errlen)
{
    srv->replication = NULL;
    if (!srv->cfg.redis[0])
        return 0;
    replication *rep = calloc(1, sizeof *rep);
    if (!rep) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&rep->lock, NULL);
    pthread_cond_init(&rep->cond, NULL);
    if (replication_setup(rep, srv, err, errlen) != 0) {
        replication_free(rep);
        return -1;
    }
    atomic_store(&rep->tombs_loaded, 0);
    atomic_store(&rep->stop, 0);
    rep->on = true;
    if (pthread_create(&rep->pub, NULL, replication_publisher, rep) != 0) {
        snprintf(err, errlen, "cannot start the replication threads");
        replication_free(rep);
        return -1;
    }
    if (pthread_create(&rep->app, NULL, replication_applier, rep) != 0) {
        snprintf(err, errlen, "cannot start the replication threads");
        atomic_store(&rep->stop, 1);
        pthread_join(rep->pub, NULL);
        replication_free(rep);
        return -1;
    }
    srv->replication = rep;
    /* every store the registry opens from now on publishes its adds */
    srv->namespace_opened = replication_attach;
    srv->namespace_deleted = replication_namespace_deleted;
    srv->namespace_opened_ctx = rep;
    slog(SLOG_INFO, "replication", json_pack("{s:s,s:i,s:s,s:s}", "redis_host", rep->host, "redis_port", rep->port,
                                            "prefix", rep->prefix, "replica", rep->tag));
    return 0;
}

void replication_stop(nc_server *srv)
{
    replication *rep = srv->replication;
    if (!rep)
        return;
    /* The publisher goes on for up to 5 s while there is something to
     * publish and Redis answers; what is left stays in the logs, published
     * at the next start. */
    atomic_store(&rep->stop, 1);
    pthread_mutex_lock(&rep->lock);
    pthread_cond_broadcast(&rep->cond);
    pthread_mutex_unlock(&rep->lock);
    pthread_join(rep->pub, NULL);
    pthread_join(rep->app, NULL);
    unsigned long long left = replication_unpublished_records(rep);
    if (left || rep->ndels)
        slog(SLOG_WARN, "replication: not everything published at exit (kept, published at the next start)",
             json_pack("{s:I,s:i}", "log_records", (json_int_t)left, "deletions", rep->ndels));
    rep->on = false;
}

void replication_shutdown(nc_server *srv)
{
    /* the stores' log observers point into rep until they are closed */
    replication_free(srv->replication);
    srv->replication = NULL;
    srv->namespace_opened = NULL;
    srv->namespace_deleted = NULL;
    srv->namespace_opened_ctx = NULL;
}

/* ---- observability -------------------------------------------------------------- */

char *replication_metrics(nc_server *srv, char *text)
{
    replication *rep = srv->replication;
    if (!rep)
        return text;
    char buf[2048];
    snprintf(buf, sizeof buf,
             "# HELP neurocache_replication_published_tokens_total Pairs published to Redis.\n"
             "# TYPE neurocache_replication_published_tokens_total counter\n"
             "neurocache_replication_published_tokens_total %llu\n"
             "# HELP neurocache_replication_applied_tokens_total Pairs of other replicas applied here.\n"
             "# TYPE neurocache_replication_applied_tokens_total counter\n"
             "neurocache_replication_applied_tokens_total %llu\n"
             "# HELP neurocache_replication_duplicate_entries_total Entries skipped as already applied (republished after a crash).\n"
             "# TYPE neurocache_replication_duplicate_entries_total counter\n"
             "neurocache_replication_duplicate_entries_total %llu\n"
             "# HELP neurocache_replication_refused_entries_total Entries not applied (other model, malformed).\n"
             "# TYPE neurocache_replication_refused_entries_total counter\n"
             "neurocache_replication_refused_entries_total %llu\n"
             "# HELP neurocache_replication_unpublished_records Log records of the namespaces not yet published.\n"
             "# TYPE neurocache_replication_unpublished_records gauge\n"
             "neurocache_replication_unpublished_records %llu\n"
             "# HELP neurocache_replication_lag_seconds Age of the last applied entry when applied.\n"
             "# TYPE neurocache_replication_lag_seconds gauge\n"
             "neurocache_replication_lag_seconds %.3f\n"
             "# HELP neurocache_replication_redis_up The reader's Redis connection is up.\n"
             "# TYPE neurocache_replication_redis_up gauge\n"
             "neurocache_replication_redis_up %d\n",
             (unsigned long long)atomic_load(&rep->published_tokens),
             (unsigned long long)atomic_load(&rep->applied_tokens),
             (unsigned long long)atomic_load(&rep->duplicate_entries),
             (unsigned long long)atomic_load(&rep->refused_entries),
             (unsigned long long)replication_unpublished_records(rep),
             (double)atomic_load(&rep->last_lag_ms) / 1e3,
             atomic_load(&rep->connected_app));
    size_t a = text ? strlen(text) : 0, b = strlen(buf);
    char *t = realloc(text, a + b + 1);
    if (!t) return text;
    memcpy(t + a, buf, b + 1);
    return t;
}

json_t *replication_status(nc_server *srv)
{
    replication *rep = srv->replication;
    json_t *o = json_pack("{s:b}", "enabled", rep != NULL);
    if (rep && o) {
        json_t *pos = json_object();
        pthread_mutex_lock(&rep->lock);
        for (int i = 0; i < rep->nns; i++)
            json_object_set_new(pos, rep->ns[i].name, json_string(rep->ns[i].loaded ? rep->ns[i].last_id : "0"));
        pthread_mutex_unlock(&rep->lock);
        json_object_set_new(o, "replica", json_string(rep->tag));
        json_object_set_new(o, "redis", json_pack("{s:s,s:i,s:b,s:b}", "host", rep->host, "port", rep->port,
                                                  "reader_connected", atomic_load(&rep->connected_app),
                                                  "publisher_connected", atomic_load(&rep->connected_pub)));
        json_object_set_new(o, "published_entries", json_integer((json_int_t)atomic_load(&rep->published_entries)));
        json_object_set_new(o, "published_tokens", json_integer((json_int_t)atomic_load(&rep->published_tokens)));
        json_object_set_new(o, "applied_entries", json_integer((json_int_t)atomic_load(&rep->applied_entries)));
        json_object_set_new(o, "applied_tokens", json_integer((json_int_t)atomic_load(&rep->applied_tokens)));
        json_object_set_new(o, "duplicate_entries", json_integer((json_int_t)atomic_load(&rep->duplicate_entries)));
        json_object_set_new(o, "refused_entries", json_integer((json_int_t)atomic_load(&rep->refused_entries)));
        json_object_set_new(o, "unpublished_records", json_integer((json_int_t)replication_unpublished_records(rep)));
        pthread_mutex_lock(&rep->lock);
        int nd = rep->ndels;
        pthread_mutex_unlock(&rep->lock);
        json_object_set_new(o, "pending_deletions", json_integer(nd));
        json_object_set_new(o, "last_lag_ms", json_integer((json_int_t)atomic_load(&rep->last_lag_ms)));
        json_object_set_new(o, "max_lag_ms", json_integer((json_int_t)atomic_load(&rep->max_lag_ms)));
        json_object_set_new(o, "applied_positions", pos);
    }
    return o;
}
