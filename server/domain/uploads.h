/* uploads.h -- the upload pipeline of POST /v1/namespaces/{ns}/documents:
 * a body of plain text (one document) or NDJSON (lines {"id", "text"}) is
 * processed as it arrives -- tokenised, run through the LSTM from a new
 * document's start state (design §3) and every pair (h before token j,
 * token j) added to the namespace's store with its provenance -- and made
 * durable before the answer. The endpoint is the API's (api_namespaces.h). */
#ifndef NC_SERVER_UPLOADS_H
#define NC_SERVER_UPLOADS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "namespaces.h"
#include "proto.h"

typedef struct upload upload;
typedef struct upload_registry upload_registry;   /* srv->uploads */

/* Creates srv->uploads (the list of uploads in progress). 0 or -1 with a
 * message. */
int uploads_init(nc_server *srv, char *err, size_t errlen);
/* Frees it, once no upload runs (after the HTTP daemon stopped). */
void uploads_shutdown(nc_server *srv);

/* An upload into namespace ns (created when absent): content_type decides
 * plain text or NDJSON (NULL = plain), plain_id names a plain-text
 * document (NULL = a generated id), normalize (?normalize=, NULL = "true")
 * whether the text is normalised to the model's text conventions. NULL
 * when out of memory; a refused
 * upload (bad Content-Type, bad namespace) is returned too and reports its
 * failure at upload_finish, its body read and dropped. Free with
 * upload_free (NULL ok), which waits for the batches queued. */
upload *upload_open(nc_server *srv, const char *ns, const char *content_type, const char *plain_id,
                    const char *normalize);
void upload_free(void *u);

/* The next piece of the body, processed as far as it holds complete
 * words or lines; after a failure, pieces are dropped. */
void upload_chunk(upload *u, const char *data, size_t len);

/* The end of the body: the rest processed, every batch added, then synced.
 * 0 with res filled (ns and ids borrowed from u), or -1 with res->code and
 * res->msg (documents and tokens_added: what was added before the failure,
 * durable too). */
typedef struct {
    api_error code;
    char msg[700];
    uint64_t documents, tokens_added;
    const char *ns;               /* the namespace's name */
    json_t *ids;                  /* the documents' ids (the first 1000) */
    int64_t entries;              /* pairs in the namespace now */
    uint64_t incarnation;         /* the namespace incarnation it went into (namespaces.h) */
} upload_result;
int upload_finish(upload *u, upload_result *res);

/* An upload in progress, as GET /v1/namespaces/{ns} shows it. */
typedef struct {
    char document[160];           /* the document being read */
    uint64_t bytes, documents, tokens_added;
    double seconds;               /* since the upload started */
} upload_status;

/* The uploads in progress into namespace ns: *out malloc'ed (free()), their
 * count returned (0 with *out NULL when none, or out of memory). */
size_t uploads_in_progress(nc_server *srv, const ns_handle *ns, upload_status **out);

#endif
