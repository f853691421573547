/* replication.h -- namespaces shared by replicas through Redis Streams
 * (hiredis). Every pair a replica adds to a namespace's unbounded cache (a
 * document streamed in, a session feeding with adapt) is appended to the
 * Redis Stream <prefix>ns:<namespace> as one entry per add:
 *   o  origin replica tag          d  document id at the origin
 *   f  offset of the first token   n  number of pairs
 *   m  model fingerprint (migrate_model_fingerprint: configuration,
 *      vocabulary and weights; entries of another model are refused)
 *   w  the n words, '\n'-separated surface strings (open vocabulary too)
 *   k  the n keys, float16 little-endian [n, H] -- exactly what the origin's
 *      index stores (keys are rounded to float16 there), so every replica
 *      holds bit-identical keys and answers the same distribution
 * and every replica applies the entries the others appended (into its own
 * durable namespace store, logged and fsync'ed like a local add, under the
 * document "repl:<origin>:<stream id>:<n>:<doc>", one per entry). Those
 * documents are the replica's position: logged with the pairs, they tell a
 * restarted replica, even one killed mid-batch, exactly which entries it
 * holds, and it resumes after the last. Consistency is eventual: an add is visible
 * locally as soon as it is acknowledged, on the other replicas after the
 * replication lag (measured: /v1/replication, /metrics).
 *
 * Publishing is asynchronous (a bounded queue drained by one thread, so
 * Redis never sits on the request path); an add made while Redis is
 * unreachable waits in the queue and is retried. Redis is optional: with
 * option `redis` empty nothing here runs. */
#ifndef NC_SERVER_REPLICATION_H
#define NC_SERVER_REPLICATION_H

#include "http.h"
#include "nsstore.h"
#include "server.h"

/* Starts the publisher and applier threads when cfg.redis is set (a
 * replica_tag is then required). 0, or -1 with a message. */
int replication_start(nc_server *srv, char *err, size_t errlen);
/* Publishes what is queued (up to a few seconds), stops the threads. */
void replication_stop(void);

/* Called by the namespace registry for every store it opens or creates:
 * local adds to it are published from now on. No-op when replication is
 * off. */
void replication_attach(const char *ns_name, nc_nsstore *store);

/* A namespace was deleted here: the other replicas delete it too, its
 * stream is removed from Redis, and entries appended before the deletion are
 * not applied (a namespace created later under the name starts empty). */
void replication_namespace_deleted(const char *ns_name);

/* Prometheus lines appended to text (realloc'ed; returns the new pointer). */
char *replication_metrics(char *text);

/* GET /v1/replication: enabled, counters, lag, per-namespace positions. */
void h_replication(nc_server *srv, http_request *req, http_response *resp);

#endif
