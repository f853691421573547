/* api_rescore.h -- N-best rescoring: POST /v1/sessions/{id}/rescore scores
 * hypotheses as continuations of a session's state without changing it;
 * POST /v1/rescore does the same after a context, statelessly. */
#ifndef NC_SERVER_API_RESCORE_H
#define NC_SERVER_API_RESCORE_H

#include "http.h"

/* Hypotheses per request at most (the token budget bounds the work). */
#define RESCORE_MAX_HYPOTHESES 4096

void api_h_rescore_session(nc_server *srv, http_request *req, http_response *resp);
void api_h_rescore(nc_server *srv, http_request *req, http_response *resp);

#endif
