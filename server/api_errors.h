/* api_errors.h -- failures of the layers below the API as API errors: the
 * one place where a core NC_E* code or a session table code becomes an
 * api_error (proto.c's table then gives its HTTP status and wire code). */
#ifndef NC_SERVER_API_ERRORS_H
#define NC_SERVER_API_ERRORS_H

#include "proto.h"
#include "sessions.h"

/* A core NC_E* code: a bad value is the client's (400), storage failures
 * under the write-ahead log are 507 (disk full) or 503 storage_unavailable
 * (any other write or fsync error), anything else 500. */
api_error api_error_from_core(int rc);

/* A session table failure (create, adopt). */
api_error api_error_from_sessions(sessions_rc rc);

#endif
