/* api_generate.h -- POST /v1/sessions/{id}/generate: words drawn from a
 * session's state, answered whole or as server-sent events, the session
 * advancing by the words delivered. */
#ifndef NC_SERVER_API_GENERATE_H
#define NC_SERVER_API_GENERATE_H

#include "http.h"

void api_h_generate(nc_server *srv, http_request *req, http_response *resp);

#endif
