/* handlers.h -- the HTTP API: the route table and one handler per endpoint. */
#ifndef NC_SERVER_HANDLERS_H
#define NC_SERVER_HANDLERS_H

#include "http.h"
#include "sessions.h"

/* The static route table (n rows); misses answer 404/405 in http.c. */
const http_route *handlers_routes(int *n);

#endif
