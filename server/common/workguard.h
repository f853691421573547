/* workguard.h -- bounded, cancellable heavy work: a small pool of worker
 * threads with a bounded queue runs the requests that do model work (score,
 * feed, completions, document uploads), and a guard per request tells that
 * work when to stop (its deadline passed, its client went away, the server
 * is shutting down).
 *
 * Why a pool of its own rather than the HTTP threads: every connection has
 * its own thread (http.c), so probes and predicts never wait behind model
 * work for a thread; the pool bounds how many heavy requests compete for
 * the cores at once (the rest queue, 429 when the queue is full), and its
 * threads run at a lower priority (nice), so a probe or a predict preempts
 * heavy work as soon as it becomes runnable instead of waiting for a time
 * slice. The work checks its guard between slices (WORKGUARD_SLICE tokens,
 * one generated token): a stop takes effect within one slice. */
#ifndef NC_SERVER_WORKGUARD_H
#define NC_SERVER_WORKGUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "proto.h"

/* Tokens scored or fed between two checks: small enough that a stop frees
 * the core in well under a second (about 0.1 s at the 2x256 demo model's
 * 13,000 tokens/s per core), large enough that the batched GEMMs keep
 * their speed (their blocks are 256 positions). */
#define WORKGUARD_SLICE 1024

/* Why work must stop; WG_RUN = go on. */
typedef enum { WG_RUN = 0, WG_DEADLINE, WG_CLIENT_GONE, WG_SHUTDOWN } wg_stop;

/* One request's guard, embedded in the request (http.h). */
typedef struct {
    double deadline;              /* nc_now_s() seconds; 0 = none */
    atomic_int stop;              /* wg_stop set from outside the work */
    bool counted;                 /* its stop is in the metrics */
} workguard;

/* Why the work must stop now (the first reason seen sticks), WG_RUN to go
 * on. Cheap: one clock read and two atomic loads. */
wg_stop workguard_check(workguard *g);
/* The error to answer for a stop (deadline_exceeded, not_ready). */
api_error workguard_api(wg_stop why);
/* A sentence for the error message ("request_timeout of 30 s reached"). */
const char *workguard_reason(wg_stop why, int request_timeout_s);

/* Every guard reports WG_SHUTDOWN from now on, and the pool runs nothing
 * more: queued jobs return WP_SHUTDOWN. */
void workguard_cancel_all(void);
bool workguard_cancelled_all(void);

typedef struct workpool workpool;

/* threads (>= 1) workers at nice value nice (0..19), at most max_queued
 * (>= 0) jobs waiting. NULL on failure. */
workpool *workpool_new(int threads, int max_queued, int nice);
/* Joins the workers (after workguard_cancel_all, or with nothing queued).
 * NULL allowed. */
void workpool_free(workpool *p);

/* Renices the calling thread to the heavy workers' nice value (worker_nice,
 * docs/threads.md) for long work off the pool -- an upload's threads, a
 * backup's copy -- so that predicts, at nice 0, preempt it. Linux: nice is
 * per thread (a thread id is a process id for setpriority); raising one's
 * own needs no privilege. Returns the thread's id when it was reniced
 * (give it back with setpriority(PRIO_PROCESS, tid, *before)), else 0. */
pid_t workguard_nice_thread(int nice, int *before);

typedef enum {
    WP_DONE = 0,                  /* fn ran to its end (it answered) */
    WP_FULL,                      /* not run: the queue is full (429) */
    WP_GONE,                      /* not run: the client went away while queued */
    WP_DEADLINE,                  /* not run: the deadline passed while queued */
    WP_SHUTDOWN,                  /* not run: the server is shutting down */
} wp_result;

/* Runs fn(arg) on a worker and waits for it. admitted: the request was
 * already let in (the next piece of an upload), the queue limit does not
 * apply. While waiting, the calling thread watches the client's socket fd
 * (-1 = none) and the deadline: a client that hangs up sets g->stop to
 * WG_CLIENT_GONE, which fn sees at its next check (or drops the job if it
 * has not started). Returns WP_DONE, or why fn did not run.
 *
 * Why the socket is polled rather than libmicrohttpd's notifications
 * (MHD_OPTION_NOTIFY_COMPLETED with MHD_REQUEST_TERMINATED_*, or
 * MHD_OPTION_NOTIFY_CONNECTION): with one thread per connection the thread
 * that would read the socket is this one, waiting here inside the access
 * handler, so libmicrohttpd reads nothing and reports no hang-up until the
 * handler returns -- after the work. poll() with POLLRDHUP sees the peer's
 * FIN or reset without reading the socket. */
wp_result workpool_run(workpool *p, workguard *g, int fd, bool admitted, void (*fn)(void *), void *arg);

/* Queues fn(arg) on a worker and returns at once (a streamed answer: the
 * connection's thread sends what fn produces meanwhile, sse.h). admitted as
 * for workpool_run. fn always runs once queued, even if its client has gone
 * or the server is shutting down: it must check its own guard first. At
 * shutdown (workpool_free) queued jobs still run before the workers exit.
 * Returns WP_DONE (queued), WP_FULL or WP_SHUTDOWN (not queued: fn never
 * runs). */
wp_result workpool_submit(workpool *p, bool admitted, void (*fn)(void *), void *arg);

/* Whether a heavy request not yet admitted would be refused now because
 * the queue is full (WP_FULL, counted with the refusals as workpool_run's
 * are): the net tier asks before it parses a body only to refuse it. The
 * queue may change before the request is run: workpool_run decides. */
bool workpool_refuses(workpool *p);

/* The peer of socket fd hung up (FIN or reset), seen without reading it. */
bool workguard_client_gone(int fd);
/* Records that g's client is gone, unless g is already stopped for
 * another reason; the work sees it at its next workguard_check. */
void workguard_mark_gone(workguard *g);
/* How often a thread waiting on behalf of a client looks at its socket and
 * guard: a hang-up reaches the work within this plus one slice. */
#define WORKGUARD_WATCH_MS 50
/* *ts = CLOCK_MONOTONIC now + WORKGUARD_WATCH_MS, for a condition variable
 * on that clock. */
void workguard_watch_deadline(struct timespec *ts);

/* Appends the pool's gauges and counters (Prometheus text) to text,
 * which it reallocates; returns the new text (NULL if text was NULL or on
 * out of memory, text freed). NULL p: nothing added. */
char *workpool_metrics(workpool *p, char *text);

#endif
