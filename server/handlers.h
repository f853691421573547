/* handlers.h -- the HTTP API: the route table and one handler per endpoint. */
#ifndef NC_SERVER_HANDLERS_H
#define NC_SERVER_HANDLERS_H

#include "http.h"
#include "sessions.h"

/* The static route table (n rows); misses answer 404/405 in http.c. */
const http_route *handlers_routes(int *n);

/* The API error for a session table failure (create, adopt). */
api_error sessions_rc_api(sessions_rc rc);

/* The API error for a core NC_E* code: storage failures under the
 * write-ahead log are 507 (disk full) or 503 storage_unavailable (any other
 * write or fsync error), not 500. */
api_error core_rc_api(int rc);

#endif
