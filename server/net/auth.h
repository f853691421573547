/* auth.h -- access control: optional API keys (Authorization: Bearer ...),
 * each allowed a set of operations (read, write, admin) on a set of
 * namespaces, with per-key limits (sessions, request rate, tokens per minute)
 * answered 429; and the start-up checks (no root unless allowed, key file
 * not readable by others).
 *
 * The key file has one key a line (blank lines and '#' comments ignored):
 *
 *   NAME  KEY  OPERATIONS  NAMESPACES  [sessions=N] [rate=R] [tokens_per_minute=T]
 *   alice nc_3f9a...e1 read,write docs,news sessions=10 rate=20 tokens_per_minute=200000
 *   ops   nc_77c0...9b read,write,admin *
 *
 * NAME: [A-Za-z0-9_.-], 1-63 bytes. KEY: 16-127 printable ASCII bytes
 * without white space. OPERATIONS: comma list of read, write, admin (or
 * "all"). NAMESPACES: "*" or a comma list of namespace names ("default" is
 * the namespace of sessions created without one). Limits: 0 or absent =
 * unlimited; rate in requests per second (burst = one second's worth).
 *
 * Operations of the routes: read = model info, sessions (create, inspect,
 * delete one's own), predict, score, completions, tokenize, state export,
 * feed without adapt (it only changes the session's own caches), a
 * namespace's info and document list; write = feed with "adapt": true (it
 * adds to the namespace's unbounded cache), streaming documents into a
 * namespace; admin = anything else (session state import -- the blob names
 * its namespace --, the namespace list, namespace deletion, snapshots,
 * hand-offs, and routes this table does not know: fail closed).
 * /health, /ready and the web page's static files (GET /, /web/...) need no
 * key. */
#ifndef NC_SERVER_AUTH_H
#define NC_SERVER_AUTH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "proto.h"
#include "server.h"

enum { AUTH_READ = 1, AUTH_WRITE = 2, AUTH_ADMIN = 4 };

typedef struct auth_key auth_key;
typedef struct auth_table auth_table;

/* Parses a key file's text (see above). Returns the table or NULL with a
 * message naming the line in err. Free with auth_table_free (NULL ok). */
auth_table *auth_parse(const char *text, size_t len, char *err, size_t errlen);
/* Reads and parses path; refuses a file that is not a regular file or that
 * its group or others may read or write (mode & 077). */
auth_table *auth_load_file(const char *path, char *err, size_t errlen);
void auth_table_free(auth_table *t);
int auth_table_count(const auth_table *t);

/* The key whose secret equals token[0..len), or NULL. Every key is compared
 * over its full padded length whatever matches, so the time taken does not
 * depend on where (or whether) the token differs from a key. */
const auth_key *auth_find(const auth_table *t, const char *token, size_t len);
const char *auth_key_name(const auth_key *k);
/* Whether k may do ops (AUTH_*) in namespace ns ("" = "default"). */
bool auth_key_allows(const auth_key *k, int ops, const char *ns);

/* Constant-time equality of two byte strings of at most 127 bytes (longer
 * ones compare unequal). */
bool auth_equal(const char *a, size_t alen, const char *b, size_t blen);

/* Operation class (AUTH_*) of a route by its endpoint label; 0 = open. */
int auth_route_ops(const char *endpoint);

/* Start-up, called by main after the configuration is read: refuses to run
 * as root without allow_root, loads cfg.api_keys (if set) as the active
 * table (srv->auth), warns when listening beyond loopback without keys.
 * Returns 0, or -1 with a message. */
int auth_startup(nc_server *srv, char *err, size_t errlen);
/* Frees the active table (at exit). */
void auth_shutdown(nc_server *srv);

/* What auth_check reads of a request (http.c fills it in). */
typedef struct {
    const char *method, *url;
    const char *endpoint;         /* the route's label (auth_route_ops) */
    const char *pattern;          /* the route's path pattern */
    const char *param;            /* the path's first {capture} ("" = none) */
    const json_t *json;           /* the parsed body, NULL = none (yet) */
    const char *authorization;    /* the Authorization header, NULL = absent */
} auth_request;

/* Why a request is refused: the API error, its message, and for a 401 the
 * WWW-Authenticate value (static; NULL otherwise). */
typedef struct {
    api_error code;
    char message[400];
    const char *challenge;
} auth_refusal;

/* Per request, before the handler (http.c): with no active table returns 0
 * at once. Otherwise checks the bearer key, the route's operation, the
 * namespace (of the URL, of the body's "namespace", or of the session the
 * URL names) and the key's limits; returns 0 with *key set, or -1 with why
 * filled: unauthorized (no or unknown key), forbidden (operation or
 * namespace not allowed), session_not_found (a session in a namespace the
 * key cannot see: as if it did not exist), rate_limited,
 * token_budget_exceeded or too_many_sessions (a limit). */
int auth_check(nc_server *srv, const auth_request *ar, const auth_key **key, auth_refusal *why);
/* The key of a request already checked, from its Authorization header
 * (a streaming route is checked by auth_check on its first callback,
 * before its body arrives; its last callback only needs the key for
 * auth_done). NULL without keys. */
const auth_key *auth_identify(nc_server *srv, const char *authorization);
/* After the handler: charges the tokens the answer (status, JSON body or
 * NULL; text_tokens for an answer written as text) reports to the key's
 * per-minute budget and records the sessions it
 * created. key NULL: no-op. */
void auth_done(nc_server *srv, const auth_key *key, const char *endpoint, unsigned status, const json_t *answer,
               long text_tokens);

#endif
