/* api_sessions.h -- the session endpoints:
 *   POST   /v1/sessions                  create (201 with the session)
 *   GET    /v1/sessions                  count and memory
 *   GET    /v1/sessions/{id}             one session (pulled from the peers if elsewhere)
 *   DELETE /v1/sessions/{id}             removal
 *   GET    /v1/sessions/{id}/state       the state blob (application/octet-stream, migrate.h)
 *   PUT    /v1/sessions/{id}/state       recreates the session under {id} from a blob
 *                                        (replacing a session of that id); 201
 *   POST   /v1/sessions/{id}/handoff     export and remove in one step under the
 *                                        session's lock, so no token fed here is lost
 *                                        (live migration, peers pulling a session) */
#ifndef NC_SERVER_API_SESSIONS_H
#define NC_SERVER_API_SESSIONS_H

#include "http.h"

void api_h_sessions_create(nc_server *srv, http_request *req, http_response *resp);
void api_h_sessions_list(nc_server *srv, http_request *req, http_response *resp);
void api_h_sessions_get(nc_server *srv, http_request *req, http_response *resp);
void api_h_sessions_delete(nc_server *srv, http_request *req, http_response *resp);
void api_h_sessions_state_get(nc_server *srv, http_request *req, http_response *resp);
void api_h_sessions_state_put(nc_server *srv, http_request *req, http_response *resp);
void api_h_sessions_handoff(nc_server *srv, http_request *req, http_response *resp);

#endif
