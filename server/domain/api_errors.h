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

/* A failure of durable storage (the log, a snapshot: NC_EIO, NC_ENOSPACE)
 * as api_error_from_core says; any other code is otherwise. */
api_error api_error_from_storage(int rc, api_error otherwise);

/* Why a namespace could not be opened (created): a bad name is the
 * client's; its log and snapshot can fail on the disk (503
 * storage_unavailable, 507 when full) or on what is on it (500). */
api_error api_error_from_namespace(int rc);

/* A session table failure (create, adopt). */
api_error api_error_from_sessions(sessions_rc rc);

#endif
