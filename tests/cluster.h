/* cluster.h -- test helper for the multi-replica suites (test_replicas,
 * test_replica_faults): the shipped HAProxy configuration with a test's loopback
 * ports, and requests through the balancer. */
#ifndef NC_TEST_CLUSTER_H
#define NC_TEST_CLUSTER_H

#include <sys/types.h>

#include "daemon.h"

#define CLUSTER_NREP 3

/* deploy/haproxy/haproxy.cfg (read from the working directory) written to
 * out with the frontend on lb_port, servers a, b, c on rep_port[0..2], the
 * statistics on stats_port and the admin socket at sock. 0 or -1. */
int cluster_haproxy_cfg(const char *out, int lb_port, const int rep_port[CLUSTER_NREP], int stats_port,
                        const char *sock);

/* Starts haproxy (binary bin) in the foreground (-db) on workdir's
 * haproxy.cfg written by cluster_haproxy_cfg (admin socket
 * workdir/haproxy.sock), its output in workdir/haproxy.log. The child's
 * pid, or -1. The caller waits for what it needs (servers up, the port). */
pid_t cluster_haproxy_start(const char *bin, const char *workdir, int lb_port, const int rep_port[CLUSTER_NREP],
                            int stats_port);

/* One request through the balancer on lb_port. ctype NULL = JSON; body may
 * be NULL; sid != NULL adds X-Session-Id (the balancer routes by it).
 * 0 when an answer came, -1 on transport failure (30 s timeout). */
int cluster_lb_call(int lb_port, const char *method, const char *path, const char *ctype, const char *body,
                    const char *sid, http_resp *out);

#endif
