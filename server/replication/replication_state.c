/* replication_state.c -- the state replication keeps: the per-namespace
 * marker file (incarnation, published position), the tombstones not yet in
 * Redis, the namespace table, and the Redis connection helpers. */
#include "replication_state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "atomicfile.h"
#include "slog.h"

/* The marker of a namespace directory: its incarnation and how far its log
 * is published. 1 read, 0 absent, -1 unreadable or corrupt (err says). */
int replication_marker_read(const char *dir, uint64_t *birth, uint64_t *published, char *err, size_t errlen)
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

int replication_marker_write(const char *dir, uint64_t birth, uint64_t published, char *err, size_t errlen)
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
void replication_deletes_save(replication *rep)
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

void replication_deletes_add(replication *rep, const char *name, uint64_t t)
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

void replication_deletes_load(replication *rep)
{
    FILE *f = rep->deletes_path[0] ? fopen(rep->deletes_path, "r") : NULL;
    if (!f) return;
    char name[SESSION_ID_MAX];
    unsigned long long t;
    while (fscanf(f, "%63s %llu", name, &t) == 2)
        replication_deletes_add(rep, name, t);
    fclose(f);
}

void replication_tombs_save(replication *rep)
{
    if (!rep->tombs_path[0]) return;
    size_t cap = 64 + (size_t)rep->nns * (SESSION_ID_MAX + 24), k = 0;
    char *buf = malloc(cap), err[NC_ERRLEN];
    if (!buf) return;
    for (int i = 0; i < rep->nns; i++)
        if (rep->ns[i].tomb)
            k += (size_t)snprintf(buf + k, cap - k, "%s %llu\n", rep->ns[i].name, (unsigned long long)rep->ns[i].tomb);
    if (atomicfile_write(rep->tombs_path, buf, k, err, sizeof err) != NC_OK)
        slog(SLOG_ERROR, "replication: cannot record the tombstones", json_pack("{s:s}", "error", err));
    free(buf);
}

void replication_tombs_load(replication *rep)
{
    FILE *f = rep->tombs_path[0] ? fopen(rep->tombs_path, "r") : NULL;
    if (!f) return;
    char name[SESSION_ID_MAX];
    unsigned long long t;
    while (fscanf(f, "%63s %llu", name, &t) == 2) {
        ns_state *s = replication_ns_get(rep, name);
        if (s && t > s->tomb) s->tomb = t;
    }
    fclose(f);
}

/* ---- namespaces --------------------------------------------------------------- */

/* The entry of name, or NULL (rep->lock held). */
ns_state *replication_ns_find(replication *rep, const char *name)
{
    for (int i = 0; i < rep->nns; i++)
        if (!strcmp(rep->ns[i].name, name)) return &rep->ns[i];
    return NULL;
}

/* The entry of name, created when absent (rep->lock held); NULL when full. */
ns_state *replication_ns_get(replication *rep, const char *name)
{
    ns_state *s = replication_ns_find(rep, name);
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


/* ---- Redis ------------------------------------------------------------------ */

redisContext *replication_connect_redis(replication *rep, atomic_int *flag)
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

void replication_stream_key(replication *rep, const char *ns, char *out, size_t cap)
{
    snprintf(out, cap, "%sns:%s", rep->prefix, ns);
}

/* Reads n pipelined replies; 0 when all succeeded. */
int replication_read_replies(redisContext *c, int n)
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

void replication_each_store(replication *rep, void (*fn)(replication *, ns_state *, nc_nsstore *, uint64_t, unsigned,
                                                          void *), void *ctx)
{
    pthread_mutex_lock(&rep->lock);
    int nns = rep->nns;
    pthread_mutex_unlock(&rep->lock);
    for (int i = 0; i < nns; i++) {
        ns_state *s = &rep->ns[i];
        pthread_mutex_lock(&rep->lock);
        uint64_t birth = s->birth;
        unsigned gen = s->gen;
        pthread_mutex_unlock(&rep->lock);
        char err[NC_ERRLEN];
        ns_handle *ref = birth ? namespaces_acquire(rep->srv, s->name, false, err, sizeof err) : NULL;
        if (!ref) continue;
        fn(rep, s, namespaces_store(ref), birth, gen, ctx);
        namespaces_release(rep->srv, ref);
    }
}

static void count_unpublished(replication *rep, ns_state *s, nc_nsstore *store, uint64_t birth, unsigned gen, void *ctx)
{
    (void)birth;
    uint64_t last = nsstore_last_seq(store);
    pthread_mutex_lock(&rep->lock);
    uint64_t done = s->published > s->pub_pos ? s->published : s->pub_pos;
    bool same = s->gen == gen;
    pthread_mutex_unlock(&rep->lock);
    if (same && last > done) *(uint64_t *)ctx += last - done;
}

/* Log records of the attached stores not yet published (or passed over:
 * DOC records, entries applied from others), whatever Redis's state. */
uint64_t replication_unpublished_records(replication *rep)
{
    uint64_t total = 0;
    replication_each_store(rep, count_unpublished, &total);
    return total;
}

