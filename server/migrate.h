/* migrate.h -- sessions that move between replicas: the versioned,
 * checksummed session state blob, the endpoints that export and import it,
 * pulling a session from the peers when a request lands on a replica that
 * does not hold it, and handing every session to the peers on drain.
 *
 * Blob layout (little-endian), version 1:
 *   "NCSESS\r\n"  magic (8 bytes; the \r\n catches text-mode mangling)
 *   u32 version   MIGRATE_BLOB_VERSION
 *   u64 model     fingerprint of the model (model_fingerprint, core/model.h)
 *   u32 V, H, L   the model's shape, for the error message
 *   u16 n + id    the session id it had (informational: PUT names the id)
 *   u16 n + ns    its namespace ("" = none)
 *   f64 created   wall-clock creation time
 *   u64 n + blob  the per-stream predictor (core/stream.h stream_export:
 *                 cache settings, LSTM state, windows, open-vocabulary words
 *                 by surface string)
 *   u32 crc32     zlib crc32 of everything before
 */
#ifndef NC_SERVER_MIGRATE_H
#define NC_SERVER_MIGRATE_H

#include <stddef.h>
#include <stdint.h>

#include "http.h"
#include "server.h"

#define MIGRATE_BLOB_VERSION 1u

/* Parses cfg.peers ("tag=url,tag=url", an entry with this replica's tag is
 * skipped; a bare url is accepted), computes the model fingerprint and
 * initialises libcurl. Call once, after the model is loaded, before any
 * request can reach the session endpoints. 0 or -1 with a message. */
int migrate_init(nc_server *srv, char *err, size_t errlen);
void migrate_shutdown(void);

/* Serialises a session whose lock the caller holds. *blob malloc'ed
 * (free()). 0 or an NC_* rc with err. */
int migrate_encode(const nc_model *m, uint64_t fingerprint, const nc_session *s, void **blob,
                   size_t *len, char *err, size_t errlen);

/* Validates and decodes a blob for model m: magic, version, checksum,
 * fingerprint, then the stream, bound to its namespace through t's binder
 * (t NULL: no namespace binding). Returns API_OK with *out and *ns_ref (both
 * for sessions_adopt, which takes them over) and the namespace in ns, or the
 * API error (state_corrupt, state_version, state_model_mismatch, or
 * out_of_range when the namespace cannot be bound) with a message in err.
 * out NULL: the envelope only (magic, version, checksum, fingerprint) and
 * the namespace, nothing imported or bound. */
api_error migrate_decode(const nc_model *m, uint64_t fingerprint, sessions *t, const void *blob,
                         size_t len, nc_stream **out, void **ns_ref, char *ns, size_t nslen,
                         char *err, size_t errlen);

/* The session a request names (req->params[0]), held (release with
 * sessions_release). On a miss, asks the peers to hand it over first; if
 * nobody holds it, answers 404 session_not_here (the id names another
 * replica), 503 session_moved (this replica is draining and the session was
 * handed over: the balancer retries elsewhere) or 404 session_not_found, and
 * returns NULL. */
nc_session *migrate_acquire(nc_server *srv, http_request *req, http_response *resp);

/* Locks s->lock for a request; if the session was handed over or deleted
 * while the request waited, unlocks, answers 503 session_moved / 404 and
 * returns -1 (the caller still releases s). */
int migrate_lock(nc_server *srv, nc_session *s, http_response *resp);

/* GET /v1/sessions/{id}/state: the blob (application/octet-stream). */
void migrate_h_state_get(nc_server *srv, http_request *req, http_response *resp);
/* PUT /v1/sessions/{id}/state: recreates the session under {id} from a blob
 * (replacing a session of that id). 201 with the session. */
void migrate_h_state_put(nc_server *srv, http_request *req, http_response *resp);
/* POST /v1/sessions/{id}/handoff: export and remove in one step under the
 * session's lock, so no token fed here is lost (live migration, peers
 * pulling a session). 200 with the blob; 404 when absent. */
void migrate_h_handoff(nc_server *srv, http_request *req, http_response *resp);

/* Drain: hands every session to the peers (PUT /state, round-robin, next
 * peer on failure), removing each one handed. Returns the number handed;
 * *failed gets the number kept (no peer took them). */
int migrate_drain(nc_server *srv, int *failed);


#endif
