/* bench_score.c -- scoring speed of the static model: a randomly initialised
 * 2-layer, 256-unit LSTM with the PTB vocabulary scores ptb.test.txt through
 * the batched path and the step path; OpenBLAS sgemm GFLOP/s as the peak.
 *
 * usage: bench_score [--data DIR] [--threads N] [--block N] [--step-tokens N]
 * Exits 0 with a notice when the corpora are absent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "slurp.h"
#include "lstm.h"
#include "model.h"
#include "scorer.h"
#include "tokenizer.h"
#include "vocab.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static float urand(void)           /* xorshift64, uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * urand();
}

/* sgemm C[M,N] = A[M,K] B[N,K]^T, repeated for ~0.4 s: GFLOP/s. */
static double sgemm_gflops(int M, int N, int K)
{
    float *a = malloc((size_t)M * K * sizeof(float)), *b = malloc((size_t)N * K * sizeof(float));
    float *c = malloc((size_t)M * N * sizeof(float));
    fill(a, (size_t)M * K, 1.0f);
    fill(b, (size_t)N * K, 1.0f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
    int reps = 0;
    double t0 = now_s(), dt;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        reps++;
        dt = now_s() - t0;
    } while (dt < 0.4);
    free(a);
    free(b);
    free(c);
    return 2.0 * M * N * (double)K * reps / dt * 1e-9;
}

int main(int argc, char **argv)
{
    const char *data = "../shared/data/ptb";
    int threads = 2;
    size_t step_tokens = 0;       /* 0 = whole file */
    size_t block = 0;             /* 0 = NC_SCORE_BLOCK */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            data = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--block") && i + 1 < argc)
            block = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--step-tokens") && i + 1 < argc)
            step_tokens = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_score [--data DIR] [--threads N] [--block N] [--step-tokens N]\n");
            return 2;
        }
    }
    char trainp[1024], testp[1024];
    snprintf(trainp, sizeof trainp, "%s/ptb.train.txt", data);
    snprintf(testp, sizeof testp, "%s/ptb.test.txt", data);
    size_t trlen, telen;
    char *train = slurp_file(trainp, &trlen), *test = slurp_file(testp, &telen);
    if (!train || !test) {
        printf("bench_score: PTB corpora not found under %s (ptb.train.txt, ptb.test.txt): skipped\n", data);
        free(train);
        free(test);
        return 0;
    }

    /* Vocabulary of the training set, as word_language_model builds it. */
    nc_vocab *v = vocab_new();
    vocab_add(v, "<unk>", 5);
    vocab_add(v, "<eos>", 5);
    for (char *tok = strtok(train, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n"))
        vocab_add(v, tok, strlen(tok));
    free(train);
    nc_model_config cfg = {.model_type = "lstm", .vocab_size = vocab_size(v), .embedding_size = 256,
                           .hidden_size = 256, .num_layers = 2, .tie_weights = false,
                           .unk_token = "<unk>", .eos_token = "<eos>"};
    nc_model *m = NULL;
    char err[NC_ERRLEN];
    if (model_create(&cfg, v, &m, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_score: %s\n", err);
        return 1;
    }
    const size_t V = (size_t)cfg.vocab_size, H = 256;
    /* PyTorch's init: encoder/decoder U(-0.1, 0.1), LSTM U(-1/sqrt(H), 1/sqrt(H)). */
    fill(m->encoder, V * H, 0.1f);
    fill(m->decoder_w, V * H, 0.1f);
    for (int k = 0; k < 2; k++) {
        fill(m->layers[k].w_ih, 4 * H * H, 0.0625f);
        fill(m->layers[k].w_hh, 4 * H * H, 0.0625f);
        fill(m->layers[k].b_ih, 4 * H, 0.0625f);
        fill(m->layers[k].b_hh, 4 * H, 0.0625f);
    }
    model_refresh_derived(m);

    nc_tokens toks;
    tokens_init(&toks);
    if (tokenize(m, test, telen, true, &toks, err, sizeof err) != NC_OK) {
        fprintf(stderr, "bench_score: %s\n", err);
        return 1;
    }
    free(test);
    size_t n = toks.n;
    if (step_tokens == 0 || step_tokens > n)
        step_tokens = n;

    /* FLOPs per scored token: LSTM 2 * 4H * (in + H) per layer, decoder 2VH. */
    double flop_tok = 2.0 * 2 * 4 * H * (H + H) + 2.0 * V * H;

    printf("model: V=%zu E=H=%zu L=2 (random init), %zu parameters; text: %s, %zu tokens\n", V, H,
           model_num_params(m), testp, n);
    openblas_set_num_threads(1);
    double g1 = sgemm_gflops(1024, 1024, 1024);
    double d1 = sgemm_gflops(NC_SCORE_BLOCK, (int)V, (int)H);
    openblas_set_num_threads(threads);
    double gN = sgemm_gflops(1024, 1024, 1024);
    double dN = sgemm_gflops(NC_SCORE_BLOCK, (int)V, (int)H);
    printf("sgemm 1024^3:            %7.1f GFLOP/s (1 thread)  %7.1f GFLOP/s (%d threads)\n", g1, gN, threads);
    printf("sgemm %dx%zux%zu (decoder): %5.1f GFLOP/s (1 thread)  %7.1f GFLOP/s (%d threads)\n", NC_SCORE_BLOCK,
           V, H, d1, dN, threads);

    nc_state *s = lstm_state_new(m);
    nc_scorer *sc = scorer_new(m, block);
    float *lp = malloc(n * sizeof(float));
    size_t first;
    double best_b = 0;
    int best_threads = 1;
    double sum_b = 0;
    for (int th = 1; th <= threads; th++) {
        openblas_set_num_threads(th);
        scorer_begin(sc, s, NC_BOS_EOS, toks.ids, n, &first, err, sizeof err);
        double t0 = now_s();
        if (scorer_run(sc, s, toks.ids, n, lp, NULL, NULL, err, sizeof err) != NC_OK) {
            fprintf(stderr, "bench_score: %s\n", err);
            return 1;
        }
        double dt = now_s() - t0, tps = (double)n / dt;
        sum_b = 0;
        for (size_t i = 0; i < n; i++)
            sum_b += lp[i];
        printf("batched  (%d BLAS thread%s): %8.0f tokens/s  %6.2f s  %6.1f GFLOP/s  ppl %.1f\n", th,
               th > 1 ? "s" : " ", tps, dt, tps * flop_tok * 1e-9, exp(-sum_b / (double)n));
        if (tps > best_b) {
            best_b = tps;
            best_threads = th;
        }
    }

    /* Step path: one token at a time, full distribution (what a session does). */
    openblas_set_num_threads(1);
    nc_lstm_work *w = lstm_work_new(m);
    float *logits = malloc(V * sizeof(float));
    lstm_state_reset(s);
    lstm_step(m, s, m->eos_id, w);
    double worst = 0;
    double t0 = now_s();
    for (size_t i = 0; i < step_tokens; i++) {
        lstm_logits(m, lstm_state_top(s), logits);
        float l = logits[toks.ids[i]] - nc_logsumexp(logits, V);
        worst = fmax(worst, fabs(l - lp[i]));
        lstm_step(m, s, toks.ids[i], w);
    }
    double dt = now_s() - t0, tps_s = (double)step_tokens / dt;
    printf("step     (1 BLAS thread):  %8.0f tokens/s  %6.2f s  (%zu tokens; max |batched - step| = %.2g)\n",
           tps_s, dt, step_tokens, worst);
    double peak = fmax(gN, dN);
    printf("summary: batched %.0f tokens/s (%d BLAS threads) = %.1f GFLOP/s = %.0f%% of measured sgemm peak "
           "%.1f GFLOP/s; step %.0f tokens/s; batched/step %.1fx\n",
           best_b, best_threads, best_b * flop_tok * 1e-9, 100.0 * best_b * flop_tok * 1e-9 / peak, peak, tps_s,
           best_b / tps_s);

    free(logits);
    lstm_work_free(w);
    free(lp);
    scorer_free(sc);
    lstm_state_free(s);
    tokens_clear(&toks);
    model_free(m);
    return worst <= 1e-3 ? 0 : 1;
}
