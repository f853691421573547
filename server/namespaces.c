/* namespaces.c -- the registry of durable namespaces, their HTTP endpoints,
 * streaming document uploads, feed with adapt, explain, snapshots. */
#include "namespaces.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

#include "api_errors.h"
#include "metrics.h"
#include "replication.h"
#include "slog.h"

#define NS_NAME_MAX 64
#define UPLOAD_BATCH 512          /* tokens per LSTM pass / log record */
#define UPLOAD_MAX_WORD (1 << 20) /* a "word" longer than this is refused */
#define EXPLAIN_PER_WORD 3

/* What GET /v1/namespaces/{ns} shows of an upload in progress (an HTTP
 * answer cannot start before libmicrohttpd has read the whole body, so a
 * long upload's progress is read here). Counters are written by the
 * upload's threads, read by anyone; the lists are under uploads_lock. */
typedef struct upload_progress {
    struct upload_progress *prev, *next;
    char document[160];           /* id of the document being read (under the lock) */
    _Atomic uint64_t bytes, documents, tokens_added;
    double started;
} upload_progress;

static pthread_mutex_t uploads_lock = PTHREAD_MUTEX_INITIALIZER;

struct nsref {
    upload_progress *uploads;     /* in progress, under uploads_lock */
    char name[NS_NAME_MAX];
    char dir[1200];
    nc_nsstore *store;
    int refs;
    bool removed;                 /* deleted: directory removed at last release */
    bool heal_failing;            /* snapshot thread's: a failed nsstore_heal was logged */
    UT_hash_handle hh;
};

struct nsreg {
    pthread_mutex_t lock;
    nsref *by_name;
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
    void (*opened)(const char *name, nc_nsstore *store);   /* nc_server.namespace_opened */
};

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= NS_NAME_MAX || s[0] == '.')
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return false;
    return true;
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int open_store(nsreg *g, const char *dir, nc_nsstore **out, nc_nsstore_recovery *info, char *err,
                      size_t errlen)
{
    nc_nsstore_opts o = {.dir = dir, .model = g->m, .sync = g->sync};
    unbounded_cache_opts_default(&o.ub, g->m->cfg.hidden_size);
    o.ub.trained_path = g->trained[0] ? g->trained : NULL;
    o.ub.factory = g->factory[0] ? g->factory : NULL;
    o.ub.train_self = g->train_self;
    if (g->switch_at > 0)
        o.ub.switch_at = g->switch_at;
    /* FAISS's OpenMP threads compete with the request threads for the
     * cores (design §6): a search of one query is not worth a team */
    o.ub.omp_threads = 1;
    int rc = nsstore_open(&o, out, info, err, errlen);
    if (rc == NC_OK && g->opened) {
        /* e.g. replication (Redis) publishes this store's adds from now on */
        const char *slash = strrchr(dir, '/');
        g->opened(slash ? slash + 1 : dir, *out);
    }
    return rc;
}

/* ---- registry -------------------------------------------------------------- */

nsref *namespaces_acquire(nc_server *srv, const char *name, bool create, char *err, size_t errlen)
{
    int rc;
    return namespaces_acquire_rc(srv, name, create, &rc, err, errlen);
}

nsref *namespaces_acquire_rc(nc_server *srv, const char *name, bool create, int *rc, char *err, size_t errlen)
{
    nsreg *g = srv->namespaces;
    *rc = NC_OK;
    if (!g) {
        snprintf(err, errlen, "namespaces are not available yet");
        *rc = NC_ESTATE;
        return NULL;
    }
    if (!valid_name(name)) {
        snprintf(err, errlen, "namespace name must be 1-63 characters of [A-Za-z0-9_.-], not starting with '.'");
        *rc = NC_EINVAL;
        return NULL;
    }
    pthread_mutex_lock(&g->lock);
    nsref *r;
    HASH_FIND_STR(g->by_name, name, r);
    if (!r && create) {
        r = calloc(1, sizeof *r);
        char e2[NC_ERRLEN] = "";
        if (r) {
            snprintf(r->name, sizeof r->name, "%s", name);
            snprintf(r->dir, sizeof r->dir, "%.1000s/%.63s", g->root, name);
            if ((*rc = open_store(g, r->dir, &r->store, NULL, e2, sizeof e2)) != NC_OK) {
                snprintf(err, errlen, "namespace '%s': %s", name, e2);
                free(r);
                r = NULL;
            } else {
                HASH_ADD_STR(g->by_name, name, r);
                slog(SLOG_INFO, "namespace created", json_pack("{s:s,s:s}", "namespace", name, "dir", r->dir));
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

static void ref_destroy(nsref *r)
{
    nsstore_close(r->store);
    if (r->removed) {
        char err[NC_ERRLEN] = "";
        if (nsstore_remove_dir(r->dir, err, sizeof err) != NC_OK)
            slog(SLOG_WARN, "namespace removal", json_pack("{s:s,s:s}", "namespace", r->name, "error", err));
    }
    free(r);
}

void namespaces_release(nc_server *srv, nsref *r)
{
    if (!r)
        return;
    nsreg *g = srv->namespaces;
    pthread_mutex_lock(&g->lock);
    bool destroy = --r->refs == 0 && r->removed;
    pthread_mutex_unlock(&g->lock);
    if (destroy)
        ref_destroy(r);
}

nc_nsstore *nsref_store(nsref *r)
{
    return r->store;
}

int namespaces_bind_session(void *ctx, const char *ns, nc_unbounded_cache **ub, void **ref, char *err,
                            size_t errlen)
{
    nc_server *srv = ctx;
    int rc = NC_OK;
    nsref *r = namespaces_acquire_rc(srv, ns && ns[0] ? ns : "default", true, &rc, err, errlen);
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

static void snapshot_one(nsreg *g, nsref *r, const char *why)
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
static void for_each(nsreg *g, void (*fn)(nsreg *, nsref *, const char *), const char *arg)
{
    pthread_mutex_lock(&g->lock);
    int n = HASH_COUNT(g->by_name), i = 0;
    nsref **all = calloc((size_t)n + 1, sizeof *all), *r, *tmp;
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
    nsref *dead[64];
    int nd = 0;
    for (int j = 0; j < i; j++)
        if (--all[j]->refs == 0 && all[j]->removed && nd < 64)
            dead[nd++] = all[j];
    pthread_mutex_unlock(&g->lock);
    for (int j = 0; j < nd; j++)
        ref_destroy(dead[j]);
    free(all);
}

static void snapshot_if_due(nsreg *g, nsref *r, const char *arg)
{
    (void)arg;
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
    nsreg *g = p;
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

int namespaces_init(nc_server *srv, char *err, size_t errlen)
{
    nsreg *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->m = srv->model;
    g->sync = (nc_wal_sync)srv->cfg.fsync_mode;
    g->period = srv->cfg.snapshot_period_s;
    g->switch_at = srv->cfg.index_switch_at;
    g->train_self = srv->cfg.index_train_self;
    g->opened = srv->namespace_opened;
    snprintf(g->factory, sizeof g->factory, "%s", srv->cfg.index_factory);
    const char *data = srv->cfg.data_dir;
    if (!data[0]) {
        snprintf(g->tmp_root, sizeof g->tmp_root, "/tmp/neurocached-XXXXXX");
        if (!mkdtemp(g->tmp_root)) {
            snprintf(err, errlen, "cannot create a temporary data directory: %s", strerror(errno));
            free(g);
            return -1;
        }
        data = g->tmp_root;
        slog(SLOG_WARN, "no data_dir: namespaces are not durable",
             json_pack("{s:s}", "directory", g->tmp_root));
    }
    snprintf(g->root, sizeof g->root, "%.1000s/namespaces", data);
    if (mkdir_p(g->root) != 0) {
        snprintf(err, errlen, "option 'data_dir': cannot create '%s': %s", g->root, strerror(errno));
        free(g);
        return -1;
    }
    snprintf(g->trained, sizeof g->trained, "%.1000s/unbounded.faiss", srv->cfg.model);
    if (access(g->trained, R_OK) != 0)
        g->trained[0] = 0;
    /* recovery: every namespace directory */
    double t0 = mono();
    DIR *d = opendir(g->root);
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && d && (e = readdir(d))) {
        if (!valid_name(e->d_name))
            continue;
        char dir[1200];
        snprintf(dir, sizeof dir, "%.1000s/%.63s", g->root, e->d_name);
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        nsref *r = calloc(1, sizeof *r);
        nc_nsstore_recovery info;
        char e2[2 * NC_ERRLEN] = "";
        if (!r) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
            break;
        }
        snprintf(r->name, sizeof r->name, "%.63s", e->d_name);
        snprintf(r->dir, sizeof r->dir, "%s", dir);
        int orc = open_store(g, dir, &r->store, &info, e2, sizeof e2);
        if (orc == NC_ENOSPACE) {
            /* nothing is wrong with what is on disk: recovery only needs
             * room for a new log segment (test_diskfull) */
            snprintf(err, errlen, "namespace '%s': no room to reopen its log: %s; free space on the data "
                     "directory's file system and start again (nothing was lost)", r->name, e2);
            free(r);
            rc = -1;
            break;
        }
        if (orc != NC_OK) {
            snprintf(err, errlen, "namespace '%s' cannot be recovered: %s", r->name, e2);
            free(r);
            rc = -1;
            break;
        }
        HASH_ADD_STR(g->by_name, name, r);
        if (info.warning[0])
            slog(SLOG_WARN, "namespace recovered with a warning",
                 json_pack("{s:s,s:s}", "namespace", r->name, "warning", info.warning));
        slog(SLOG_INFO, "namespace recovered",
             json_pack("{s:s,s:I,s:I,s:I,s:f}", "namespace", r->name, "entries", (json_int_t)info.entries,
                       "snapshot_seq", (json_int_t)info.snapshot_seq, "records_replayed",
                       (json_int_t)info.records_replayed, "seconds", info.seconds));
    }
    if (d)
        closedir(d);
    g->recovery_s = mono() - t0;
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

static void snapshot_shutdown(nsreg *g, nsref *r, const char *arg)
{
    snapshot_one(g, r, arg);
}

void namespaces_shutdown(nc_server *srv)
{
    nsreg *g = srv->namespaces;
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
        for_each(g, snapshot_shutdown, "shutdown");
    nsref *r, *tmp;
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
    nsref *r = s->ns_ref;
    *seq = 0;
    if (!r)
        return stream_feed(s->stream, t, false, logprobs, err, errlen);
    if (!s->ns_doc_set) {
        char id[128];
        snprintf(id, sizeof id, "session:%s", s->id);
        int rc = nsstore_doc_begin(r->store, id, strlen(id), &s->ns_doc, NULL, 0, err, errlen);
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
    nsref *r = s->ns_ref;
    return r ? nsstore_sync(r->store, seq, err, errlen) : NC_OK;
}

/* Formats what stream_explain returns (core computes the weights with the
 * mixture's own functions): neural pairs by their token position in the
 * session, unbounded pairs with their provenance from the namespace store. */
json_t *namespaces_explain(nc_session *s, const int *ids, size_t k)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < k; i++)
        json_array_append_new(out, json_array());
    nsref *r = s->ns_ref;
    nc_explain_entry *e = malloc((k ? k : 1) * 2 * EXPLAIN_PER_WORD * sizeof *e);
    int *cnt = malloc((k ? k : 1) * sizeof *cnt);
    char err[NC_ERRLEN];
    if (!out || !e || !cnt || k == 0 ||
        stream_explain(s->stream, ids, k, EXPLAIN_PER_WORD, e, cnt, err, sizeof err) != NC_OK)
        goto done;
    for (size_t i = 0; i < k; i++) {
        json_t *list = json_array_get(out, i);
        for (int j = 0; j < cnt[i]; j++) {
            const nc_explain_entry *x = &e[i * 2 * EXPLAIN_PER_WORD + j];
            char doc[1100], snip[512];
            uint64_t off = 0;
            json_t *o;
            if (x->source == NC_COMP_NEURAL) {
                o = json_pack("{s:s,s:I,s:f}", "source", "neural", "position", (json_int_t)x->at, "weight",
                              x->weight);
            } else if (!r) {
                continue;
            } else if (nsstore_entry(r->store, x->at, doc, sizeof doc, &off, NULL, err, sizeof err) == NC_OK) {
                nsstore_snippet(r->store, x->at, 8, 4, snip, sizeof snip);
                o = json_pack("{s:s,s:s,s:I,s:I,s:f,s:f,s:s}", "source", "unbounded", "document", doc, "offset",
                              (json_int_t)off, "entry", (json_int_t)x->at, "weight", x->weight, "distance",
                              x->distance, "snippet", snip);
            } else {
                o = json_pack("{s:s,s:I,s:f,s:f}", "source", "unbounded", "entry", (json_int_t)x->at, "weight",
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
};

char *namespaces_metrics(nc_server *srv, char *text)
{
    nsreg *g = srv->namespaces;
    if (!text || !g)
        return text;
    metrics_text b = {text, strlen(text), strlen(text) + 1, 0};
    pthread_mutex_lock(&g->lock);
    int n = HASH_COUNT(g->by_name), cnt = 0;
    nc_nsstore_stats *st = calloc((size_t)n + 1, sizeof *st);
    char (*names)[NS_NAME_MAX] = calloc((size_t)n + 1, sizeof *names);
    nsref *r, *tmp;
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
            default: v = st[i].snapshot_seconds; break;
            }
            metrics_printf(&b, "%s{namespace=\"%s\"} %.17g\n", ns_metrics[m].name, names[i], v);
        }
    }
    metrics_printf(&b, "# HELP neurocache_namespaces namespaces open\n# TYPE neurocache_namespaces gauge\n"
                       "neurocache_namespaces %d\n", cnt);
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

/* ---- namespace endpoints ------------------------------------------------------- */

static json_t *uploads_json(nsref *r)
{
    json_t *a = json_array();
    double t = mono();
    pthread_mutex_lock(&uploads_lock);
    for (upload_progress *p = r->uploads; p; p = p->next) {
        double secs = t - p->started;
        uint64_t tok = p->tokens_added;
        json_array_append_new(a, json_pack("{s:s,s:I,s:I,s:I,s:f,s:f}", "document", p->document, "documents",
                                           (json_int_t)p->documents, "bytes_received", (json_int_t)p->bytes,
                                           "tokens_added", (json_int_t)tok, "seconds", secs, "tokens_per_second",
                                           secs > 0 ? (double)tok / secs : 0.0));
    }
    pthread_mutex_unlock(&uploads_lock);
    return a;
}

static json_t *ns_json(nsref *r)
{
    nc_nsstore_stats st;
    nsstore_stats(r->store, &st);
    char idx[160];
    if (st.exact)
        snprintf(idx, sizeof idx, "Flat");
    else
        snprintf(idx, sizeof idx, "%s", st.factory ? st.factory : "IVF");
    return json_pack("{s:s,s:I,s:i,s:I,s:{s:s,s:b,s:i},s:I,s:I,s:I,s:{s:I,s:I,s:f,s:f},s:I,s:o}", "name", r->name,
                     "entries", (json_int_t)st.entries, "words", st.words, "documents", (json_int_t)st.docs,
                     "index", "type", idx, "exact", st.exact, "nprobe", st.nprobe,
                     "disk_bytes", (json_int_t)st.disk_bytes, "wal_bytes", (json_int_t)st.wal_bytes,
                     "memory_bytes", (json_int_t)st.memory_bytes,
                     "log", "last_seq", (json_int_t)st.last_seq, "synced_seq", (json_int_t)st.synced_seq,
                     "snapshot_age", st.snapshot_age, "snapshot_seconds", st.snapshot_seconds,
                     "fsyncs", (json_int_t)st.fsyncs, "uploads", uploads_json(r));
}

void h_ns_list(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    nsreg *g = srv->namespaces;
    json_t *a = json_array();
    if (g) {
        pthread_mutex_lock(&g->lock);
        nsref *r, *tmp;
        HASH_ITER(hh, g->by_name, r, tmp) {
            if (!r->removed)
                json_array_append_new(a, ns_json(r));
        }
        pthread_mutex_unlock(&g->lock);
    }
    http_reply_json(resp, 200, json_pack("{s:o}", "namespaces", a));
}

void h_ns_get(nc_server *srv, http_request *req, http_response *resp)
{
    char err[NC_ERRLEN] = "";
    nsref *r = namespaces_acquire(srv, req->params[0], false, err, sizeof err);
    if (!r) {
        http_reply_error(resp, API_NOT_FOUND, "%s", err);
        return;
    }
    http_reply_json(resp, 200, ns_json(r));
    namespaces_release(srv, r);
}

void h_ns_delete(nc_server *srv, http_request *req, http_response *resp)
{
    const char *name = req->params[0];
    const char *confirm = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "confirm");
    if (!confirm || strcmp(confirm, name) != 0) {
        http_reply_error(resp, API_OUT_OF_RANGE,
                         "deleting namespace '%s' removes every document streamed into it: confirm with "
                         "?confirm=%s", name, name);
        return;
    }
    char err[NC_ERRLEN] = "";
    int64_t entries = 0;
    if (namespaces_delete(srv, name, &entries, err, sizeof err) != 0) {
        http_reply_error(resp, API_NOT_FOUND, "%s", err);
        return;
    }
    /* The other replicas delete it too (replication.h; no-op without Redis). */
    replication_namespace_deleted(name);
    http_reply_json(resp, 200, json_pack("{s:s,s:b,s:I}", "name", name, "deleted", 1, "entries",
                                         (json_int_t)entries));
}

int namespaces_delete(nc_server *srv, const char *name, int64_t *entries, char *err, size_t errlen)
{
    nsreg *g = srv->namespaces;
    nsref *r = namespaces_acquire(srv, name, false, err, errlen);
    if (!r)
        return -1;
    nc_nsstore_stats st;
    nsstore_stats(r->store, &st);
    pthread_mutex_lock(&g->lock);
    HASH_DEL(g->by_name, r);
    r->removed = true;
    /* sessions bound to it keep their (now private) memory until they go;
     * the directory moves aside at once so the name can be reused */
    char aside[1200];
    snprintf(aside, sizeof aside, "%.1150s.deleted-%ld", r->dir, (long)time(NULL));
    if (rename(r->dir, aside) == 0)
        snprintf(r->dir, sizeof r->dir, "%s", aside);
    pthread_mutex_unlock(&g->lock);
    slog(SLOG_INFO, "namespace deleted", json_pack("{s:s,s:I}", "namespace", name, "entries", (json_int_t)st.entries));
    namespaces_release(srv, r);
    if (entries)
        *entries = st.entries;
    return 0;
}

void h_ns_docs_list(nc_server *srv, http_request *req, http_response *resp)
{
    char err[NC_ERRLEN] = "";
    nsref *r = namespaces_acquire(srv, req->params[0], false, err, sizeof err);
    if (!r) {
        http_reply_error(resp, API_NOT_FOUND, "%s", err);
        return;
    }
    json_t *a = json_array();
    uint32_t n = nsstore_doc_count(r->store);
    for (uint32_t i = 0; i < n; i++) {
        char id[1100];
        uint64_t pairs = 0;
        if (nsstore_doc_info(r->store, i, id, sizeof id, &pairs) == NC_OK)
            json_array_append_new(a, json_pack("{s:s,s:I}", "id", id, "tokens", (json_int_t)pairs));
    }
    namespaces_release(srv, r);
    http_reply_json(resp, 200, json_pack("{s:s,s:o}", "namespace", req->params[0], "documents", a));
}

/* ---- streaming document upload -------------------------------------------------- */

enum { UP_PLAIN = 0, UP_NDJSON = 1 };

/* An upload runs on two threads: its HTTP thread tokenizes and runs the
 * LSTM (sequential within a document), a worker adds each batch of pairs
 * to the namespace (log record + index add: the IVF assignment and PQ
 * encoding cost as much as the LSTM). Batches go from one to the other
 * through a small ring, in order. */
#define UPLOAD_SLOTS 3

typedef struct {
    float *keys;                  /* [UPLOAD_BATCH, H] */
    int *wids;
    size_t n;
    uint32_t doc;
    uint64_t off;
} upload_batch;

typedef struct {
    pthread_t thread;
    bool started, stop;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    upload_batch slot[UPLOAD_SLOTS];
    unsigned head, count;         /* next batch to add; batches queued, the one
                                   * being added included until it is done */
    int rc;                       /* first failure of an add, NC_OK so far */
    char err[NC_ERRLEN];
    uint64_t last_seq;            /* of the batches added (their tokens: prog) */
} upload_worker;

typedef struct {
    nc_server *srv;
    nsref *r;
    int mode;
    char *carry;                  /* bytes not processed yet (partial word or line) */
    size_t clen, ccap;
    nc_state *st;
    nc_lstm_work *work;
    float *h;                     /* [H] h before the next token (key of its pair) */
    float *hid;                   /* [UPLOAD_BATCH, H] */
    int *wids;
    upload_worker w;
    upload_progress prog;         /* listed in r->uploads while registered */
    bool listed;
    bool doc_open;
    uint32_t doc;
    uint64_t off;                 /* token offset in the document */
    char plain_id[1100];          /* ?id= of a plain-text upload */
    uint64_t lines;
    json_t *ids;                  /* document ids (first 1000) */
    bool failed;
    api_error code;
    char msg[600];
} upload;

static void *upload_worker_main(void *arg);

/* Waits until every queued batch is added; the first add failure (rc, err)
 * stays in the worker. */
static void upload_drain(upload_worker *w)
{
    pthread_mutex_lock(&w->lock);
    while (w->count > 0)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

/* Off the namespace's list of uploads in progress: before the answer goes
 * out, so that a client reading the namespace after it no longer sees it. */
static void upload_unlist(upload *u)
{
    if (!u->listed)
        return;
    pthread_mutex_lock(&uploads_lock);
    if (u->prog.prev)
        u->prog.prev->next = u->prog.next;
    else
        u->r->uploads = u->prog.next;
    if (u->prog.next)
        u->prog.next->prev = u->prog.prev;
    u->listed = false;
    pthread_mutex_unlock(&uploads_lock);
}

static void upload_free(void *p)
{
    upload *u = p;
    if (!u)
        return;
    upload_worker *w = &u->w;
    if (w->started) {
        /* a failed or abandoned upload: what was queued is still added (it
         * is in the answer's counts), then the worker ends */
        upload_drain(w);
        pthread_mutex_lock(&w->lock);
        w->stop = true;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thread, NULL);
    }
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    for (int i = 0; i < UPLOAD_SLOTS; i++) {
        nc_free(w->slot[i].keys);
        free(w->slot[i].wids);
    }
    upload_unlist(u);
    if (u->r)
        namespaces_release(u->srv, u->r);
    free(u->carry);
    lstm_state_free(u->st);
    lstm_work_free(u->work);
    nc_free(u->h);
    nc_free(u->hid);
    free(u->wids);
    json_decref(u->ids);
    free(u);
}

/* Why a namespace could not be opened (created), as an API error: a bad
 * name is the client's; its log and snapshot can fail on the disk (503
 * storage_unavailable, 507 when full) or on what is on it (500). */
static api_error acquire_api(int rc)
{
    switch (rc) {
    case NC_EINVAL: return API_OUT_OF_RANGE;
    case NC_ENOTFOUND: return API_NOT_FOUND;
    case NC_ESTATE: return API_NOT_READY;
    case NC_EIO:
    case NC_ENOSPACE: return api_error_from_core(rc);
    default: return API_INTERNAL;
    }
}

static void up_fail(upload *u, api_error code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void up_fail(upload *u, api_error code, const char *fmt, ...)
{
    if (u->failed)
        return;
    u->failed = true;
    u->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(u->msg, sizeof u->msg, fmt, ap);
    va_end(ap);
}

static upload *upload_new(nc_server *srv, http_request *req)
{
    upload *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    u->srv = srv;
    const int H = srv->model->cfg.hidden_size;
    u->st = lstm_state_new(srv->model);
    u->work = lstm_work_new(srv->model);
    u->h = nc_alloc((size_t)H * sizeof(float));
    u->hid = nc_alloc((size_t)UPLOAD_BATCH * H * sizeof(float));
    u->wids = malloc(UPLOAD_BATCH * sizeof(int));
    u->ids = json_array();
    pthread_mutex_init(&u->w.lock, NULL);
    pthread_cond_init(&u->w.cond, NULL);
    bool slots = true;
    for (int i = 0; i < UPLOAD_SLOTS; i++) {
        u->w.slot[i].keys = nc_alloc((size_t)UPLOAD_BATCH * H * sizeof(float));
        u->w.slot[i].wids = malloc(UPLOAD_BATCH * sizeof(int));
        slots = slots && u->w.slot[i].keys && u->w.slot[i].wids;
    }
    if (!u->st || !u->work || !u->h || !u->hid || !u->wids || !u->ids || !slots) {
        upload_free(u);
        return NULL;
    }
    const char *ct = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (ct && (strncasecmp(ct, "application/x-ndjson", 20) == 0 || strncasecmp(ct, "application/jsonl", 17) == 0 ||
               strncasecmp(ct, "application/ndjson", 18) == 0 || strncasecmp(ct, "application/json-seq", 20) == 0))
        u->mode = UP_NDJSON;
    else if (ct && strncasecmp(ct, "text/plain", 10) != 0)
        up_fail(u, API_UNSUPPORTED_MEDIA, "Content-Type must be text/plain (one document) or application/x-ndjson "
                "(lines {\"id\": ..., \"text\": ...}), not %s", ct);
    const char *id = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "id");
    if (id) {
        if (u->mode == UP_NDJSON)
            up_fail(u, API_OUT_OF_RANGE, "?id= names the document of a plain-text upload; NDJSON lines carry their own");
        snprintf(u->plain_id, sizeof u->plain_id, "%s", id);
    }
    char err[NC_ERRLEN] = "";
    int rc = NC_OK;
    if (!u->failed && !(u->r = namespaces_acquire_rc(srv, req->params[0], true, &rc, err, sizeof err)))
        up_fail(u, acquire_api(rc), "%s", err);
    if (!u->failed) {
        if (pthread_create(&u->w.thread, NULL, upload_worker_main, u) != 0) {
            upload_free(u);
            return NULL;
        }
        u->w.started = true;
        u->prog.started = mono();
        pthread_mutex_lock(&uploads_lock);
        u->prog.next = u->r->uploads;
        if (u->r->uploads)
            u->r->uploads->prev = &u->prog;
        u->r->uploads = &u->prog;
        u->listed = true;
        pthread_mutex_unlock(&uploads_lock);
    }
    return u;
}

/* The worker: adds the queued batches in order; after a failure it only
 * drops what is queued (the HTTP thread reports the failure). */
static void *upload_worker_main(void *arg)
{
    upload *u = arg;
    upload_worker *w = &u->w;
    char err[NC_ERRLEN];
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (w->count == 0 && !w->stop)
            pthread_cond_wait(&w->cond, &w->lock);
        if (w->count == 0)
            break;
        upload_batch *b = &w->slot[w->head];
        int failed = w->rc;
        pthread_mutex_unlock(&w->lock);
        uint64_t seq = 0;
        int rc = failed ? failed
                        : nsstore_add(u->r->store, b->keys, b->wids, b->n, b->doc, b->off, &seq, err, sizeof err);
        pthread_mutex_lock(&w->lock);
        if (rc && !w->rc) {
            w->rc = rc;
            snprintf(w->err, sizeof w->err, "%s", err);
        } else if (!rc) {
            w->last_seq = seq;
            u->prog.tokens_added += b->n;
            u->srv->namespaces->adapt_tokens += b->n;
        }
        w->head = (w->head + 1) % UPLOAD_SLOTS;
        w->count--;
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* The failure of an add made by the worker, as the upload's error. */
static int upload_worker_failed(upload *u)
{
    pthread_mutex_lock(&u->w.lock);
    int rc = u->w.rc;
    pthread_mutex_unlock(&u->w.lock);
    if (rc)
        up_fail(u, rc == NC_ENOSPACE || rc == NC_EIO ? api_error_from_core(rc) : API_INTERNAL,
                "adding to namespace '%s': %s", u->r->name, u->w.err);
    return rc;
}

/* Starts a document: state = zero advanced by eos (design §3), as a session. */
static int doc_start(upload *u, const char *id, size_t len)
{
    char err[NC_ERRLEN] = "", used[1100] = "";
    if (len >= 5 && !memcmp(id, "repl:", 5)) {
        /* the documents of entries applied from other replicas: the
         * publisher does not publish them again (replication.h) */
        up_fail(u, API_OUT_OF_RANGE, "document %llu: ids starting with 'repl:' are reserved for replication",
                (unsigned long long)u->prog.documents + 1);
        return -1;
    }
    int rc = nsstore_doc_begin(u->r->store, id, len, &u->doc, used, sizeof used, err, sizeof err);
    if (rc != NC_OK) {
        /* a bad id (400), or the log under the DOC record (503/507) */
        up_fail(u, api_error_from_core(rc), "document %llu: %s", (unsigned long long)u->prog.documents + 1, err);
        return -1;
    }
    const nc_model *m = u->srv->model;
    lstm_state_reset(u->st);
    lstm_step(m, u->st, m->eos_id, u->work);
    memcpy(u->h, lstm_state_top(u->st), (size_t)m->cfg.hidden_size * sizeof(float));
    u->doc_open = true;
    u->off = 0;
    u->prog.documents++;
    pthread_mutex_lock(&uploads_lock);
    snprintf(u->prog.document, sizeof u->prog.document, "%s", used);
    pthread_mutex_unlock(&uploads_lock);
    u->srv->namespaces->documents++;
    if (json_array_size(u->ids) < 1000)
        json_array_append_new(u->ids, json_string(used));
    return 0;
}

/* Runs tokens through the model in batches and adds every pair (h before
 * token j, token j) with its provenance. */
static int add_tokens(upload *u, const nc_tokens *t)
{
    const nc_model *m = u->srv->model;
    const int H = m->cfg.hidden_size;
    nc_wordtable *words = nsstore_words(u->r->store);
    char err[NC_ERRLEN] = "";
    for (size_t j0 = 0; j0 < t->n; j0 += UPLOAD_BATCH) {
        size_t nb = t->n - j0 < UPLOAD_BATCH ? t->n - j0 : UPLOAD_BATCH;
        for (size_t j = 0; j < nb; j++) {
            int id = t->ids[j0 + j];
            if (id == m->unk_id && t->words[j0 + j]) {
                /* open vocabulary: the namespace remembers the word itself */
                id = wordtable_id(words, t->words[j0 + j], strlen(t->words[j0 + j]), true);
                if (id < 0) {
                    up_fail(u, API_INTERNAL, "word table: out of memory");
                    return -1;
                }
            }
            u->wids[j] = id;
        }
        if (lstm_forward_seq(m, u->st, t->ids + j0, nb, u->hid, err, sizeof err) != NC_OK) {
            up_fail(u, API_INTERNAL, "model: %s", err);
            return -1;
        }
        /* hand the batch to the worker: wait for a free slot */
        upload_worker *w = &u->w;
        pthread_mutex_lock(&w->lock);
        while (w->count == UPLOAD_SLOTS && !w->rc)
            pthread_cond_wait(&w->cond, &w->lock);
        int failed = w->rc;
        /* head + count is where the next batch goes; the worker moves
         * head and count together, and reads only slot[head] */
        upload_batch *b = &w->slot[(w->head + w->count) % UPLOAD_SLOTS];
        pthread_mutex_unlock(&w->lock);
        if (failed) {
            upload_worker_failed(u);
            return -1;
        }
        memcpy(b->keys, u->h, (size_t)H * sizeof(float));
        memcpy(b->keys + H, u->hid, (nb - 1) * (size_t)H * sizeof(float));
        memcpy(b->wids, u->wids, nb * sizeof(int));
        b->n = nb;
        b->doc = u->doc;
        b->off = u->off;
        memcpy(u->h, u->hid + (nb - 1) * (size_t)H, (size_t)H * sizeof(float));
        pthread_mutex_lock(&w->lock);
        w->count++;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
        u->off += nb;
    }
    return 0;
}

static int add_text(upload *u, const char *text, size_t len, bool final_eos)
{
    nc_tokens t;
    tokens_init(&t);
    char err[NC_ERRLEN] = "";
    int rc = tokenize(u->srv->model, text, len, final_eos, &t, err, sizeof err);
    if (rc != NC_OK)
        up_fail(u, rc == NC_EFORMAT ? API_INVALID_TEXT : API_INTERNAL, "document %llu: %s",
                (unsigned long long)u->prog.documents, err);
    else
        rc = add_tokens(u, &t);
    tokens_clear(&t);
    return rc;
}

static int ndjson_line(upload *u, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
        len--;
    if (len == 0)
        return 0;   /* blank lines are allowed */
    u->lines++;
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        up_fail(u, o ? API_INVALID_TYPE : API_INVALID_JSON, "line %llu: %s", (unsigned long long)u->lines,
                o ? "each line must be an object {\"id\": ..., \"text\": ...}" : je.text);
        json_decref(o);
        return -1;
    }
    json_t *text = json_object_get(o, "text"), *id = json_object_get(o, "id");
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (strcmp(k, "text") != 0 && strcmp(k, "id") != 0) {
            up_fail(u, API_UNKNOWN_FIELD, "line %llu: unknown field '%s'", (unsigned long long)u->lines, k);
            json_decref(o);
            return -1;
        }
    }
    if (!json_is_string(text) || (id && !json_is_string(id) && !json_is_null(id))) {
        up_fail(u, text ? API_INVALID_TYPE : API_MISSING_FIELD, "line %llu: %s", (unsigned long long)u->lines,
                !text ? "field 'text' is required" : !json_is_string(text) ? "field 'text' must be a string"
                                                                           : "field 'id' must be a string");
        json_decref(o);
        return -1;
    }
    int rc = doc_start(u, json_is_string(id) ? json_string_value(id) : NULL,
                       json_is_string(id) ? json_string_length(id) : 0);
    if (rc == 0)
        rc = add_text(u, json_string_value(text), json_string_length(text), true);
    u->doc_open = false;
    json_decref(o);
    return rc;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

static void docs_chunk(nc_server *srv, http_request *req, const char *data, size_t len)
{
    upload *u = req->user;
    if (!u) {
        u = upload_new(srv, req);
        if (!u)
            return;   /* answered 500 at the end */
        req->user = u;
        req->user_free = upload_free;
    }
    u->prog.bytes += len;
    if (u->failed)
        return;   /* the rest of the body is read and dropped */
    long max_line = srv->cfg.max_body_bytes;
    /* the unprocessed tail plus this chunk */
    if (u->clen + len + 1 > u->ccap) {
        size_t cap = u->ccap ? u->ccap : 65536;
        while (cap < u->clen + len + 1)
            cap *= 2;
        char *c = realloc(u->carry, cap);
        if (!c) {
            up_fail(u, API_INTERNAL, "out of memory");
            return;
        }
        u->carry = c;
        u->ccap = cap;
    }
    memcpy(u->carry + u->clen, data, len);
    u->clen += len;
    size_t done = 0;
    if (u->mode == UP_NDJSON) {
        char *nl;
        while ((nl = memchr(u->carry + done, '\n', u->clen - done))) {
            size_t l = (size_t)(nl - (u->carry + done));
            if (ndjson_line(u, u->carry + done, l) != 0)
                return;
            done += l + 1;
        }
        if (u->clen - done > (size_t)max_line) {
            up_fail(u, API_BODY_TOO_LARGE, "NDJSON line %llu is longer than max_body_bytes (%ld); stream long "
                    "documents as text/plain", (unsigned long long)u->lines + 1, max_line);
            return;
        }
    } else {
        /* plain text: everything up to the last white space is complete
         * words (and newlines, which become eos); the rest waits */
        size_t cut = u->clen;
        while (cut > 0 && !is_space(u->carry[cut - 1]))
            cut--;
        if (cut > 0) {
            if (!u->doc_open && doc_start(u, u->plain_id[0] ? u->plain_id : NULL, strlen(u->plain_id)) != 0)
                return;
            if (add_text(u, u->carry, cut, false) != 0)
                return;
            done = cut;
        } else if (u->clen > UPLOAD_MAX_WORD) {
            up_fail(u, API_INVALID_TEXT, "a word of more than %d bytes", UPLOAD_MAX_WORD);
            return;
        }
    }
    memmove(u->carry, u->carry + done, u->clen - done);
    u->clen -= done;
}

void h_ns_documents(nc_server *srv, http_request *req, http_response *resp)
{
    if (!resp) {
        docs_chunk(srv, req, req->chunk, req->chunk_len);
        return;
    }
    upload *u = req->user;
    if (!u) {
        /* an empty body: no chunk came */
        docs_chunk(srv, req, "", 0);
        u = req->user;
        if (!u) {
            http_reply_error(resp, API_INTERNAL, "out of memory");
            return;
        }
    }
    if (!u->failed && u->clen > 0) {
        if (u->mode == UP_NDJSON)
            ndjson_line(u, u->carry, u->clen);
        else {
            if (!u->doc_open)
                doc_start(u, u->plain_id[0] ? u->plain_id : NULL, strlen(u->plain_id));
            if (!u->failed)
                add_text(u, u->carry, u->clen, true);
        }
        u->clen = 0;
    }
    /* every batch added, then durable before the answer -- also what was
     * added before a failure, which the error message reports */
    if (u->w.started) {
        upload_drain(&u->w);
        upload_worker_failed(u);
    }
    char err[NC_ERRLEN] = "";
    int rc = u->r ? nsstore_sync(u->r->store, u->w.last_seq, err, sizeof err) : NC_OK;
    upload_unlist(u);
    if (rc != NC_OK && !u->failed)
        up_fail(u, api_error_from_core(rc), "making the upload durable: %s", err);
    if (u->failed) {
        http_reply_error(resp, u->code, "%s (%llu documents, %llu tokens were added before this)", u->msg,
                         (unsigned long long)u->prog.documents, (unsigned long long)u->prog.tokens_added);
        return;
    }
    metrics_add_tokens_fed(u->prog.tokens_added);
    http_reply_json(resp, 200, json_pack("{s:s,s:I,s:I,s:O,s:I}", "namespace", u->r->name, "documents",
                                         (json_int_t)u->prog.documents, "tokens_added",
                                         (json_int_t)u->prog.tokens_added, "ids", u->ids, "entries",
                                         (json_int_t)unbounded_cache_count(nsstore_unbounded_cache(u->r->store))));
}
