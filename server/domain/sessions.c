/* sessions.c -- the sessions table: uthash under one mutex, a mutex per
 * session, reference counts so a deleted or evicted session is freed only
 * when the last request holding it is done. */
#include "sessions.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "components.h"

struct sessions {
    pthread_mutex_t lock;
    nc_session *by_id;            /* uthash head */
    const nc_model *model;
    int max_sessions, ttl_s;
    size_t budget, used;
    long count;
    char tag[16];
    int (*bind)(void *ctx, const char *ns, nc_unbounded_cache **ub, void **ref, char *err, size_t errlen);
    void (*unbind)(void *ctx, void *ref);
    void *bind_ctx;
};

void sessions_set_binder(sessions *t,
                         int (*bind)(void *ctx, const char *ns, nc_unbounded_cache **ub, void **ref,
                                     char *err, size_t errlen),
                         void (*unbind)(void *ctx, void *ref), void *ctx)
{
    t->bind = bind;
    t->unbind = unbind;
    t->bind_ctx = ctx;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

sessions *sessions_new(const nc_model *m, int max_sessions, int ttl_s, size_t budget,
                       const char *tag)
{
    sessions *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    pthread_mutex_init(&t->lock, NULL);
    t->model = m;
    t->max_sessions = max_sessions;
    t->ttl_s = ttl_s;
    t->budget = budget;
    snprintf(t->tag, sizeof t->tag, "%s", tag ? tag : "");
    return t;
}

static void session_destroy(nc_session *s)
{
    if (!s)
        return;
    stream_free(s->stream);
    if (s->ns_ref && s->ns_unbind)
        s->ns_unbind(s->ns_ctx, s->ns_ref);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void sessions_free(sessions *t)
{
    if (!t)
        return;
    nc_session *s, *tmp;
    HASH_ITER(hh, t->by_id, s, tmp) {
        HASH_DEL(t->by_id, s);
        session_destroy(s);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

size_t sessions_estimate(const nc_model *m, const nc_cache_params *p)
{
    NC_ASSERT(m, "sessions_estimate: no m");
    size_t H = (size_t)m->cfg.hidden_size, L = (size_t)m->cfg.num_layers;
    size_t bytes = 4096 + 2 * L * H * sizeof(float) * 2;     /* state + work */
    return bytes + components_state_bytes(p, (int)H);   /* the rows' windows */
}

/* Unguessable id: 128 bits from getrandom, hex; the replica tag, when set,
 * lets a load balancer route the id without a lookup. */
static int random_id(const char *tag, char *out, size_t cap)
{
    unsigned char r[16];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t n = getrandom(r + got, sizeof r - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)n;
    }
    int k = snprintf(out, cap, "ses_%s%s", tag, tag[0] ? "_" : "");
    for (size_t i = 0; i < sizeof r && (size_t)k + 2 < cap; i++)
        k += snprintf(out + k, cap - (size_t)k, "%02x", r[i]);
    return 0;
}

sessions_rc sessions_create(sessions *t, const nc_session_spec *sp, nc_session **out, char *err, size_t errlen)
{
    NC_ASSERT(!sp->stream && !sp->ns_ref, "sessions_create with a ready stream: sessions_adopt takes it over");
    return sessions_adopt(t, sp, out, err, errlen);
}

int sessions_bind(sessions *t, const char *ns, nc_unbounded_cache **ub, void **ref, char *err, size_t errlen)
{
    NC_ASSERT(t, "sessions_bind: no t");
    *ub = NULL;
    *ref = NULL;
    return t->bind ? t->bind(t->bind_ctx, ns, ub, ref, err, errlen) : 0;
}

void sessions_unbind(sessions *t, void *ref)
{
    NC_ASSERT(t, "sessions_unbind: no t");
    if (ref && t->unbind)
        t->unbind(t->bind_ctx, ref);
}


/* Reserves a slot and need bytes first, so concurrent creations cannot
 * overshoot the limits while the stream is being built. */
static sessions_rc reserve_slot(sessions *t, const char *id, size_t need, char *err, size_t errlen)
{
    sessions_rc rc = SESS_OK;
    pthread_mutex_lock(&t->lock);
    nc_session *old = NULL;
    if (id)
        HASH_FIND_STR(t->by_id, id, old);
    if (t->count >= t->max_sessions) {
        rc = SESS_ELIMIT;
        snprintf(err, errlen, "the server holds its maximum of %d sessions", t->max_sessions);
    } else if (t->used + need > t->budget) {
        rc = SESS_EMEMORY;
        snprintf(err, errlen, "session memory budget exceeded: %zu bytes in use, %zu needed, budget %zu",
                 t->used, need, t->budget);
    } else if (old) {
        rc = SESS_EEXIST;
        snprintf(err, errlen, "session '%s' already exists", id);
    } else {
        t->count++;
        t->used += need;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* Fills the new session s: its settings, its stream (the adopted one,
 * taken over, or a new one bound to its namespace) and its id. */
static sessions_rc session_fill(sessions *t, nc_session *s, const nc_session_spec *sp, size_t need, char *err,
                                size_t errlen)
{
    sessions_rc rc = SESS_OK;
    pthread_mutex_init(&s->lock, NULL);
    s->params = *sp->p;
    s->reserved = need;
    s->created = wall_now();
    snprintf(s->ns, sizeof s->ns, "%s", sp->ns ? sp->ns : "");
    s->ns_unbind = t->unbind;
    s->ns_ctx = t->bind_ctx;
    if (sp->stream) {
        s->stream = sp->stream;   /* taken over: freed with s from here on */
        s->ns_ref = sp->ns_ref;
    } else {
        nc_unbounded_cache *ub = NULL;
        /* Names were validated by proto: a binder failure is the
         * server's (opening the namespace's log or snapshot: I/O), a
         * 5xx, not the client's 400 (found by test_fault_injection's fsync walk). */
        int brc = t->bind ? t->bind(t->bind_ctx, sp->ns, &ub, &s->ns_ref, err, errlen) : 0;
        if (brc != 0)
            rc = brc == NC_EIO ? SESS_ESTORAGE : brc == NC_ENOSPACE ? SESS_ENOSPACE : SESS_ENOMEM;
        if (rc == SESS_OK && stream_new(t->model, sp->p, ub, NULL, true, &s->stream, err, errlen) != NC_OK)
            rc = SESS_EINVAL;
    }
    if (rc == SESS_OK && !sp->id && random_id(t->tag, s->id, sizeof s->id) != 0) {
        rc = SESS_ENOMEM;
        snprintf(err, errlen, "getrandom failed: %s", strerror(errno));
    }
    if (rc == SESS_OK && sp->id)
        snprintf(s->id, sizeof s->id, "%s", sp->id);
    return rc;
}

/* Enters s into the table (rc SESS_OK and its id still free), or gives
 * its reservation back. */
static sessions_rc session_enter(sessions *t, nc_session *s, size_t need, sessions_rc rc, char *err, size_t errlen)
{
    pthread_mutex_lock(&t->lock);
    if (rc == SESS_OK) {
        nc_session *old;
        HASH_FIND_STR(t->by_id, s->id, old);
        if (old) { /* a concurrent create took the client's id */
            rc = SESS_EEXIST;
            snprintf(err, errlen, "session '%s' already exists", s->id);
        }
    }
    if (rc == SESS_OK) {
        s->refs = 1;
        s->last_used = nc_now_s();
        HASH_ADD_STR(t->by_id, id, s);
    } else {
        t->count--;
        t->used -= need;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

sessions_rc sessions_adopt(sessions *t, const nc_session_spec *sp, nc_session **out, char *err, size_t errlen)
{
    NC_ASSERT(t, "sessions_adopt: no t");
    *out = NULL;
    size_t need = sessions_estimate(t->model, sp->p);
    sessions_rc rc = reserve_slot(t, sp->id, need, err, errlen);
    nc_session *s = NULL;
    if (rc == SESS_OK) {
        s = calloc(1, sizeof *s);
        if (!s) {
            rc = session_enter(t, NULL, need, SESS_ENOMEM, err, errlen);
            snprintf(err, errlen, "out of memory");
        }
    }
    if (!s) {
        /* An adopted stream's namespace reference is released with it. */
        stream_free(sp->stream);
        sessions_unbind(t, sp->ns_ref);
        return rc;
    }
    rc = session_fill(t, s, sp, need, err, errlen);
    rc = session_enter(t, s, need, rc, err, errlen);
    if (rc == SESS_OK)
        *out = s;
    else
        session_destroy(s);
    return rc;
}

nc_session *sessions_acquire(sessions *t, const char *id)
{
    NC_ASSERT(t, "sessions_acquire: no t");
    nc_session *s;
    pthread_mutex_lock(&t->lock);
    HASH_FIND_STR(t->by_id, id, s);
    if (s) {
        s->refs++;
        s->last_used = nc_now_s();
    }
    pthread_mutex_unlock(&t->lock);
    return s;
}

void sessions_release(sessions *t, nc_session *s)
{
    NC_ASSERT(t, "sessions_release: no t");
    if (!s)
        return;
    int destroy = 0;
    pthread_mutex_lock(&t->lock);
    NC_ASSERT(s->refs > 0, "sessions_release: session %s released more often than acquired", s->id);
    s->refs--;
    s->last_used = nc_now_s();
    if (s->removed && s->refs == 0)
        destroy = 1;
    pthread_mutex_unlock(&t->lock);
    if (destroy)
        session_destroy(s);
}

/* Table lock held. The session leaves the table and the budget at once; its
 * memory is freed by the last release (or now when unheld). */
static int unlink_locked(sessions *t, nc_session *s)
{
    HASH_DEL(t->by_id, s);
    s->removed = true;
    t->count--;
    t->used -= s->reserved;
    return s->refs == 0;
}

static sessions_rc remove_session(sessions *t, const char *id, bool moved)
{
    nc_session *s;
    int destroy = 0;
    pthread_mutex_lock(&t->lock);
    HASH_FIND_STR(t->by_id, id, s);
    if (s) {
        s->moved = moved;
        destroy = unlink_locked(t, s);
    }
    pthread_mutex_unlock(&t->lock);
    if (!s)
        return SESS_ENOTFOUND;
    if (destroy)
        session_destroy(s);
    return SESS_OK;
}

sessions_rc sessions_delete(sessions *t, const char *id)
{
    return remove_session(t, id, false);
}

sessions_rc sessions_hand_over(sessions *t, const char *id)
{
    return remove_session(t, id, true);
}

int sessions_evict_idle(sessions *t)
{
    NC_ASSERT(t, "sessions_evict_idle: no t");
    double now = nc_now_s();
    nc_session *s, *tmp, *dead = NULL;
    int n = 0;
    pthread_mutex_lock(&t->lock);
    HASH_ITER(hh, t->by_id, s, tmp) {
        if (s->refs == 0 && now - s->last_used > t->ttl_s) {
            unlink_locked(t, s);
            s->hh.next = dead;   /* reuse the handle as a free list */
            dead = s;
            n++;
        }
    }
    pthread_mutex_unlock(&t->lock);
    while (dead) {
        nc_session *next = dead->hh.next;
        session_destroy(dead);
        dead = next;
    }
    return n;
}

void sessions_stats(sessions *t, long *count, size_t *bytes)
{
    NC_ASSERT(t, "sessions_stats: no t");
    pthread_mutex_lock(&t->lock);
    if (count) *count = t->count;
    if (bytes) *bytes = t->used;
    pthread_mutex_unlock(&t->lock);
}

bool sessions_removed(sessions *t, nc_session *s)
{
    NC_ASSERT(t, "sessions_removed: no t");
    pthread_mutex_lock(&t->lock);
    bool r = s->removed;
    pthread_mutex_unlock(&t->lock);
    return r;
}

bool sessions_moved(sessions *t, nc_session *s)
{
    NC_ASSERT(t, "sessions_moved: no t");
    pthread_mutex_lock(&t->lock);
    bool r = s->removed && s->moved;
    pthread_mutex_unlock(&t->lock);
    return r;
}

const char *sessions_tag(const sessions *t)
{
    NC_ASSERT(t, "sessions_tag: no t");
    return t->tag;
}

int sessions_ids(sessions *t, char (**ids)[SESSION_ID_MAX], size_t *n)
{
    *ids = NULL;
    *n = 0;
    pthread_mutex_lock(&t->lock);
    size_t cnt = HASH_COUNT(t->by_id);
    char (*v)[SESSION_ID_MAX] = malloc((cnt ? cnt : 1) * sizeof *v);
    if (!v) {
        pthread_mutex_unlock(&t->lock);
        return -1;
    }
    nc_session *s, *tmp;
    size_t i = 0;
    HASH_ITER(hh, t->by_id, s, tmp)
        memcpy(v[i++], s->id, SESSION_ID_MAX);
    pthread_mutex_unlock(&t->lock);
    *ids = v;
    *n = i;
    return 0;
}
