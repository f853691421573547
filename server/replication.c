/* replication.c -- namespaces shared by replicas through Redis Streams: an
 * observer on every namespace store queues local adds, a publisher thread
 * XADDs them (pipelined), an applier thread XREADs every namespace's stream
 * and adds the other replicas' entries to the local stores. */
#include "replication.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "migrate.h"
#include "namespaces.h"
#include "slog.h"

#define MAX_NS 256
#define QUEUE_MAX_BYTES ((size_t)512 << 20)   /* beyond: adds are dropped, counted */

typedef struct entry {
    struct entry *next;
    char ns[SESSION_ID_MAX];
    char *doc;                    /* origin document id */
    uint64_t off;
    size_t n;
    char *words;                  /* '\n'-joined */
    size_t words_len;
    uint16_t *keys;               /* [n, H] float16 */
    size_t bytes;
    bool del;                     /* the namespace was deleted here (no pairs) */
} entry;

typedef struct {
    char name[SESSION_ID_MAX];
    char last_id[64];             /* last applied (or skipped) stream id */
    bool loaded;                  /* last_id recovered from the store (pos_load) */
    bool warned;                  /* "namespace unavailable" logged */
} ns_state;

static struct {
    bool on;
    nc_server *srv;
    char host[256];
    int port;
    char prefix[128];
    long maxlen;
    char tag[16];
    uint64_t model_fp;            /* migrate_model_fingerprint: weights, not only the vocabulary */
    int H;
    pthread_t pub, app;
    pthread_mutex_t lock;         /* queue and ns table */
    pthread_cond_t cond;
    entry *head, *tail;
    size_t queued_bytes;
    atomic_int stop;
    ns_state ns[MAX_NS];
    int nns;
    /* counters */
    atomic_ullong published_entries, published_tokens, dropped_tokens;
    atomic_ullong applied_entries, applied_tokens, refused_entries, redis_errors;
    atomic_llong last_lag_ms, max_lag_ms;
    atomic_int queue_len;
    atomic_int connected_pub, connected_app;
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void enqueue(entry *e);

/* Set while the applier adds remote pairs: the observer must not publish
 * them again. */
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

static void entry_free(entry *e)
{
    if (!e) return;
    free(e->doc);
    free(e->words);
    free(e->keys);
    free(e);
}

/* ---- observer: local adds into the queue ----------------------------------- */

static void on_local_add(void *ctx, nc_nsstore *ns, uint32_t doc, uint64_t off, const float *keys,
                         const int *words, size_t n)
{
    const char *name = ctx;
    if (applying || n == 0 || atomic_load(&R.stop))
        return;
    entry *e = calloc(1, sizeof *e);
    char docid[1100] = "";
    if (doc != NSSTORE_NO_DOC)
        nsstore_doc_info(ns, doc, docid, sizeof docid, NULL);
    nc_wordtable *wt = nsstore_words(ns);
    size_t wl = 0;
    for (size_t i = 0; i < n; i++) {
        const char *w = wordtable_word(wt, words[i]);
        wl += (w ? strlen(w) : 0) + 1;
    }
    if (e) {
        snprintf(e->ns, sizeof e->ns, "%s", name);
        e->doc = strdup(docid);
        e->off = off;
        e->n = n;
        e->words = malloc(wl + 1);
        e->keys = malloc(n * (size_t)R.H * sizeof(uint16_t));
    }
    if (!e || !e->doc || !e->words || !e->keys) {
        entry_free(e);
        atomic_fetch_add(&R.dropped_tokens, n);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *w = wordtable_word(wt, words[i]);
        size_t l = w ? strlen(w) : 0;
        memcpy(e->words + k, w ? w : "", l);
        k += l;
        if (i + 1 < n) e->words[k++] = '\n';
    }
    e->words[k] = 0;
    e->words_len = k;
    /* Keys arrive as the index will store them (rounded to float16): the
     * conversion is exact. */
    for (size_t i = 0; i < n * (size_t)R.H; i++)
        e->keys[i] = nc_float_to_half(keys[i]);
    e->bytes = sizeof *e + wl + n * (size_t)R.H * 2;
    pthread_mutex_lock(&R.lock);
    bool full = R.queued_bytes + e->bytes > QUEUE_MAX_BYTES;
    pthread_mutex_unlock(&R.lock);
    if (full) {
        atomic_fetch_add(&R.dropped_tokens, n);
        entry_free(e);
        return;
    }
    enqueue(e);
}

static void enqueue(entry *e)
{
    pthread_mutex_lock(&R.lock);
    if (R.tail) R.tail->next = e;
    else R.head = e;
    R.tail = e;
    R.queued_bytes += e->bytes;
    atomic_fetch_add(&R.queue_len, 1);
    pthread_cond_signal(&R.cond);
    pthread_mutex_unlock(&R.lock);
}

/* The position of a namespace in the table (-1 when absent). */
static int ns_index(const char *name)
{
    pthread_mutex_lock(&R.lock);
    int i, n = R.nns;
    pthread_mutex_unlock(&R.lock);
    for (i = 0; i < n; i++)
        if (!strcmp(R.ns[i].name, name)) return i;
    return -1;
}

void replication_namespace_deleted(const char *ns_name)
{
    if (!R.on)
        return;
    /* Entries appended before this moment belong to the deleted namespace:
     * skip them (a later namespace of the same name starts after it). */
    int i = ns_index(ns_name);
    if (i >= 0) {
        snprintf(R.ns[i].last_id, sizeof R.ns[i].last_id, "%llu-0", (unsigned long long)now_ms());
        R.ns[i].loaded = true;
    }
    entry *e = calloc(1, sizeof *e);
    if (!e)
        return;
    snprintf(e->ns, sizeof e->ns, "%s", ns_name);
    e->doc = strdup("");
    e->words = strdup("");
    e->del = true;
    e->bytes = sizeof *e;
    if (!e->doc || !e->words) {
        entry_free(e);
        return;
    }
    enqueue(e);
}

void replication_attach(const char *ns_name, nc_nsstore *store)
{
    if (!R.on || !store)
        return;
    /* The observer's context must outlive the store: a name kept here. */
    pthread_mutex_lock(&R.lock);
    int i;
    for (i = 0; i < R.nns; i++)
        if (!strcmp(R.ns[i].name, ns_name)) break;
    if (i == R.nns && R.nns < MAX_NS) {
        snprintf(R.ns[i].name, sizeof R.ns[i].name, "%s", ns_name);
        R.nns++;
    }
    pthread_mutex_unlock(&R.lock);
    if (i < MAX_NS)
        nsstore_set_observer(store, on_local_add, R.ns[i].name);
}

/* ---- Redis ------------------------------------------------------------------ */

static redisContext *connect_redis(atomic_int *flag)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(R.host, R.port, tv);
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

static void stream_key(const char *ns, char *out, size_t cap)
{
    snprintf(out, cap, "%sns:%s", R.prefix, ns);
}

/* ---- publisher ---------------------------------------------------------------- */

static void *publisher(void *arg)
{
    (void)arg;
    redisContext *c = NULL;
    char index_key[200], ctl_key[200];
    snprintf(index_key, sizeof index_key, "%snamespaces", R.prefix);
    snprintf(ctl_key, sizeof ctl_key, "%sctl", R.prefix);
    /* Namespaces this process announced on the control stream (wakes the
     * other replicas' readers at once for a namespace new to them). */
    static char announced[MAX_NS][SESSION_ID_MAX];
    int nannounced = 0;
    for (;;) {
        pthread_mutex_lock(&R.lock);
        while (!R.head && !atomic_load(&R.stop))
            pthread_cond_wait(&R.cond, &R.lock);
        entry *batch = R.head;
        int nb = 0;
        entry *last = NULL;
        for (entry *e = R.head; e && nb < 256; e = e->next, nb++)
            last = e;
        if (last) {
            R.head = last->next;
            if (!R.head) R.tail = NULL;
            last->next = NULL;
        }
        bool stopping = atomic_load(&R.stop);
        pthread_mutex_unlock(&R.lock);
        if (!batch) {
            if (stopping) break;
            continue;
        }
        if (!c) c = connect_redis(&R.connected_pub);
        int ok = c != NULL;
        /* Pipelined: one XADD per entry (and the announcement of a
         * namespace the first time this process publishes into it). */
        int sent = 0, extra = 0, nann_before = nannounced;
        for (entry *e = batch; ok && e; e = e->next) {
            if (e->del) {
                /* Everyone deletes it; the stream and its announcement go. */
                char key[256];
                stream_key(e->ns, key, sizeof key);
                const char *av[] = {"XADD", ctl_key, "MAXLEN", "~", "10000", "*", "del", e->ns, "o", R.tag};
                size_t al[10];
                for (int i = 0; i < 10; i++) al[i] = strlen(av[i]);
                redisAppendCommandArgv(c, 10, av, al);
                redisAppendCommand(c, "DEL %s", key);
                redisAppendCommand(c, "SREM %s %s", index_key, e->ns);
                extra += 3;
                for (int i = 0; i < nannounced; i++)
                    if (!strcmp(announced[i], e->ns)) {
                        memmove(announced[i], announced[nannounced - 1], SESSION_ID_MAX);
                        nannounced--;
                        break;
                    }
                continue;
            }
            int known = 0;
            for (int i = 0; i < nannounced && !known; i++)
                known = !strcmp(announced[i], e->ns);
            if (!known && nannounced < MAX_NS) {
                snprintf(announced[nannounced++], SESSION_ID_MAX, "%s", e->ns);
                const char *av[] = {"XADD", ctl_key, "MAXLEN", "~", "10000", "*", "ns", e->ns};
                size_t al[8];
                for (int i = 0; i < 8; i++) al[i] = strlen(av[i]);
                /* the set first, then the wake-up: a reader woken by the
                 * control entry finds the namespace in the set */
                redisAppendCommand(c, "SADD %s %s", index_key, e->ns);
                redisAppendCommandArgv(c, 8, av, al);
                extra += 2;
            }
            char key[256], off[32], n[32], mt[32], maxlen[32];
            stream_key(e->ns, key, sizeof key);
            snprintf(off, sizeof off, "%llu", (unsigned long long)e->off);
            snprintf(n, sizeof n, "%zu", e->n);
            snprintf(mt, sizeof mt, "%016llx", (unsigned long long)R.model_fp);
            snprintf(maxlen, sizeof maxlen, "%ld", R.maxlen);
            const char *argv[24];
            size_t argl[24];
            int a = 0;
#define ARG(s, l) (argv[a] = (s), argl[a] = (l), a++)
            ARG("XADD", 4); ARG(key, strlen(key));
            if (R.maxlen > 0) { ARG("MAXLEN", 6); ARG("~", 1); ARG(maxlen, strlen(maxlen)); }
            ARG("*", 1);
            ARG("o", 1); ARG(R.tag, strlen(R.tag));
            ARG("d", 1); ARG(e->doc, strlen(e->doc));
            ARG("f", 1); ARG(off, strlen(off));
            ARG("n", 1); ARG(n, strlen(n));
            ARG("m", 1); ARG(mt, strlen(mt));
            ARG("w", 1); ARG(e->words, e->words_len);
            ARG("k", 1); ARG((const char *)e->keys, e->n * (size_t)R.H * 2);
#undef ARG
            redisAppendCommandArgv(c, a, argv, argl);
            sent++;
        }
        for (int i = 0; ok && i < sent + extra; i++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK || !r || r->type == REDIS_REPLY_ERROR) {
                if (r && r->type == REDIS_REPLY_ERROR)
                    slog(SLOG_WARN, "replication: redis refused an entry", json_pack("{s:s}", "error", r->str));
                ok = 0;
            }
            if (r) freeReplyObject(r);
        }
        if (ok) {
            size_t bytes = 0;
            while (batch) {
                entry *e = batch;
                batch = e->next;
                atomic_fetch_add(&R.published_entries, 1);
                atomic_fetch_add(&R.published_tokens, e->n);
                atomic_fetch_sub(&R.queue_len, 1);
                bytes += e->bytes;
                entry_free(e);
            }
            pthread_mutex_lock(&R.lock);
            R.queued_bytes -= bytes;
            pthread_mutex_unlock(&R.lock);
            continue;
        }
        /* Redis unreachable or failing: reconnect later, keep the batch at
         * the head (order preserved), unless we are stopping for good. */
        atomic_fetch_add(&R.redis_errors, 1);
        if (c) { redisFree(c); c = NULL; }
        atomic_store(&R.connected_pub, 0);
        nannounced = nann_before;   /* announce again with the retry */
        pthread_mutex_lock(&R.lock);
        entry *t = batch;
        while (t->next) t = t->next;
        t->next = R.head;
        R.head = batch;
        if (!R.tail) R.tail = t;
        pthread_mutex_unlock(&R.lock);
        if (stopping) break;
        sleep_ms(200);
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

/* The position of a namespace is in the namespace itself: every applied
 * entry is a document "repl:<origin>:<stream id>:<n>:<origin doc>" of the
 * store, logged and fsynced with its pairs (one ADD record, whole or torn
 * away), so the last applied entry is the largest stream id whose document
 * holds its n pairs -- exact after any crash, no separate file to lose. */
static void pos_load(ns_state *s)
{
    snprintf(s->last_id, sizeof s->last_id, "0");
    s->loaded = true;
    char err[NC_ERRLEN];
    nsref *ref = namespaces_acquire(R.srv, s->name, false, err, sizeof err);
    if (!ref)
        return;   /* not here yet: everything from the start */
    nc_nsstore *st = nsref_store(ref);
    uint32_t n = nsstore_doc_count(st);
    char id[1200];
    for (uint32_t i = 0; i < n; i++) {
        uint64_t pairs = 0;
        if (nsstore_doc_info(st, i, id, sizeof id, &pairs) != NC_OK || strncmp(id, "repl:", 5) != 0)
            continue;
        char origin[64], sid[64];
        unsigned long long cnt = 0;
        if (sscanf(id + 5, "%63[^:]:%63[0-9-]:%llu:", origin, sid, &cnt) != 3 || pairs != cnt)
            continue;
        if (sid_cmp(sid, s->last_id) > 0)
            snprintf(s->last_id, sizeof s->last_id, "%s", sid);
    }
    namespaces_release(R.srv, ref);
}

static const redisReply *field(const redisReply *kv, const char *name)
{
    for (size_t i = 0; i + 1 < kv->elements; i += 2)
        if (kv->element[i]->type == REDIS_REPLY_STRING && !strcmp(kv->element[i]->str, name))
            return kv->element[i + 1];
    return NULL;
}

/* Applies one entry of another replica into the store; returns the log
 * sequence to sync (0 = none). */
static uint64_t apply_entry(nc_nsstore *st, const char *sid, const redisReply *kv)
{
    const redisReply *o = field(kv, "o"), *d = field(kv, "d"), *f = field(kv, "f"), *n = field(kv, "n"),
                     *m = field(kv, "m"), *w = field(kv, "w"), *k = field(kv, "k");
    if (!o || !d || !f || !n || !m || !w || !k) {
        atomic_fetch_add(&R.refused_entries, 1);
        return 0;
    }
    if (!strcmp(o->str, R.tag))
        return 0;   /* ours: already in the local store */
    size_t cnt = strtoull(n->str, NULL, 10);
    uint64_t off = strtoull(f->str, NULL, 10);
    if (strtoull(m->str, NULL, 16) != R.model_fp || cnt == 0 || k->len != cnt * (size_t)R.H * 2) {
        if (atomic_fetch_add(&R.refused_entries, 1) == 0)
            slog(SLOG_WARN, "replication: entry refused (another model or malformed)",
                 json_pack("{s:s,s:s}", "id", sid, "origin", o->str));
        return 0;
    }
    float *keys = malloc(cnt * (size_t)R.H * sizeof(float));
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
    for (size_t i = 0; rc == NC_OK && i < cnt * (size_t)R.H; i++) {
        uint16_t h;
        memcpy(&h, kh + i, 2);
        keys[i] = nc_half_to_float(h);
    }
    /* One document per entry, naming it: the namespace's own record of
     * how far it has applied the stream (pos_load). */
    char docid[1300];
    uint32_t doc = 0;
    snprintf(docid, sizeof docid, "repl:%s:%s:%zu:%s", o->str, sid, cnt, d->str);
    size_t dl = strlen(docid);
    if (rc == NC_OK)
        rc = nsstore_doc_begin(st, docid, dl > 1024 ? 1024 : dl, &doc, NULL, 0, err, sizeof err);
    if (rc == NC_OK) {
        applying = 1;
        rc = nsstore_add(st, keys, ids, cnt, doc, off, &seq, err, sizeof err);
        applying = 0;
    }
    if (rc == NC_OK) {
        atomic_fetch_add(&R.applied_entries, 1);
        atomic_fetch_add(&R.applied_tokens, cnt);
        long long lag = (long long)(now_ms() - (double)strtoull(sid, NULL, 10));
        if (lag < 0) lag = 0;
        atomic_store(&R.last_lag_ms, lag);
        if (lag > atomic_load(&R.max_lag_ms)) atomic_store(&R.max_lag_ms, lag);
    } else {
        atomic_fetch_add(&R.refused_entries, 1);
        slog(SLOG_WARN, "replication: entry not applied", json_pack("{s:s,s:s}", "id", sid, "error", err));
    }
    free(keys);
    free(ids);
    return rc == NC_OK ? seq : 0;
}

/* The namespaces announced in Redis, added to the table. */
static int refresh_namespaces(redisContext *c)
{
    redisReply *r = redisCommand(c, "SMEMBERS %snamespaces", R.prefix);
    if (!r) return -1;
    if (r->type == REDIS_REPLY_ARRAY) {
        pthread_mutex_lock(&R.lock);
        for (size_t i = 0; i < r->elements; i++) {
            const char *name = r->element[i]->str;
            if (!name || strlen(name) >= SESSION_ID_MAX) continue;
            int j;
            for (j = 0; j < R.nns; j++)
                if (!strcmp(R.ns[j].name, name)) break;
            if (j == R.nns && R.nns < MAX_NS) {
                snprintf(R.ns[j].name, sizeof R.ns[j].name, "%s", name);
                R.nns++;
            }
        }
        pthread_mutex_unlock(&R.lock);
    }
    freeReplyObject(r);
    return 0;
}

static void *applier(void *arg)
{
    (void)arg;
    redisContext *c = NULL;
    double last_refresh = 0;
    char ctl_key[200], ctl_id[64] = "$";
    snprintf(ctl_key, sizeof ctl_key, "%sctl", R.prefix);
    while (!atomic_load(&R.stop)) {
        /* Namespaces are recovered before the server turns ready. */
        if (!atomic_load(&R.srv->ready)) {
            sleep_ms(50);
            continue;
        }
        if (!c && !(c = connect_redis(&R.connected_app))) {
            sleep_ms(300);
            continue;
        }
        if (now_ms() - last_refresh > 1000) {
            if (refresh_namespaces(c)) { redisFree(c); c = NULL; atomic_fetch_add(&R.redis_errors, 1); continue; }
            last_refresh = now_ms();
        }
        /* Entries of R.ns never move and only this thread writes their
         * positions: the lock only guards the count (attach appends under
         * it while holding the registry's lock, which pos_load takes). */
        pthread_mutex_lock(&R.lock);
        int nns = R.nns;
        pthread_mutex_unlock(&R.lock);
        for (int i = 0; i < nns; i++)
            if (!R.ns[i].loaded) pos_load(&R.ns[i]);
        /* XREAD COUNT 256 BLOCK 500 STREAMS ctl k1..kn ctl_id id1..idn */
        int argc = 6 + 2 * (nns + 1);
        const char **argv = malloc((size_t)argc * sizeof *argv);
        size_t *argl = malloc((size_t)argc * sizeof *argl);
        char (*keys)[256] = malloc((size_t)(nns + 1) * sizeof *keys);
        if (!argv || !argl || !keys) {
            free(argv); free(argl); free(keys);
            sleep_ms(100);
            continue;
        }
        argv[0] = "XREAD"; argv[1] = "COUNT"; argv[2] = "256"; argv[3] = "BLOCK"; argv[4] = "500";
        argv[5] = "STREAMS";
        argv[6] = ctl_key;
        argv[7 + nns] = ctl_id;
        for (int i = 0; i < nns; i++) {
            stream_key(R.ns[i].name, keys[i], sizeof keys[i]);
            argv[7 + i] = keys[i];
            argv[8 + nns + i] = R.ns[i].last_id;
        }
        for (int i = 0; i < argc; i++) argl[i] = strlen(argv[i]);
        redisReply *r = redisCommandArgv(c, argc, argv, argl);
        free(argv);
        free(argl);
        free(keys);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            if (r) {
                slog(SLOG_WARN, "replication: XREAD failed", json_pack("{s:s}", "error", r->str));
                freeReplyObject(r);
            }
            atomic_fetch_add(&R.redis_errors, 1);
            redisFree(c);
            c = NULL;
            atomic_store(&R.connected_app, 0);
            sleep_ms(200);
            continue;
        }
        /* [[key, [[id, [f, v, ...]], ...]], ...] */
        bool retry_later = false;
        for (size_t s = 0; r->type == REDIS_REPLY_ARRAY && s < r->elements; s++) {
            const redisReply *sr = r->element[s];
            if (sr->type != REDIS_REPLY_ARRAY || sr->elements != 2) continue;
            const char *key = sr->element[0]->str;
            if (!strcmp(key, ctl_key)) {
                /* A namespace announced (read the set again now) or deleted
                 * by another replica (delete it here too; entries before the
                 * deletion are skipped). */
                const redisReply *ents = sr->element[1];
                for (size_t e = 0; ents->type == REDIS_REPLY_ARRAY && e < ents->elements; e++) {
                    const redisReply *en = ents->element[e];
                    if (en->type != REDIS_REPLY_ARRAY || en->elements != 2) continue;
                    snprintf(ctl_id, sizeof ctl_id, "%s", en->element[0]->str);
                    const redisReply *del = field(en->element[1], "del"), *o = field(en->element[1], "o");
                    if (!del || !o || !strcmp(o->str, R.tag)) continue;
                    char err[NC_ERRLEN] = "";
                    int64_t gone = 0;
                    if (namespaces_delete(R.srv, del->str, &gone, err, sizeof err) == 0)
                        slog(SLOG_INFO, "replication: namespace deleted by another replica",
                             json_pack("{s:s,s:s,s:I}", "namespace", del->str, "origin", o->str,
                                       "entries", (json_int_t)gone));
                    int i = ns_index(del->str);
                    if (i >= 0) {
                        snprintf(R.ns[i].last_id, sizeof R.ns[i].last_id, "%s", en->element[0]->str);
                        R.ns[i].loaded = true;
                    }
                }
                last_refresh = 0;
                continue;
            }
            ns_state *ns = NULL;
            for (int i = 0; i < nns; i++) {
                char k[256];
                stream_key(R.ns[i].name, k, sizeof k);
                if (!strcmp(k, key)) ns = &R.ns[i];
            }
            const redisReply *ents = sr->element[1];
            if (!ns || ents->type != REDIS_REPLY_ARRAY || ents->elements == 0) continue;
            char err[NC_ERRLEN] = "";
            nsref *ref = namespaces_acquire(R.srv, ns->name, true, err, sizeof err);
            if (!ref) {
                /* Retried at the next read, from the same position; logged
                 * once, not at every retry. */
                if (!ns->warned)
                    slog(SLOG_WARN, "replication: namespace unavailable",
                         json_pack("{s:s,s:s}", "namespace", ns->name, "error", err));
                ns->warned = true;
                retry_later = true;
                continue;
            }
            ns->warned = false;
            nc_nsstore *st = nsref_store(ref);
            uint64_t last_seq = 0;
            for (size_t e = 0; e < ents->elements; e++) {
                const redisReply *en = ents->element[e];
                if (en->type != REDIS_REPLY_ARRAY || en->elements != 2) continue;
                if (sid_cmp(en->element[0]->str, ns->last_id) <= 0)
                    continue;   /* before a deletion of the namespace */
                uint64_t seq = apply_entry(st, en->element[0]->str, en->element[1]);
                if (seq) last_seq = seq;
                snprintf(ns->last_id, sizeof ns->last_id, "%s", en->element[0]->str);
            }
            if (last_seq && nsstore_sync(st, last_seq, err, sizeof err) != NC_OK)
                slog(SLOG_WARN, "replication: sync failed", json_pack("{s:s,s:s}", "namespace", ns->name, "error", err));
            namespaces_release(R.srv, ref);
        }
        freeReplyObject(r);
        if (retry_later)
            sleep_ms(200);
    }
    if (c) redisFree(c);
    return NULL;
}

/* ---- set-up ------------------------------------------------------------------- */

int replication_start(nc_server *srv, char *err, size_t errlen)
{
    R.on = false;
    if (!srv->cfg.redis[0])
        return 0;
    if (!srv->cfg.replica_tag[0]) {
        snprintf(err, errlen, "option 'redis' needs option 'replica_tag' (the origin of what this replica publishes)");
        return -1;
    }
    const char *u = srv->cfg.redis;
    if (!strncmp(u, "redis://", 8)) u += 8;
    const char *colon = strrchr(u, ':');
    R.port = 6379;
    size_t hl = colon ? (size_t)(colon - u) : strlen(u);
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (*end || p <= 0 || p > 65535) {
            snprintf(err, errlen, "option 'redis': '%s' is not host:port", srv->cfg.redis);
            return -1;
        }
        R.port = (int)p;
    }
    if (hl == 0 || hl >= sizeof R.host) {
        snprintf(err, errlen, "option 'redis': '%s' is not host:port", srv->cfg.redis);
        return -1;
    }
    memcpy(R.host, u, hl);
    R.host[hl] = 0;
    R.srv = srv;
    snprintf(R.prefix, sizeof R.prefix, "%s", srv->cfg.redis_prefix);
    R.maxlen = srv->cfg.redis_maxlen;
    snprintf(R.tag, sizeof R.tag, "%s", srv->cfg.replica_tag);
    R.model_fp = migrate_model_fingerprint(srv->model);
    R.H = srv->model->cfg.hidden_size;
    atomic_store(&R.stop, 0);
    R.on = true;
    if (pthread_create(&R.pub, NULL, publisher, NULL) != 0 ||
        pthread_create(&R.app, NULL, applier, NULL) != 0) {
        snprintf(err, errlen, "cannot start the replication threads");
        R.on = false;
        return -1;
    }
    slog(SLOG_INFO, "replication", json_pack("{s:s,s:i,s:s,s:s}", "redis_host", R.host, "redis_port", R.port,
                                            "prefix", R.prefix, "replica", R.tag));
    return 0;
}

void replication_stop(void)
{
    if (!R.on)
        return;
    /* Give the publisher a few seconds to empty the queue. */
    for (int i = 0; i < 50 && atomic_load(&R.queue_len) > 0 && atomic_load(&R.connected_pub); i++)
        sleep_ms(100);
    atomic_store(&R.stop, 1);
    pthread_mutex_lock(&R.lock);
    pthread_cond_broadcast(&R.cond);
    pthread_mutex_unlock(&R.lock);
    pthread_join(R.pub, NULL);
    pthread_join(R.app, NULL);
    int left = atomic_load(&R.queue_len);
    if (left)
        slog(SLOG_WARN, "replication: entries not published at exit", json_pack("{s:i}", "entries", left));
    while (R.head) {
        entry *e = R.head;
        R.head = e->next;
        entry_free(e);
    }
    R.tail = NULL;
    R.on = false;
}

/* ---- observability -------------------------------------------------------------- */

char *replication_metrics(char *text)
{
    if (!R.on)
        return text;
    char buf[2048];
    snprintf(buf, sizeof buf,
             "# HELP neurocache_replication_published_tokens_total Pairs published to Redis.\n"
             "# TYPE neurocache_replication_published_tokens_total counter\n"
             "neurocache_replication_published_tokens_total %llu\n"
             "# HELP neurocache_replication_applied_tokens_total Pairs of other replicas applied here.\n"
             "# TYPE neurocache_replication_applied_tokens_total counter\n"
             "neurocache_replication_applied_tokens_total %llu\n"
             "# HELP neurocache_replication_dropped_tokens_total Pairs not queued for publishing (queue full).\n"
             "# TYPE neurocache_replication_dropped_tokens_total counter\n"
             "neurocache_replication_dropped_tokens_total %llu\n"
             "# HELP neurocache_replication_refused_entries_total Entries not applied (other model, malformed).\n"
             "# TYPE neurocache_replication_refused_entries_total counter\n"
             "neurocache_replication_refused_entries_total %llu\n"
             "# HELP neurocache_replication_queue_entries Entries waiting to be published.\n"
             "# TYPE neurocache_replication_queue_entries gauge\n"
             "neurocache_replication_queue_entries %d\n"
             "# HELP neurocache_replication_lag_seconds Age of the last applied entry when applied.\n"
             "# TYPE neurocache_replication_lag_seconds gauge\n"
             "neurocache_replication_lag_seconds %.3f\n"
             "# HELP neurocache_replication_redis_up The reader's Redis connection is up.\n"
             "# TYPE neurocache_replication_redis_up gauge\n"
             "neurocache_replication_redis_up %d\n",
             (unsigned long long)atomic_load(&R.published_tokens),
             (unsigned long long)atomic_load(&R.applied_tokens),
             (unsigned long long)atomic_load(&R.dropped_tokens),
             (unsigned long long)atomic_load(&R.refused_entries), atomic_load(&R.queue_len),
             (double)atomic_load(&R.last_lag_ms) / 1e3,
             atomic_load(&R.connected_app));
    size_t a = text ? strlen(text) : 0, b = strlen(buf);
    char *t = realloc(text, a + b + 1);
    if (!t) return text;
    memcpy(t + a, buf, b + 1);
    return t;
}

void h_replication(nc_server *srv, http_request *req, http_response *resp)
{
    (void)srv, (void)req;
    json_t *o = json_pack("{s:b}", "enabled", R.on);
    if (R.on && o) {
        json_t *pos = json_object();
        pthread_mutex_lock(&R.lock);
        for (int i = 0; i < R.nns; i++)
            json_object_set_new(pos, R.ns[i].name, json_string(R.ns[i].loaded ? R.ns[i].last_id : "0"));
        pthread_mutex_unlock(&R.lock);
        json_object_set_new(o, "replica", json_string(R.tag));
        json_object_set_new(o, "redis", json_pack("{s:s,s:i,s:b,s:b}", "host", R.host, "port", R.port,
                                                  "reader_connected", atomic_load(&R.connected_app),
                                                  "publisher_connected", atomic_load(&R.connected_pub)));
        json_object_set_new(o, "published_entries", json_integer((json_int_t)atomic_load(&R.published_entries)));
        json_object_set_new(o, "published_tokens", json_integer((json_int_t)atomic_load(&R.published_tokens)));
        json_object_set_new(o, "applied_entries", json_integer((json_int_t)atomic_load(&R.applied_entries)));
        json_object_set_new(o, "applied_tokens", json_integer((json_int_t)atomic_load(&R.applied_tokens)));
        json_object_set_new(o, "dropped_tokens", json_integer((json_int_t)atomic_load(&R.dropped_tokens)));
        json_object_set_new(o, "refused_entries", json_integer((json_int_t)atomic_load(&R.refused_entries)));
        json_object_set_new(o, "queue_entries", json_integer(atomic_load(&R.queue_len)));
        json_object_set_new(o, "last_lag_ms", json_integer((json_int_t)atomic_load(&R.last_lag_ms)));
        json_object_set_new(o, "max_lag_ms", json_integer((json_int_t)atomic_load(&R.max_lag_ms)));
        json_object_set_new(o, "applied_positions", pos);
    }
    http_reply_json(resp, 200, o);
}
