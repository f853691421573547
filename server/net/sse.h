/* sse.h -- server-sent events: an answer produced on a worker while the
 * connection's thread sends it (text/event-stream, one "data: ...\n\n"
 * event at a time).
 *
 * Who runs what. The generation is heavy work and runs on the worker pool
 * (workguard.h), like every model request: the pool bounds how many compete
 * for the cores and runs them at a lower priority. libmicrohttpd sends the
 * answer from the connection's own thread (one thread per connection,
 * http.c), pulling bytes through a content-reader callback
 * (MHD_create_response_from_callback). The two meet in a bounded byte
 * queue: the producer appends events (waiting while the queue is full, so
 * a slow reader slows the generation rather than filling memory), the
 * callback hands them to libmicrohttpd as they come, blocking in between --
 * which is allowed with a thread per connection, where it holds up no other
 * connection.
 *
 * Why not generate inside the callback: the work would escape the pool
 * (its bound, its priority, its queue's 429) and run at the connection
 * threads' priority, ahead of probes and predicts.
 *
 * Hang-ups. While the callback waits for the next event it polls the
 * client's socket (workguard_client_gone: the same POLLRDHUP test a waiting
 * heavy request uses), and libmicrohttpd ends the response when a write
 * fails; either sets the stream's guard to WG_CLIENT_GONE, which the
 * producer checks before each token: a cancelled stream frees its worker
 * within one token. */
#ifndef NC_SERVER_SSE_H
#define NC_SERVER_SSE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "workguard.h"

typedef struct sse_stream sse_stream;

/* The producer: runs on a worker, writes events with sse_event*, checks
 * sse_guard(s) between tokens, returns when done. arg is its own. */
typedef void (*sse_producer)(sse_stream *s, void *arg);

/* A stream whose events fn(s, arg) will produce; arg_free(arg) (may be
 * NULL) runs when the stream is freed, whether fn ran or not. NULL on out
 * of memory (arg_free(arg) has run). */
sse_stream *sse_new(sse_producer fn, void *arg, void (*arg_free)(void *));

/* Starts the producer on pool p (admitted: the request was let in already,
 * the queue limit does not apply), with the request's deadline (0 = none)
 * and its client's socket fd (-1 = not watched). WP_DONE: running or
 * queued; otherwise it never runs and the caller answers the error and
 * calls sse_abort. */
wp_result sse_start(sse_stream *s, workpool *p, double deadline, int fd);
/* Drops a stream that was never started or never handed to
 * libmicrohttpd. */
void sse_abort(sse_stream *s);

/* libmicrohttpd's content reader and its free callback for the response
 * (MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, ..., sse_read, s,
 * sse_release)). sse_read blocks until bytes, the end or a hang-up. */
ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max);
void sse_release(void *cls);

/* The producer's side. The guard the producer checks between tokens. */
workguard *sse_guard(sse_stream *s);
/* Appends the event "data: <json compact>\n\n" (j stolen; NULL = out of
 * memory, nothing sent). Returns 0, or -1 when the client is gone (nothing
 * more will be read: stop). Waits while the queue is full. */
int sse_event(sse_stream *s, json_t *j);
/* The same for a raw line ("[DONE]"). */
int sse_event_raw(sse_stream *s, const char *data);
/* Waits until every event appended so far was handed to the connection, or
 * the client went away, or the guard stops. Returns the number of events
 * handed to the connection (written to its socket) so far. */
size_t sse_flush(sse_stream *s);

#endif
