/* sse.c -- server-sent events: the byte queue between a producer on a
 * worker and libmicrohttpd's content reader on the connection's thread
 * (see sse.h for the why). */
#include "sse.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bytes the producer may run ahead of the connection: a few hundred
 * chunks; past it the producer waits for the client to read. */
#define SSE_QUEUE_MAX (64 * 1024)

struct sse_stream {
    pthread_mutex_t lock;
    pthread_cond_t cv;            /* bytes appended, bytes taken, an end */
    char *buf;                    /* queued bytes [off, len) */
    size_t len, cap, off;
    uint64_t in, out;             /* bytes ever appended / handed to the connection */
    uint64_t *ends;               /* absolute end offset of each event appended */
    size_t nevents, capevents, handed;   /* events; those wholly handed over */
    bool done;                    /* the producer returned: nothing more comes */
    bool gone;                    /* libmicrohttpd released the response */
    int refs;                     /* the producer's and the response's */
    int fd;
    workguard guard;
    sse_producer fn;
    void *arg;
    void (*arg_free)(void *);
};

static void sse_free(sse_stream *s)
{
    if (s->arg_free)
        s->arg_free(s->arg);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->lock);
    free(s->buf);
    free(s->ends);
    free(s);
}

/* Drops one reference; the last frees. Called with s->lock held; unlocks. */
static void unref_unlock(sse_stream *s)
{
    bool last = --s->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (last)
        sse_free(s);
}

sse_stream *sse_new(sse_producer fn, void *arg, void (*arg_free)(void *))
{
    sse_stream *s = calloc(1, sizeof *s);
    if (!s) {
        if (arg_free)
            arg_free(arg);
        return NULL;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->lock, NULL);
    s->fn = fn;
    s->arg = arg;
    s->arg_free = arg_free;
    s->fd = -1;
    s->refs = 2;                  /* the producer's, the response's */
    return s;
}

static void run(void *arg)
{
    sse_stream *s = arg;
    /* a stream whose client left while it queued costs one check */
    if (workguard_check(&s->guard) == WG_RUN)
        s->fn(s, s->arg);
    pthread_mutex_lock(&s->lock);
    s->done = true;
    pthread_cond_broadcast(&s->cv);
    unref_unlock(s);
}

wp_result sse_start(sse_stream *s, workpool *p, double deadline, int fd)
{
    s->guard.deadline = deadline;
    s->fd = fd;
    return workpool_submit(p, true, run, s);
}

void sse_abort(sse_stream *s)
{
    if (s)
        sse_free(s);
}

/* Waits on s->cv for a watch period at most; s->lock held. */
static void wait_a_while(sse_stream *s)
{
    struct timespec ts;
    workguard_watch_deadline(&ts);
    pthread_cond_timedwait(&s->cv, &s->lock, &ts);
}

ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    sse_stream *s = cls;
    (void)pos;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (s->len > s->off) {
            size_t n = s->len - s->off < max ? s->len - s->off : max;
            memcpy(buf, s->buf + s->off, n);
            s->off += n;
            s->out += n;
            if (s->off == s->len)
                s->off = s->len = 0;
            while (s->handed < s->nevents && s->ends[s->handed] <= s->out)
                s->handed++;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->lock);
            return (ssize_t)n;
        }
        if (s->done) {
            pthread_mutex_unlock(&s->lock);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        wait_a_while(s);
        if (s->len > s->off || s->done)
            continue;
        /* nothing yet: has the client gone? (the producer sees it at its
         * next check and ends; this side stops at once) */
        pthread_mutex_unlock(&s->lock);
        bool gone = s->fd >= 0 && workguard_client_gone(s->fd);
        pthread_mutex_lock(&s->lock);
        if (gone) {
            workguard_mark_gone(&s->guard);
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->lock);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

void sse_release(void *cls)
{
    sse_stream *s = cls;
    pthread_mutex_lock(&s->lock);
    s->gone = true;
    if (!s->done)
        workguard_mark_gone(&s->guard);             /* the connection ended before the stream */
    pthread_cond_broadcast(&s->cv);
    unref_unlock(s);
}

workguard *sse_guard(sse_stream *s)
{
    return &s->guard;
}

/* Appends bytes as one event. */
static int append(sse_stream *s, const char *a, size_t na, const char *b, size_t nb, const char *c, size_t nc)
{
    size_t n = na + nb + nc;
    pthread_mutex_lock(&s->lock);
    /* a slow client holds the producer here; a stop (deadline, shutdown)
     * gives up rather than wait for it */
    while (!s->gone && s->len - s->off + n > SSE_QUEUE_MAX && s->len > s->off) {
        wait_a_while(s);
        if (!s->gone && workguard_check(&s->guard) != WG_RUN && s->len - s->off + n > SSE_QUEUE_MAX) {
            pthread_mutex_unlock(&s->lock);
            return -1;
        }
    }
    if (s->gone) {
        /* the connection ended (workguard_mark_gone set the guard): count the stop
         * here too, the producer may not reach its own check */
        (void)workguard_check(&s->guard);
        pthread_mutex_unlock(&s->lock);
        return -1;
    }
    if (s->off > 0 && s->len + n > s->cap) {
        memmove(s->buf, s->buf + s->off, s->len - s->off);
        s->len -= s->off;
        s->off = 0;
    }
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n) cap *= 2;
        char *nb2 = realloc(s->buf, cap);
        if (!nb2) {
            pthread_mutex_unlock(&s->lock);
            return -1;
        }
        s->buf = nb2;
        s->cap = cap;
    }
    if (s->nevents == s->capevents) {
        size_t cap = s->capevents ? 2 * s->capevents : 64;
        uint64_t *ne = realloc(s->ends, cap * sizeof *ne);
        if (!ne) {
            pthread_mutex_unlock(&s->lock);
            return -1;
        }
        s->ends = ne;
        s->capevents = cap;
    }
    memcpy(s->buf + s->len, a, na);
    memcpy(s->buf + s->len + na, b, nb);
    memcpy(s->buf + s->len + na + nb, c, nc);
    s->len += n;
    s->in += n;
    s->ends[s->nevents++] = s->in;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int sse_event_raw(sse_stream *s, const char *data)
{
    return append(s, "data: ", 6, data, strlen(data), "\n\n", 2);
}

int sse_event(sse_stream *s, json_t *j)
{
    /* as http.c encodes JSON answers: 12 significant digits */
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(j);
    if (!t)
        return s->gone ? -1 : 0;
    int rc = sse_event_raw(s, t);
    free(t);
    return rc;
}

size_t sse_flush(sse_stream *s)
{
    pthread_mutex_lock(&s->lock);
    while (!s->gone && s->len > s->off && workguard_check(&s->guard) == WG_RUN)
        wait_a_while(s);
    size_t h = s->handed;
    pthread_mutex_unlock(&s->lock);
    return h;
}
