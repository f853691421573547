/* test_lstm.c -- LSTM step and batched paths against PyTorch's reference
 * vectors (each fixture's reference.json), state handling, log-softmax. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "harness.h"
#include "lstm.h"
#include "model.h"
#include "vmath.h"

#define TOL_LOGPROB 1e-4   /* design §2 / testdata README */
#define TOL_HIDDEN 1e-4

/* The harness macro tests its pointer for NULL; arrays need a decay. */
static const char *msg(const char *s)
{
    return s;
}

static const char *fixtures[] = {"lstm-2layer", "lstm-1layer-tied", "lstm-2layer-f16"};

typedef struct {
    nc_model *m;
    json_t *ref;
    int *tokens;
    size_t T;
} fixture;

static int fixture_open(const char *name, fixture *f)
{
    char dir[1024], path[1100], err[NC_ERRLEN];
    memset(f, 0, sizeof *f);
    snprintf(dir, sizeof dir, "%s/%s", harness_fixtures(), name);
    int rc = model_load(dir, &f->m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s: %s", dir, err);
    if (rc != NC_OK)
        return -1;
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t jerr;
    f->ref = json_load_file(path, 0, &jerr);
    CHECKF(f->ref != NULL, "%s: %s", path, jerr.text);
    if (!f->ref)
        return -1;
    json_t *toks = json_object_get(f->ref, "tokens");
    f->T = json_array_size(toks);
    f->tokens = malloc(f->T * sizeof(int));
    for (size_t i = 0; i < f->T; i++)
        f->tokens[i] = (int)json_integer_value(json_array_get(toks, i));
    CHECK(f->T > 10);
    return 0;
}

static void fixture_close(fixture *f)
{
    model_free(f->m);
    json_decref(f->ref);
    free(f->tokens);
}

static double ref_at2(json_t *ref, const char *key, size_t i, size_t j)
{
    return json_number_value(json_array_get(json_array_get(json_object_get(ref, key), i), j));
}

/* Compares a [V] log-prob row with static_logprobs_full[t]; returns max |d|. */
static double cmp_logprobs(const fixture *f, size_t t, const float *lp)
{
    double worst = 0;
    for (int w = 0; w < f->m->cfg.vocab_size; w++) {
        double d = fabs(lp[w] - ref_at2(f->ref, "static_logprobs_full", t, (size_t)w));
        worst = d > worst ? d : worst;
    }
    return worst;
}

static double cmp_hidden(const fixture *f, size_t t, const float *h)
{
    double worst = 0;
    for (int j = 0; j < f->m->cfg.hidden_size; j++) {
        double d = fabs(h[j] - ref_at2(f->ref, "hidden_last_layer", t, (size_t)j));
        worst = d > worst ? d : worst;
    }
    return worst;
}

static void check_final_state(const fixture *f, const nc_state *s, const char *path)
{
    json_t *fs = json_object_get(f->ref, "final_state");
    int L = f->m->cfg.num_layers, H = f->m->cfg.hidden_size;
    double worst = 0;
    for (int k = 0; k < L; k++)
        for (int j = 0; j < H; j++) {
            double dh = fabs(s->h[k * H + j] -
                             json_number_value(json_array_get(json_array_get(json_object_get(fs, "h"), k), j)));
            double dc = fabs(s->c[k * H + j] -
                             json_number_value(json_array_get(json_array_get(json_object_get(fs, "c"), k), j)));
            worst = fmax(worst, fmax(dh, dc));
        }
    CHECKF(worst <= TOL_HIDDEN, "%s: final_state differs by %g", path, worst);
}

TEST(reference_step_path)
{
    for (size_t fi = 0; fi < sizeof fixtures / sizeof fixtures[0]; fi++) {
        fixture f;
        if (fixture_open(fixtures[fi], &f) != 0) {
            fixture_close(&f);
            continue;
        }
        int V = f.m->cfg.vocab_size;
        nc_state *s = lstm_state_new(f.m);
        nc_lstm_work *w = lstm_work_new(f.m);
        float *lp = malloc((size_t)V * sizeof(float));
        double worst_lp = 0, worst_h = 0;
        for (size_t t = 0; t < f.T; t++) {
            lstm_step(f.m, s, f.tokens[t], w);
            worst_h = fmax(worst_h, cmp_hidden(&f, t, lstm_state_top(s)));
            lstm_logits(f.m, lstm_state_top(s), lp);
            nc_log_softmax(lp, (size_t)V);
            worst_lp = fmax(worst_lp, cmp_logprobs(&f, t, lp));
        }
        CHECKF(worst_lp <= TOL_LOGPROB, "%s: step log-probs differ by %g", fixtures[fi], worst_lp);
        CHECKF(worst_h <= TOL_HIDDEN, "%s: step hidden differs by %g", fixtures[fi], worst_h);
        check_final_state(&f, s, fixtures[fi]);
        free(lp);
        lstm_work_free(w);
        lstm_state_free(s);
        fixture_close(&f);
    }
}

/* The batched path, whole and split into two calls at every split point
 * class (start, middle, end): chunking must not change anything. */
TEST(reference_batched_path)
{
    for (size_t fi = 0; fi < sizeof fixtures / sizeof fixtures[0]; fi++) {
        fixture f;
        if (fixture_open(fixtures[fi], &f) != 0) {
            fixture_close(&f);
            continue;
        }
        int V = f.m->cfg.vocab_size, H = f.m->cfg.hidden_size;
        size_t splits[] = {f.T, 1, f.T / 2, f.T - 1};
        for (size_t si = 0; si < 4; si++) {
            size_t cut = splits[si];
            nc_state *s = lstm_state_new(f.m);
            float *hid = malloc(f.T * (size_t)H * sizeof(float));
            float *lg = malloc(f.T * (size_t)V * sizeof(float));
            char err[NC_ERRLEN];
            CHECK(lstm_forward_seq(f.m, s, f.tokens, cut, hid, err, sizeof err) == NC_OK);
            CHECK(lstm_forward_seq(f.m, s, f.tokens + cut, f.T - cut, hid + cut * (size_t)H, err, sizeof err) ==
                  NC_OK);
            lstm_logits_batch(f.m, hid, f.T, lg);
            double worst_lp = 0, worst_h = 0;
            for (size_t t = 0; t < f.T; t++) {
                nc_log_softmax(lg + t * (size_t)V, (size_t)V);
                worst_lp = fmax(worst_lp, cmp_logprobs(&f, t, lg + t * (size_t)V));
                worst_h = fmax(worst_h, cmp_hidden(&f, t, hid + t * (size_t)H));
            }
            CHECKF(worst_lp <= TOL_LOGPROB, "%s split %zu: batched log-probs differ by %g", fixtures[fi], cut,
                   worst_lp);
            CHECKF(worst_h <= TOL_HIDDEN, "%s split %zu: batched hidden differs by %g", fixtures[fi], cut, worst_h);
            check_final_state(&f, s, fixtures[fi]);
            free(hid);
            free(lg);
            lstm_state_free(s);
        }
        fixture_close(&f);
    }
}

/* Longer than one block of lstm_forward_seq: batched == step (naive path). */
TEST(batched_equals_step_across_blocks)
{
    fixture f;
    if (fixture_open("lstm-2layer", &f) != 0) {
        fixture_close(&f);
        return;
    }
    int V = f.m->cfg.vocab_size, H = f.m->cfg.hidden_size;
    size_t T = 700;
    int *toks = malloc(T * sizeof(int));
    unsigned x = 12345;
    for (size_t t = 0; t < T; t++) {
        x = x * 1103515245u + 12345u;
        toks[t] = (int)((x >> 16) % (unsigned)V);
    }
    nc_state *a = lstm_state_new(f.m), *b = lstm_state_new(f.m);
    nc_lstm_work *w = lstm_work_new(f.m);
    float *hid = malloc(T * (size_t)H * sizeof(float));
    float *lg = malloc(T * (size_t)V * sizeof(float));
    float *lp = malloc((size_t)V * sizeof(float));
    char err[NC_ERRLEN];
    CHECK(lstm_forward_seq(f.m, a, toks, T, hid, err, sizeof err) == NC_OK);
    lstm_logits_batch(f.m, hid, T, lg);
    double worst = 0;
    for (size_t t = 0; t < T; t++) {
        lstm_step(f.m, b, toks[t], w);
        lstm_logits(f.m, lstm_state_top(b), lp);
        nc_log_softmax(lp, (size_t)V);
        nc_log_softmax(lg + t * (size_t)V, (size_t)V);
        for (int j = 0; j < V; j++)
            worst = fmax(worst, fabs(lp[j] - lg[t * (size_t)V + (size_t)j]));
    }
    CHECKF(worst <= 1e-5, "batched vs step over %zu tokens: %g", T, worst);
    double ws = 0;
    for (int j = 0; j < f.m->cfg.num_layers * H; j++)
        ws = fmax(ws, fmax(fabs(a->h[j] - b->h[j]), fabs(a->c[j] - b->c[j])));
    CHECK(ws <= 1e-5);
    free(toks);
    free(hid);
    free(lg);
    free(lp);
    lstm_work_free(w);
    lstm_state_free(a);
    lstm_state_free(b);
    fixture_close(&f);
}

TEST(state_copy_reset_blob)
{
    fixture f;
    if (fixture_open("lstm-2layer", &f) != 0) {
        fixture_close(&f);
        return;
    }
    nc_state *s = lstm_state_new(f.m), *c = lstm_state_new(f.m), *r = lstm_state_new(f.m);
    nc_lstm_work *w = lstm_work_new(f.m);
    for (size_t t = 0; t < 20; t++)
        lstm_step(f.m, s, f.tokens[t], w);
    size_t n = (size_t)s->num_layers * s->hidden_size;
    lstm_state_copy(c, s);
    CHECK(memcmp(c->h, s->h, n * sizeof(float)) == 0 && memcmp(c->c, s->c, n * sizeof(float)) == 0);

    /* Serialise, restore, and continue: identical to continuing the original. */
    size_t bl = lstm_state_blob_size(s);
    CHECK(bl == 16 + 2 * n * sizeof(float));
    unsigned char *blob = malloc(bl);
    lstm_state_to_blob(s, blob);
    char err[NC_ERRLEN];
    CHECK(lstm_state_from_blob(r, blob, bl, err, sizeof err) == NC_OK);
    for (size_t t = 20; t < f.T; t++) {
        lstm_step(f.m, s, f.tokens[t], w);
        lstm_step(f.m, r, f.tokens[t], w);
    }
    CHECK(memcmp(r->h, s->h, n * sizeof(float)) == 0 && memcmp(r->c, s->c, n * sizeof(float)) == 0);
    check_final_state(&f, r, "restored");

    /* Bad blobs are refused and leave the state untouched. */
    lstm_state_copy(c, r);
    CHECK(lstm_state_from_blob(r, blob, bl - 1, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "bytes");
    blob[0] = 'X';
    CHECK(lstm_state_from_blob(r, blob, bl, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "magic");
    blob[0] = 'N';
    blob[4] = 3;
    CHECK(lstm_state_from_blob(r, blob, bl, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "layers");
    blob[4] = 2;
    float nan = NAN;
    memcpy(blob + 16, &nan, sizeof nan);
    CHECK(lstm_state_from_blob(r, blob, bl, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "finite");
    CHECK(memcmp(c->h, r->h, n * sizeof(float)) == 0);

    lstm_state_reset(s);
    int zero = 1;
    for (size_t i = 0; i < n; i++)
        zero &= s->h[i] == 0.0f && s->c[i] == 0.0f;
    CHECK(zero);
    free(blob);
    lstm_work_free(w);
    lstm_state_free(s);
    lstm_state_free(c);
    lstm_state_free(r);
    fixture_close(&f);
}

/* The vectorised exp in nc_logsumexp against a naive double computation. */
TEST(logsumexp_matches_naive)
{
    size_t sizes[] = {1, 5, 16, 17, 50, 10000};
    unsigned x = 7;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        float *v = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            v[i] = ((float)((x >> 8) & 0xffff) / 65536.0f - 0.5f) * 60.0f;
        }
        double mx = -INFINITY, sum = 0;
        for (size_t i = 0; i < n; i++)
            mx = fmax(mx, v[i]);
        for (size_t i = 0; i < n; i++)
            sum += exp((double)v[i] - mx);
        double want = mx + log(sum);
        CHECK_NEAR(nc_logsumexp(v, n), want, 1e-5 * fmax(1.0, fabs(want)));
        nc_log_softmax(v, n);
        double total = 0;
        for (size_t i = 0; i < n; i++)
            total += exp((double)v[i]);
        CHECK_NEAR(total, 1.0, 1e-5);
        free(v);
    }
    float big[3] = {1000.0f, 999.0f, -INFINITY};
    CHECK_NEAR(nc_logsumexp(big, 3), 1000.0 + log(1.0 + exp(-1.0)), 1e-3);
    float ninf[2] = {-INFINITY, -INFINITY};
    CHECK(isinf(nc_logsumexp(ninf, 2)) && nc_logsumexp(ninf, 2) < 0);
}

/* Every kernel this CPU supports (AVX-512, AVX2, scalar) against libm in
 * double precision, over the whole useful range and the clamping edges. */
TEST(vmath_kernels_match_libm)
{
    const char *isas[] = {"avx512", "avx2", "scalar"};
    size_t n = 1037;              /* not a multiple of any vector width */
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (int k = 0; k < 3; k++) {
        if (vm_set_isa(isas[k]) != 0) {
            fprintf(stderr, "  (kernel %s not supported here: skipped)\n", isas[k]);
            continue;
        }
        double ws = 0, wt = 0;
        for (size_t i = 0; i < n; i++)
            x[i] = -100.0f + 200.0f * (float)i / (float)(n - 1);
        memcpy(y, x, n * sizeof(float));
        vm_sigmoid(y, n);
        for (size_t i = 0; i < n; i++)
            ws = fmax(ws, fabs(y[i] - 1.0 / (1.0 + exp(-(double)x[i]))));
        memcpy(y, x, n * sizeof(float));
        vm_tanh(y, n);
        for (size_t i = 0; i < n; i++)
            wt = fmax(wt, fabs(y[i] - tanh((double)x[i])));
        for (size_t i = 0; i < n; i++)
            x[i] = -0.05f + 0.1f * (float)i / (float)(n - 1);   /* small |x|: cancellation in tanh */
        memcpy(y, x, n * sizeof(float));
        vm_tanh(y, n);
        for (size_t i = 0; i < n; i++)
            wt = fmax(wt, fabs(y[i] - tanh((double)x[i])));
        CHECKF(ws <= 1e-6, "%s sigmoid error %g", isas[k], ws);
        CHECKF(wt <= 1e-6, "%s tanh error %g", isas[k], wt);
        size_t sizes[] = {1, 15, 16, 17, 33, 64, 79, 1037};
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            unsigned r = 3;
            for (size_t i = 0; i < sizes[si]; i++) {
                r = r * 1103515245u + 12345u;
                x[i] = ((float)((r >> 8) & 0xffff) / 65536.0f - 0.5f) * 200.0f;
            }
            double mx = -INFINITY, sum = 0;
            for (size_t i = 0; i < sizes[si]; i++)
                mx = fmax(mx, x[i]);
            for (size_t i = 0; i < sizes[si]; i++)
                sum += exp((double)x[i] - mx);
            CHECKF(fabs(vm_logsumexp(x, sizes[si]) - (mx + log(sum))) <= 1e-5 * fmax(1.0, fabs(mx)),
                   "%s logsumexp n=%zu: %g vs %g", isas[k], sizes[si], vm_logsumexp(x, sizes[si]), mx + log(sum));
            /* vm_max and vm_exp_sum (softmax numerators) against libm */
            CHECK(vm_max(x, sizes[si]) == (float)mx);
            double es = vm_exp_sum(y, x, sizes[si], (float)mx), we = 0;
            for (size_t i = 0; i < sizes[si]; i++)
                we = fmax(we, fabs(y[i] - exp((double)x[i] - mx)) / fmax(exp((double)x[i] - mx), 1e-30));
            CHECKF(we <= 1e-6 && fabs(es - sum) <= 1e-6 * sum, "%s exp_sum n=%zu: rel err %g, sum %g vs %g",
                   isas[k], sizes[si], we, es, sum);
            /* vm_cache_exp_sum (the neural cache's window): exp(θ d - s), the
             * sum, and the part whose value is the target, against libm */
            int vals[1037];
            for (size_t i = 0; i < sizes[si]; i++)
                vals[i] = (int)((i * 7u + 3u) % 5u);
            double theta = 0.3, s = theta * mx - 0.25, cs = 0, cm = 0, cmatch, ce = 0;
            for (size_t i = 0; i < sizes[si]; i++) {
                double e = exp(theta * x[i] - s);
                cs += e;
                cm += vals[i] == 3 ? e : 0.0;
            }
            double gs = vm_cache_exp_sum(y, x, vals, sizes[si], (float)theta, (float)s, 3, &cmatch);
            for (size_t i = 0; i < sizes[si]; i++)
                ce = fmax(ce, fabs(y[i] - exp(theta * x[i] - s)) / exp(theta * x[i] - s));
            CHECKF(ce <= 1e-5 && fabs(gs - cs) <= 1e-5 * cs && fabs(cmatch - cm) <= 1e-5 * cs,
                   "%s cache_exp_sum n=%zu: rel err %g, sum %g vs %g, match %g vs %g", isas[k], sizes[si], ce,
                   gs, cs, cmatch, cm);
            double nomatch;
            CHECK(vm_cache_exp_sum(NULL, x, vals, sizes[si], (float)theta, (float)s, -1, &nomatch) == gs);
            CHECK(nomatch == 0.0);
        }
        float edge[4] = {-INFINITY, 0.0f, -INFINITY, -1e30f};
        CHECK_NEAR(vm_logsumexp(edge, 4), 0.0, 1e-6);
        CHECK(vm_logsumexp(edge, 0) == -INFINITY);
    }
    CHECK(vm_set_isa("sse9") != 0);
    vm_set_isa(NULL);   /* back to the level this run tests (NEUROCACHE_SIMD) */
    free(x);
    free(y);
}

/* vm_half_to_float / vm_float_to_half against the portable converters, in
 * every kernel: all 65,536 halves, and float bit patterns spread over the
 * whole range (normals, subnormals, overflow, ties), NaN only as NaN. */
TEST(vmath_half_conversions_match_portable)
{
    const char *isas[] = {"avx512", "avx2", "scalar"};
    enum { NH = 65536, NF = 1 << 20 };
    uint16_t *h = malloc(NH * sizeof *h), *h2 = malloc(NF * sizeof *h2);
    float *f = malloc(NF * sizeof *f), *g = malloc(NF * sizeof *g);
    for (int k = 0; k < 3; k++) {
        if (vm_set_isa(isas[k]) != 0)
            continue;
        for (size_t i = 0; i < NH; i++)
            h[i] = (uint16_t)i;
        vm_half_to_float(h, g, NH - 3);             /* a tail that is no vector width */
        size_t bad = 0;
        for (size_t i = 0; i < NH - 3; i++) {
            float want = nc_half_to_float(h[i]);
            if (isnan(want) ? !isnan(g[i]) : memcmp(&want, &g[i], sizeof want) != 0)
                bad++;
        }
        CHECKF(bad == 0, "%s half->float: %zu of %d differ", isas[k], bad, NH - 3);
        uint32_t bits = 0x9e3779b9u;
        for (size_t i = 0; i < NF; i++) {
            /* every 4,096th pattern, plus exact ties of the rounding (low 13 bits 0x1000) */
            uint32_t b = (uint32_t)i * 4096u + (i & 1 ? 0x1000u : (bits = bits * 1664525u + 1013904223u) & 0xfffu);
            memcpy(&f[i], &b, sizeof b);
        }
        vm_float_to_half(f, h2, NF - 5);
        bad = 0;
        for (size_t i = 0; i < NF - 5; i++) {
            uint16_t want = nc_float_to_half(f[i]);
            bool nan_want = (want & 0x7c00) == 0x7c00 && (want & 0x3ff);
            bool nan_got = (h2[i] & 0x7c00) == 0x7c00 && (h2[i] & 0x3ff);
            if (nan_want ? !nan_got : h2[i] != want)
                bad++;
        }
        CHECKF(bad == 0, "%s float->half: %zu of %d differ", isas[k], bad, NF - 5);
        /* vm_round_to_half = float(half(x)) */
        memcpy(g, f, 1000 * sizeof(float));
        vm_round_to_half(g, 1000);
        bad = 0;
        for (size_t i = 0; i < 1000; i++) {
            float want = nc_half_to_float(nc_float_to_half(f[i]));
            if (isnan(want) ? !isnan(g[i]) : memcmp(&want, &g[i], sizeof want) != 0)
                bad++;
        }
        CHECKF(bad == 0, "%s round_to_half: %zu of 1000 differ", isas[k], bad);
    }
    vm_set_isa(NULL);
    free(h);
    free(h2);
    free(f);
    free(g);
}

/* Out-of-range ids never read outside the embedding table (they act as unk). */
TEST(out_of_range_token_is_unk)
{
    fixture f;
    if (fixture_open("lstm-2layer", &f) != 0) {
        fixture_close(&f);
        return;
    }
    nc_state *a = lstm_state_new(f.m), *b = lstm_state_new(f.m);
    nc_lstm_work *w = lstm_work_new(f.m);
    lstm_step(f.m, a, 1 << 30, w);
    lstm_step(f.m, b, f.m->unk_id, w);
    CHECK(memcmp(a->h, b->h, (size_t)a->num_layers * a->hidden_size * sizeof(float)) == 0);
    lstm_work_free(w);
    lstm_state_free(a);
    lstm_state_free(b);
    fixture_close(&f);
}

/* The binary16 GEMV of the recurrence against a naive double-precision
 * one, on shapes with row and column tails, in every kernel this CPU has. */
TEST(gemv_f16_matches_naive)
{
    const int shapes[][2] = {{1024, 256}, {64, 16}, {7, 37}, {5, 8}, {4, 3}};
    const char *isas[] = {"avx512", "avx2", "scalar"};
    unsigned seed = 12345;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int R = shapes[si][0], C = shapes[si][1];
        uint16_t *W = malloc((size_t)R * C * sizeof *W);
        float *x = malloc((size_t)C * sizeof *x), *y = malloc((size_t)R * sizeof *y);
        double *want = malloc((size_t)R * sizeof *want), *scale = malloc((size_t)R * sizeof *scale);
        for (size_t i = 0; i < (size_t)R * C; i++) {
            seed = seed * 1103515245u + 12345u;
            W[i] = nc_float_to_half(((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.25f);
        }
        for (int k = 0; k < C; k++)
            x[k] = sinf(0.37f * (float)k);
        for (int r = 0; r < R; r++) {
            want[r] = 0.5 * r;
            scale[r] = 1.0 + 0.5 * r;   /* float32 rounding grows with the magnitudes summed */
            for (int k = 0; k < C; k++) {
                want[r] += (double)nc_half_to_float(W[(size_t)r * C + k]) * x[k];
                scale[r] += fabs((double)nc_half_to_float(W[(size_t)r * C + k]) * x[k]);
            }
        }
        for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
            if (vm_set_isa(isas[a]) != 0)
                continue;
            for (int r = 0; r < R; r++)
                y[r] = 0.5f * (float)r;   /* y += W x accumulates */
            vm_gemv_f16(W, R, C, x, y);
            double worst = 0;
            for (int r = 0; r < R; r++)
                worst = fmax(worst, fabs(y[r] - want[r]) / scale[r]);
            CHECKF(worst < 1e-6, "%s %dx%d: max relative error %g", isas[a], R, C, worst);
        }
        free(W), free(x), free(y), free(want), free(scale);
    }
    vm_set_isa(NULL);
}

/* An F16 model file gets the binary16 copy of W_hh, an F32 one does not;
 * weights that are no longer halves (a training step) drop it. */
/* vm_gemm_nt / vm_gemm_nn against double sums, in every kernel, on shapes
 * that hit every tile and tail (rows 1..6, n not a multiple of 4 and over
 * the nn block of 2048, k a vector multiple or not). Bound: a float32 sum
 * of m terms in any order (FMA or not) is within gamma_m * sum |terms| of
 * the exact one, gamma_m = m u / (1 - m u), u = 2^-24 (Higham eq. 3.4);
 * m = k + 1 for nt (the k products and y's start value), n for nn. */
TEST(decoder_gemm_small_matches_naive)
{
    const char *isas[] = {"avx512", "avx2", "scalar"};
    const int shapes[][3] = {{1, 5, 8}, {2, 4, 16}, {3, 9, 24}, {5, 2051, 32}, {6, 4099, 40}, {4, 37, 19}, {20, 301, 256}};
    const double u = 1.0 / 16777216.0;
    unsigned rs = 11;
    for (int a = 0; a < 3; a++) {
        if (vm_set_isa(isas[a]) != 0)
            continue;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int R = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            float *x = malloc((size_t)R * K * sizeof(float)), *w = malloc((size_t)N * K * sizeof(float));
            float *p = malloc((size_t)R * N * sizeof(float)), *y = malloc((size_t)R * N * sizeof(float));
            float *z = malloc((size_t)R * K * sizeof(float));
            for (size_t i = 0; i < (size_t)R * K; i++)
                x[i] = ((float)((rs = rs * 1103515245u + 12345u) >> 9 & 0xffff) / 65536.0f - 0.5f) * 4.0f;
            for (size_t i = 0; i < (size_t)N * K; i++)
                w[i] = ((float)((rs = rs * 1103515245u + 12345u) >> 9 & 0xffff) / 65536.0f - 0.5f);
            for (size_t i = 0; i < (size_t)R * N; i++) {
                p[i] = ((float)((rs = rs * 1103515245u + 12345u) >> 9 & 0xffff) / 65536.0f - 0.5f);
                y[i] = (float)i * 0.25f;   /* nt accumulates into y */
            }
            vm_gemm_nt(x, w, y, R, N, K);
            vm_gemm_nn(p, w, z, R, N, K);
            double worst = 0;
            const double gk = (K + 1) * u / (1 - (K + 1) * u), gn = N * u / (1 - N * u);
            for (int r = 0; r < R; r++) {
                for (int j = 0; j < N; j++) {
                    double e = (double)(r * N + j) * 0.25, mag = fabs(e);
                    for (int i = 0; i < K; i++) {
                        double t = (double)x[r * K + i] * w[(size_t)j * K + i];
                        e += t, mag += fabs(t);
                    }
                    double d = fabs(y[(size_t)r * N + j] - e) / (gk * mag + 1e-30);
                    worst = d > worst ? d : worst;
                }
                for (int c = 0; c < K; c++) {
                    double e = 0, mag = 0;
                    for (int j = 0; j < N; j++) {
                        double t = (double)p[(size_t)r * N + j] * w[(size_t)j * K + c];
                        e += t, mag += fabs(t);
                    }
                    double d = fabs(z[r * K + c] - e) / (gn * mag + 1e-30);
                    worst = d > worst ? d : worst;
                }
            }
            CHECKF(worst <= 1.0, "%s %dx%dx%d: error %.3g of the bound", isas[a], R, N, K, worst);
            /* a row of w gives the same bits wherever it sits (rows 1..N-1
             * again, one place earlier; x row 0 alone) */
            float *y2 = calloc((size_t)N, sizeof(float)), *y3 = calloc((size_t)N, sizeof(float));
            vm_gemm_nt(x, w, y2, 1, N, K);
            vm_gemm_nt(x, w + K, y3, 1, N - 1, K);
            size_t moved = 0;
            for (int j = 1; j < N; j++)
                moved += y2[j] != y3[j - 1];
            CHECKF(moved == 0, "%s %dx%dx%d: %zu dots change with their row's place", isas[a], R, N, K, moved);
            /* and a row of x alone (a lone tile) gives the batch's bits */
            for (int r = 0; r < R; r++) {
                for (int j = 0; j < N; j++)
                    y2[j] = (float)(r * N + j) * 0.25f;
                vm_gemm_nt(x + (size_t)r * K, w, y2, 1, N, K);
                moved += memcmp(y2, y + (size_t)r * N, (size_t)N * sizeof(float)) != 0;
            }
            CHECKF(moved == 0, "%s %dx%dx%d: %zu rows change alone", isas[a], R, N, K, moved);
            free(y2), free(y3);
            free(x), free(w), free(p), free(y), free(z);
        }
    }
    vm_set_isa(NULL);
}

/* vm_gemm_nt_f16 (the decoder's binary16 copy) against double sums of the
 * same products, in every kernel, on shapes that hit every tile and tail
 * (rows 1..9: pairs and a lone last row; n not a multiple of 4 or 8; k a
 * multiple of 16, of 8 only (AVX-512 hands it to AVX2), or of neither
 * (scalar)). Bound as vm_gemm_nt's: gamma_{k+1} * sum |terms| (vmath.h).
 * Batch invariance, exactly: every row computed alone, the rows after the
 * first as a batch of their own, and w's rows one place earlier give the
 * same bits as the whole batch. */
TEST(decoder_f16_matches_naive_and_is_batch_invariant)
{
    const char *isas[] = {"avx512", "avx2", "scalar"};
    const int shapes[][3] = {{1, 5, 16}, {2, 4, 16}, {3, 9, 24}, {5, 2051, 32}, {7, 37, 19}, {9, 301, 256},
                             {4, 13, 48}, {1, 10000, 256}};
    const double u = 1.0 / 16777216.0;
    unsigned rs = 29;
    for (int a = 0; a < 3; a++) {
        if (vm_set_isa(isas[a]) != 0)
            continue;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int R = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            float *x = malloc((size_t)R * K * sizeof(float)), *y = malloc((size_t)R * N * sizeof(float));
            float *y1 = malloc((size_t)R * N * sizeof(float));
            uint16_t *w = malloc((size_t)N * K * sizeof(uint16_t));
            for (size_t i = 0; i < (size_t)R * K; i++)
                x[i] = ((float)((rs = rs * 1103515245u + 12345u) >> 9 & 0xffff) / 65536.0f - 0.5f) * 4.0f;
            for (size_t i = 0; i < (size_t)N * K; i++)
                w[i] = nc_float_to_half((float)((rs = rs * 1103515245u + 12345u) >> 9 & 0xffff) / 65536.0f - 0.5f);
            for (size_t i = 0; i < (size_t)R * N; i++)
                y[i] = y1[i] = (float)(i % 97) * 0.25f;   /* accumulates into y: the bias */
            vm_gemm_nt_f16(x, w, y, R, N, K);
            double worst = 0;
            const double gk = (K + 1) * u / (1 - (K + 1) * u);
            for (int r = 0; r < R; r++)
                for (int j = 0; j < N; j++) {
                    double e = (double)((r * N + j) % 97) * 0.25, mag = fabs(e);
                    for (int i = 0; i < K; i++) {
                        double t = (double)x[r * K + i] * nc_half_to_float(w[(size_t)j * K + i]);
                        e += t, mag += fabs(t);
                    }
                    double d = fabs(y[(size_t)r * N + j] - e) / (gk * mag + 1e-30);
                    worst = d > worst ? d : worst;
                }
            CHECKF(worst <= 1.0, "%s %dx%dx%d: error %.3g of the bound", isas[a], R, N, K, worst);
            size_t moved = 0;
            for (int r = 0; r < R; r++) {   /* each row alone */
                vm_gemm_nt_f16(x + (size_t)r * K, w, y1 + (size_t)r * N, 1, N, K);
                moved += memcmp(y1 + (size_t)r * N, y + (size_t)r * N, (size_t)N * sizeof(float)) != 0;
            }
            if (R > 1) {   /* rows 1.. as a batch (pairs shift by one) */
                for (size_t i = (size_t)N; i < (size_t)R * N; i++)
                    y1[i] = (float)(i % 97) * 0.25f;
                vm_gemm_nt_f16(x + K, w, y1 + N, R - 1, N, K);
                moved += memcmp(y1 + N, y + N, (size_t)(R - 1) * N * sizeof(float)) != 0;
            }
            float *y3 = malloc((size_t)R * N * sizeof(float));
            for (int r = 0; r < R; r++)   /* w's rows 1.. one place earlier */
                for (int j = 1; j < N; j++)
                    y3[(size_t)r * (N - 1) + j - 1] = (float)((r * N + j) % 97) * 0.25f;
            if (N > 1)
                vm_gemm_nt_f16(x, w + K, y3, R, N - 1, K);
            for (int r = 0; N > 1 && r < R; r++)
                for (int j = 1; j < N; j++)
                    moved += y3[(size_t)r * (N - 1) + j - 1] != y[(size_t)r * N + j];
            CHECKF(moved == 0, "%s %dx%dx%d: %zu rows or dots change with the batch", isas[a], R, N, K, moved);
            free(x), free(y), free(y1), free(y3), free(w);
        }
    }
    vm_set_isa(NULL);
}

TEST(w_hh_f16_copy_only_when_exact)
{
    fixture f16, f32;
    if (fixture_open("lstm-2layer-f16", &f16) != 0 || fixture_open("lstm-2layer", &f32) != 0)
        return;
    for (int k = 0; k < f16.m->cfg.num_layers; k++) {
        CHECK(f16.m->layers[k].w_hh_f16 != NULL);
        CHECK(f32.m->layers[k].w_hh_f16 == NULL);
    }
    /* W_ih and the decoder the same way */
    CHECK(f16.m->decoder_f16 != NULL && f32.m->decoder_f16 == NULL);
    CHECK(f16.m->layers[0].w_ih_f16 != NULL && f32.m->layers[0].w_ih_f16 == NULL);
    nc_lstm_layer *ly = &f16.m->layers[0];
    ly->w_hh[5] += 1e-4f * (1.0f + fabsf(ly->w_hh[5]));
    model_refresh_derived(f16.m);
    CHECK(ly->w_hh_f16 == NULL);
    CHECK(f16.m->layers[1].w_hh_f16 != NULL);
    CHECK(ly->w_ih_f16 != NULL && f16.m->decoder_f16 != NULL);
    /* the copy serves the decoder: its logits are the widened weights'
     * within vm_gemm_nt's reordering; a weight off the half grid drops it */
    const int V = f16.m->cfg.vocab_size, H = f16.m->cfg.hidden_size;
    float *h = malloc((size_t)H * sizeof(float)), *l16 = malloc((size_t)V * sizeof(float));
    float *l32 = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < H; i++)
        h[i] = sinf(0.7f * (float)i);
    lstm_logits(f16.m, h, l16);
    const uint16_t *keep = f16.m->decoder_f16;
    f16.m->decoder_f16 = NULL;
    lstm_logits(f16.m, h, l32);
    f16.m->decoder_f16 = keep;
    double worst = 0;
    for (int j = 0; j < V; j++) {
        double mag = fabs(f16.m->decoder_b[j]);
        for (int i = 0; i < H; i++)
            mag += fabs((double)f16.m->decoder_w[(size_t)j * H + i] * h[i]);
        /* each within gamma_{H+1} * mag of the exact sum (vmath.h) */
        const double g = (H + 1) / 16777216.0 / (1 - (H + 1) / 16777216.0);
        worst = fmax(worst, fabs((double)l16[j] - l32[j]) / (2 * g * mag + 1e-30));
    }
    CHECKF(worst <= 1.0, "binary16 decoder vs float32: %.3g of the bound", worst);
    f16.m->decoder_w[7] += 1e-4f * (1.0f + fabsf(f16.m->decoder_w[7]));
    f16.m->layers[1].w_ih[3] += 1e-4f * (1.0f + fabsf(f16.m->layers[1].w_ih[3]));
    model_refresh_derived(f16.m);
    CHECK(f16.m->decoder_f16 == NULL && f16.m->layers[1].w_ih_f16 == NULL && ly->w_ih_f16 != NULL);
    free(h), free(l16), free(l32);
    fixture_close(&f16);
    fixture_close(&f32);
}

/* NEUROCACHE_SIMD: each supported level can be forced, an unknown or
 * unsupported one is refused with a message naming the variable. */
TEST(simd_level_selection)
{
    const char *saved = getenv(VM_SIMD_ENV);
    char keep[32] = "", err[NC_ERRLEN];
    if (saved)
        snprintf(keep, sizeof keep, "%s", saved);
    const char *levels[] = {"scalar", "avx2", "avx512"};
    const char *supported = vm_isa_supported();
    for (int k = 0; k < 3; k++) {
        setenv(VM_SIMD_ENV, levels[k], 1);
        bool have = strstr(supported, levels[k]) != NULL;
        int rc = vm_simd_init(err, sizeof err);
        CHECKF(have ? rc == NC_OK : rc == NC_EINVAL, "%s: rc %d (%s)", levels[k], rc, err);
        if (have)
            CHECK(!strcmp(vm_isa(), levels[k]));
        else
            CHECK(strstr(err, "this CPU supports") != NULL);
    }
    setenv(VM_SIMD_ENV, "sse9", 1);
    CHECK(vm_simd_init(err, sizeof err) == NC_EINVAL);
    CHECKF(strstr(err, "NEUROCACHE_SIMD=sse9: expected scalar, avx2 or avx512") != NULL, "%s", err);
    CHECK(vm_set_isa("sse9") == NC_EINVAL);
    if (saved)
        setenv(VM_SIMD_ENV, keep, 1);
    else
        unsetenv(VM_SIMD_ENV);
    CHECK(vm_simd_init(err, sizeof err) == NC_OK);
}

/* tolerance.h derives TOL_FIXTURE_PATHS from the fixtures' sizes and
 * magnitudes: H, E <= 16, every weight and bias within +-0.61 (0.6 rounded
 * to binary16 in the F16 fixture is 0.6001), every matrix
 * row's l1 norm <= 7. A new fixture outside them needs its own bound. */
static double max_abs(const float *w, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(w[i]));
    return m;
}
static double max_row_l1(const float *w, int rows, int cols)
{
    double m = 0;
    for (int r = 0; r < rows; r++) {
        double l1 = 0;
        for (int k = 0; k < cols; k++)
            l1 += fabs(w[(size_t)r * cols + k]);
        m = fmax(m, l1);
    }
    return m;
}
TEST(fixture_magnitudes_as_tolerance_assumes)
{
    const char *names[] = {"lstm-2layer", "lstm-2layer-f16", "lstm-1layer-tied"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        fixture f;
        if (fixture_open(names[i], &f) != 0)
            continue;
        const nc_model *m = f.m;
        int H = m->cfg.hidden_size, V = m->cfg.vocab_size, E = m->cfg.embedding_size;
        double w = fmax(max_abs(m->encoder, (size_t)V * E), max_abs(m->decoder_w, (size_t)V * H));
        w = fmax(w, max_abs(m->decoder_b, (size_t)V));
        double l1 = max_row_l1(m->decoder_w, V, H);
        for (int k = 0; k < m->cfg.num_layers; k++) {
            const nc_lstm_layer *ly = &m->layers[k];
            w = fmax(w, fmax(max_abs(ly->w_ih, (size_t)4 * H * ly->input_size), max_abs(ly->w_hh, (size_t)4 * H * H)));
            w = fmax(w, fmax(max_abs(ly->b_ih, (size_t)4 * H), max_abs(ly->b_hh, (size_t)4 * H)));
            l1 = fmax(l1, fmax(max_row_l1(ly->w_ih, 4 * H, ly->input_size), max_row_l1(ly->w_hh, 4 * H, H)));
        }
        CHECKF(H <= 16 && E <= 16 && w <= 0.61 && l1 <= 7, "%s: H %d E %d max|w| %g max row l1 %g", names[i], H, E,
               w, l1);
        fixture_close(&f);
    }
}

int main(void)
{
    RUN(reference_step_path);
    RUN(reference_batched_path);
    RUN(batched_equals_step_across_blocks);
    RUN(state_copy_reset_blob);
    RUN(logsumexp_matches_naive);
    RUN(out_of_range_token_is_unk);
    RUN(vmath_kernels_match_libm);
    RUN(vmath_half_conversions_match_portable);
    RUN(gemv_f16_matches_naive);
    RUN(decoder_gemm_small_matches_naive);
    RUN(decoder_f16_matches_naive_and_is_batch_invariant);
    RUN(w_hh_f16_copy_only_when_exact);
    RUN(simd_level_selection);
    RUN(fixture_magnitudes_as_tolerance_assumes);
    return harness_summary();
}
