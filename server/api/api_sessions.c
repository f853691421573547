/* api_sessions.c -- the session endpoints (api_sessions.h): create, list,
 * inspect, delete, and the state blob's export, import and hand-off
 * (migrate.h holds the blob and the peers). */
#include "api_sessions.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_errors.h"
#include "apiutil.h"
#include "auth.h"
#include "migrate.h"
#include "namespaces.h"
#include "slog.h"

static json_t *session_json(nc_session *s, bool locked_stream)
{
    json_t *o = json_pack("{s:s,s:s?}", "id", s->id, "namespace", s->ns[0] ? s->ns : NULL);
    if (!o)
        return NULL;
    json_object_set_new(o, "cache", proto_encode_cache(&s->params));
    if (s->ns_ref) {
        /* the incarnation it is bound to, and whether that was deleted */
        json_object_set_new(o, "namespace_incarnation", json_integer((json_int_t)namespaces_incarnation(s->ns_ref)));
        json_object_set_new(o, "namespace_deleted", json_boolean(namespaces_session_deleted(s)));
    }
    if (locked_stream) {
        json_object_set_new(o, "tokens", json_integer((json_int_t)stream_position(s->stream)));
        json_object_set_new(o, "memory_bytes", json_integer((json_int_t)stream_memory(s->stream)));
    }
    json_object_set_new(o, "reserved_bytes", json_integer((json_int_t)s->reserved));
    json_object_set_new(o, "created", json_real(s->created));
    return o;
}

void api_h_sessions_create(nc_server *srv, http_request *req, http_response *resp)
{
    proto_session_req r;
    api_status st;
    if (proto_decode_session(req->json, &srv->cache_defaults, &r, &st)) {
        http_reply_status(resp, &st);
        return;
    }
    if (api_dyneval_check(srv, &r.cache, resp))
        return;
    nc_session *s;
    char err[NC_ERRLEN] = "";
    if (r.cache.exact && r.cache.unbounded && namespaces_compact(srv, r.ns && r.ns[0] ? r.ns : "default")) {
        http_reply_error(resp, API_OUT_OF_RANGE, "field 'exact': namespace '%s' has compact storage, which keeps "
                         "no keys to search exactly (docs/namespaces.md#compact-storage)",
                         r.ns && r.ns[0] ? r.ns : "default");
        return;
    }
    nc_session_spec sp = {.id = r.id, .ns = r.ns, .p = &r.cache};
    sessions_rc rc = sessions_create(srv->sessions, &sp, &s, err, sizeof err);
    if (rc != SESS_OK) {
        http_reply_error(resp, api_error_from_sessions(rc), "%s", err);
        return;
    }
    pthread_mutex_lock(&s->lock);
    http_reply_json(resp, 201, session_json(s, true));
    pthread_mutex_unlock(&s->lock);
    sessions_release(srv->sessions, s);
}

void api_h_sessions_get(nc_server *srv, http_request *req, http_response *resp)
{
    nc_session *s = api_session_acquire(srv, req, resp);
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    json_t *o = session_json(s, true);
    pthread_mutex_unlock(&s->lock);
    if (o)
        json_object_set_new(o, "idle_ttl", json_integer(srv->cfg.session_ttl_s));
    http_reply_json(resp, 200, o);
    sessions_release(srv->sessions, s);
}

void api_h_sessions_list(nc_server *srv, http_request *req, http_response *resp)
{
    (void)req;
    long n = 0;
    size_t bytes = 0;
    sessions_stats(srv->sessions, &n, &bytes);
    http_reply_json(resp, 200, json_pack("{s:i,s:I,s:i,s:I}", "count", (int)n, "reserved_bytes",
                                         (json_int_t)bytes, "max_sessions", srv->cfg.max_sessions,
                                         "memory_budget_bytes",
                                         (json_int_t)srv->cfg.session_memory_mb << 20));
}

void api_h_sessions_delete(nc_server *srv, http_request *req, http_response *resp)
{
    if (sessions_delete(srv->sessions, req->params[0]) != SESS_OK) {
        http_reply_error(resp, API_SESSION_NOT_FOUND, "no session '%s'", req->params[0]);
        return;
    }
    resp->status = 204;
}

/* ---- the state blob ------------------------------------------------------- */

static void reply_blob(http_response *resp, unsigned status, void *blob, size_t len)
{
    resp->status = status;
    resp->text = blob;
    resp->text_len = len;
    resp->content_type = "application/octet-stream";
}

void api_h_sessions_state_get(nc_server *srv, http_request *req, http_response *resp)
{
    nc_session *s = api_session_acquire(srv, req, resp);
    if (!s)
        return;
    void *blob = NULL;
    size_t len = 0;
    char err[NC_ERRLEN] = "";
    int rc = -1;
    if (api_session_lock(srv, s, resp) == 0) {
        rc = migrate_export(srv, s, &blob, &len, err, sizeof err);
        pthread_mutex_unlock(&s->lock);
        if (rc != NC_OK)
            http_reply_error(resp, API_INTERNAL, "export: %s", err);
    }
    sessions_release(srv->sessions, s);
    if (rc == NC_OK)
        reply_blob(resp, 200, blob, len);
}

void api_h_sessions_handoff(nc_server *srv, http_request *req, http_response *resp)
{
    /* No pull here: a peer asking us must not make us ask the others. */
    nc_session *s = sessions_acquire(srv->sessions, req->params[0]);
    if (!s) {
        http_reply_error(resp, API_SESSION_NOT_FOUND, "no session '%s' here", req->params[0]);
        return;
    }
    void *blob = NULL;
    size_t len = 0;
    char err[NC_ERRLEN] = "";
    int rc = -1;
    if (api_session_lock(srv, s, resp) == 0) {
        rc = migrate_export(srv, s, &blob, &len, err, sizeof err);
        if (rc == NC_OK)
            sessions_hand_over(srv->sessions, s->id);
        else
            http_reply_error(resp, API_INTERNAL, "export: %s", err);
        pthread_mutex_unlock(&s->lock);
    }
    if (rc == NC_OK)
        slog(SLOG_INFO, "session handed over", json_pack("{s:s,s:I}", "session", s->id, "bytes", (json_int_t)len));
    sessions_release(srv->sessions, s);
    if (rc == NC_OK)
        reply_blob(resp, 200, blob, len);
}

void api_h_sessions_state_put(nc_server *srv, http_request *req, http_response *resp)
{
    const char *id = req->params[0];
    if (atomic_load(&srv->draining)) {
        http_reply_error(resp, API_NOT_READY, "draining: the server is shutting down");
        return;
    }
    if (!migrate_id_url_safe(id) || strlen(id) >= SESSION_ID_MAX) {
        http_reply_error(resp, API_OUT_OF_RANGE, "session id must be 1-%d characters of [A-Za-z0-9_.-]",
                         SESSION_ID_MAX - 1);
        return;
    }
    migrate_state ms = {0};
    char *ns = ms.ns, *err = ms.err;
    const size_t errlen = sizeof ms.err;
    /* The namespace is inside the blob, where the key check before the
     * handler cannot see it: a key may only import into namespaces it may
     * write. Checked before the namespace is bound (or created). */
    const auth_key *key = auth_identify(srv, MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND,
                                                                          MHD_HTTP_HEADER_AUTHORIZATION));
    if (key) {
        api_error e0 = migrate_peek(srv, req->body ? req->body : "", req->len, &ms);
        if (e0 != API_OK) {
            http_reply_error(resp, e0, "%s", err);
            return;
        }
        if (!auth_key_allows(key, AUTH_WRITE, ns)) {
            char msg[256];
            snprintf(msg, sizeof msg, "the session state belongs to namespace '%s', which this key may not write",
                     ns[0] ? ns : "default");
            http_reply_json(resp, 403, json_pack("{s:{s:s,s:s}}", "error", "code", "forbidden", "message", msg));
            return;
        }
    }
    api_error e = migrate_import(srv, req->body ? req->body : "", req->len, &ms);
    if (e != API_OK) {
        http_reply_error(resp, e, "%s", err);
        return;
    }
    /* PUT replaces: a session of that id (an older copy) goes first; a
     * request waiting for the old copy is told to retry (it finds this one). */
    sessions_hand_over(srv->sessions, id);
    nc_session *s = NULL;
    nc_session_spec sp = {.id = id, .ns = ns, .p = stream_params(ms.stream), .stream = ms.stream, .ns_ref = ms.ns_ref};
    sessions_rc rc = sessions_adopt(srv->sessions, &sp, &s, err, errlen);
    if (rc != SESS_OK) {
        http_reply_error(resp, api_error_from_sessions(rc), "%s", err);
        return;
    }
    pthread_mutex_lock(&s->lock);
    json_t *o = json_pack("{s:s,s:s?,s:I,s:b}", "id", s->id, "namespace", s->ns[0] ? s->ns : NULL,
                          "tokens", (json_int_t)stream_position(s->stream), "imported", 1);
    if (o)
        json_object_set_new(o, "cache", proto_encode_cache(&s->params));
    pthread_mutex_unlock(&s->lock);
    sessions_release(srv->sessions, s);
    http_reply_json(resp, 201, o);
}
