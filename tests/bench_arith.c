/* bench_arith.c -- the model's own arithmetic of one prediction, measured in
 * process (issue 36): what a daemon's predict cannot do without, to set its
 * CPU a prediction against.
 *
 *  * one LSTM step (lstm_step: the input projection and the recurrence of
 *    every layer, binary16 copies of W_ih and W_hh for an F16 model);
 *  * the decoder row (lstm_logits: W_dec h + b over V), alone and as one
 *    row of a batch of B (lstm_logits_rows, what the daemon's batcher runs);
 *  * the neural cache's dots of a window of N float32 keys
 *    (neural_cache_dots), in cache (the same window again) and from memory
 *    (64 windows in turn, as 64 sessions read theirs).
 *
 * Thread CPU time (CLOCK_THREAD_CPUTIME_ID) per call, the best of 5 runs of
 * R calls each, one thread, OpenBLAS at one thread as the daemon runs it.
 *
 * usage: bench_arith [--model DIR] [--reps R] [--batch B] [--neural N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "lstm.h"
#include "model.h"
#include "neural_cache.h"
#include "rng.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const nc_model *m;
    nc_state *s;
    nc_lstm_work *w;
    float *X, *L;                 /* [B, H] rows, [B, V] logits */
    int B;
    nc_neural_cache *nc;          /* [64] windows */
    int nnc, at;
    float *dots;
} arith;

enum { STEP, ROW, BATCH, DOTS_HOT, DOTS_COLD };

/* One call of what k names. */
static void run_one(arith *a, int k, int i)
{
    const int H = a->m->cfg.hidden_size, V = a->m->cfg.vocab_size;
    switch (k) {
    case STEP:
        lstm_step(a->m, a->s, i % V, a->w);
        break;
    case ROW:
        lstm_logits(a->m, lstm_state_top(a->s), a->L);
        break;
    case BATCH:
        lstm_logits_rows(a->m, a->X, (size_t)a->B, a->L);
        break;
    case DOTS_HOT:
        neural_cache_dots(&a->nc[0], a->X, a->dots);
        break;
    case DOTS_COLD:
        a->at = (a->at + 1) % a->nnc;
        neural_cache_dots(&a->nc[a->at], a->X + (size_t)(a->at % a->B) * H, a->dots);
        break;
    }
}

/* Microseconds of CPU a call, best of 5 runs of reps calls. */
static double measure(arith *a, int k, int reps)
{
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = cpu_s();
        for (int i = 0; i < reps; i++)
            run_one(a, k, i);
        double dt = (cpu_s() - t0) / reps;
        if (dt < best)
            best = dt;
    }
    return best * 1e6;
}

int main(int argc, char **argv)
{
    const char *dir = "models/demo";
    int reps = 2000, B = 16, N = 2000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--neural")) N = atoi(argv[i + 1]);
    }
    if (B < 1 || B > LSTM_LOGITS_ROWS_MAX || N < 1 || reps < 1) {
        fprintf(stderr, "bench_arith: --batch 1..%d, --neural >= 1, --reps >= 1\n", LSTM_LOGITS_ROWS_MAX);
        return 1;
    }
    openblas_set_num_threads(1);
    char err[256];
    nc_model *m = NULL;
    if (model_load(dir, &m, err, sizeof err) != 0) {
        fprintf(stderr, "bench_arith: %s\n", err);
        return 1;
    }
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    arith a = {.m = m, .s = lstm_state_new(m), .w = lstm_work_new(m), .B = B, .nnc = 64};
    a.X = malloc((size_t)B * H * sizeof(float));
    a.L = malloc((size_t)B * V * sizeof(float));
    a.dots = malloc((size_t)N * sizeof(float));
    a.nc = calloc((size_t)a.nnc, sizeof *a.nc);
    nc_rng r;
    rng_seed(&r, 36);
    for (int i = 0; i < B * H; i++)
        a.X[i] = rng_uniform(&r) - 0.5f;
    for (int c = 0; c < a.nnc; c++) {
        if (neural_cache_init(&a.nc[c], N, H, false, err, sizeof err) != 0) {
            fprintf(stderr, "bench_arith: %s\n", err);
            return 1;
        }
        for (int i = 0; i < N; i++)
            neural_cache_push(&a.nc[c], a.X + (size_t)(i % B) * H, i % V);
    }
    lstm_step(m, a.s, m->eos_id, a.w);
    double step = measure(&a, STEP, reps), row = measure(&a, ROW, reps);
    double batch = measure(&a, BATCH, reps / B + 1) / B;
    double hot = measure(&a, DOTS_HOT, reps / 4 + 1), cold = measure(&a, DOTS_COLD, reps / 4 + 1);
    printf("model %s (%d x %d LSTM, V = %d), CPU us a call, best of 5 x %d\n", dir, m->cfg.num_layers, H, V, reps);
    printf("| lstm_step | decoder row alone | decoder row in a batch of %d | step + row (batched) | "
           "neural dots, %d keys, in cache | same, from memory (64 windows) |\n|---:|---:|---:|---:|---:|---:|\n",
           B, N);
    printf("| %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", step, row, batch, step + batch, hot, cold);
    for (int c = 0; c < a.nnc; c++)
        neural_cache_free(&a.nc[c]);
    free(a.nc), free(a.X), free(a.L), free(a.dots);
    lstm_work_free(a.w);
    lstm_state_free(a.s);
    model_free(m);
    return 0;
}
