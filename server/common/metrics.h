/* metrics.h -- Prometheus counters and histograms of the daemon. */
#ifndef NC_SERVER_METRICS_H
#define NC_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_ENDPOINTS 64

/* endpoints: names used as the "endpoint" label (borrowed, must outlive the
 * metrics), at most METRICS_MAX_ENDPOINTS. Call once before serving. */
void metrics_init(const char *const *endpoints, int n);

/* One finished request: endpoint index, HTTP status, latency in seconds.
 * Lock-free (atomics); callable from any thread. */
void metrics_request(int endpoint, unsigned status, double seconds);

void metrics_add_tokens_scored(uint64_t n);
void metrics_add_tokens_fed(uint64_t n);
void metrics_add_predictions(uint64_t n);
void metrics_add_evictions(uint64_t n);
/* One predict batch of jobs requests (batcher.c). */
void metrics_add_predict_batch(uint64_t jobs);
/* a predict answered from its session's memo without the batcher (api_predict.c) */
void metrics_add_predict_memo(void);

/* A growing text buffer for the exposition format: metrics_printf appends;
 * on a failed allocation it sets oom and appends nothing more (the caller
 * frees s either way). */
typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} metrics_text;
void metrics_printf(metrics_text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Renders the Prometheus text exposition format (version 0.0.4) with the
 * given gauges. Returns a malloc'd string (caller frees) or NULL. */
char *metrics_render(long sessions_active, size_t session_bytes, int ready, int draining);

#endif
