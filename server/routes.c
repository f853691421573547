/* routes.c -- the HTTP API's one route table (routes.h): every endpoint,
 * its handler (the api_*.c files, one per resource), its metrics label and
 * what it needs; the last row answers what no other row takes. */
#include "routes.h"

#include "api_completions.h"
#include "api_generate.h"
#include "api_namespaces.h"
#include "api_predict.h"
#include "api_rescore.h"
#include "api_service.h"
#include "api_sessions.h"
#include "web.h"

/* The last row: 405 with the methods the path allows, else 404. */
static void h_unmatched(nc_server *srv, http_request *req, http_response *resp)
{
    (void)srv;
    if (req->allow[0])
        http_reply_error(resp, API_METHOD_NOT_ALLOWED, "method %s is not allowed on %s (allowed: %s)",
                         req->method, req->url, req->allow);
    else
        http_reply_error(resp, API_NOT_FOUND, "no route for %s %s", req->method, req->url);
}


#define J ROUTE_JSON
#define M ROUTE_NEEDS_MODEL
#define H ROUTE_HEAVY
static const http_route route_table[] = {
    {"GET", "/health", api_h_health, "health", 0, NULL},
    {"GET", "/ready", api_h_ready, "ready", 0, NULL},
    {"GET", "/metrics", api_h_metrics, "metrics", 0, NULL},
    /* the page (web.h): static files only, no key needed, nothing served but them */
    {"GET", "/", web_h_page, "web_page", 0, NULL},
    {"GET", "/web/{file}", web_h_page, "web_asset", 0, NULL},
    {"GET", "/favicon.ico", web_h_page, "web_favicon", 0, NULL},
    {"GET", "/v1/model", api_h_model, "model", M, NULL},
    {"GET", "/v1/models", api_h_models, "models", M, NULL},
    {"POST", "/v1/sessions", api_h_sessions_create, "sessions_create", J | ROUTE_EMPTY_OK | M, NULL},
    {"GET", "/v1/sessions", api_h_sessions_list, "sessions_list", M, NULL},
    {"GET", "/v1/sessions/{id}", api_h_sessions_get, "sessions_get", M, NULL},
    {"DELETE", "/v1/sessions/{id}", api_h_sessions_delete, "sessions_delete", M, NULL},
    {"POST", "/v1/sessions/{id}/feed", api_h_feed, "feed", J | M | H, api_feed_is_light},
    {"GET", "/v1/replication", api_h_replication, "replication", 0, NULL},
    {"GET", "/v1/sessions/{id}/state", api_h_sessions_state_get, "sessions_state_get", M, NULL},
    {"PUT", "/v1/sessions/{id}/state", api_h_sessions_state_put, "sessions_state_put", M, NULL},
    {"POST", "/v1/sessions/{id}/handoff", api_h_sessions_handoff, "sessions_handoff", M, NULL},
    {"POST", "/v1/sessions/{id}/predict", api_h_predict, "predict", J | ROUTE_EMPTY_OK | M, NULL},
    {"POST", "/v1/score", api_h_score, "score", J | M | H, NULL},
    {"POST", "/v1/sessions/{id}/generate", api_h_generate, "generate", J | M | H, NULL},
    {"POST", "/v1/sessions/{id}/rescore", api_h_rescore_session, "rescore_session", J | M | H, NULL},
    {"POST", "/v1/rescore", api_h_rescore, "rescore", J | M | H, NULL},
    {"POST", "/v1/chat/completions", api_h_chat_completions, "chat_completions", 0, NULL},
    {"POST", "/v1/completions", api_h_completions, "completions", J | M | H, NULL},
    {"POST", "/tokenize", api_h_tokenize, "tokenize", J | M, NULL},
    {"POST", "/detokenize", api_h_detokenize, "detokenize", J | M, NULL},
    {"GET", "/tokenizer_info", api_h_tokenizer_info, "tokenizer_info", M, NULL},
    {"GET", "/v1/namespaces", api_h_ns_list, "namespaces_list", M, NULL},
    {"GET", "/v1/namespaces/{ns}", api_h_ns_get, "namespaces_get", M, NULL},
    {"PUT", "/v1/namespaces/{ns}", api_h_ns_create, "namespaces_create", J | ROUTE_EMPTY_OK | M, NULL},
    {"DELETE", "/v1/namespaces/{ns}", api_h_ns_delete, "namespaces_delete", M, NULL},
    {"GET", "/v1/namespaces/{ns}/documents", api_h_ns_docs_list, "documents_list", M, NULL},
    {"POST", "/v1/namespaces/{ns}/documents", api_h_ns_documents, "documents", ROUTE_STREAM | M | H, NULL},
    {"POST", "/v1/admin/backup", api_h_backup, "backup", J | ROUTE_EMPTY_OK | M, NULL},
    /* last: everything else is 404 or 405 */
    {NULL, NULL, h_unmatched, "unmatched", 0, NULL},
};
#undef J
#undef M
#undef H

const http_route *routes_table(int *n)
{
    *n = (int)(sizeof route_table / sizeof route_table[0]);
    return route_table;
}
