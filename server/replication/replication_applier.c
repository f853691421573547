/* replication_applier.c -- the applier thread: XREADs every namespace's
 * stream and adds the other replicas' entries to the local stores, skipping
 * what it holds already; applies tombstones. */
#include "replication_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slog.h"

/* Set while the applier adds remote pairs: the observer ignores them. */
__thread int replication_applying;

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
/* A namespace's applied position, published under rep->lock: /v1/replication
 * (replication_status) reads last_id and loaded under it from HTTP threads,
 * while only this thread writes them. */
static void set_last_id(replication *rep, ns_state *s, const char *sid)
{
    pthread_mutex_lock(&rep->lock);
    snprintf(s->last_id, sizeof s->last_id, "%s", sid);
    s->loaded = true;
    pthread_mutex_unlock(&rep->lock);
}

static void pos_load(replication *rep, ns_state *s)
{
    s->nhw = 0;
    char err[NC_ERRLEN];
    ns_handle *ref = namespaces_acquire(rep->srv, s->name, false, err, sizeof err);
    if (!ref) {
        set_last_id(rep, s, "0");   /* not here yet: everything from the start */
        return;
    }
    char last[sizeof s->last_id] = "0";
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
        if (sid_cmp(sid, last) > 0)
            snprintf(last, sizeof last, "%s", sid);
        if (strlen(origin) < sizeof s->hw[0].origin && sscanf(id + 5 + used, "%llu.%llu:", &b, &sq) == 2) {
            hwm_t *h = hwm_find(s, origin, b, true);
            if (h && sq > h->seq) h->seq = sq;
        }
    }
    namespaces_release(rep->srv, ref);
    set_last_id(rep, s, last);
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

/* An entry's pairs decoded for the store: word ids, and f16 keys as
 * floats or (compact storage) lists; codes borrowed from the reply. */
typedef struct {
    size_t cnt;
    int *ids;
    float *keys;
    int64_t *lists;
    const uint8_t *codes;
    size_t code_size;
} entry_pairs;

static void entry_pairs_free(entry_pairs *e)
{
    free(e->ids);
    free(e->keys);
    free(e->lists);
}

/* The words ("w": cnt strings joined by '\n') as ids of st's table. */
static int entry_words(nc_nsstore *st, const redisReply *w, entry_pairs *e)
{
    e->ids = malloc(e->cnt * sizeof(int));
    if (!e->ids)
        return NC_ENOMEM;
    nc_wordtable *wt = nsstore_words(st);
    const char *p = w->str, *end = w->str + w->len;
    for (size_t i = 0; i < e->cnt; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        e->ids[i] = l ? wordtable_id(wt, p, l, true) : -1;
        if (e->ids[i] < 0)
            return NC_EFORMAT;
        p = nl ? nl + 1 : end;
    }
    return NC_OK;
}

/* The pairs of an entry with keys ("k", [cnt, H] f16), whatever st's
 * storage (a compact store encodes them). */
static int entry_keys(replication *rep, const redisReply *k, entry_pairs *e)
{
    e->keys = malloc(e->cnt * (size_t)rep->H * sizeof(float));
    if (!e->keys)
        return NC_ENOMEM;
    const uint16_t *kh = (const uint16_t *)k->str;
    for (size_t i = 0; i < e->cnt * (size_t)rep->H; i++) {
        uint16_t h;
        memcpy(&h, kh + i, 2);
        e->keys[i] = nc_half_to_float(h);
    }
    return NC_OK;
}

/* The pairs of a compact entry ("l" u32 lists, "c" codes, "t" training
 * fingerprint): only for a compact store of the same training -- without
 * keys nothing can place the pairs in other lists. */
static int entry_codes(nc_nsstore *st, const redisReply *kv, entry_pairs *e, char *err, size_t errlen)
{
    const redisReply *l = field(kv, "l"), *c = field(kv, "c"), *t = field(kv, "t");
    if (!l || !c || !t || l->len != e->cnt * 4 || c->len % e->cnt != 0)
        return nc_error(err, errlen, NC_EFORMAT, "malformed compact entry");
    if (!nsstore_is_compact(st))
        return nc_error(err, errlen, NC_EINVAL, "an entry of a namespace with compact storage (codes, no keys) "
                        "cannot enter this replica's namespace, which keeps keys");
    unsigned long long fp = strtoull(t->str, NULL, 16);
    if (fp != nsstore_fingerprint(st))
        return nc_error(err, errlen, NC_EINVAL, "compact storage: the entry's codes are of trained index %016llx, "
                        "this replica's namespace reads %016llx: replicas of a compact namespace need the same "
                        "unbounded.faiss (it keeps no keys to encode them again)", fp,
                        (unsigned long long)nsstore_fingerprint(st));
    e->lists = malloc(e->cnt * sizeof *e->lists);
    if (!e->lists)
        return NC_ENOMEM;
    for (size_t i = 0; i < e->cnt; i++) {
        uint32_t x;
        memcpy(&x, l->str + 4 * i, 4);
        e->lists[i] = x;
    }
    e->codes = (const uint8_t *)c->str;
    e->code_size = c->len / e->cnt;
    return NC_OK;
}

/* Whether an entry is well formed for this replica (its model, a pair
 * count its keys or codes bear out); the count in *cnt. */
static bool entry_valid(replication *rep, ns_state *s, const redisReply *kv, size_t *cnt)
{
    const redisReply *o = field(kv, "o"), *d = field(kv, "d"), *f = field(kv, "f"), *n = field(kv, "n"),
                     *m = field(kv, "m"), *w = field(kv, "w"), *k = field(kv, "k"), *l = field(kv, "l");
    if (!o || !d || !f || !n || !m || !w || (!k && !l))
        return false;
    *cnt = strtoull(n->str, NULL, 10);
    /* The pair count is checked against the keys' (lists') length by
     * division: a product (cnt * H * 2) wraps for a count near 2^62, which
     * the key length then matches, and the buffers sized by it are tiny. */
    size_t unit = k ? (size_t)rep->H * 2 : 4;
    const redisReply *x = k ? k : l;
    return strtoull(m->str, NULL, 16) == rep->model_fp && *cnt > 0 && x->len % unit == 0 && *cnt == x->len / unit &&
           strlen(o->str) < sizeof s->hw[0].origin;
}

/* The pairs of a valid entry added to st under document doc (keys, or
 * codes of a compact namespace); *seq the log record to sync. */
static int entry_add(replication *rep, nc_nsstore *st, const redisReply *kv, uint32_t doc, uint64_t *seq,
                     char err[NC_ERRLEN])
{
    const size_t errlen = NC_ERRLEN;
    entry_pairs e = {.cnt = strtoull(field(kv, "n")->str, NULL, 10)};
    uint64_t off = strtoull(field(kv, "f")->str, NULL, 10);
    const redisReply *k = field(kv, "k");
    int rc = entry_words(st, field(kv, "w"), &e);
    if (rc == NC_OK)
        rc = k ? entry_keys(rep, k, &e) : entry_codes(st, kv, &e, err, errlen);
    replication_applying = 1;
    if (rc == NC_OK && k) {
        const nsstore_pairs pairs = {.keys = e.keys, .words = e.ids, .n = e.cnt, .doc = doc, .off = off};
        rc = nsstore_add(st, &pairs, seq, err, errlen);
    } else if (rc == NC_OK) {
        nsstore_codes c = {.lists = e.lists, .codes = e.codes, .code_size = e.code_size, .words = e.ids,
                           .n = e.cnt, .doc = doc, .off = off};
        rc = nsstore_add_codes(st, &c, seq, err, errlen);
    }
    replication_applying = 0;
    if (rc != NC_OK && !err[0])
        snprintf(err, errlen, "%s", rc == NC_ENOMEM ? "out of memory" : "malformed words");
    entry_pairs_free(&e);
    return rc;
}

/* Applies one entry of another replica into the store; *seq receives the
 * log sequence to sync (0 = none). Returns NC_EIO or NC_ENOSPACE when the
 * store could not write it (a full or failing disk: the entry must be
 * applied again later, not passed over), else NC_OK (applied, or refused
 * for good: another model, malformed). */
static int apply_entry(replication *rep, ns_state *s, nc_nsstore *st, const char *sid, const redisReply *kv,
                       uint64_t *seq_out)
{
    *seq_out = 0;
    const redisReply *o = field(kv, "o"), *d = field(kv, "d"), *b = field(kv, "b"), *sq = field(kv, "s");
    size_t cnt = 0;
    if (!entry_valid(rep, s, kv, &cnt)) {
        if (atomic_fetch_add(&rep->refused_entries, 1) == 0)
            slog(SLOG_WARN, "replication: entry refused (another model or malformed)",
                 json_pack("{s:s,s:s}", "id", sid, "origin", o ? o->str : "?"));
        return NC_OK;
    }
    uint64_t birth = b ? strtoull(b->str, NULL, 10) : 0, oseq = sq ? strtoull(sq->str, NULL, 10) : 0;
    uint64_t seq = 0;
    char err[NC_ERRLEN] = "";
    /* One document per entry, naming it: the namespace's own record of
     * how far it has applied the stream and each origin (pos_load). */
    char docid[1300];
    uint32_t doc = 0;
    snprintf(docid, sizeof docid, "repl:%s:%s:%zu:%llu.%llu:%s", o->str, sid, cnt, (unsigned long long)birth,
             (unsigned long long)oseq, d->str);
    size_t dl = strlen(docid);
    int rc = nsstore_doc_begin(st, docid, dl > NSSTORE_DOC_ID_MAX ? NSSTORE_DOC_ID_MAX : dl, &doc, err, sizeof err);
    if (rc == NC_OK)
        rc = entry_add(rep, st, kv, doc, &seq, err);
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
    } else if (rc == NC_EIO || rc == NC_ENOSPACE) {
        return rc;   /* the caller stops here and reads it again later */
    } else {
        atomic_fetch_add(&rep->refused_entries, 1);
        slog(SLOG_WARN, "replication: entry not applied", json_pack("{s:s,s:s}", "id", sid, "error", err));
    }
    *seq_out = rc == NC_OK ? seq : 0;
    return NC_OK;
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
            if (name && strlen(name) < SESSION_ID_MAX) replication_ns_get(rep, name);
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
    ns_state *s = replication_ns_find(rep, name);
    bool drop = false;
    if (s) {
        if (t > s->tomb) {
            s->tomb = t;
            replication_tombs_save(rep);   /* given back to a Redis that loses its data */
        }
        drop = s->birth != 0 && s->birth <= t;
    }
    pthread_mutex_unlock(&rep->lock);
    if (!drop) return;
    char err[NC_ERRLEN] = "";
    int64_t gone = 0;
    bool deleted = namespaces_delete(rep->srv, name, t, &gone, NULL, NULL, err, sizeof err) == 0;
    if (deleted)
        slog(SLOG_INFO, "replication: namespace deleted by another replica",
             json_pack("{s:s,s:s,s:I}", "namespace", name, "origin", origin, "entries", (json_int_t)gone));
    pthread_mutex_lock(&rep->lock);
    if (s->birth != 0 && s->birth <= t)
        s->birth = 0;
    /* The store just deleted may hold entries of later incarnations of
     * other origins, applied into it before this tombstone was known (it
     * comes from the periodic HGETALL as well as the control stream): the
     * stream is read again from its start, or they are lost here. Decided
     * by the deletion itself, not by s->birth: a request may already have
     * created the name again here (s->birth after t), and that new store
     * holds nothing applied -- only this thread applies, and it applies
     * nothing before the reset is taken. */
    if (deleted)
        s->reset = true;
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
            replication_stream_key(rep, rep->ns[i].name, keys[i], sizeof keys[i]);
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
    ns_create nc = {.name = ns->name, .create = true};
    for (size_t e = 0; e < ents->elements && !want; e++) {
        const redisReply *en = ents->element[e];
        want = en->type == REDIS_REPLY_ARRAY && en->elements == 2 &&
               sid_cmp(en->element[0]->str, ns->last_id) > 0 && entry_wanted(rep, ns, tomb, en->element[1], false);
        /* a namespace made here for a compact one's codes is compact */
        nc.compact = want && field(en->element[1], "c") != NULL;
    }
    ns_handle *ref = NULL;
    char err[NC_ERRLEN] = "";
    if (want && !(ref = namespaces_create(rep->srv, &nc, err, sizeof err))) {
        /* Retried at the next read, from the same position; logged
         * once, not at every retry. */
        if (!ns->warned)
            slog(SLOG_WARN, "replication: namespace unavailable",
                 json_pack("{s:s,s:s}", "namespace", ns->name, "error", err));
        ns->warned = true;
        return -1;
    }
    ns->warned = false;
    if (ref) {
        /* Deleted here (or by a tombstone) between the look at the
         * tombstone and the acquire: the store just acquired may be a new
         * incarnation, which entries judged against the old tombstone must
         * not enter. Read again from the position the reset gives. */
        pthread_mutex_lock(&rep->lock);
        bool moved = ns->reset || ns->tomb != tomb;
        pthread_mutex_unlock(&rep->lock);
        if (moved) {
            namespaces_release(rep->srv, ref);
            return 0;
        }
    }
    nc_nsstore *st = ref ? namespaces_store(ref) : NULL;
    uint64_t last_seq = 0;
    bool stalled = false;
    for (size_t e = 0; e < ents->elements; e++) {
        const redisReply *en = ents->element[e];
        if (en->type != REDIS_REPLY_ARRAY || en->elements != 2) continue;
        if (sid_cmp(en->element[0]->str, ns->last_id) <= 0)
            continue;
        if (entry_wanted(rep, ns, tomb, en->element[1], true) && st) {
            uint64_t seq = 0;
            /* A store that cannot write (disk full, I/O error) keeps the
             * position here: the entry is read again at the next read,
             * once the log takes writes again (found by make endurance:
             * a replica's full disk used to pass its entries over). */
            if (apply_entry(rep, ns, st, en->element[0]->str, en->element[1], &seq) != NC_OK) {
                stalled = true;
                break;
            }
            if (seq) last_seq = seq;
        }
        set_last_id(rep, ns, en->element[0]->str);
    }
    if (last_seq && nsstore_sync(st, last_seq, err, sizeof err) != NC_OK)
        slog(SLOG_WARN, "replication: sync failed", json_pack("{s:s,s:s}", "namespace", ns->name, "error", err));
    if (stalled && !ns->warned)
        slog(SLOG_WARN, "replication: namespace cannot be written; its entries wait",
             json_pack("{s:s}", "namespace", ns->name));
    ns->warned = stalled;
    if (ref) namespaces_release(rep->srv, ref);
    return stalled ? -1 : 0;
}

/* The applier thread's connection and read positions. */
typedef struct {
    redisContext *c;
    double last_refresh;          /* ms of the last namespace/tombstone refresh */
    char ctl_key[200], ctl_id[64];
} applier_loop;

/* Clears the positions of the namespaces deleted here (whatever comes next
 * is of a new incarnation); the namespace count. Entries of rep->ns never
 * move and only this thread writes their positions: the lock only guards
 * the count and the fields shared with the publisher and the request
 * threads. */
static int reset_deleted(replication *rep)
{
    pthread_mutex_lock(&rep->lock);
    int nns = rep->nns;
    for (int i = 0; i < nns; i++)
        if (rep->ns[i].reset) {
            rep->ns[i].reset = false;
            rep->ns[i].loaded = true;
            rep->ns[i].nhw = 0;
            snprintf(rep->ns[i].last_id, sizeof rep->ns[i].last_id, "0");
        }
    pthread_mutex_unlock(&rep->lock);
    return nns;
}

/* Drops the connection after a Redis error. */
static void applier_disconnect(replication *rep, applier_loop *al)
{
    atomic_fetch_add(&rep->redis_errors, 1);
    redisFree(al->c);
    al->c = NULL;
}

/* Applies an XREAD answer, [[key, [[id, [f, v, ...]], ...]], ...]: the
 * control stream's entries and each namespace's. true when a namespace's
 * entries must be read again later. */
static bool apply_reply(replication *rep, applier_loop *al, const redisReply *r, int nns)
{
    bool retry_later = false;
    for (size_t si = 0; r->type == REDIS_REPLY_ARRAY && si < r->elements; si++) {
        const redisReply *sr = r->element[si];
        if (sr->type != REDIS_REPLY_ARRAY || sr->elements != 2) continue;
        const char *key = sr->element[0]->str;
        if (!strcmp(key, al->ctl_key)) {
            apply_control(rep, sr->element[1], al->ctl_id, sizeof al->ctl_id);
            al->last_refresh = 0;
            continue;
        }
        ns_state *ns = NULL;
        for (int i = 0; i < nns; i++) {
            char k[256];
            replication_stream_key(rep, rep->ns[i].name, k, sizeof k);
            if (!strcmp(k, key)) ns = &rep->ns[i];
        }
        if (ns && apply_stream(rep, ns, sr->element[1]) != 0)
            retry_later = true;
    }
    return retry_later;
}

/* One round: (re)connect, refresh the namespaces each second, one XREAD
 * of the control and namespace streams, applied. Returns the milliseconds
 * to sleep before the next round (0: none). */
static int applier_round(replication *rep, applier_loop *al)
{
    /* Namespaces are recovered before the server turns ready. */
    if (!atomic_load(&rep->srv->ready))
        return 50;
    if (!al->c && !(al->c = replication_connect_redis(rep, &rep->connected_app)))
        return 300;
    if (now_ms() - al->last_refresh > 1000) {
        if (refresh_namespaces(rep, al->c) || load_tombstones(rep, al->c)) {
            applier_disconnect(rep, al);
            return 0;
        }
        al->last_refresh = now_ms();
    }
    int nns = reset_deleted(rep);
    for (int i = 0; i < nns; i++)
        if (!rep->ns[i].loaded) pos_load(rep, &rep->ns[i]);
    bool oom = false;
    redisReply *r = xread(rep, al->c, al->ctl_key, al->ctl_id, nns, &oom);
    if (oom)
        return 100;
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r) {
            slog(SLOG_WARN, "replication: XREAD failed", json_pack("{s:s}", "error", r->str));
            freeReplyObject(r);
        }
        applier_disconnect(rep, al);
        atomic_store(&rep->connected_app, 0);
        return 200;
    }
    bool retry_later = apply_reply(rep, al, r, nns);
    freeReplyObject(r);
    return retry_later ? 200 : 0;
}

void *replication_applier(void *arg)
{
    replication *rep = arg;
    /* From the control stream's start, not "$": "$" means "after what is
     * there when this XREAD is sent", so a deletion announced between two
     * XREADs (while a batch is applied) would be missed until the next
     * HGETALL, meanwhile entries of the later incarnation go into the
     * store the tombstone deletes. Old deletions read again are no-ops
     * (apply_tombstone), as with load_tombstones. */
    applier_loop al = {.ctl_id = "0"};
    snprintf(al.ctl_key, sizeof al.ctl_key, "%sctl", rep->prefix);
    while (!atomic_load(&rep->stop)) {
        int ms = applier_round(rep, &al);
        if (ms > 0)
            sleep_ms(ms);
    }
    if (al.c) redisFree(al.c);
    return NULL;
}
