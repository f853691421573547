/* http.c -- libmicrohttpd glue: per-request state allocated on the first
 * callback and freed in the completed callback, bodies accumulated up to
 * max_body_bytes, JSON parsed with json_loadb, routing through a static table
 * whose misses answer 404/405, every answer counted in the metrics. */
#include "http.h"

#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "auth.h"
#include "metrics.h"
#include "slog.h"

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
    return sessions_now();
}

static enum MHD_Result send_response(struct MHD_Connection *conn, http_request *req,
                                     http_response *resp, const char *allow)
{
    char *buf = NULL;
    size_t len = 0;
    const char *ctype = "application/json";
    if (resp->json) {
        /* 12 significant digits: 0.1 stays 0.1 (not 0.10000000000000001),
         * far beyond the float precision of probabilities. */
        buf = json_dumps(resp->json, JSON_COMPACT | JSON_REAL_PRECISION(12));
        if (!buf) {
            resp->status = 500;
            buf = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}");
        }
        len = buf ? strlen(buf) : 0;
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

void http_defer(http_request *req)
{
    req->deferred = true;
    MHD_suspend_connection(req->conn);
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
    req->later = copy;            /* NULL: answered 500 */
    /* The connection's thread calls on_request again once resumed. */
    MHD_resume_connection(req->conn);
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

static int is_json_type(const char *ct)
{
    if (!ct)
        return 0;
    while (*ct == ' ') ct++;
    size_t n = strlen("application/json");
    return strncasecmp(ct, "application/json", n) == 0 &&
           (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    nc_server *srv = cls;
    http_request *req = *con_cls;
    (void)version;

    if (!req) {
        req = calloc(1, sizeof *req);
        if (!req)
            return MHD_NO;
        req->conn = conn;
        req->method = method;
        req->url = url;
        req->t0 = now_s();
        req->route = -1;
        req->status = 500;
        atomic_fetch_add(&srv->inflight, 1);
        *con_cls = req;
        /* A streaming route gets its body piece by piece as it arrives
         * (ROUTE_STREAM): no size limit, nothing accumulated here. */
        char sallow[64];
        int sr = find_route(method, url, req->params, sallow, sizeof sallow);
        if (sr >= 0 && (routes[sr].flags & ROUTE_STREAM)) {
            req->route = sr;
            if ((routes[sr].flags & ROUTE_NEEDS_MODEL) && !atomic_load(&srv->ready))
                return answer_error(conn, req, API_NOT_READY, NULL, "the server is not ready yet");
            http_response aresp = {.status = 500};
            const auth_key *akey;   /* API keys: checked before any of the body is used */
            if (auth_check(srv, req, &routes[sr], &akey, &aresp) != 0)
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

    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (req->route >= 0 && (routes[req->route].flags & ROUTE_STREAM)) {
            if (!req->answered) {
                req->chunk = upload_data;
                req->chunk_len = n;
                routes[req->route].handler(srv, req, NULL);
                req->chunk = NULL;
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
        memcpy(req->body + req->len, upload_data, n);
        req->len += n;
        req->body[req->len] = 0;
        return MHD_YES;
    }

    /* The whole request is in: route, check, parse, handle. */
    if (req->deferred) {
        /* Resumed after http_resume: send the answer prepared elsewhere. */
        http_response *later = req->later;
        http_response resp = {.status = 500};
        if (later)
            resp = *later;
        free(later);
        req->later = NULL;
        req->deferred = false;
        if (!resp.json && !resp.text && resp.status != 204) {
            resp.status = 500;
            resp.json = proto_error_body(API_INTERNAL, "out of memory");
        }
        return send_response(conn, req, &resp, NULL);
    }
    if (req->answered)
        return MHD_YES;
    req->route = find_route(method, url, req->params, req->allow, sizeof req->allow);
    if (req->route < 0) {
        /* The table's last row answers 404/405 (req->allow says which). */
        int fb = fallback_route();
        if (fb >= 0) {
            req->route = fb;
            http_response resp = {.status = 500};
            routes[fb].handler(srv, req, &resp);
            return send_response(conn, req, &resp, resp.status == 405 ? req->allow : NULL);
        }
        if (!req->allow[0])
            return answer_error(conn, req, API_NOT_FOUND, NULL, "no route for %s %s", method, url);
        return answer_error(conn, req, API_METHOD_NOT_ALLOWED, req->allow,
                            "method %s is not allowed on %s (allowed: %s)", method, url, req->allow);
    }
    if (req->too_large)
        return answer_error(conn, req, API_BODY_TOO_LARGE, NULL,
                            "request body is over the limit of %ld bytes", srv->cfg.max_body_bytes);
    const http_route *rt = &routes[req->route];
    if (rt->flags & ROUTE_JSON) {
        const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if ((req->len > 0 || !(rt->flags & ROUTE_EMPTY_OK)) && !is_json_type(ct))
            return answer_error(conn, req, API_UNSUPPORTED_MEDIA, NULL,
                                "Content-Type must be application/json (got %s)", ct ? ct : "none");
        api_status st;
        req->json = proto_parse_body(req->body ? req->body : "", req->len,
                                     (rt->flags & ROUTE_EMPTY_OK) != 0, &st);
        if (!req->json) {
            http_response resp = {0};
            http_reply_status(&resp, &st);
            return send_response(conn, req, &resp, NULL);
        }
    }
    if ((rt->flags & ROUTE_NEEDS_MODEL) && !atomic_load(&srv->ready))
        return answer_error(conn, req, API_NOT_READY, NULL, "the model is not loaded yet");

    http_response resp = {.status = 500};
    /* API keys (auth.h): 401/403/404/429 before the handler (a streaming
     * route was checked on its first callback). */
    const auth_key *key = (rt->flags & ROUTE_STREAM) ? auth_identify(req) : NULL;
    if (!(rt->flags & ROUTE_STREAM) && auth_check(srv, req, rt, &key, &resp) != 0)
        return send_response(conn, req, &resp, NULL);
    rt->handler(srv, req, &resp);
    auth_done(srv, key, rt, &resp);
    if (req->deferred)
        return MHD_YES;           /* answered later, from http_resume */
    if (!resp.json && !resp.text && resp.status != 204) {
        resp.status = 500;
        resp.json = proto_error_body(API_INTERNAL, "out of memory");
    }
    return send_response(conn, req, &resp, NULL);
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

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    if (strchr(srv->cfg.bind, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)srv->cfg.port);
        if (inet_pton(AF_INET6, srv->cfg.bind, &a->sin6_addr) != 1) {
            snprintf(err, errlen, "option 'bind': '%s' is not an IPv6 address", srv->cfg.bind);
            return -1;
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)srv->cfg.port);
        if (inet_pton(AF_INET, srv->cfg.bind, &a->sin_addr) != 1) {
            snprintf(err, errlen, "option 'bind': '%s' is not an IPv4 address", srv->cfg.bind);
            return -1;
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned threads = srv->cfg.threads > 0 ? (unsigned)srv->cfg.threads : (unsigned)(cores > 0 ? cores : 1);
    srv->mhd = MHD_start_daemon(flags, (uint16_t)srv->cfg.port, NULL, NULL, on_request, srv,
                                MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                                MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                MHD_OPTION_THREAD_POOL_SIZE, threads,
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                                MHD_OPTION_END);
    if (!srv->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%d (address in use or not available)",
                 srv->cfg.bind, srv->cfg.port);
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = info ? info->port : srv->cfg.port;
    return 0;
}

void http_stop(nc_server *srv)
{
    if (srv->mhd) {
        MHD_stop_daemon(srv->mhd);
        srv->mhd = NULL;
    }
}
