/* replication_publisher.c -- the publisher thread: follows every
 * namespace's write-ahead log and XADDs the local adds to Redis Streams
 * (pipelined), then advances the namespace's marker; publishes tombstones. */
#include "replication_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "atomicfile.h"
#include "slog.h"

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

typedef struct {
    uint64_t birth, pos;
    char *err;
    size_t errlen;
} marker_job;

static int marker_write_in(void *ctx, const char *dir)
{
    marker_job *j = ctx;
    return replication_marker_write(dir, j->birth, j->pos, j->err, j->errlen) == 0 ? NC_OK : NC_EIO;
}

/* The log kept for a Redis that loses its data: a record is kept RETAIN_MS
 * after it was published, so that a Redis restarted without appendonly can
 * be given back what it lost (check_epoch) -- unless a replica was down for
 * longer than that as well. s->marks samples (time, published position);
 * the point is the position published RETAIN_MS ago, 0 (everything the log
 * holds) until the follower is that old. Publisher thread only. */
static uint64_t retain_point(ns_state *s, uint64_t pos)
{
    double now = now_ms();
    if (s->nmarks == 0 || now - s->marks[s->nmarks - 1].t >= RETAIN_MS / (RETAIN_MARKS - 1)) {
        if (s->nmarks == RETAIN_MARKS) {
            memmove(s->marks, s->marks + 1, (RETAIN_MARKS - 1) * sizeof s->marks[0]);
            s->nmarks--;
        }
        s->marks[s->nmarks].t = now;
        s->marks[s->nmarks++].pos = pos;
    }
    uint64_t point = 0;
    for (int i = 0; i < s->nmarks && now - s->marks[i].t >= RETAIN_MS; i++)
        point = s->marks[i].pos;
    return point;
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
    /* Through nsstore_run_live: a store deleted meanwhile is retired and
     * its path may already be a new incarnation's, whose marker this is not. */
    marker_job job = {birth, pos, err, sizeof err};
    int wrc = nsstore_run_live(store, marker_write_in, &job);
    if (wrc == NC_ESTATE)
        return;
    if (wrc != NC_OK) {
        slog(SLOG_WARN, "replication: cannot write the marker (entries may be published twice after a crash; "
             "the other replicas skip them)", json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        return;
    }
    pthread_mutex_lock(&rep->lock);
    if (s->birth == birth) s->published = pos;
    pthread_mutex_unlock(&rep->lock);
    nsstore_retain_log(store, retain_point(s, pos));
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
        replication_stream_key(rep, d[i].name, key, sizeof key);
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
    int rc = replication_read_replies(c, 4 * n);
    if (rc == 0) {
        /* done with these (a newer deletion of a name meanwhile stays) */
        pthread_mutex_lock(&rep->lock);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < rep->ndels; j++)
                if (!strcmp(rep->dels[j].name, d[i].name) && rep->dels[j].t == d[i].t) {
                    rep->dels[j] = rep->dels[--rep->ndels];
                    break;
                }
        replication_deletes_save(rep);
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
        /* Segments were removed behind replication's back (after a Redis
         * that lost its data, records older than the retention: see
         * RETAIN_MS): what they held is lost for the replicas that had not
         * read it. Go on from the oldest record that exists. */
        uint64_t oldest = nsstore_log_oldest(store);
        nc_nsstore_stats st;
        nsstore_stats(store, &st);
        slog(published ? SLOG_ERROR : SLOG_WARN, "replication: the log no longer reaches back that far; "
             "publishing from its oldest record", json_pack("{s:s,s:s,s:I}", "namespace", s->name, "error", err,
                                                             "from", (json_int_t)oldest));
        published = oldest ? oldest - 1 : st.last_seq;
        rc = nsstore_log_open(store, published, &s->log, err, sizeof err);
    }
    s->nmarks = 0;   /* a new follower: its retention starts over (retain_point) */
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
    replication_stream_key(rep, s->name, key, sizeof key);
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
        const char *argv[32];
        size_t argl[32];
        char fp[24];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)a.fingerprint);
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
        if (a.keys_f16) {
            ARG("k", 1); ARG((const char *)a.keys_f16, a.n * (size_t)rep->H * 2);
        } else {
            /* compact storage: the lists and codes its log holds, and the
             * training they need at the other end */
            ARG("l", 1); ARG((const char *)a.lists, a.n * 4);
            ARG("c", 1); ARG((const char *)a.codes, a.n * a.code_size);
            ARG("t", 1); ARG(fp, strlen(fp));
        }
#undef ARG
        redisAppendCommandArgv(c, k, argv, argl);
        (*sent)++;
        *tokens += a.n;
        bytes += a.n * (a.keys_f16 ? (size_t)rep->H * 2 : 4 + a.code_size);
    }
    return rc;
}

/* What publish_ns reads of s under the lock: the store's generation and
 * birth, the position Redis acknowledged (the marker may lag it), the
 * tombstone, whether a deletion of the name waits to be published. */
typedef struct {
    unsigned gen;
    uint64_t birth, published, tomb;
    bool deleting;
} pub_view;

static void pub_view_read(replication *rep, ns_state *s, pub_view *v)
{
    pthread_mutex_lock(&rep->lock);
    v->gen = s->gen;
    v->birth = s->birth;
    v->published = s->pub_pos;
    v->tomb = s->tomb;
    v->deleting = deletion_pending(rep, s->name);
    s->dirty = false;
    pthread_mutex_unlock(&rep->lock);
    if (s->log && (s->log_gen != v->gen || v->birth == 0)) {
        /* the store it followed was closed (deleted, or opened again) */
        nsstore_log_close(s->log);
        s->log = NULL;
    }
}

/* A long upload syncs its log only before it answers: publishing would
 * wait for the whole document. Records appended but not yet durable are
 * synced here (group commit: shared with the requests' own syncs), so the
 * other replicas follow the upload as it goes. true when the log cannot be
 * synced (do not poll it). */
static bool sync_appended(ns_state *s, nc_nsstore *store)
{
    char err[NC_ERRLEN] = "";
    uint64_t last = nsstore_last_seq(store);
    if (last > nsstore_durable_seq(store) && nsstore_sync(store, last, err, sizeof err) != NC_OK) {
        if (!s->log_warned)
            slog(SLOG_ERROR, "replication: cannot sync the namespace's log",
                 json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        s->log_warned = true;
        return true;
    }
    return false;
}

/* queue_adds' rc, told: records the log lost (a tail cut by a failed
 * fsync, before the namespace healed) cannot be published and the follower
 * goes on after them (1); a log that cannot be read is closed, to be opened
 * again (rc < 0). */
static int log_read_outcome(ns_state *s, int rc, const char *err)
{
    if (rc == NC_ENOTFOUND) {
        slog(SLOG_ERROR, "replication: log records lost, not published",
             json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        return 1;
    }
    if (rc < 0) {
        if (!s->log_warned)
            slog(SLOG_ERROR, "replication: cannot read the namespace's log",
                 json_pack("{s:s,s:s}", "namespace", s->name, "error", err));
        s->log_warned = true;
        nsstore_log_close(s->log);
        s->log = NULL;
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
    pub_view v;
    pub_view_read(rep, s, &v);
    if (v.birth == 0 || v.birth <= v.tomb)
        return 0;   /* no store here, or one of a deleted incarnation (the applier removes it) */
    if (v.deleting)
        return 1;   /* created again since its deletion: after the tombstone, whose DEL and
                       SREM would take away the new store's entries and announcement */
    ns_handle *ref = namespaces_acquire(rep->srv, s->name, false, err, sizeof err);
    if (!ref)
        return 0;
    nc_nsstore *store = namespaces_store(ref);
    pthread_mutex_lock(&rep->lock);
    bool same = s->gen == v.gen;
    pthread_mutex_unlock(&rep->lock);
    if (!same) {
        namespaces_release(rep->srv, ref);
        return 1;   /* attached again meanwhile: look again */
    }
    if (!s->log && follow_log(rep, s, store, v.gen, v.published) != 0) {
        namespaces_release(rep->srv, ref);
        return 0;
    }
    bool broken = sync_appended(s, store);
    int extra = announce(rep, c, s), sent = 0;
    uint64_t tokens = 0;
    int rc = queue_adds(rep, c, s, v.birth, &sent, &tokens, err, sizeof err);
    /* what was sent covers the log up to here (a bad record stops the
     * batch before it: the next pass opens the log again and stops there
     * again, logged once, until the log is repaired) */
    uint64_t pos = nsstore_log_position(s->log);
    rc = log_read_outcome(s, rc, err);
    if (replication_read_replies(c, sent + extra) != 0) {
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
    pub_pos_advance(rep, s, v.gen, pos, false);
    int more = rc == 1 || (!broken && nsstore_last_seq(store) > pos);
    marker_flush(rep, s, store, v.birth, final || !more);
    namespaces_release(rep->srv, ref);
    return more;
}

/* ---- Redis's epoch ------------------------------------------------------------
 * Redis without appendonly (or a new Redis behind the same address) comes
 * back empty: the streams and tombstones published into it are gone, and a
 * replica that had not read them yet would never get them. The key
 * <prefix>epoch names Redis's data set (set once, by whoever finds it
 * absent); a replica remembers the one it published into
 * (data_dir/replication-epoch). When they differ, it publishes again its
 * whole log (the appliers skip what they hold: (origin, birth, seq)) and
 * every tombstone it knows, before adopting the new epoch -- a crash in
 * between does it again at the next start. The logs reach back to the
 * last snapshot only (snapshot_period): run Redis with appendonly. */

typedef struct {
    uint64_t birth;
} marker_reset;

static int marker_reset_in(void *ctx, const char *dir)
{
    char err[NC_ERRLEN];
    return replication_marker_write(dir, ((marker_reset *)ctx)->birth, 0, err, sizeof err) == 0 ? NC_OK : NC_EIO;
}

/* One store published again from the start of its log (republish_logs):
 * the marker says so on disk first. */
static void republish_one(replication *rep, ns_state *s, nc_nsstore *store, uint64_t birth, unsigned gen, void *ctx)
{
    (void)ctx;
    marker_reset mr = {birth};
    pthread_mutex_lock(&rep->lock);
    bool same = s->gen == gen && s->birth == birth;
    if (same) {
        s->published = 0;
        s->pub_pos = 0;
        s->dirty = true;
    }
    pthread_mutex_unlock(&rep->lock);
    if (!same)
        return;
    nsstore_retain_log(store, 0);
    nsstore_run_live(store, marker_reset_in, &mr);
    if (s->log) {
        nsstore_log_close(s->log);
        s->log = NULL;
    }
}

/* The tombstones known here, into Redis's hash (the appliers read it every
 * second). 0, or -1 when Redis failed. */
static int republish_tombstones(replication *rep, redisContext *c)
{
    char tombs[200];
    snprintf(tombs, sizeof tombs, "%stombstones", rep->prefix);
    int n = 0;
    pthread_mutex_lock(&rep->lock);
    for (int i = 0; i < rep->nns; i++) {
        if (!rep->ns[i].tomb) continue;
        char t[32];
        snprintf(t, sizeof t, "%llu", (unsigned long long)rep->ns[i].tomb);
        const char *hv[] = {"HSET", tombs, rep->ns[i].name, t};
        size_t hl[4];
        for (int k = 0; k < 4; k++) hl[k] = strlen(hv[k]);
        redisAppendCommandArgv(c, 4, hv, hl);
        n++;
    }
    pthread_mutex_unlock(&rep->lock);
    return replication_read_replies(c, n);
}

/* On a new connection: compares Redis's epoch with the one published into
 * and publishes everything again when Redis lost its data. 0, or -1 when
 * Redis failed (the caller reconnects, and this runs again). */
static int check_epoch(replication *rep, redisContext *c)
{
    unsigned char rnd[16];
    char fresh[40];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) return -1;
    for (int i = 0; i < 16; i++) snprintf(fresh + 2 * i, 3, "%02x", rnd[i]);
    redisReply *r = redisCommand(c, "SET %sepoch %s NX", rep->prefix, fresh);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r) freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    r = redisCommand(c, "GET %sepoch", rep->prefix);
    if (!r || r->type != REDIS_REPLY_STRING || r->len >= sizeof rep->epoch) {
        if (r) freeReplyObject(r);
        return -1;
    }
    char now[40];
    snprintf(now, sizeof now, "%s", r->str);
    freeReplyObject(r);
    if (!strcmp(now, rep->epoch)) return 0;
    if (rep->epoch[0]) {
        slog(SLOG_WARN, "replication: Redis lost its data (a restart without appendonly?); publishing the logs "
             "and tombstones again", json_pack("{s:s,s:s}", "epoch_was", rep->epoch, "epoch", now));
        replication_each_store(rep, republish_one, NULL);
        if (republish_tombstones(rep, c) != 0) return -1;
    }
    char err[NC_ERRLEN];
    if (rep->epoch_path[0] && atomicfile_write(rep->epoch_path, now, strlen(now), err, sizeof err) != NC_OK) {
        slog(SLOG_ERROR, "replication: cannot record Redis's epoch", json_pack("{s:s}", "error", err));
        return -1;
    }
    snprintf(rep->epoch, sizeof rep->epoch, "%s", now);
    return 0;
}

static int ns_count(replication *rep)
{
    pthread_mutex_lock(&rep->lock);
    int nns = rep->nns;
    pthread_mutex_unlock(&rep->lock);
    return nns;
}

/* One pass: the deletions, then each namespace's batch. Returns -1 when
 * Redis failed, else whether more may be waiting (*more). */
static int publish_all(replication *rep, redisContext *c, bool stopping, bool *more)
{
    int failed = publish_deletes(rep, c);
    int nns = ns_count(rep);
    *more = false;
    for (int i = 0; i < nns && !failed; i++) {
        int r = publish_ns(rep, c, &rep->ns[i], stopping);
        if (r < 0) failed = 1;
        if (r > 0) *more = true;
    }
    return failed ? -1 : 0;
}

/* Sleeps until a local add, a deletion, or (more: records appended but
 * not yet durable, markers behind) a short while. */
static void wait_for_work(replication *rep, bool more)
{
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

/* At stop: markers as far as published; followers closed before the stores. */
static void close_followers(replication *rep)
{
    int nns = ns_count(rep);
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
}

/* Drops the connection after a failure: everything stays in the logs, read
 * again once Redis is back. */
static void publisher_disconnect(replication *rep, redisContext **c)
{
    atomic_fetch_add(&rep->redis_errors, 1);
    redisFree(*c);
    *c = NULL;
    atomic_store(&rep->connected_pub, 0);
    int nns = ns_count(rep);
    for (int i = 0; i < nns; i++) rep->ns[i].announced = false;
}

void *replication_publisher(void *arg)
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
        if (!c && (c = replication_connect_redis(rep, &rep->connected_pub)) && check_epoch(rep, c) != 0) {
            redisFree(c);
            c = NULL;
            atomic_store(&rep->connected_pub, 0);
        }
        if (!c) {
            atomic_fetch_add(&rep->redis_errors, 1);
            if (stopping) break;
            sleep_ms(200);
            continue;
        }
        bool more = false;
        int failed = publish_all(rep, c, stopping, &more);
        pending = more || failed;
        if (failed) {
            publisher_disconnect(rep, &c);
            if (stopping) break;
            sleep_ms(200);
            continue;
        }
        if (!stopping)
            wait_for_work(rep, more);
    }
    close_followers(rep);
    if (c) redisFree(c);
    return NULL;
}

