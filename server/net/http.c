/* http.c -- libmicrohttpd glue: per-request state allocated on the first
 * callback and freed in the completed callback, bodies accumulated up to
 * max_body_bytes, JSON parsed with json_loadb, routing through a static table
 * whose misses answer 404/405, every answer counted in the metrics. */
#include "http.h"

#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "metrics.h"
#include "slog.h"
#include "sse.h"

static const http_route *routes;
static int nroutes;

void http_reply_json(http_response *r, unsigned status, json_t *json)
{
    json_decref(r->json);
    r->status = status;
    r->json = json;
    /* a later answer replaces an earlier one's headers too */
    r->retry_after = 0;
    r->challenge = NULL;
}

void http_reply_error(http_response *r, api_error e, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    http_reply_json(r, proto_http_status(e), proto_error_body(e, msg));
    r->retry_after = proto_retry_after(e);
}

void http_reply_status(http_response *r, const api_status *st)
{
    http_reply_json(r, proto_http_status(st->code), proto_error_body(st->code, st->message));
    r->retry_after = proto_retry_after(st->code);
}

/* Matches url against pattern segment by segment; "{name}" captures one
 * non-empty segment. Returns 1 on match. */
static int match(const char *pattern, const char *url, char params[][128])
{
    int np = 0;
    const char *p = pattern, *u = url;
    while (*p && *u) {
        if (*p != '/' || *u != '/')
            return 0;
        p++, u++;
        const char *pe = strchr(p, '/'), *ue = strchr(u, '/');
        size_t pl = pe ? (size_t)(pe - p) : strlen(p), ul = ue ? (size_t)(ue - u) : strlen(u);
        if (pl > 1 && p[0] == '{' && p[pl - 1] == '}') {
            if (ul == 0 || ul >= 128 || np >= HTTP_MAX_PARAMS)
                return 0;
            memcpy(params[np], u, ul);
            params[np][ul] = 0;
            np++;
        } else if (pl != ul || strncmp(p, u, pl) != 0) {
            return 0;
        }
        p += pl, u += ul;
    }
    return *p == 0 && *u == 0;
}

static double now_s(void)
{
    return nc_now_s();
}

static enum MHD_Result send_response(struct MHD_Connection *conn, http_request *req,
                                     http_response *resp, const char *allow)
{
    char *buf = NULL;
    size_t len = 0;
    const char *ctype = "application/json";
    if (resp->json) {
        buf = proto_dump(resp->json, &len);
        if (!buf) {
            resp->status = 500;
            buf = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}\n");
            len = buf ? strlen(buf) : 0;
        }
    } else if (resp->text) {
        buf = resp->text;
        resp->text = NULL;
        len = resp->text_len ? resp->text_len : strlen(buf);
        ctype = resp->content_type ? resp->content_type : "text/plain; charset=utf-8";
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf ? buf : (void *)"",
                                                             buf ? MHD_RESPMEM_MUST_FREE
                                                                 : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(buf);
        return MHD_NO;
    }
    if (len > 0 || resp->status != 204)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (resp->retry_after) {
        char ra[16];
        snprintf(ra, sizeof ra, "%u", resp->retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (resp->challenge)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, resp->challenge);
    req->status = resp->status;
    req->answered = true;
    enum MHD_Result ret = MHD_queue_response(conn, resp->status, r);
    MHD_destroy_response(r);
    json_decref(resp->json);
    resp->json = NULL;
    free(resp->text);
    resp->text = NULL;
    return ret;
}

/* A streamed answer (sse.h): its producer goes to the pool, the response
 * pulls its events on this connection's thread. The request was admitted
 * when its handler ran, so the queue limit does not apply again. */
static enum MHD_Result send_stream(nc_server *srv, struct MHD_Connection *conn, http_request *req,
                                   http_response *resp)
{
    sse_stream *s = resp->sse;
    resp->sse = NULL;
    json_decref(resp->json);
    resp->json = NULL;
    wp_result wr = sse_start(s, srv->pool, req->guard.deadline, req->fd);
    if (wr != WP_DONE) {
        sse_abort(s);
        http_response e = {0};
        http_reply_error(&e, wr == WP_FULL ? API_OVERLOADED : API_NOT_READY, "not started: %s",
                         wr == WP_FULL ? "out of memory" : workguard_reason(WG_SHUTDOWN, 0));
        return send_response(conn, req, &e, NULL);
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, s,
                                                               sse_release);
    if (!r) {
        sse_release(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    /* nginx would otherwise buffer the events (deploy/ proxies) */
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    req->status = 200;
    req->answered = true;
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result answer_error(struct MHD_Connection *conn, http_request *req, api_error e,
                                    const char *allow, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result answer_error(struct MHD_Connection *conn, http_request *req, api_error e,
                                    const char *allow, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    http_response resp = {.status = proto_http_status(e), .json = proto_error_body(e, msg),
                          .retry_after = proto_retry_after(e)};
    return send_response(conn, req, &resp, allow);
}

/* Every connection has its own thread (http_start): a deferred answer is
 * waited for in that thread, which holds no other connection up. */
void http_defer(http_request *req)
{
    req->deferred = true;
}

void http_resume(http_request *req, http_response *resp)
{
    http_response *copy = malloc(sizeof *copy);
    if (copy) {
        *copy = *resp;
    } else {
        json_decref(resp->json);
        free(resp->text);
    }
    resp->json = NULL;
    resp->text = NULL;
    pthread_mutex_lock(&req->wait_lock);
    req->later = copy;            /* NULL: answered 500 */
    req->resumed = true;
    pthread_cond_signal(&req->wait_cv);
    pthread_mutex_unlock(&req->wait_lock);
}

/* The deferred answer, once http_resume has given it. */
static enum MHD_Result send_later(struct MHD_Connection *conn, http_request *req)
{
    pthread_mutex_lock(&req->wait_lock);
    while (!req->resumed)
        pthread_cond_wait(&req->wait_cv, &req->wait_lock);
    http_response *later = req->later;
    req->later = NULL;
    pthread_mutex_unlock(&req->wait_lock);
    http_response resp = {.status = 500};
    if (later)
        resp = *later;
    free(later);
    req->deferred = false;
    if (!resp.json && !resp.text && resp.status != 204) {
        resp.status = 500;
        resp.json = proto_error_body(API_INTERNAL, "out of memory");
    }
    return send_response(conn, req, &resp, NULL);
}

/* A heavy route's handler call, run on a worker (workguard.h). */
typedef struct {
    nc_server *srv;
    http_request *req;
    const http_route *rt;
    http_response *resp;          /* NULL: a piece of a streaming body */
} heavy_call;

static void heavy_fn(void *arg)
{
    heavy_call *c = arg;
    c->rt->handler(c->srv, c->req, c->resp);
}

/* The 429 of a heavy request the workers' queue has no room for */
#define OVERLOADED_FMT                                                                                           \
    "%d heavy requests (score, feed, completions) run at once and max_queued = %d more are waiting: retry later"

/* Runs the handler of a ROUTE_HEAVY route on the pool. Returns WP_DONE, or
 * why it did not run with resp answered accordingly (not for WP_GONE: there
 * is nobody to answer). */
static wp_result run_heavy(nc_server *srv, http_request *req, const http_route *rt, http_response *resp,
                           bool admitted)
{
    heavy_call c = {srv, req, rt, resp};
    wp_result r = (wp_result)srv->run_heavy(srv, &req->guard, req->fd, admitted, heavy_fn, &c);
    if (!resp)
        return r;
    switch (r) {
    case WP_FULL:
        http_reply_error(resp, API_OVERLOADED, OVERLOADED_FMT, srv->cfg.threads, srv->cfg.max_queued);
        break;
    case WP_DEADLINE:
    case WP_SHUTDOWN:
        http_reply_error(resp, r == WP_DEADLINE ? API_DEADLINE_EXCEEDED : API_NOT_READY, "not started: %s",
                         workguard_reason(r == WP_DEADLINE ? WG_DEADLINE : WG_SHUTDOWN,
                                          srv->cfg.request_timeout_s));
        break;
    default:
        break;
    }
    return r;
}

/* Finds the route: index >= 0, or -1 (no pattern matches: 404) or -2 (a
 * pattern matches with another method: 405, allowed methods in allow). The
 * fallback row (method NULL, the table's last) is never matched here. */
static int find_route(const char *method, const char *url, char params[][128], char *allow,
                      size_t allowlen)
{
    int path_match = 0;
    allow[0] = 0;
    for (int i = 0; i < nroutes; i++) {
        char tmp[HTTP_MAX_PARAMS][128];
        if (!routes[i].method || !match(routes[i].pattern, url, tmp))
            continue;
        if (strcmp(routes[i].method, method) == 0) {
            memcpy(params, tmp, sizeof tmp);
            return i;
        }
        path_match = 1;
        size_t l = strlen(allow);
        if (!strstr(allow, routes[i].method))
            snprintf(allow + l, allowlen - l, "%s%s", l ? ", " : "", routes[i].method);
    }
    return path_match ? -2 : -1;
}

/* The fallback row (method NULL), -1 if the table has none. */
static int fallback_route(void)
{
    for (int i = nroutes; i-- > 0;)
        if (!routes[i].method)
            return i;
    return -1;
}

/* The request's Authorization header, NULL when absent. */
static const char *request_authorization(http_request *req)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
}

static int is_json_type(const char *ct)
{
    if (!ct)
        return 0;
    while (*ct == ' ') ct++;
    size_t n = strlen("application/json");
    return strncasecmp(ct, "application/json", n) == 0 &&
           (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

/* The API key check of auth.h for req on route rt: 0 with *key, or -1 with
 * resp holding the refusal. */
static int check_key(nc_server *srv, http_request *req, const http_route *rt, const auth_key **key,
                     http_response *resp)
{
    auth_request ar = {.method = req->method, .url = req->url, .endpoint = rt->endpoint,
                       .pattern = rt->pattern, .param = req->params[0], .json = req->json,
                       .authorization = request_authorization(req)};
    auth_refusal why;
    if (auth_check(srv, &ar, key, &why) == 0)
        return 0;
    http_reply_error(resp, why.code, "%s", why.message);
    resp->challenge = why.challenge;
    return -1;
}

/* The first callback of a request: its state, its deadline, and a
 * streaming route's checks before any of its body arrives (a body over
 * the limit is refused on its declared length). */
static enum MHD_Result request_begin(nc_server *srv, struct MHD_Connection *conn, const char *url,
                                     const char *method, void **con_cls)
{
    http_request *req = calloc(1, sizeof *req);
    if (!req)
        return MHD_NO;
    req->conn = conn;
    req->method = method;
    req->url = url;
    req->t0 = now_s();
    req->route = -1;
    req->status = 500;
    pthread_mutex_init(&req->wait_lock, NULL);
    pthread_cond_init(&req->wait_cv, NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    req->fd = ci ? ci->connect_fd : -1;
    /* The deadline counts from the request's head: waiting for a
     * worker is part of it. */
    req->guard.deadline = req->t0 + srv->cfg.request_timeout_s;
    atomic_fetch_add(&srv->inflight, 1);
    *con_cls = req;
    /* A streaming route gets its body piece by piece as it arrives
     * (ROUTE_STREAM): no size limit, nothing accumulated here. */
    char sallow[64];
    int sr = find_route(method, url, req->params, sallow, sizeof sallow);
    if (sr >= 0 && (routes[sr].flags & ROUTE_STREAM)) {
        req->route = sr;
        /* An upload is as long as its client makes it: no deadline (it
         * stops with its connection, or at shutdown). */
        req->guard.deadline = 0;
        if ((routes[sr].flags & ROUTE_NEEDS_MODEL) && !atomic_load(&srv->ready))
            return answer_error(conn, req, API_NOT_READY, NULL, "the server is not ready yet");
        http_response aresp = {.status = 500};
        const auth_key *akey;   /* API keys: checked before any of the body is used */
        if (check_key(srv, req, &routes[sr], &akey, &aresp) != 0)
            return send_response(conn, req, &aresp, NULL);
        /* An upload of any length is processed as it arrives: a piece can
         * take long (the index's switch to IVF trains it), so the idle
         * timeout must not cut the connection meanwhile. */
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)0);
        return MHD_YES;
    }
    /* A declared length over the limit is refused before reading it. */
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > (unsigned long long)srv->cfg.max_body_bytes) {
        req->too_large = true;
        return answer_error(conn, req, API_BODY_TOO_LARGE, NULL,
                            "request body of %s bytes is over the limit of %ld bytes", cl,
                            srv->cfg.max_body_bytes);
    }
    return MHD_YES;
}

/* A piece of the body: handed to a streaming route as it comes, else
 * accumulated up to max_body_bytes (beyond, read and dropped). */
static enum MHD_Result request_piece(nc_server *srv, http_request *req, const char *data, size_t n)
{
    if (req->route >= 0 && (routes[req->route].flags & ROUTE_STREAM)) {
        if (!req->answered) {
            req->chunk = data;
            req->chunk_len = n;
            /* each piece waits its turn among the heavy requests; an
             * upload is never refused half-way (admitted) */
            wp_result wr = WP_DONE;
            if (routes[req->route].flags & ROUTE_HEAVY)
                wr = run_heavy(srv, req, &routes[req->route], NULL, true);
            else
                routes[req->route].handler(srv, req, NULL);
            req->chunk = NULL;
            /* hung up, or shutting down: the connection closes, what was
             * added stays (and is in the log) */
            if (wr != WP_DONE)
                return MHD_NO;
        }
        return MHD_YES;
    }
    if (req->too_large || req->answered)
        return MHD_YES;
    if (req->len + n > (size_t)srv->cfg.max_body_bytes) {
        req->too_large = true;       /* keep reading, drop the bytes */
        free(req->body);
        req->body = NULL;
        req->len = req->cap = 0;
        return MHD_YES;
    }
    if (req->len + n + 1 > req->cap) {
        size_t cap = req->cap ? req->cap : 4096;
        while (cap < req->len + n + 1) cap *= 2;
        char *nb = realloc(req->body, cap);
        if (!nb)
            return MHD_NO;
        req->body = nb;
        req->cap = cap;
    }
    memcpy(req->body + req->len, data, n);
    req->len += n;
    req->body[req->len] = 0;
    return MHD_YES;
}

/* The route of a whole request, or -1 when it was answered: no route (the
 * table's last row answers 404/405), a body over the limit, a heavy
 * request the workers' queue has no room for, a JSON route whose body is
 * not JSON, or the model not loaded yet. */
static int request_route(nc_server *srv, struct MHD_Connection *conn, http_request *req, enum MHD_Result *ret)
{
    const char *method = req->method, *url = req->url;
    req->route = find_route(method, url, req->params, req->allow, sizeof req->allow);
    if (req->route < 0) {
        /* The table's last row answers 404/405 (req->allow says which). */
        int fb = fallback_route();
        if (fb >= 0) {
            req->route = fb;
            http_response resp = {.status = 500};
            routes[fb].handler(srv, req, &resp);
            *ret = send_response(conn, req, &resp, resp.status == 405 ? req->allow : NULL);
        } else if (!req->allow[0]) {
            *ret = answer_error(conn, req, API_NOT_FOUND, NULL, "no route for %s %s", method, url);
        } else {
            *ret = answer_error(conn, req, API_METHOD_NOT_ALLOWED, req->allow,
                                "method %s is not allowed on %s (allowed: %s)", method, url, req->allow);
        }
        return -1;
    }
    if (req->too_large) {
        *ret = answer_error(conn, req, API_BODY_TOO_LARGE, NULL, "request body is over the limit of %ld bytes",
                            srv->cfg.max_body_bytes);
        return -1;
    }
    const http_route *rt = &routes[req->route];
    if (rt->flags & ROUTE_JSON) {
        const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if ((req->len > 0 || !(rt->flags & ROUTE_EMPTY_OK)) && !is_json_type(ct)) {
            *ret = answer_error(conn, req, API_UNSUPPORTED_MEDIA, NULL,
                                "Content-Type must be application/json (got %s)", ct ? ct : "none");
            return -1;
        }
        /* A heavy request the queue would refuse is refused before its body
         * is parsed: a body of up to max_body_bytes parsed in this thread
         * only to answer 429 was work for nothing, done by every client
         * that retries into a full queue. (So a full queue answers 429
         * before a malformed body's 400 and before a key's 401/403, which
         * read the parsed body. A route that may run light, a feed of a
         * few words, needs the parse to know: its queue is asked after.) */
        if ((rt->flags & ROUTE_HEAVY) && !(rt->flags & ROUTE_STREAM) && !rt->light && srv->pool &&
            workpool_refuses(srv->pool)) {
            *ret = answer_error(conn, req, API_OVERLOADED, NULL, OVERLOADED_FMT, srv->cfg.threads,
                                srv->cfg.max_queued);
            return -1;
        }
        api_status st;
        req->json = proto_parse_body(req->body ? req->body : "", req->len,
                                     (rt->flags & ROUTE_EMPTY_OK) != 0, &st);
        if (!req->json) {
            http_response resp = {0};
            http_reply_status(&resp, &st);
            *ret = send_response(conn, req, &resp, NULL);
            return -1;
        }
    }
    if ((rt->flags & ROUTE_NEEDS_MODEL) && !atomic_load(&srv->ready)) {
        *ret = answer_error(conn, req, API_NOT_READY, NULL, "the model is not loaded yet");
        return -1;
    }
    return req->route;
}

/* The whole request is in: route, check, parse, handle, answer. */
static enum MHD_Result request_answer(nc_server *srv, struct MHD_Connection *conn, http_request *req)
{
    enum MHD_Result ret = MHD_YES;
    if (request_route(srv, conn, req, &ret) < 0)
        return ret;
    const http_route *rt = &routes[req->route];
    http_response resp = {.status = 500};
    /* API keys (auth.h): 401/403/404/429 before the handler (a streaming
     * route was checked on its first callback). */
    const auth_key *key = (rt->flags & ROUTE_STREAM) ? auth_identify(srv, request_authorization(req)) : NULL;
    if (!(rt->flags & ROUTE_STREAM) && check_key(srv, req, rt, &key, &resp) != 0)
        return send_response(conn, req, &resp, NULL);
    if ((rt->flags & ROUTE_HEAVY) && !(rt->light && rt->light(srv, req))) {
        if (run_heavy(srv, req, rt, &resp, (rt->flags & ROUTE_STREAM) != 0) == WP_GONE) {
            auth_done(srv, key, rt->endpoint, resp.status, resp.json, resp.text_tokens);
            json_decref(resp.json);
            sse_abort(resp.sse);
            return MHD_NO;        /* nobody to answer: close */
        }
    } else {
        rt->handler(srv, req, &resp);
    }
    auth_done(srv, key, rt->endpoint, resp.status, resp.json, resp.text_tokens);
    if (req->deferred)
        return send_later(conn, req);   /* answered from http_resume */
    if (resp.sse)
        return send_stream(srv, conn, req, &resp);
    if (!resp.json && !resp.text && resp.status != 204) {
        resp.status = 500;
        resp.json = proto_error_body(API_INTERNAL, "out of memory");
    }
    return send_response(conn, req, &resp, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    nc_server *srv = cls;
    http_request *req = *con_cls;
    (void)version;
    if (!req)
        return request_begin(srv, conn, url, method, con_cls);
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return request_piece(srv, req, upload_data, n);
    }
    if (req->answered)
        return MHD_YES;
    return request_answer(srv, conn, req);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    nc_server *srv = cls;
    http_request *req = *con_cls;
    (void)conn;
    if (!req)
        return;
    double dt = now_s() - req->t0;
    /* answered before routing (413 on Content-Length): the misses' label */
    int fb = fallback_route();
    int ep = req->route >= 0 ? req->route : fb >= 0 ? fb : nroutes;
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK || req->status)
        metrics_request(ep, req->status, dt);
    if (srv->cfg.log_requests && slog_enabled(SLOG_INFO))
        slog(SLOG_INFO, "request",
             json_pack("{s:s,s:s,s:i,s:f,s:i}", "method", req->method, "path", req->url, "status",
                       (int)req->status, "seconds", dt, "termination", (int)toe));
    if (req->later) {
        http_response *later = req->later;
        json_decref(later->json);
        free(later->text);
        free(later);
    }
    if (req->user_free)
        req->user_free(req->user);
    pthread_cond_destroy(&req->wait_cv);
    pthread_mutex_destroy(&req->wait_lock);
    json_decref(req->json);
    free(req->body);
    free(req);
    *con_cls = NULL;
    atomic_fetch_sub(&srv->inflight, 1);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    slog(SLOG_WARN, "libmicrohttpd", json_pack("{s:s}", "detail", msg));
}

/* ---- the connection acceptor -------------------------------------------
 * The daemon accepts connections itself and hands them to libmicrohttpd
 * (MHD_add_connection) once their first bytes look like an HTTP request
 * line: "METHOD " with METHOD upper-case letters. libmicrohttpd waits for a
 * line end before it judges a request line, so a TLS ClientHello (or any
 * bytes without a newline) held a connection and its thread until the idle
 * timeout, and a line it could not parse was closed without an answer; here
 * both get 400 malformed_request at once. The acceptor also bounds the open
 * connections (max_connections, each has a thread) with a 503. */

#define ACCEPTOR_PEEK 32              /* bytes that decide; methods are short */

typedef struct {
    int fd;
    double since;
    struct sockaddr_storage addr;
    socklen_t alen;
} acceptor_conn;

struct http_acceptor {
    nc_server *srv;
    int lfd;                      /* listening socket */
    int wake[2];                  /* pipe: http_stop wakes the thread */
    pthread_t th;
    acceptor_conn *pend;              /* accepted, no request line yet */
    int npend, cap;
};

/* Writes a JSON error answer on a socket that libmicrohttpd never saw, and
 * closes it. What the client sent is read first: closing a socket with
 * unread bytes resets the connection, and the reset can destroy the answer
 * before the client reads it. */
static void acceptor_refuse(int fd, api_error e, const char *msg)
{
    json_t *b = proto_error_body(e, msg);
    char *body = b ? proto_dump(b, NULL) : NULL;
    json_decref(b);
    char head[256];
    unsigned ra = proto_retry_after(e);
    char rah[32] = "";
    if (ra)
        snprintf(rah, sizeof rah, "Retry-After: %u\r\n", ra);
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s"
                      "Connection: close\r\n\r\n",
                      proto_http_status(e), proto_http_status(e) == 400 ? "Bad Request" : "Service Unavailable",
                      body ? strlen(body) : 0, rah);
    char junk[4096];
    while (recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {}
    if (send(fd, head, (size_t)hl, MSG_DONTWAIT | MSG_NOSIGNAL) == hl && body)
        (void)!send(fd, body, strlen(body), MSG_DONTWAIT | MSG_NOSIGNAL);
    free(body);
    shutdown(fd, SHUT_WR);
    while (recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {}
    close(fd);
}

/* 1: the bytes start an HTTP request line; 0: not yet known (all
 * upper-case letters so far); -1: they cannot. */
static int looks_like_request(const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (b[i] == ' ')
            return i > 0 ? 1 : -1;
        if (b[i] < 'A' || b[i] > 'Z' || i >= 20)
            return -1;
    }
    return 0;
}

static long open_connections(struct http_acceptor *g)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(g->srv->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return (di ? (long)di->num_connections : 0) + g->npend;
}

static void acceptor_drop(struct http_acceptor *g, int i)
{
    g->pend[i] = g->pend[--g->npend];
}

/* pfd sized for the wake pipe, the listening socket and every pending
 * connection, and filled. false when out of memory: then the pending
 * connections were closed (refused), and the caller goes round again. */
static bool acceptor_poll_set(struct http_acceptor *g, struct pollfd **pfd, int *pcap)
{
    if (*pcap < g->npend + 2) {
        int cap = 2 * (g->npend + 2);
        struct pollfd *np = realloc(*pfd, (size_t)cap * sizeof *np);
        if (!np) {
            while (g->npend) {
                close(g->pend[g->npend - 1].fd);
                g->npend--;
            }
            return false;
        }
        *pfd = np;
        *pcap = cap;
    }
    (*pfd)[0] = (struct pollfd){.fd = g->wake[0], .events = POLLIN};
    (*pfd)[1] = (struct pollfd){.fd = g->lfd, .events = POLLIN};
    for (int i = 0; i < g->npend; i++)
        (*pfd)[2 + i] = (struct pollfd){.fd = g->pend[i].fd, .events = POLLIN};
    return true;
}

/* The first np pending connections, polled (revents in pfd[2 + i]): each
 * that sent enough bytes goes to libmicrohttpd or is refused; one silent
 * past the idle timeout is closed. */
static void acceptor_judge(struct http_acceptor *g, const struct pollfd *pfd, int np, double now)
{
    nc_server *srv = g->srv;
    /* from the last: acceptor_drop moves the last entry into the hole */
    for (int i = np; i-- > 0;) {
        acceptor_conn *c = &g->pend[i];
        if (!pfd[2 + i].revents) {
            if (now - c->since > srv->cfg.connection_timeout_s) {
                close(c->fd);   /* said nothing: the idle timeout */
                acceptor_drop(g, i);
            }
            continue;
        }
        unsigned char buf[ACCEPTOR_PEEK];
        ssize_t k = recv(c->fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        int ok = k > 0 ? looks_like_request(buf, (size_t)k) : -2;
        if (ok == 0 && k < (ssize_t)sizeof buf)
            continue;         /* "GE": wait for more */
        if (ok == 1) {
            /* libmicrohttpd owns (and closes) the socket from here */
            MHD_add_connection(srv->mhd, c->fd, (struct sockaddr *)&c->addr, c->alen);
        } else if (ok == -2) {
            close(c->fd);     /* closed (or reset) before a request */
        } else {
            acceptor_refuse(c->fd, API_MALFORMED_REQUEST,
                            "not an HTTP/1.1 request line (this port speaks plain HTTP, not TLS)");
        }
        acceptor_drop(g, i);
    }
}

/* Accepts up to 64 waiting connections: each is refused with 503 past
 * max_connections, else pending until its request line is judged. */
static void acceptor_accept(struct http_acceptor *g, double now)
{
    nc_server *srv = g->srv;
    for (int burst = 0; burst < 64; burst++) {
        acceptor_conn c = {.alen = sizeof c.addr};
        c.fd = accept4(g->lfd, (struct sockaddr *)&c.addr, &c.alen, SOCK_CLOEXEC);
        if (c.fd < 0)
            break;
        if (open_connections(g) >= srv->cfg.max_connections) {
            char msg[128];
            snprintf(msg, sizeof msg, "max_connections (%d) connections are open: retry later",
                     srv->cfg.max_connections);
            acceptor_refuse(c.fd, API_TOO_MANY_CONNECTIONS, msg);
            continue;
        }
        if (g->npend == g->cap) {
            int cap = g->cap ? 2 * g->cap : 64;
            acceptor_conn *nb = realloc(g->pend, (size_t)cap * sizeof *nb);
            if (!nb) {
                close(c.fd);
                continue;
            }
            g->pend = nb;
            g->cap = cap;
        }
        c.since = now;
        g->pend[g->npend++] = c;
    }
}

/* The acceptor thread: polls the listening socket and the pending
 * connections until http_stop writes to the wake pipe. */
static void *acceptor_main(void *arg)
{
    struct http_acceptor *g = arg;
    struct pollfd *pfd = NULL;
    int pcap = 0;
    for (;;) {
        if (!acceptor_poll_set(g, &pfd, &pcap))
            continue;         /* out of memory: refused the waiting ones */
        int np = g->npend;
        int rc = poll(pfd, (nfds_t)np + 2, 250);
        if (rc < 0 && errno != EINTR)
            break;
        if (pfd[0].revents)
            break;                /* http_stop */
        double now = now_s();
        acceptor_judge(g, pfd, np, now);
        if (pfd[1].revents & POLLIN)
            acceptor_accept(g, now);
    }
    free(pfd);
    return NULL;
}

/* Binds and listens on cfg.bind:cfg.port. Returns the socket or -1. */
static int acceptor_listen(nc_server *srv, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    int family;
    if (strchr(srv->cfg.bind, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)srv->cfg.port);
        if (inet_pton(AF_INET6, srv->cfg.bind, &a->sin6_addr) != 1) {
            snprintf(err, errlen, "option 'bind': '%s' is not an IPv6 address", srv->cfg.bind);
            return -1;
        }
        family = AF_INET6;
        sl = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)srv->cfg.port);
        if (inet_pton(AF_INET, srv->cfg.bind, &a->sin_addr) != 1) {
            snprintf(err, errlen, "option 'bind': '%s' is not an IPv4 address", srv->cfg.bind);
            return -1;
        }
        family = AF_INET;
        sl = sizeof *a;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 1024) != 0) {
        snprintf(err, errlen, "cannot listen on %s:%d (%s)", srv->cfg.bind, srv->cfg.port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (srv->cfg.port == 0) {
        struct sockaddr_storage got;
        socklen_t gl = sizeof got;
        getsockname(fd, (struct sockaddr *)&got, &gl);
        srv->port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                             : ((struct sockaddr_in *)&got)->sin_port);
    } else {
        srv->port = srv->cfg.port;
    }
    return fd;
}

int http_start(nc_server *srv, const http_route *rts, int n, char *err, size_t errlen)
{
    static const char *names[METRICS_MAX_ENDPOINTS];
    routes = rts;
    nroutes = n;
    int ne = 0;
    for (int i = 0; i < n && ne < METRICS_MAX_ENDPOINTS - 1; i++)
        names[ne++] = rts[i].endpoint;
    if (fallback_route() < 0)
        names[ne++] = "unmatched";    /* misses, without a fallback row */
    metrics_init(names, ne);

    struct http_acceptor *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->srv = srv;
    g->wake[0] = g->wake[1] = -1;
    g->lfd = acceptor_listen(srv, err, errlen);
    if (g->lfd < 0 || pipe2(g->wake, O_CLOEXEC) != 0) {
        if (g->lfd >= 0) {
            snprintf(err, errlen, "pipe: %s", strerror(errno));
            close(g->lfd);
        }
        free(g);
        return -1;
    }
    /* One thread per connection: a connection's work (or its wait for a
     * worker, or a deferred predict) holds up no other connection, so
     * /health, /ready and /metrics are answered at once whatever runs.
     * (With a pool of event-loop threads, a handler running model work
     * stopped every connection of its thread; suspending them would stop
     * libmicrohttpd from noticing hang-ups.) The threads are bounded by
     * max_connections; heavy work itself runs on the worker pool. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC | MHD_USE_POLL;
    srv->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv,
                                MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->cfg.connection_timeout_s,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->cfg.max_connections,
                                MHD_OPTION_END);
    if (!srv->mhd) {
        snprintf(err, errlen, "cannot start libmicrohttpd");
        close(g->lfd);
        close(g->wake[0]);
        close(g->wake[1]);
        free(g);
        return -1;
    }
    if (pthread_create(&g->th, NULL, acceptor_main, g) != 0) {
        snprintf(err, errlen, "cannot start the accepting thread");
        MHD_stop_daemon(srv->mhd);
        srv->mhd = NULL;
        close(g->lfd);
        close(g->wake[0]);
        close(g->wake[1]);
        free(g);
        return -1;
    }
    srv->acceptor = g;
    return 0;
}

void http_stop(nc_server *srv)
{
    struct http_acceptor *g = srv->acceptor;
    if (g) {
        /* no new connections first; then libmicrohttpd closes its own */
        (void)!write(g->wake[1], "x", 1);
        pthread_join(g->th, NULL);
        for (int i = 0; i < g->npend; i++)
            close(g->pend[i].fd);
        close(g->lfd);
        close(g->wake[0]);
        close(g->wake[1]);
        free(g->pend);
        free(g);
        srv->acceptor = NULL;
    }
    if (srv->mhd) {
        MHD_stop_daemon(srv->mhd);
        srv->mhd = NULL;
    }
}
