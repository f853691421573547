/* replication.c -- namespaces shared by replicas through Redis Streams: a
 * publisher thread follows every namespace's write-ahead log and XADDs the
 * local adds (pipelined), remembering how far it got in a marker file of
 * the namespace; an applier thread XREADs every namespace's stream and adds
 * the other replicas' entries to the local stores, skipping what it holds
 * already; deletions travel as tombstones. */
#include "replication.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "atomicfile.h"
#include "namespaces.h"
#include "slog.h"

#define MAX_NS 256
#define BATCH_ENTRIES 256                   /* XADDs per pipeline */
#define BATCH_BYTES ((size_t)8 << 20)       /* ...or this much key data */
#define MARKER_FILE "replication-state"     /* in the namespace's directory */
#define MARKER_HEAD "neurocache-replication 1"
#define MARKER_EVERY_MS 100                 /* marker writes per namespace, at most */
#define DELETES_FILE "replication-deletes"  /* in data_dir: tombstones not yet in Redis */

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

/* Set while the applier adds remote pairs: the observer ignores them. */
static __thread int applying;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The marker of a namespace directory: its incarnation and how far its log
 * is published. 1 read, 0 absent, -1 unreadable or corrupt (err says). */
static int marker_read(const char *dir, uint64_t *birth, uint64_t *published, char *err, size_t errlen)
{
    char path[1200], buf[512];
    snprintf(path, sizeof path, "%s/%s", dir, MARKER_FILE);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "%.400s: %s", path, strerror(errno));
        return -1;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    unsigned long long b = 0, p = 0;
    unsigned crc = 0;
    int used = 0;
    char *c = strstr(buf, "crc ");
    if (!c || sscanf(buf, MARKER_HEAD "\nbirth %llu\npublished %llu\n%n", &b, &p, &used) != 2 ||
        buf + used != c || sscanf(c, "crc %8x", &crc) != 1 ||
        crc != (unsigned)crc32(0L, (const Bytef *)buf, (uInt)(c - buf)) || b == 0) {
        snprintf(err, errlen, "%.400s: not a replication marker, or corrupt", path);
        return -1;
    }
    *birth = b;
    *published = p;
    return 1;
}

static int marker_write(const char *dir, uint64_t birth, uint64_t published, char *err, size_t errlen)
{
    char path[1200], buf[512];
    snprintf(path, sizeof path, "%s/%s", dir, MARKER_FILE);
    int k = snprintf(buf, sizeof buf, MARKER_HEAD "\nbirth %llu\npublished %llu\n", (unsigned long long)birth,
                     (unsigned long long)published);
    k += snprintf(buf + k, sizeof buf - (size_t)k, "crc %08x\n", (unsigned)crc32(0L, (const Bytef *)buf, (uInt)k));
    /* after a crash the old marker or the new one, never a mix */
    return atomicfile_write(path, buf, (size_t)k, err, errlen) == NC_OK ? 0 : -1;
}

/* The tombstones this replica has not yet put in Redis (rep->lock held). */
static void deletes_save(replication *rep)
{
    if (!rep->deletes_path[0]) return;
    size_t cap = 64 + (size_t)rep->ndels * (SESSION_ID_MAX + 24), k = 0;
    char *buf = malloc(cap), err[NC_ERRLEN];
    if (!buf) return;
    for (int i = 0; i < rep->ndels; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s %llu\n", rep->dels[i].name, (unsigned long long)rep->dels[i].t);
    if (atomicfile_write(rep->deletes_path, buf, k, err, sizeof err) != NC_OK)
        slog(SLOG_ERROR, "replication: cannot record a namespace deletion", json_pack("{s:s}", "error", err));
    free(buf);
}

static void deletes_add(replication *rep, const char *name, uint64_t t)
{
    int i;
    for (i = 0; i < rep->ndels && strcmp(rep->dels[i].name, name); i++) {}
    if (i == rep->ndels) {
        if (rep->ndels == rep->delcap) {
            int c = rep->delcap ? 2 * rep->delcap : 8;
            pending_del *p = realloc(rep->dels, (size_t)c * sizeof *p);
            if (!p) return;
            rep->dels = p;
            rep->delcap = c;
        }
        snprintf(rep->dels[rep->ndels].name, sizeof rep->dels[0].name, "%s", name);
        rep->dels[rep->ndels].t = 0;
        rep->ndels++;
    }
    if (t > rep->dels[i].t) rep->dels[i].t = t;
}

static void deletes_load(replication *rep)
{
    FILE *f = rep->deletes_path[0] ? fopen(rep->deletes_path, "r") : NULL;
    if (!f) return;
    char name[SESSION_ID_MAX];
    unsigned long long t;
    while (fscanf(f, "%63s %llu", name, &t) == 2)
        deletes_add(rep, name, t);
    fclose(f);
}

/* ---- namespaces --------------------------------------------------------------- */

/* The entry of name, or NULL (rep->lock held). */
static ns_state *ns_find(replication *rep, const char *name)
{
    for (int i = 0; i < rep->nns; i++)
        if (!strcmp(rep->ns[i].name, name)) return &rep->ns[i];
    return NULL;
}

/* The entry of name, created when absent (rep->lock held); NULL when full. */
static ns_state *ns_get(replication *rep, const char *name)
{
    ns_state *s = ns_find(rep, name);
    if (s || rep->nns == MAX_NS) return s;
    s = &rep->ns[rep->nns];
    memset(s, 0, sizeof *s);
    s->rep = rep;
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->last_id, sizeof s->last_id, "0");
    /* published fully before the count grows: the applier reads entries
     * below the count without the lock */
    __atomic_store_n(&rep->nns, rep->nns + 1, __ATOMIC_RELEASE);
    return s;
}

/* Observer of a store's logged adds: only wakes the publisher, which reads
 * the adds back from the log once they are durable. */
static void on_local_add(void *ctx, nc_nsstore *ns, uint32_t doc, uint64_t off, const float *keys,
                         const int *words, size_t n)
{
    (void)ns, (void)doc, (void)off, (void)keys, (void)words, (void)n;
    ns_state *s = ctx;
    replication *rep = s->rep;
    if (applying) return;
    pthread_mutex_lock(&rep->lock);
    s->dirty = true;
    pthread_cond_signal(&rep->cond);
    pthread_mutex_unlock(&rep->lock);
}

void replication_attach(void *ctx, const char *ns_name, nc_nsstore *store)
{
    replication *rep = ctx;
    if (!rep || !rep->on || !store)
        return;
    /* The incarnation and position of the store, from its marker; a store
     * without one is new (its whole log is to publish) or older than the
     * marker (written by a version that published from memory, or while
     * replication was off: taken as published). */
    const char *dir = nsstore_dir(store);
    char err[NC_ERRLEN] = "";
    uint64_t birth = 0, published = 0;
    int m = marker_read(dir, &birth, &published, err, sizeof err);
    nc_nsstore_stats st;
    nsstore_stats(store, &st);
    if (m < 0)
        slog(SLOG_WARN, "replication: marker unreadable; the namespace's log is taken as published",
             json_pack("{s:s,s:s}", "namespace", ns_name, "error", err));
    pthread_mutex_lock(&rep->lock);
    ns_state *s = ns_get(rep, ns_name);
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
        return;
    }
    if (m <= 0 && marker_write(dir, birth, published, err, sizeof err) != 0)
        slog(SLOG_ERROR, "replication: cannot write the marker", json_pack("{s:s,s:s}", "namespace", ns_name, "error", err));
    /* Segments holding unpublished records outlive snapshots. */
    nsstore_retain_log(store, published);
    nsstore_set_observer(store, on_local_add, s);
}

void replication_namespace_deleted(nc_server *srv, const char *ns_name)
{
    replication *rep = srv->replication;
    if (!rep || !rep->on)
        return;
    /* The tombstone: a time after the deleted incarnation's birth (so the
     * other replicas skip its entries and drop their copies, even those
     * down now) and before any later one's (replication_attach). Recorded
     * on disk before the answer, published by the publisher. */
    pthread_mutex_lock(&rep->lock);
    ns_state *s = ns_get(rep, ns_name);
    uint64_t t = (uint64_t)now_ms();
    if (s) {
        if (t <= s->birth) t = s->birth + 1;
        if (t <= s->tomb) t = s->tomb + 1;
        s->tomb = t;
        s->birth = 0;
        s->reset = true;
    }
    deletes_add(rep, ns_name, t);
    deletes_save(rep);
    pthread_cond_signal(&rep->cond);
    pthread_mutex_unlock(&rep->lock);
}

/* ---- Redis ------------------------------------------------------------------ */

static redisContext *connect_redis(replication *rep, atomic_int *flag)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(rep->host, rep->port, tv);
    if (!c || c->err) {
        if (c) redisFree(c);
        atomic_store(flag, 0);
        return NULL;
    }
    struct timeval io = {5, 0};
    redisSetTimeout(c, io);
    atomic_store(flag, 1);
    return c;
}

static void stream_key(replication *rep, const char *ns, char *out, size_t cap)
{
    snprintf(out, cap, "%sns:%s", rep->prefix, ns);
}

/* Reads n pipelined replies; 0 when all succeeded. */
static int read_replies(redisContext *c, int n)
{
    int ok = 1;
    for (int i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK || !r) {
            if (r) freeReplyObject(r);
            return -1;   /* the connection is gone: the rest will not come */
        }
        if (r->type == REDIS_REPLY_ERROR) {
            slog(SLOG_WARN, "replication: redis refused a command", json_pack("{s:s}", "error", r->str));
            ok = 0;
        }
        freeReplyObject(r);
    }
    return ok ? 0 : -1;
}

/* Log records of the attached stores not yet published (or passed over:
 * DOC records, entries applied from others), whatever Redis's state. */
static uint64_t unpublished_records(replication *rep)
{
    uint64_t total = 0;
    pthread_mutex_lock(&rep->lock);
    int nns = rep->nns;
    pthread_mutex_unlock(&rep->lock);
    for (int i = 0; i < nns; i++) {
        ns_state *s = &rep->ns[i];
        pthread_mutex_lock(&rep->lock);
        unsigned gen = s->gen;
        bool attached = s->birth != 0;
        uint64_t done = s->published;
        if (s->pub_pos > done) done = s->pub_pos;
        pthread_mutex_unlock(&rep->lock);
        char err[NC_ERRLEN];
        ns_handle *ref = attached ? namespaces_acquire(rep->srv, s->name, false, err, sizeof err) : NULL;
        if (!ref) continue;
        uint64_t last = nsstore_last_seq(namespaces_store(ref));
        namespaces_release(rep->srv, ref);
        pthread_mutex_lock(&rep->lock);
        bool same = s->gen == gen;
        pthread_mutex_unlock(&rep->lock);
        if (same && last > done) total += last - done;
    }
    return total;
}

/* ---- publisher ---------------------------------------------------------------- */

/* Moves s's published position to pos (forward only, unless reset), if s
 * is still attached to the store of attachment gen: a position in the log
 * of a store deleted (and created again) meanwhile means nothing in the
 * new store's log, whose records would be passed over. */
static void pub_pos_advance(replication *rep, ns_state *s, unsigned gen, uint64_t pos, bool reset)
{
    pthread_mutex_lock(&rep->lock);
    if (s->gen == gen && (reset || pos > s->pub_pos)) s->pub_pos = pos;
    pthread_mutex_unlock(&rep->lock);
}

/* Writes s's marker if it is behind and due (or forced). */
static void marker_flush(replication *rep, ns_state *s, nc_nsstore *store, uint64_t birth, bool force)
{
    pthread_mutex_lock(&rep->lock);
    uint64_t pos = s->pub_pos;
    bool behind = pos > s->published && s->birth == birth;
    pthread_mutex_unlock(&rep->lock);
    if (!behind || (!force && now_ms() - s->marker_at < MARKER_EVERY_MS))
        return;
    char err[NC_ERRLEN] = "";
    s->marker_at = now_ms();
    if (rep->no_marker)
        return;
    if (marker_write(nsstore_dir(store), birth, pos, err, sizeof err) != 0) {
        slog(SLOG_WARN, "replication: cannot write the marker (entries may be published twice after a crash; "
             "the other replicas skip them)", json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        return;
    }
    pthread_mutex_lock(&rep->lock);
    if (s->birth == birth) s->published = pos;
    pthread_mutex_unlock(&rep->lock);
    nsstore_retain_log(store, pos);
}

/* Whether a deletion of name waits to be published (rep->lock held). */
static bool deletion_pending(replication *rep, const char *name)
{
    for (int i = 0; i < rep->ndels; i++)
        if (!strcmp(rep->dels[i].name, name)) return true;
    return false;
}

/* Tombstones not yet in Redis: the control stream wakes the replicas that
 * are up, the hash tells the ones down now when they come back. 0, or -1
 * when Redis failed. */
static int publish_deletes(replication *rep, redisContext *c)
{
    pthread_mutex_lock(&rep->lock);
    int n = rep->ndels;
    pending_del *d = n ? malloc((size_t)n * sizeof *d) : NULL;
    if (d) memcpy(d, rep->dels, (size_t)n * sizeof *d);
    pthread_mutex_unlock(&rep->lock);
    if (!d) return 0;
    char ctl[200], tombs[200];
    snprintf(ctl, sizeof ctl, "%sctl", rep->prefix);
    snprintf(tombs, sizeof tombs, "%stombstones", rep->prefix);
    for (int i = 0; i < n; i++) {
        char key[256], t[32];
        stream_key(rep, d[i].name, key, sizeof key);
        snprintf(t, sizeof t, "%llu", (unsigned long long)d[i].t);
        /* the hash first: a replica woken by the control entry finds it */
        const char *hv[] = {"HSET", tombs, d[i].name, t};
        size_t hl[4];
        for (int k = 0; k < 4; k++) hl[k] = strlen(hv[k]);
        redisAppendCommandArgv(c, 4, hv, hl);
        const char *av[] = {"XADD", ctl, "MAXLEN", "~", "10000", "*", "del", d[i].name, "o", rep->tag, "t", t};
        size_t al[12];
        for (int k = 0; k < 12; k++) al[k] = strlen(av[k]);
        redisAppendCommandArgv(c, 12, av, al);
        redisAppendCommand(c, "DEL %s", key);
        redisAppendCommand(c, "SREM %snamespaces %s", rep->prefix, d[i].name);
    }
    int rc = read_replies(c, 4 * n);
    if (rc == 0) {
        /* done with these (a newer deletion of a name meanwhile stays) */
        pthread_mutex_lock(&rep->lock);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < rep->ndels; j++)
                if (!strcmp(rep->dels[j].name, d[i].name) && rep->dels[j].t == d[i].t) {
                    rep->dels[j] = rep->dels[--rep->ndels];
                    break;
                }
        deletes_save(rep);
        pthread_mutex_unlock(&rep->lock);
    }
    free(d);
    return rc;
}

/* Opens a follower of store's log at published into s->log (attachment
 * gen). 0, or -1 when the log cannot be read (logged once). */
static int follow_log(replication *rep, ns_state *s, nc_nsstore *store, unsigned gen, uint64_t published)
{
    char err[NC_ERRLEN] = "";
    int rc = nsstore_log_open(store, published, &s->log, err, sizeof err);
    if (rc == NC_ENOTFOUND) {
        /* Only if segments were removed behind replication's back
         * (nsstore_retain_log keeps them): what they held is lost for
         * the other replicas. Go on from what exists. */
        nc_nsstore_stats st;
        nsstore_stats(store, &st);
        slog(SLOG_ERROR, "replication: the log no longer holds unpublished records; publishing from its end",
             json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        published = st.last_seq;
        rc = nsstore_log_open(store, published, &s->log, err, sizeof err);
    }
    if (rc != NC_OK) {
        if (!s->log_warned)
            slog(SLOG_ERROR, "replication: cannot read the namespace's log",
                 json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        s->log_warned = true;
        return -1;
    }
    s->log_gen = gen;
    /* A new follower (a store opened or created again, a name deleted
     * and created again here or elsewhere, whose deletion took it out
     * of the namespace set): announced again, or a replica that learns
     * names from the set would never read its stream. */
    s->announced = false;
    pub_pos_advance(rep, s, gen, published, true);
    return 0;
}

/* Queues on c (pipelined) the announcement of s's namespace when it is not
 * announced on this connection yet: the set first, then the wake-up, so a
 * reader woken by the control entry finds the namespace in the set.
 * Returns the number of commands queued. */
static int announce(replication *rep, redisContext *c, const ns_state *s)
{
    if (s->announced)
        return 0;
    char ctl[200];
    snprintf(ctl, sizeof ctl, "%sctl", rep->prefix);
    redisAppendCommand(c, "SADD %snamespaces %s", rep->prefix, s->name);
    const char *av[] = {"XADD", ctl, "MAXLEN", "~", "10000", "*", "ns", s->name};
    size_t al[8];
    for (int i = 0; i < 8; i++) al[i] = strlen(av[i]);
    redisAppendCommandArgv(c, 8, av, al);
    return 2;
}

/* Queues on c (pipelined) one XADD per local add that s's log holds next,
 * up to a batch (BATCH_ENTRIES, or BATCH_BYTES of keys); adds applied from
 * other replicas are passed over. *sent and *tokens count what was queued;
 * returns what the log's reader last said (1 more, 0 at the end, NC_* < 0
 * an error with err). */
static int queue_adds(replication *rep, redisContext *c, ns_state *s, uint64_t birth, int *sent, uint64_t *tokens,
                      char *err, size_t errlen)
{
    char key[256], mt[32], maxlen[32], bs[32];
    stream_key(rep, s->name, key, sizeof key);
    snprintf(mt, sizeof mt, "%016llx", (unsigned long long)rep->model_fp);
    snprintf(maxlen, sizeof maxlen, "%ld", rep->maxlen);
    snprintf(bs, sizeof bs, "%llu", (unsigned long long)birth);
    size_t bytes = 0;
    nc_nslog_add a;
    int rc = 0;
    *sent = 0;
    *tokens = 0;
    while (*sent < BATCH_ENTRIES && bytes < BATCH_BYTES && (rc = nsstore_log_next(s->log, &a, err, errlen)) == 1) {
        if (!strncmp(a.doc, "repl:", 5))
            continue;   /* applied from another replica: its origin published it */
        char off[32], n[32], sq[32];
        snprintf(off, sizeof off, "%llu", (unsigned long long)a.off);
        snprintf(n, sizeof n, "%zu", a.n);
        snprintf(sq, sizeof sq, "%llu", (unsigned long long)a.seq);
        const char *argv[28];
        size_t argl[28];
        int k = 0;
#define ARG(x, l) (argv[k] = (x), argl[k] = (l), k++)
        ARG("XADD", 4); ARG(key, strlen(key));
        if (rep->maxlen > 0) { ARG("MAXLEN", 6); ARG("~", 1); ARG(maxlen, strlen(maxlen)); }
        ARG("*", 1);
        ARG("o", 1); ARG(rep->tag, strlen(rep->tag));
        ARG("b", 1); ARG(bs, strlen(bs));
        ARG("s", 1); ARG(sq, strlen(sq));
        ARG("d", 1); ARG(a.doc, strlen(a.doc));
        ARG("f", 1); ARG(off, strlen(off));
        ARG("n", 1); ARG(n, strlen(n));
        ARG("m", 1); ARG(mt, strlen(mt));
        ARG("w", 1); ARG(a.words, a.words_len);
        ARG("k", 1); ARG((const char *)a.keys_f16, a.n * (size_t)rep->H * 2);
#undef ARG
        redisAppendCommandArgv(c, k, argv, argl);
        (*sent)++;
        *tokens += a.n;
        bytes += a.n * (size_t)rep->H * 2;
    }
    return rc;
}

/* Publishes what s's log holds after its position, up to one batch.
 * 1 when more may be waiting (a full batch, or records not yet durable),
 * 0 when s is up to date, -1 when Redis failed (the position stays: the
 * batch is read again from the log next time). */
static int publish_ns(replication *rep, redisContext *c, ns_state *s, bool final)
{
    char err[NC_ERRLEN] = "";
    pthread_mutex_lock(&rep->lock);
    unsigned gen = s->gen;
    /* from what Redis acknowledged (the marker may lag it) */
    uint64_t birth = s->birth, published = s->pub_pos, tomb = s->tomb;
    bool deleting = deletion_pending(rep, s->name);
    s->dirty = false;
    pthread_mutex_unlock(&rep->lock);
    if (s->log && (s->log_gen != gen || birth == 0)) {
        /* the store it followed was closed (deleted, or opened again) */
        nsstore_log_close(s->log);
        s->log = NULL;
    }
    if (birth == 0 || birth <= tomb)
        return 0;   /* no store here, or one of a deleted incarnation (the applier removes it) */
    if (deleting)
        return 1;   /* created again since its deletion: after the tombstone, whose DEL and
                       SREM would take away the new store's entries and announcement */
    ns_handle *ref = namespaces_acquire(rep->srv, s->name, false, err, sizeof err);
    if (!ref)
        return 0;
    nc_nsstore *store = namespaces_store(ref);
    pthread_mutex_lock(&rep->lock);
    bool same = s->gen == gen;
    pthread_mutex_unlock(&rep->lock);
    if (!same) {
        namespaces_release(rep->srv, ref);
        return 1;   /* attached again meanwhile: look again */
    }
    if (!s->log && follow_log(rep, s, store, gen, published) != 0) {
        namespaces_release(rep->srv, ref);
        return 0;
    }
    /* A long upload syncs its log only before it answers: publishing
     * would wait for the whole document. Records appended but not yet
     * durable are synced here (group commit: shared with the requests'
     * own syncs), so the other replicas follow the upload as it goes. */
    uint64_t last = nsstore_last_seq(store);
    bool broken = false;   /* the log cannot be synced: do not poll it */
    if (last > nsstore_durable_seq(store) && nsstore_sync(store, last, err, sizeof err) != NC_OK) {
        if (!s->log_warned)
            slog(SLOG_ERROR, "replication: cannot sync the namespace's log",
                 json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        s->log_warned = true;
        broken = true;
    }
    int extra = announce(rep, c, s), sent = 0, more = 0;
    uint64_t tokens = 0;
    int rc = queue_adds(rep, c, s, birth, &sent, &tokens, err, sizeof err);
    /* what was sent covers the log up to here (a bad record stops the
     * batch before it: the next pass opens the log again and stops there
     * again, logged once, until the log is repaired) */
    uint64_t pos = nsstore_log_position(s->log);
    if (rc == NC_ENOTFOUND) {
        /* records the log lost (a tail cut by a failed fsync, before the
         * namespace healed): they cannot be published; the follower goes
         * on after them */
        slog(SLOG_ERROR, "replication: log records lost, not published",
             json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        rc = 1;
    } else if (rc < 0) {
        if (!s->log_warned)
            slog(SLOG_ERROR, "replication: cannot read the namespace's log",
                 json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        s->log_warned = true;
        nsstore_log_close(s->log);
        s->log = NULL;
    }
    if (read_replies(c, sent + extra) != 0) {
        nsstore_log_close(s->log);
        s->log = NULL;
        s->announced = false;
        namespaces_release(rep->srv, ref);
        return -1;
    }
    if (extra) s->announced = true;
    if (rc >= 0 && !broken) s->log_warned = false;
    atomic_fetch_add(&rep->published_entries, (unsigned long long)sent);
    atomic_fetch_add(&rep->published_tokens, tokens);
    if (sent && rep->publish_delay_ms > 0)
        sleep_ms(rep->publish_delay_ms);
    pub_pos_advance(rep, s, gen, pos, false);
    more = rc == 1 || (!broken && nsstore_last_seq(store) > pos);
    marker_flush(rep, s, store, birth, final || !more);
    namespaces_release(rep->srv, ref);
    return more;
}

static void *publisher(void *arg)
{
    replication *rep = arg;
    redisContext *c = NULL;
    double stop_at = 0;
    bool pending = true;   /* something may be left to publish */
    for (;;) {
        bool stopping = atomic_load(&rep->stop);
        if (stopping && stop_at == 0) stop_at = now_ms() + 5000;
        if (stopping && (!pending || now_ms() > stop_at)) break;
        /* Nothing before the namespaces are recovered and the tombstones
         * read: a store of a deleted incarnation must not be published. */
        if (!atomic_load(&rep->srv->ready) || !atomic_load(&rep->tombs_loaded)) {
            if (stopping) break;
            sleep_ms(20);
            continue;
        }
        if (!c && !(c = connect_redis(rep, &rep->connected_pub))) {
            atomic_fetch_add(&rep->redis_errors, 1);
            if (stopping) break;
            sleep_ms(200);
            continue;
        }
        int failed = publish_deletes(rep, c);
        pthread_mutex_lock(&rep->lock);
        int nns = rep->nns;
        pthread_mutex_unlock(&rep->lock);
        bool more = false;
        for (int i = 0; i < nns && !failed; i++) {
            int r = publish_ns(rep, c, &rep->ns[i], stopping);
            if (r < 0) failed = 1;
            if (r > 0) more = true;
        }
        pending = more || failed;
        if (failed) {
            /* Redis unreachable or failing: everything stays in the logs,
             * read again once it is back. */
            atomic_fetch_add(&rep->redis_errors, 1);
            redisFree(c);
            c = NULL;
            atomic_store(&rep->connected_pub, 0);
            for (int i = 0; i < nns; i++) rep->ns[i].announced = false;
            if (stopping) break;
            sleep_ms(200);
            continue;
        }
        if (stopping) continue;
        /* Sleep until a local add, a deletion, or (records appended but not
         * yet durable, markers behind) a short while. */
        pthread_mutex_lock(&rep->lock);
        bool dirty = rep->ndels > 0;
        for (int i = 0; i < rep->nns && !dirty; i++) dirty = rep->ns[i].dirty;
        if (!dirty && !atomic_load(&rep->stop)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long wait_ns = more ? 2000000L : (long)MARKER_EVERY_MS * 1000000L;
            ts.tv_nsec += wait_ns;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&rep->cond, &rep->lock, &ts);
        }
        pthread_mutex_unlock(&rep->lock);
    }
    /* markers as far as published; followers closed before the stores */
    pthread_mutex_lock(&rep->lock);
    int nns = rep->nns;
    pthread_mutex_unlock(&rep->lock);
    for (int i = 0; i < nns; i++) {
        ns_state *s = &rep->ns[i];
        char err[NC_ERRLEN];
        ns_handle *ref = s->log ? namespaces_acquire(rep->srv, s->name, false, err, sizeof err) : NULL;
        if (ref) {
            pthread_mutex_lock(&rep->lock);
            uint64_t birth = s->gen == s->log_gen ? s->birth : 0;
            pthread_mutex_unlock(&rep->lock);
            if (birth) marker_flush(rep, s, namespaces_store(ref), birth, true);
            namespaces_release(rep->srv, ref);
        }
        nsstore_log_close(s->log);
        s->log = NULL;
    }
    if (c) redisFree(c);
    return NULL;
}

/* ---- applier ---------------------------------------------------------------- */

/* Stream ids "<ms>-<seq>" compared numerically. */
static int sid_cmp(const char *x, const char *y)
{
    unsigned long long xm = 0, xs = 0, ym = 0, ys = 0;
    sscanf(x, "%llu-%llu", &xm, &xs);
    sscanf(y, "%llu-%llu", &ym, &ys);
    return xm < ym ? -1 : xm > ym ? 1 : xs < ys ? -1 : xs > ys ? 1 : 0;
}

static hwm_t *hwm_find(ns_state *s, const char *origin, uint64_t birth, bool add)
{
    for (int i = 0; i < s->nhw; i++)
        if (s->hw[i].birth == birth && !strcmp(s->hw[i].origin, origin)) return &s->hw[i];
    if (!add) return NULL;
    if (s->nhw == s->hwcap) {
        int c = s->hwcap ? 2 * s->hwcap : 4;
        hwm_t *p = realloc(s->hw, (size_t)c * sizeof *p);
        if (!p) return NULL;
        s->hw = p;
        s->hwcap = c;
    }
    hwm_t *h = &s->hw[s->nhw++];
    snprintf(h->origin, sizeof h->origin, "%s", origin);
    h->birth = birth;
    h->seq = 0;
    return h;
}

/* The position of a namespace is in the namespace itself: every applied
 * entry is a document "repl:<origin>:<stream id>:<n>:<birth>.<seq>:<origin
 * doc>" of the store, logged and fsynced with its pairs (one ADD record,
 * whole or torn away), so the last applied entry is the largest stream id
 * whose document holds its n pairs, and the last applied record of each
 * origin's incarnation (birth) is the largest seq -- exact after any crash,
 * no separate file to lose. */
static void pos_load(replication *rep, ns_state *s)
{
    snprintf(s->last_id, sizeof s->last_id, "0");
    s->nhw = 0;
    s->loaded = true;
    char err[NC_ERRLEN];
    ns_handle *ref = namespaces_acquire(rep->srv, s->name, false, err, sizeof err);
    if (!ref)
        return;   /* not here yet: everything from the start */
    nc_nsstore *st = namespaces_store(ref);
    uint32_t n = nsstore_doc_count(st);
    char id[1200];
    for (uint32_t i = 0; i < n; i++) {
        uint64_t pairs = 0;
        if (nsstore_doc_info(st, i, id, sizeof id, &pairs) != NC_OK || strncmp(id, "repl:", 5) != 0)
            continue;
        char origin[64], sid[64];
        unsigned long long cnt = 0, b = 0, sq = 0;
        int used = 0;
        if (sscanf(id + 5, "%63[^:]:%63[0-9-]:%llu:%n", origin, sid, &cnt, &used) != 3 || used == 0 || pairs != cnt)
            continue;
        if (sid_cmp(sid, s->last_id) > 0)
            snprintf(s->last_id, sizeof s->last_id, "%s", sid);
        if (strlen(origin) < sizeof s->hw[0].origin && sscanf(id + 5 + used, "%llu.%llu:", &b, &sq) == 2) {
            hwm_t *h = hwm_find(s, origin, b, true);
            if (h && sq > h->seq) h->seq = sq;
        }
    }
    namespaces_release(rep->srv, ref);
}

static const redisReply *field(const redisReply *kv, const char *name)
{
    if (kv->type != REDIS_REPLY_ARRAY) return NULL;
    for (size_t i = 0; i + 1 < kv->elements; i += 2)
        if (kv->element[i]->type == REDIS_REPLY_STRING && !strcmp(kv->element[i]->str, name) &&
            kv->element[i + 1]->type == REDIS_REPLY_STRING)
            return kv->element[i + 1];
    return NULL;
}

/* Whether an entry is to be applied here: not our own, not of a deleted
 * incarnation of the namespace, not one applied already (an origin that
 * crashed between its XADD and its marker publishes it again). */
static bool entry_wanted(replication *rep, ns_state *s, uint64_t tomb, const redisReply *kv, bool count)
{
    const redisReply *o = field(kv, "o"), *b = field(kv, "b"), *sq = field(kv, "s");
    if (!o || !strcmp(o->str, rep->tag))
        return false;   /* ours: already in the local store */
    uint64_t birth = b ? strtoull(b->str, NULL, 10) : 0;
    if (birth && birth <= tomb)
        return false;   /* the namespace it was added to was deleted since */
    if (birth && sq) {
        hwm_t *h = hwm_find(s, o->str, birth, false);
        if (h && strtoull(sq->str, NULL, 10) <= h->seq) {
            if (count) atomic_fetch_add(&rep->duplicate_entries, 1);
            return false;
        }
    }
    return true;
}

/* Applies one entry of another replica into the store; returns the log
 * sequence to sync (0 = none). */
static uint64_t apply_entry(replication *rep, ns_state *s, nc_nsstore *st, const char *sid, const redisReply *kv)
{
    const redisReply *o = field(kv, "o"), *d = field(kv, "d"), *f = field(kv, "f"), *n = field(kv, "n"),
                     *m = field(kv, "m"), *w = field(kv, "w"), *k = field(kv, "k"), *b = field(kv, "b"),
                     *sq = field(kv, "s");
    if (!o || !d || !f || !n || !m || !w || !k) {
        atomic_fetch_add(&rep->refused_entries, 1);
        return 0;
    }
    size_t cnt = strtoull(n->str, NULL, 10);
    uint64_t off = strtoull(f->str, NULL, 10);
    uint64_t birth = b ? strtoull(b->str, NULL, 10) : 0, oseq = sq ? strtoull(sq->str, NULL, 10) : 0;
    /* The pair count is checked against the keys' length by division: a
     * product (cnt * H * 2) wraps for a count near 2^62, which the key
     * length then matches, and the buffers sized by it are tiny. */
    size_t key_bytes = (size_t)rep->H * 2;
    if (strtoull(m->str, NULL, 16) != rep->model_fp || cnt == 0 || k->len % key_bytes != 0 ||
        cnt != k->len / key_bytes || strlen(o->str) >= sizeof s->hw[0].origin) {
        if (atomic_fetch_add(&rep->refused_entries, 1) == 0)
            slog(SLOG_WARN, "replication: entry refused (another model or malformed)",
                 json_pack("{s:s,s:s}", "id", sid, "origin", o->str));
        return 0;
    }
    float *keys = malloc(cnt * (size_t)rep->H * sizeof(float));
    int *ids = malloc(cnt * sizeof(int));
    uint64_t seq = 0;
    char err[NC_ERRLEN] = "";
    int rc = keys && ids ? NC_OK : NC_ENOMEM;
    nc_wordtable *wt = nsstore_words(st);
    const char *p = w->str, *end = w->str + w->len;
    for (size_t i = 0; rc == NC_OK && i < cnt; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        ids[i] = l ? wordtable_id(wt, p, l, true) : -1;
        if (ids[i] < 0) rc = NC_EFORMAT;
        p = nl ? nl + 1 : end;
    }
    const uint16_t *kh = (const uint16_t *)k->str;
    for (size_t i = 0; rc == NC_OK && i < cnt * (size_t)rep->H; i++) {
        uint16_t h;
        memcpy(&h, kh + i, 2);
        keys[i] = nc_half_to_float(h);
    }
    /* One document per entry, naming it: the namespace's own record of
     * how far it has applied the stream and each origin (pos_load). */
    char docid[1300];
    uint32_t doc = 0;
    snprintf(docid, sizeof docid, "repl:%s:%s:%zu:%llu.%llu:%s", o->str, sid, cnt, (unsigned long long)birth,
             (unsigned long long)oseq, d->str);
    size_t dl = strlen(docid);
    if (rc == NC_OK)
        rc = nsstore_doc_begin(st, docid, dl > 1024 ? 1024 : dl, &doc, NULL, 0, err, sizeof err);
    if (rc == NC_OK) {
        applying = 1;
        rc = nsstore_add(st, keys, ids, cnt, doc, off, &seq, err, sizeof err);
        applying = 0;
    }
    if (rc == NC_OK) {
        atomic_fetch_add(&rep->applied_entries, 1);
        atomic_fetch_add(&rep->applied_tokens, cnt);
        if (birth && oseq) {
            hwm_t *h = hwm_find(s, o->str, birth, true);
            if (h && oseq > h->seq) h->seq = oseq;
        }
        long long lag = (long long)(now_ms() - (double)strtoull(sid, NULL, 10));
        if (lag < 0) lag = 0;
        atomic_store(&rep->last_lag_ms, lag);
        if (lag > atomic_load(&rep->max_lag_ms)) atomic_store(&rep->max_lag_ms, lag);
    } else {
        atomic_fetch_add(&rep->refused_entries, 1);
        slog(SLOG_WARN, "replication: entry not applied", json_pack("{s:s,s:s}", "id", sid, "error", err));
    }
    free(keys);
    free(ids);
    return rc == NC_OK ? seq : 0;
}

/* The namespaces announced in Redis, added to the table. */
static int refresh_namespaces(replication *rep, redisContext *c)
{
    redisReply *r = redisCommand(c, "SMEMBERS %snamespaces", rep->prefix);
    if (!r) return -1;
    if (r->type == REDIS_REPLY_ARRAY) {
        pthread_mutex_lock(&rep->lock);
        for (size_t i = 0; i < r->elements; i++) {
            const char *name = r->element[i]->str;
            if (name && strlen(name) < SESSION_ID_MAX) ns_get(rep, name);
        }
        pthread_mutex_unlock(&rep->lock);
    }
    freeReplyObject(r);
    return 0;
}

/* A deletion of name at time t (ms, the deleting replica's clock) by
 * another replica, seen live or in the tombstones after a downtime: the
 * local store goes if it is of an older incarnation. */
static void apply_tombstone(replication *rep, const char *name, uint64_t t, const char *origin)
{
    /* Only names in the table matter: a name announced later is added
     * there and its tombstone read again before its stream is. */
    pthread_mutex_lock(&rep->lock);
    ns_state *s = ns_find(rep, name);
    bool drop = false;
    if (s) {
        if (t > s->tomb) s->tomb = t;
        drop = s->birth != 0 && s->birth <= t;
    }
    pthread_mutex_unlock(&rep->lock);
    if (!drop) return;
    char err[NC_ERRLEN] = "";
    int64_t gone = 0;
    if (namespaces_delete(rep->srv, name, &gone, err, sizeof err) == 0)
        slog(SLOG_INFO, "replication: namespace deleted by another replica",
             json_pack("{s:s,s:s,s:I}", "namespace", name, "origin", origin, "entries", (json_int_t)gone));
    pthread_mutex_lock(&rep->lock);
    if (s->birth != 0 && s->birth <= t) {
        s->birth = 0;
        s->reset = true;
    }
    pthread_mutex_unlock(&rep->lock);
}

/* Every tombstone in Redis (a replica down when a namespace was deleted
 * learns it here). 0, or -1 when Redis failed. */
static int load_tombstones(replication *rep, redisContext *c)
{
    redisReply *r = redisCommand(c, "HGETALL %stombstones", rep->prefix);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r) freeReplyObject(r);
        return -1;
    }
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
        const char *name = r->element[i]->str;
        const char *t = r->element[i + 1]->str;
        if (name && t && strlen(name) < SESSION_ID_MAX)
            apply_tombstone(rep, name, strtoull(t, NULL, 10), "tombstone");
    }
    freeReplyObject(r);
    atomic_store(&rep->tombs_loaded, 1);
    return 0;
}

/* XREAD COUNT 256 BLOCK 500 STREAMS ctl k1..kn ctl_id id1..idn: the control
 * stream and the first nns namespaces' streams after their positions. The
 * reply (NULL when the connection failed), or NULL with *oom. */
static redisReply *xread(replication *rep, redisContext *c, const char *ctl_key, const char *ctl_id, int nns,
                         bool *oom)
{
    int argc = 6 + 2 * (nns + 1);
    const char **argv = malloc((size_t)argc * sizeof *argv);
    size_t *argl = malloc((size_t)argc * sizeof *argl);
    char (*keys)[256] = malloc((size_t)(nns + 1) * sizeof *keys);
    *oom = !argv || !argl || !keys;
    redisReply *r = NULL;
    if (!*oom) {
        argv[0] = "XREAD"; argv[1] = "COUNT"; argv[2] = "256"; argv[3] = "BLOCK"; argv[4] = "500";
        argv[5] = "STREAMS";
        argv[6] = ctl_key;
        argv[7 + nns] = ctl_id;
        for (int i = 0; i < nns; i++) {
            stream_key(rep, rep->ns[i].name, keys[i], sizeof keys[i]);
            argv[7 + i] = keys[i];
            argv[8 + nns + i] = rep->ns[i].last_id;
        }
        for (int i = 0; i < argc; i++) argl[i] = strlen(argv[i]);
        r = redisCommandArgv(c, argc, argv, argl);
    }
    free(argv);
    free(argl);
    free(keys);
    return r;
}

/* The control stream's entries: a namespace announced (the caller reads
 * the set again) or deleted by another replica (deleted here too);
 * ctl_id[idcap] follows them. */
static void apply_control(replication *rep, const redisReply *ents, char *ctl_id, size_t idcap)
{
    for (size_t e = 0; ents->type == REDIS_REPLY_ARRAY && e < ents->elements; e++) {
        const redisReply *en = ents->element[e];
        if (en->type != REDIS_REPLY_ARRAY || en->elements != 2) continue;
        snprintf(ctl_id, idcap, "%s", en->element[0]->str);
        const redisReply *del = field(en->element[1], "del"), *o = field(en->element[1], "o"),
                         *t = field(en->element[1], "t");
        if (!del || !o || !strcmp(o->str, rep->tag) || strlen(del->str) >= SESSION_ID_MAX) continue;
        apply_tombstone(rep, del->str, strtoull(t ? t->str : en->element[0]->str, NULL, 10), o->str);
    }
}

/* The entries read from ns's stream: those wanted are applied to the local
 * store (opened, or created, only for them), synced once; ns's position
 * moves past all of them. 0, or -1 when the store is unavailable (retried
 * from the same position at the next read). */
static int apply_stream(replication *rep, ns_state *ns, const redisReply *ents)
{
    if (ents->type != REDIS_REPLY_ARRAY || ents->elements == 0) return 0;
    pthread_mutex_lock(&rep->lock);
    uint64_t tomb = ns->tomb;
    bool reset = ns->reset;
    pthread_mutex_unlock(&rep->lock);
    if (reset) return 0;   /* deleted here meanwhile: read again from the start */
    /* The store is opened (created) only for entries to apply: a
     * stream of a deleted incarnation must not bring the name back. */
    bool want = false;
    for (size_t e = 0; e < ents->elements && !want; e++) {
        const redisReply *en = ents->element[e];
        want = en->type == REDIS_REPLY_ARRAY && en->elements == 2 &&
               sid_cmp(en->element[0]->str, ns->last_id) > 0 && entry_wanted(rep, ns, tomb, en->element[1], false);
    }
    ns_handle *ref = NULL;
    char err[NC_ERRLEN] = "";
    if (want && !(ref = namespaces_acquire(rep->srv, ns->name, true, err, sizeof err))) {
        /* Retried at the next read, from the same position; logged
         * once, not at every retry. */
        if (!ns->warned)
            slog(SLOG_WARN, "replication: namespace unavailable",
                 json_pack("{s:s,s:s}", "namespace", ns->name, "error", err));
        ns->warned = true;
        return -1;
    }
    ns->warned = false;
    nc_nsstore *st = ref ? namespaces_store(ref) : NULL;
    uint64_t last_seq = 0;
    for (size_t e = 0; e < ents->elements; e++) {
        const redisReply *en = ents->element[e];
        if (en->type != REDIS_REPLY_ARRAY || en->elements != 2) continue;
        if (sid_cmp(en->element[0]->str, ns->last_id) <= 0)
            continue;
        if (entry_wanted(rep, ns, tomb, en->element[1], true) && st) {
            uint64_t seq = apply_entry(rep, ns, st, en->element[0]->str, en->element[1]);
            if (seq) last_seq = seq;
        }
        snprintf(ns->last_id, sizeof ns->last_id, "%s", en->element[0]->str);
    }
    if (last_seq && nsstore_sync(st, last_seq, err, sizeof err) != NC_OK)
        slog(SLOG_WARN, "replication: sync failed", json_pack("{s:s,s:s}", "namespace", ns->name, "error", err));
    if (ref) namespaces_release(rep->srv, ref);
    return 0;
}

static void *applier(void *arg)
{
    replication *rep = arg;
    redisContext *c = NULL;
    double last_refresh = 0;
    char ctl_key[200], ctl_id[64] = "$";
    snprintf(ctl_key, sizeof ctl_key, "%sctl", rep->prefix);
    while (!atomic_load(&rep->stop)) {
        /* Namespaces are recovered before the server turns ready. */
        if (!atomic_load(&rep->srv->ready)) {
            sleep_ms(50);
            continue;
        }
        if (!c && !(c = connect_redis(rep, &rep->connected_app))) {
            sleep_ms(300);
            continue;
        }
        if (now_ms() - last_refresh > 1000) {
            if (refresh_namespaces(rep, c) || load_tombstones(rep, c)) {
                redisFree(c);
                c = NULL;
                atomic_fetch_add(&rep->redis_errors, 1);
                continue;
            }
            last_refresh = now_ms();
        }
        /* Entries of rep->ns never move and only this thread writes their
         * positions: the lock only guards the count and the fields shared
         * with the publisher and the request threads. */
        pthread_mutex_lock(&rep->lock);
        int nns = rep->nns;
        for (int i = 0; i < nns; i++)
            if (rep->ns[i].reset) {
                /* deleted here: whatever comes next is of a new incarnation */
                rep->ns[i].reset = false;
                rep->ns[i].loaded = true;
                rep->ns[i].nhw = 0;
                snprintf(rep->ns[i].last_id, sizeof rep->ns[i].last_id, "0");
            }
        pthread_mutex_unlock(&rep->lock);
        for (int i = 0; i < nns; i++)
            if (!rep->ns[i].loaded) pos_load(rep, &rep->ns[i]);
        bool oom = false;
        redisReply *r = xread(rep, c, ctl_key, ctl_id, nns, &oom);
        if (oom) {
            sleep_ms(100);
            continue;
        }
        if (!r || r->type == REDIS_REPLY_ERROR) {
            if (r) {
                slog(SLOG_WARN, "replication: XREAD failed", json_pack("{s:s}", "error", r->str));
                freeReplyObject(r);
            }
            atomic_fetch_add(&rep->redis_errors, 1);
            redisFree(c);
            c = NULL;
            atomic_store(&rep->connected_app, 0);
            sleep_ms(200);
            continue;
        }
        /* [[key, [[id, [f, v, ...]], ...]], ...] */
        bool retry_later = false;
        for (size_t si = 0; r->type == REDIS_REPLY_ARRAY && si < r->elements; si++) {
            const redisReply *sr = r->element[si];
            if (sr->type != REDIS_REPLY_ARRAY || sr->elements != 2) continue;
            const char *key = sr->element[0]->str;
            if (!strcmp(key, ctl_key)) {
                apply_control(rep, sr->element[1], ctl_id, sizeof ctl_id);
                last_refresh = 0;
                continue;
            }
            ns_state *ns = NULL;
            for (int i = 0; i < nns; i++) {
                char k[256];
                stream_key(rep, rep->ns[i].name, k, sizeof k);
                if (!strcmp(k, key)) ns = &rep->ns[i];
            }
            if (ns && apply_stream(rep, ns, sr->element[1]) != 0)
                retry_later = true;
        }
        freeReplyObject(r);
        if (retry_later)
            sleep_ms(200);
    }
    if (c) redisFree(c);
    return NULL;
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
    deletes_load(rep);
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
    if (pthread_create(&rep->pub, NULL, publisher, rep) != 0) {
        snprintf(err, errlen, "cannot start the replication threads");
        replication_free(rep);
        return -1;
    }
    if (pthread_create(&rep->app, NULL, applier, rep) != 0) {
        snprintf(err, errlen, "cannot start the replication threads");
        atomic_store(&rep->stop, 1);
        pthread_join(rep->pub, NULL);
        replication_free(rep);
        return -1;
    }
    srv->replication = rep;
    /* every store the registry opens from now on publishes its adds */
    srv->namespace_opened = replication_attach;
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
    unsigned long long left = unpublished_records(rep);
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
             (unsigned long long)unpublished_records(rep),
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
        json_object_set_new(o, "unpublished_records", json_integer((json_int_t)unpublished_records(rep)));
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
