/* replication.h -- namespaces shared by replicas through Redis Streams
 * (hiredis). Every pair a replica adds to a namespace's unbounded cache (a
 * document streamed in, a session feeding with adapt) is appended to the
 * Redis Stream <prefix>ns:<namespace> as one entry per logged add:
 *   o  origin replica tag          d  document id at the origin
 *   b  the origin store's birth    s  the add's record in the origin's log
 *   f  offset of the first token   n  number of pairs
 *   m  model fingerprint (model_fingerprint: configuration,
 *      vocabulary and weights; entries of another model are refused)
 *   w  the n words, '\n'-separated surface strings (open vocabulary too)
 *   k  the n keys, float16 little-endian [n, H] -- exactly what the origin's
 *      index stores (keys are rounded to float16 there), so every replica
 *      holds bit-identical keys and answers the same distribution
 * and every replica applies the entries the others appended (into its own
 * durable namespace store, logged and fsync'ed like a local add, under the
 * document "repl:<origin>:<stream id>:<n>:<b>.<s>:<doc>", one per entry).
 * Those documents are the replica's position: logged with the pairs, they
 * tell a restarted replica, even one killed mid-batch, exactly which entries
 * it holds -- it resumes after the last stream id, and skips an entry whose
 * (origin, b, s) it already holds (republished after a crash of the origin).
 *
 * Publishing follows the namespace's write-ahead log (nsstore_log_open), not
 * a queue in memory: an add is published once durable, by a publisher thread
 * (Redis never sits on the request path), and the position reached is kept
 * in the namespace's "replication-state" file (birth, published seq; written
 * atomically after the XADDs succeed). A crash, a restart or a Redis outage
 * of any length loses nothing: the next start publishes everything after the
 * marker, and log segments are kept by snapshots until published
 * (nsstore_retain_log). Adds applied from others (documents "repl:...") are
 * passed over. Ids starting with "repl:" are refused for uploads.
 *
 * A store's birth (ms, set when it is created) names its incarnation: a
 * deletion is a tombstone (name, time) kept in the hash <prefix>tombstones
 * (and announced on <prefix>ctl); a replica drops its copy of a namespace
 * born before the tombstone -- at once, or when it comes back after being
 * down -- and skips entries of older incarnations. A deletion made while
 * Redis is unreachable waits in data_dir/replication-deletes.
 *
 * Consistency is eventual: an add is visible locally as soon as it is
 * acknowledged, on the other replicas after the replication lag (measured:
 * /v1/replication, /metrics). Redis is optional: with option `redis` empty
 * nothing here runs. */
#ifndef NC_SERVER_REPLICATION_H
#define NC_SERVER_REPLICATION_H

#include <jansson.h>

#include "nsstore.h"
#include "server.h"

/* Starts the publisher and applier threads when cfg.redis is set (a
 * replica_tag is then required), sets srv->replication and makes the
 * namespace registry attach every store it opens (nc_server.namespace_opened).
 * 0, or -1 with a message. */
int replication_start(nc_server *srv, char *err, size_t errlen);
/* Publishes what the logs hold (up to a few seconds while Redis answers),
 * stops the threads; what is left is published at the next start. */
void replication_stop(nc_server *srv);
/* Frees srv->replication, once the namespaces are closed (their logs'
 * observers point into it). */
void replication_shutdown(nc_server *srv);

/* Called by the namespace registry for every store it opens or creates,
 * before any add (ctx: srv->replication): reads (or creates) its marker;
 * its log is published from the marker on. Returns the store's birth (its
 * incarnation, namespaces.h), 0 when replication is off or the namespace is
 * not replicated. */
uint64_t replication_attach(void *ctx, const char *ns_name, nc_nsstore *store);

/* nc_server.namespace_deleted (ctx: srv->replication), called by the
 * registry under its lock when a namespace is deleted here (so the
 * tombstone precedes any incarnation created after the deletion): the
 * tombstone is recorded on disk, then
 * published; the other replicas delete it too (those down now when they
 * come back), its stream is removed from Redis, and entries of the deleted
 * incarnation are not applied anywhere (a namespace created later under the
 * name starts empty). Returns the tombstone's time (ms; every incarnation
 * born at or before it, on any replica, is deleted), 0 when replication is
 * off. */
uint64_t replication_namespace_deleted(void *ctx, const char *ns_name);

/* Prometheus lines appended to text (realloc'ed; returns the new pointer). */
char *replication_metrics(nc_server *srv, char *text);

/* What GET /v1/replication answers: enabled, counters, lag, per-namespace
 * positions. A new reference. */
json_t *replication_status(nc_server *srv);

#endif
