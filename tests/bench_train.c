/* bench_train.c -- throughput of one training step (forward, backward,
 * clipping, SGD) of the PTB benchmark model on random tokens: tokens/s.
 * Usage: bench_train [steps] [threads] [V] [H] [L] [T] [B] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lstm_grad.h"
#include "optim.h"
#include "rng.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 30, threads = argc > 2 ? atoi(argv[2]) : 2;
    int V = argc > 3 ? atoi(argv[3]) : 10000, H = argc > 4 ? atoi(argv[4]) : 256;
    int L = argc > 5 ? atoi(argv[5]) : 2, T = argc > 6 ? atoi(argv[6]) : 35;
    int B = argc > 7 ? atoi(argv[7]) : 20;
    openblas_set_num_threads(threads);
    char err[NC_ERRLEN];
    lstm_grad_net *n;
    lstm_grad_work *w;
    if (lstm_grad_net_new(&(lstm_grad_shape){V, H, H, L, true}, &n, err, sizeof err) ||
        lstm_grad_work_new(n, T, B, &w, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    nc_rng rng;
    rng_seed(&rng, 1);
    lstm_grad_init_uniform(n, &rng, 0.1f, 0);
    int *x = malloc(sizeof(int) * T * B), *y = malloc(sizeof(int) * T * B);
    lstm_grad_dropout d = {0.25f, 0.25f, 0.25f};
    const lstm_grad_pass pass = {.train = true, .drop = &d, .rng = &rng, .backward = true};
    double t0 = 0, loss = 0;
    for (int s = -3; s < steps; s++) {
        if (s == 0)
            t0 = now();
        for (int i = 0; i < T * B; i++)
            x[i] = (int)(rng_next(&rng) % V), y[i] = (int)(rng_next(&rng) % V);
        loss = lstm_grad_segment(n, w, x, y, T, &pass);
        optim_clip_grad_norm(n->g, n->n, 0.25f);
        optim_sgd(n->w, n->g, n->n, 20.0f);
    }
    double dt = now() - t0;
    printf("train step V=%d H=%d L=%d T=%d B=%d threads=%d: %.1f ms/step, %.0f tokens/s (loss %.3f)\n",
           V, H, L, T, B, threads, dt / steps * 1e3, (double)steps * T * B / dt, loss / (T * B));
    free(x);
    free(y);
    lstm_grad_work_free(w);
    lstm_grad_net_free(n);
    return 0;
}
