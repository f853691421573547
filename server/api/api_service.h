/* api_service.h -- the daemon's own endpoints:
 *   GET /health           the process answers
 *   GET /ready            200 once the model is loaded and the namespaces recovered, 503 while draining
 *   GET /metrics          Prometheus text
 *   GET /v1/model         the model, cache defaults and knobs, limits, compute
 *   GET /v1/models        OpenAI's model list (one model)
 *   GET /v1/replication   replication's status (replication.h) */
#ifndef NC_SERVER_API_SERVICE_H
#define NC_SERVER_API_SERVICE_H

#include "http.h"

void api_h_health(nc_server *srv, http_request *req, http_response *resp);
void api_h_ready(nc_server *srv, http_request *req, http_response *resp);
void api_h_metrics(nc_server *srv, http_request *req, http_response *resp);
void api_h_model(nc_server *srv, http_request *req, http_response *resp);
void api_h_models(nc_server *srv, http_request *req, http_response *resp);
void api_h_replication(nc_server *srv, http_request *req, http_response *resp);

#endif
