/* httpclient.h -- the one HTTP client of the programs (libcurl): replicas
 * pulling and handing over sessions (server/domain/migrate.c) and
 * `neurocache migrate` (tools/cmd_migrate.c) call a peer's API through it. */
#ifndef NC_PROTO_HTTPCLIENT_H
#define NC_PROTO_HTTPCLIENT_H

#include <stddef.h>

#include "buf.h"

typedef struct {
    const char *method;           /* "GET", "POST", "PUT", ... */
    const char *url;
    const void *body;             /* NULL = none (an empty body for non-GET) */
    size_t len;
    const char *content_type;     /* NULL = application/octet-stream */
    const char *bearer;           /* API key sent as "Authorization: Bearer KEY"; NULL or "" = none */
    long connect_timeout_ms;      /* 0 = 3000 */
    long timeout_ms;              /* whole request; 0 = 120000 */
    size_t max_bytes;             /* longest answer kept; 0 = 2 GiB */
} http_client_req;

/* Once per process, before threads (curl_global_init). 0 or -1. */
int http_client_init(void);
/* At exit, after every call (curl_global_cleanup). */
void http_client_cleanup(void);

/* Performs r; the answer's body is appended to out and its status stored in
 * *status. 0 when an answer came (whatever its status), -1 with "METHOD
 * URL: reason" in err on a transport failure, a timeout or an answer over
 * max_bytes. */
int http_client_call(const http_client_req *r, nc_buf *out, long *status, char *err, size_t errlen);

#endif
