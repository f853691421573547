/* metrics.c -- Prometheus counters and histograms of the daemon. */
#include "metrics.h"
#include "gate.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Statuses the daemon answers; anything else is counted as "other". */
static const unsigned statuses[] = {200, 201, 204, 400, 404, 405, 409, 413, 415, 429, 500, 503, 0};
#define NSTATUS (sizeof statuses / sizeof statuses[0])

/* Latency buckets in seconds (upper bounds; +Inf implied). */
static const double buckets[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
#define NBUCKET (sizeof buckets / sizeof buckets[0])

static const char *const *ep_names;
static int ep_count;
static atomic_ulong req_count[METRICS_MAX_ENDPOINTS][NSTATUS];
static atomic_ulong hist[METRICS_MAX_ENDPOINTS][NBUCKET + 1];
static atomic_ulong lat_sum_us[METRICS_MAX_ENDPOINTS];
static atomic_ulong tokens_scored, tokens_fed, predictions, evictions;
static atomic_ulong predict_batches, predict_batched, predict_memo;

void metrics_init(const char *const *endpoints, int n)
{
    ep_names = endpoints;
    ep_count = n < METRICS_MAX_ENDPOINTS ? n : METRICS_MAX_ENDPOINTS;
}

void metrics_request(int ep, unsigned status, double seconds)
{
    if (ep < 0 || ep >= ep_count)
        return;
    size_t si = NSTATUS - 1;
    for (size_t i = 0; i + 1 < NSTATUS; i++)
        if (statuses[i] == status) { si = i; break; }
    atomic_fetch_add_explicit(&req_count[ep][si], 1, memory_order_relaxed);
    size_t b = 0;
    while (b < NBUCKET && seconds > buckets[b])
        b++;
    atomic_fetch_add_explicit(&hist[ep][b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&lat_sum_us[ep], (unsigned long)(seconds * 1e6), memory_order_relaxed);
}

void metrics_add_tokens_scored(uint64_t n) { atomic_fetch_add(&tokens_scored, n); }
void metrics_add_tokens_fed(uint64_t n) { atomic_fetch_add(&tokens_fed, n); }
void metrics_add_predictions(uint64_t n) { atomic_fetch_add(&predictions, n); }
void metrics_add_predict_batch(uint64_t jobs)
{
    atomic_fetch_add(&predict_batches, 1);
    atomic_fetch_add(&predict_batched, jobs);
}
void metrics_add_predict_memo(void) { atomic_fetch_add(&predict_memo, 1); }
void metrics_add_evictions(uint64_t n) { atomic_fetch_add(&evictions, n); }

void metrics_printf(metrics_text *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = 1; return; }
        if ((size_t)n < b->cap - b->len) { b->len += (size_t)n; return; }
        size_t ncap = b->cap * 2 + (size_t)n;
        char *ns = realloc(b->s, ncap);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = ncap;
    }
}

char *metrics_render(long sessions_active, size_t session_bytes, int ready, int draining)
{
    metrics_text b = {malloc(8192), 0, 8192, 0};
    if (!b.s)
        return NULL;
    b.s[0] = 0;
    metrics_printf(&b, "# HELP neurocache_requests_total HTTP requests answered, by endpoint and status.\n"
                       "# TYPE neurocache_requests_total counter\n");
    for (int e = 0; e < ep_count; e++)
        for (size_t s = 0; s < NSTATUS; s++) {
            unsigned long v = atomic_load(&req_count[e][s]);
            if (!v) continue;
            if (statuses[s])
                metrics_printf(&b, "neurocache_requests_total{endpoint=\"%s\",status=\"%u\"} %lu\n", ep_names[e], statuses[s], v);
            else
                metrics_printf(&b, "neurocache_requests_total{endpoint=\"%s\",status=\"other\"} %lu\n", ep_names[e], v);
        }
    metrics_printf(&b, "# HELP neurocache_request_duration_seconds Request latency, by endpoint.\n"
                       "# TYPE neurocache_request_duration_seconds histogram\n");
    for (int e = 0; e < ep_count; e++) {
        unsigned long cum = 0;
        for (size_t i = 0; i <= NBUCKET; i++) {
            cum += atomic_load(&hist[e][i]);
            if (i < NBUCKET)
                metrics_printf(&b, "neurocache_request_duration_seconds_bucket{endpoint=\"%s\",le=\"%g\"} %lu\n", ep_names[e], buckets[i], cum);
            else
                metrics_printf(&b, "neurocache_request_duration_seconds_bucket{endpoint=\"%s\",le=\"+Inf\"} %lu\n", ep_names[e], cum);
        }
        metrics_printf(&b, "neurocache_request_duration_seconds_sum{endpoint=\"%s\"} %.6f\n", ep_names[e],
                       atomic_load(&lat_sum_us[e]) / 1e6);
        metrics_printf(&b, "neurocache_request_duration_seconds_count{endpoint=\"%s\"} %lu\n", ep_names[e], cum);
    }
    metrics_printf(&b, "# HELP neurocache_tokens_scored_total Tokens scored (score, completions echo, feed with scores).\n"
                       "# TYPE neurocache_tokens_scored_total counter\nneurocache_tokens_scored_total %lu\n",
                   atomic_load(&tokens_scored));
    metrics_printf(&b, "# HELP neurocache_tokens_fed_total Tokens fed into sessions.\n"
                       "# TYPE neurocache_tokens_fed_total counter\nneurocache_tokens_fed_total %lu\n",
                   atomic_load(&tokens_fed));
    metrics_printf(&b, "# HELP neurocache_predictions_total Next-word distributions computed.\n"
                       "# TYPE neurocache_predictions_total counter\nneurocache_predictions_total %lu\n",
                   atomic_load(&predictions));
    metrics_printf(&b, "# HELP neurocache_predict_batches_total Decoder products run for predict (one GEMM per batch).\n"
                       "# TYPE neurocache_predict_batches_total counter\nneurocache_predict_batches_total %lu\n"
                       "# HELP neurocache_predict_batched_total Predict requests run in those batches.\n"
                       "# TYPE neurocache_predict_batched_total counter\nneurocache_predict_batched_total %lu\n"
                       "# HELP neurocache_predict_memo_total Predict requests answered from their session's memo "
                       "on their connection's thread (no decoder product to batch).\n"
                       "# TYPE neurocache_predict_memo_total counter\nneurocache_predict_memo_total %lu\n",
                   atomic_load(&predict_batches), atomic_load(&predict_batched), atomic_load(&predict_memo));
    uint64_t gsearched, gskipped;
    gate_counters(&gsearched, &gskipped);
    metrics_printf(&b, "# HELP neurocache_gate_searches_total Unbounded-cache searches run under the gate's adaptive retrieval.\n"
                       "# TYPE neurocache_gate_searches_total counter\nneurocache_gate_searches_total %llu\n"
                       "# HELP neurocache_gate_skipped_total Unbounded-cache searches the gate skipped.\n"
                       "# TYPE neurocache_gate_skipped_total counter\nneurocache_gate_skipped_total %llu\n",
                   (unsigned long long)gsearched, (unsigned long long)gskipped);
    metrics_printf(&b, "# HELP neurocache_sessions_evicted_total Sessions evicted after their idle TTL.\n"
                       "# TYPE neurocache_sessions_evicted_total counter\nneurocache_sessions_evicted_total %lu\n",
                   atomic_load(&evictions));
    metrics_printf(&b, "# HELP neurocache_sessions_active Sessions alive.\n"
                       "# TYPE neurocache_sessions_active gauge\nneurocache_sessions_active %ld\n", sessions_active);
    metrics_printf(&b, "# HELP neurocache_session_memory_bytes Memory held by sessions (state and caches).\n"
                       "# TYPE neurocache_session_memory_bytes gauge\nneurocache_session_memory_bytes %zu\n", session_bytes);
    metrics_printf(&b, "# HELP neurocache_ready 1 when the model is loaded and the server is not draining.\n"
                       "# TYPE neurocache_ready gauge\nneurocache_ready %d\n", ready && !draining);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
