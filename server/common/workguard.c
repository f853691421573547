/* workguard.c -- bounded, cancellable heavy work (see workguard.h for the
 * why): the worker pool with its bounded FIFO queue, the per-request guards
 * and their metrics. */
#include "workguard.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"

static atomic_int cancel_all;
/* stops seen, by wg_stop; and jobs refused with a full queue */
static atomic_ulong stops[WG_SHUTDOWN + 1];
static atomic_ulong rejected;

wg_stop workguard_check(workguard *g)
{
    int s = atomic_load(&g->stop);
    if (!s && atomic_load(&cancel_all))
        s = WG_SHUTDOWN;
    if (!s && g->deadline > 0 && nc_now_s() > g->deadline)
        s = WG_DEADLINE;
    if (s) {
        int none = WG_RUN;
        atomic_compare_exchange_strong(&g->stop, &none, s);
        s = atomic_load(&g->stop);
        if (!g->counted) {
            g->counted = true;
            atomic_fetch_add(&stops[s], 1);
        }
    }
    return (wg_stop)s;
}

api_error workguard_api(wg_stop why)
{
    return why == WG_DEADLINE ? API_DEADLINE_EXCEEDED : API_NOT_READY;
}

const char *workguard_reason(wg_stop why, int request_timeout_s)
{
    static __thread char msg[96];
    switch (why) {
    case WG_DEADLINE:
        snprintf(msg, sizeof msg, "request_timeout of %d s reached", request_timeout_s);
        return msg;
    case WG_CLIENT_GONE: return "the client closed the connection";
    case WG_SHUTDOWN: return "the server is shutting down";
    default: return "running";
    }
}

void workguard_cancel_all(void)
{
    atomic_store(&cancel_all, 1);
}

bool workguard_cancelled_all(void)
{
    return atomic_load(&cancel_all) != 0;
}

/* ---- the pool ---------------------------------------------------------- */

typedef struct job {
    void (*fn)(void *);
    void *arg;
    bool started, done;
    bool detached;                /* workpool_submit: nobody waits, the worker frees it */
    pthread_cond_t cv;            /* signalled when done */
    struct job *next;
} job;

struct workpool {
    pthread_mutex_t lock;
    pthread_cond_t cv;            /* workers wait for jobs here */
    job *head, *tail;
    int nqueued;                  /* jobs waiting (not started) */
    int nidle, nrunning;
    int max_queued;
    int nice;
    bool stop;
    int nthreads;
    pthread_t *threads;
};

static void *worker_main(void *arg)
{
    workpool *p = arg;
    /* Linux: nice applies per thread (a thread id is a process id for
     * setpriority). Raising one's own nice value needs no privilege. */
    if (p->nice > 0 && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), p->nice) != 0) {
        /* a refused nice only loses the preference of probes and predicts */
    }
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stop) {
            p->nidle++;
            pthread_cond_wait(&p->cv, &p->lock);
            p->nidle--;
        }
        if (!p->head)
            break;
        job *j = p->head;
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        p->nqueued--;
        j->started = true;
        p->nrunning++;
        pthread_mutex_unlock(&p->lock);
        j->fn(j->arg);
        pthread_mutex_lock(&p->lock);
        p->nrunning--;
        if (j->detached) {
            free(j);
            continue;
        }
        j->done = true;
        /* the waiter frees j once it sees done: not touched after this */
        pthread_cond_signal(&j->cv);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

workpool *workpool_new(int threads, int max_queued, int nice)
{
    if (threads < 1 || max_queued < 0)
        return NULL;
    workpool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->threads = calloc((size_t)threads, sizeof *p->threads);
    p->max_queued = max_queued;
    p->nice = nice;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (!p->threads) {
        workpool_free(p);
        return NULL;
    }
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            workpool_free(p);
            return NULL;
        }
        p->nthreads++;
    }
    return p;
}

void workpool_free(workpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}

/* The client hung up (FIN or reset): its half of the connection is shut. A
 * client that sends more (a pipelined request) is not gone. */
bool workguard_client_gone(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0)
        return false;
    return (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* Takes a job that has not started off the queue. Caller holds p->lock. */
static void unlink_job(workpool *p, job *j)
{
    job **pp = &p->head, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = j->next;
    if (p->tail == j)
        p->tail = prev;
    p->nqueued--;
}

void workguard_mark_gone(workguard *g)
{
    int none = WG_RUN;
    atomic_compare_exchange_strong(&g->stop, &none, WG_CLIENT_GONE);
}

void workguard_watch_deadline(struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_nsec += WORKGUARD_WATCH_MS * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Appends j to the queue and wakes a worker; p->lock held. */
static void enqueue(workpool *p, job *j)
{
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    p->nqueued++;
    pthread_cond_signal(&p->cv);
}

/* The admission of a job, p->lock held: WP_DONE (take it), WP_SHUTDOWN, or
 * WP_FULL when it would wait beyond max_queued (an idle worker takes a job
 * at once: only jobs beyond the idle workers wait). */
static wp_result admit(workpool *p, bool admitted)
{
    if (atomic_load(&cancel_all) || p->stop)
        return WP_SHUTDOWN;
    if (!admitted && p->nqueued >= p->max_queued + p->nidle) {
        atomic_fetch_add(&rejected, 1);
        return WP_FULL;
    }
    return WP_DONE;
}

wp_result workpool_run(workpool *p, workguard *g, int fd, bool admitted, void (*fn)(void *), void *arg)
{
    job j = {.fn = fn, .arg = arg};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&p->lock);
    wp_result r = admit(p, admitted);
    if (r != WP_DONE) {
        pthread_mutex_unlock(&p->lock);
        pthread_cond_destroy(&j.cv);
        return r;
    }
    enqueue(p, &j);
    while (!j.done) {
        struct timespec ts;
        workguard_watch_deadline(&ts);
        pthread_cond_timedwait(&j.cv, &p->lock, &ts);
        if (j.done)
            break;
        pthread_mutex_unlock(&p->lock);
        if (fd >= 0 && workguard_client_gone(fd))
            workguard_mark_gone(g);
        pthread_mutex_lock(&p->lock);
        if (j.started || j.done)
            continue;
        /* still queued: a stop drops the job before it costs anything */
        wg_stop why = workguard_check(g);
        if (why != WG_RUN) {
            unlink_job(p, &j);
            r = why == WG_CLIENT_GONE ? WP_GONE : why == WG_DEADLINE ? WP_DEADLINE : WP_SHUTDOWN;
            break;
        }
    }
    pthread_mutex_unlock(&p->lock);
    pthread_cond_destroy(&j.cv);
    return r;
}

bool workpool_refuses(workpool *p)
{
    pthread_mutex_lock(&p->lock);
    wp_result r = admit(p, false);
    pthread_mutex_unlock(&p->lock);
    return r == WP_FULL;
}

wp_result workpool_submit(workpool *p, bool admitted, void (*fn)(void *), void *arg)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return WP_FULL;
    j->fn = fn;
    j->arg = arg;
    j->detached = true;
    pthread_mutex_lock(&p->lock);
    wp_result r = admit(p, admitted);
    if (r == WP_DONE)
        enqueue(p, j);
    pthread_mutex_unlock(&p->lock);
    if (r != WP_DONE)
        free(j);
    return r;
}

char *workpool_metrics(workpool *p, char *text)
{
    if (!text || !p)
        return text;
    metrics_text b = {text, strlen(text), strlen(text) + 1, 0};
    pthread_mutex_lock(&p->lock);
    int queued = p->nqueued, running = p->nrunning, threads = p->nthreads;
    pthread_mutex_unlock(&p->lock);
    metrics_printf(&b,
                   "# HELP neurocache_work_queue_depth Heavy requests (score, feed, completions, upload pieces) waiting for a worker.\n"
                   "# TYPE neurocache_work_queue_depth gauge\nneurocache_work_queue_depth %d\n"
                   "# HELP neurocache_work_running Heavy requests running on the workers.\n"
                   "# TYPE neurocache_work_running gauge\nneurocache_work_running %d\n"
                   "# HELP neurocache_work_workers Worker threads for heavy requests.\n"
                   "# TYPE neurocache_work_workers gauge\nneurocache_work_workers %d\n"
                   "# HELP neurocache_work_rejected_total Heavy requests refused with 429 because the queue was full.\n"
                   "# TYPE neurocache_work_rejected_total counter\nneurocache_work_rejected_total %lu\n"
                   "# HELP neurocache_work_stopped_total Heavy requests stopped before their end, by reason.\n"
                   "# TYPE neurocache_work_stopped_total counter\n"
                   "neurocache_work_stopped_total{reason=\"deadline\"} %lu\n"
                   "neurocache_work_stopped_total{reason=\"client_gone\"} %lu\n"
                   "neurocache_work_stopped_total{reason=\"shutdown\"} %lu\n",
                   queued, running, threads, atomic_load(&rejected), atomic_load(&stops[WG_DEADLINE]),
                   atomic_load(&stops[WG_CLIENT_GONE]), atomic_load(&stops[WG_SHUTDOWN]));
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

pid_t workguard_nice_thread(int nice, int *before)
{
    pid_t tid = (pid_t)syscall(SYS_gettid);
    errno = 0;
    int now = getpriority(PRIO_PROCESS, (id_t)tid);
    *before = now;
    if (nice <= 0 || (now == -1 && errno) || now >= nice)
        return 0;
    return setpriority(PRIO_PROCESS, (id_t)tid, nice) == 0 ? tid : 0;
}
