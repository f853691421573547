/* migrate.h -- sessions that move between replicas: the versioned,
 * checksummed session state blob, pulling a session from the peers when a
 * request lands on a replica that does not hold it, and handing every
 * session to the peers on drain. The endpoints that export and import a
 * blob are the API's (api_sessions.h); the peers are called through the
 * one HTTP client (proto/httpclient.h).
 *
 * Blob layout (little-endian), version 1:
 *   "NCSESS\r\n"  magic (8 bytes; the \r\n catches text-mode mangling)
 *   u32 version   MIGRATE_BLOB_VERSION
 *   u64 model     fingerprint of the model (model_fingerprint, core/model/model.h)
 *   u32 V, H, L   the model's shape, for the error message
 *   u16 n + id    the session id it had (informational: PUT names the id)
 *   u16 n + ns    its namespace ("" = none)
 *   f64 created   wall-clock creation time
 *   u64 n + blob  the per-stream predictor (core/session/stream.h stream_export:
 *                 cache settings, LSTM state, windows, open-vocabulary words
 *                 by surface string)
 *   u32 crc32     zlib crc32 of everything before
 */
#ifndef NC_SERVER_MIGRATE_H
#define NC_SERVER_MIGRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "server.h"
#include "sessions.h"

#define MIGRATE_BLOB_VERSION 1u

/* The peers and this replica's model fingerprint (srv->migration). */
typedef struct migration migration;

/* Parses cfg.peers ("tag=url,tag=url", an entry with this replica's tag is
 * skipped; a bare url is accepted), computes the model fingerprint and
 * initialises libcurl; sets srv->migration. Call once, after the model is
 * loaded, before any request can reach the session endpoints. 0 or -1 with
 * a message. */
int migrate_init(nc_server *srv, char *err, size_t errlen);
/* Frees srv->migration (NULL ok). */
void migrate_shutdown(nc_server *srv);

/* Serialises a session whose lock the caller holds. *blob malloc'ed
 * (free()). 0 or an NC_* rc with err. */
int migrate_encode(const nc_model *m, uint64_t fingerprint, const nc_session *s, void **blob,
                   size_t *len, char *err, size_t errlen);

/* A session state decoded: the stream and its namespace binding (both for
 * sessions_adopt, which takes them over), the namespace's name; err the
 * message of a failure. */
typedef struct {
    nc_stream *stream;
    void *ns_ref;
    char ns[SESSION_ID_MAX];
    char err[NC_ERRLEN];
} migrate_state;

/* migrate_encode for this replica's model (its fingerprint). */
int migrate_export(nc_server *srv, const nc_session *s, void **blob, size_t *len, char *err, size_t errlen);

/* Validates and decodes blob[0..len) for this replica's model: magic,
 * version, checksum, fingerprint, then the stream, bound to its namespace
 * through srv->sessions' binder. Returns API_OK with st->stream,
 * st->ns_ref and st->ns, or the API error (state_corrupt, state_version,
 * state_model_mismatch, or out_of_range when the namespace cannot be
 * bound) with st->err. */
api_error migrate_import(nc_server *srv, const void *blob, size_t len, migrate_state *st);

/* migrate_import's checks of the envelope only (magic, version, checksum,
 * fingerprint) and its namespace into st->ns: nothing imported or bound. */
api_error migrate_peek(nc_server *srv, const void *blob, size_t len, migrate_state *st);

/* Whether id is one POST /v1/sessions accepts ([A-Za-z0-9_.-], non-empty),
 * which is also safe to put in a peer URL. */
bool migrate_id_url_safe(const char *id);

/* The session named id, held (release with sessions_release). On a miss,
 * asks the peers to hand it over first; if nobody holds it, returns NULL
 * with *why = session_not_here (the id names another replica),
 * session_moved (this replica is draining and the session was handed over:
 * the balancer retries elsewhere) or session_not_found, and a message. */
nc_session *migrate_acquire(nc_server *srv, const char *id, api_error *why, char *msg, size_t msglen);

/* Drain: hands every session to the peers (PUT /state, round-robin, next
 * peer on failure), removing each one handed. Returns the number handed;
 * *failed gets the number kept (no peer took them). */
int migrate_drain(nc_server *srv, int *failed);

#endif
