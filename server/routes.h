/* routes.h -- the HTTP API's route table: {method, path pattern, handler,
 * metrics label, flags} per endpoint, the handlers living in the api_*.c
 * file of their resource; the last row answers 404/405. */
#ifndef NC_SERVER_ROUTES_H
#define NC_SERVER_ROUTES_H

#include "http.h"

/* The static route table (n rows), for http_start. */
const http_route *routes_table(int *n);

#endif
