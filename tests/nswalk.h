/* nswalk.h -- a namespace of fixture words seen through a running daemon,
 * as the suites that grow and train one read it (test_training_server,
 * test_training_replicas, test_compact_server): the words' text, the
 * namespace's training and a probe session's predictions. */
#ifndef NC_TESTS_NSWALK_H
#define NC_TESTS_NSWALK_H

#include <jansson.h>
#include <stdint.h>

#include "daemon.h"

/* A text of n fixture words, w0..w47 in a seeded walk with repeats, one
 * line (malloc'd) */
char *nswalk_text(int n, uint64_t seed);
/* GET /v1/namespaces/{ns}: its index.training object (a new reference;
 * NULL unless 200) and, when entries is not NULL, its entries (-1 unless
 * 200) */
json_t *nswalk_training(const nc_daemon *d, const char *ns, int64_t *entries);
/* The top-20 predictions (words and probabilities, as JSON; a new
 * reference, NULL on failure) of a session "probe" reading ns with the
 * unbounded cache (λ 0.5, and knobs: more members of its "cache" object,
 * as ",\"knn\":32"; "" for the defaults) after a fixed text; the session
 * deleted */
json_t *nswalk_predictions(const nc_daemon *d, const char *ns, const char *knobs);

#endif
