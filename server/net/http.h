/* http.h -- libmicrohttpd glue: per-request state, body accumulation with a
 * size limit, JSON parsing, the route table, error answers, metrics. */
#ifndef NC_SERVER_HTTP_H
#define NC_SERVER_HTTP_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "proto.h"
#include "server.h"
#include "workguard.h"

#define HTTP_MAX_PARAMS 2

/* One request, allocated on the first callback and freed in the completed
 * callback (the only place). */
typedef struct http_request {
    struct MHD_Connection *conn;
    const char *method, *url;     /* borrowed from MHD */
    char *body;                   /* accumulated upload, NUL-terminated */
    size_t len, cap;
    bool too_large;
    json_t *json;                 /* parsed body (object) when the route takes one */
    char params[HTTP_MAX_PARAMS][128];  /* {id} captures of the route pattern */
    int route;                    /* index in the route table, -1 = none */
    double t0;
    unsigned status;              /* answered status, for metrics */
    bool answered;                /* a response is queued */
    bool deferred;                /* suspended: another thread answers (http_defer) */
    char allow[64];               /* no route: methods the path allows ("" = none: 404) */
    void *later;                  /* that answer (http_response *), set by http_resume */
    const char *chunk;            /* ROUTE_STREAM: the piece of body being handed */
    size_t chunk_len;
    void *user;                   /* a streaming route's state (ROUTE_STREAM) */
    void (*user_free)(void *);    /* frees it in the completed callback */
    workguard guard;              /* ROUTE_HEAVY: deadline and cancellation (workguard.h) */
    int fd;                       /* the client's socket, watched for a hang-up */
    pthread_mutex_t wait_lock;    /* http_defer: the connection's thread waits */
    pthread_cond_t wait_cv;       /* here until http_resume */
    bool resumed;
} http_request;

/* What a handler answers: a status and a body (JSON, or raw text). */
typedef struct {
    unsigned status;
    json_t *json;                 /* owned; encoded compactly */
    char *text;                   /* owned malloc'd raw body (metrics) */
    const char *content_type;     /* for text */
    size_t text_len;              /* binary text: its length (0 = strlen) */
    long text_tokens;             /* a JSON answer written as text (predict): the tokens it charges
                                   * an API key's token bucket, as "consumed" in json would */
    unsigned retry_after;         /* seconds for a Retry-After header, 0 = none */
    const char *challenge;        /* a 401's WWW-Authenticate value (static) */
    struct sse_stream *sse;       /* owned: a streamed answer (sse.h), 200 text/event-stream,
                                   * produced on a worker while it is sent */
} http_response;

typedef void (*http_handler)(nc_server *srv, http_request *req, http_response *resp);

enum {
    ROUTE_JSON = 1,               /* body is a JSON object (415 / 400 checks) */
    ROUTE_EMPTY_OK = 2,           /* an empty body stands for {} */
    ROUTE_NEEDS_MODEL = 4,        /* 503 until the model is loaded */
    ROUTE_STREAM = 8,             /* the body is never accumulated (no size limit):
                                   * the handler is called with resp == NULL for
                                   * each piece as it arrives (req->chunk), then
                                   * once with resp to answer */
    ROUTE_HEAVY = 16,             /* model work: runs on the worker pool
                                   * (workguard.h) under the request's guard,
                                   * req->guard; a streaming route's pieces
                                   * each wait their turn there */
};

/* The table's last row has method NULL: its handler answers every request
 * no other row takes, 404 or 405 (req->allow lists the path's methods). */
typedef struct {
    const char *method;           /* "GET", "POST", "DELETE"; NULL = the fallback */
    const char *pattern;          /* "/v1/sessions/{id}/feed" */
    http_handler handler;
    const char *endpoint;         /* metrics label */
    int flags;
    /* NULL, or for a ROUTE_HEAVY route: whether this request (its body
     * parsed) is small enough to run in its connection's thread, as a
     * predict does, instead of queueing for a worker (a feed of a few
     * words) */
    bool (*light)(const nc_server *srv, const http_request *req);
} http_route;

/* Starts libmicrohttpd on cfg.bind:cfg.port, one thread per connection (at
 * most cfg.max_connections), routing through routes[0..n); ROUTE_HEAVY
 * routes run on srv->pool. Sets srv->port and srv->mhd. Returns 0 or -1
 * with a message. */
int http_start(nc_server *srv, const http_route *routes, int n, char *err, size_t errlen);
/* Stops accepting, closes connections, joins the pool. */
void http_stop(nc_server *srv);

/* Handler helpers. json is stolen. */
void http_reply_json(http_response *r, unsigned status, json_t *json);
void http_reply_error(http_response *r, api_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void http_reply_status(http_response *r, const api_status *st);

/* Asynchronous answers. A handler that passes its work to another thread
 * calls http_defer(req) (the handler leaves its resp empty; the connection's
 * thread then waits) and that thread later calls http_resume with the
 * answer, whose json/text are stolen. req stays valid until then. */
void http_defer(http_request *req);
void http_resume(http_request *req, http_response *resp);

#endif
