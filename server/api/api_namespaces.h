/* api_namespaces.h -- the namespace endpoints:
 *   GET    /v1/namespaces                   list
 *   GET    /v1/namespaces/{ns}              entries, words, index, bytes, uploads in progress
 *   DELETE /v1/namespaces/{ns}?confirm={ns} removal (with confirmation; the
 *                                           other replicas delete it too)
 *   GET    /v1/namespaces/{ns}/documents    documents and their pair counts
 *   POST   /v1/namespaces/{ns}/documents    streaming upload (plain text or
 *                                           NDJSON), processed as it arrives
 *   POST   /v1/admin/backup                 a backup of every namespace (or
 *                                           one) into data_dir/backups/<name>
 *                                           while they serve (backup.h) */
#ifndef NC_SERVER_API_NAMESPACES_H
#define NC_SERVER_API_NAMESPACES_H

#include "http.h"

void api_h_ns_list(nc_server *srv, http_request *req, http_response *resp);
void api_h_ns_create(nc_server *srv, http_request *req, http_response *resp);
void api_h_ns_get(nc_server *srv, http_request *req, http_response *resp);
void api_h_ns_delete(nc_server *srv, http_request *req, http_response *resp);
void api_h_backup(nc_server *srv, http_request *req, http_response *resp);
void api_h_ns_docs_list(nc_server *srv, http_request *req, http_response *resp);
/* Streaming upload (route flag ROUTE_STREAM): called with resp == NULL for
 * each piece of the body as it arrives (req->chunk), then with resp to
 * answer once the pairs are durable. */
void api_h_ns_documents(nc_server *srv, http_request *req, http_response *resp);

#endif
