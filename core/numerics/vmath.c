/* vmath.c -- vectorised exp, sigmoid, tanh and log-sum-exp (run-time ISA
 * dispatch). The decoder's normaliser evaluates V exponentials per scored
 * token, so libm's scalar expf would cost as much as the decoder GEMM. */
#include "vmath.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cpuid.h>
#include <immintrin.h>
#include <stdbool.h>

#include "nc_common.h"

/* exp(x) = 2^n e^r with n = round(x log2 e), r = x - n ln2 (ln2 split in a
 * high and a low part so r is exact enough), and e^r from its degree-6
 * Taylor polynomial on |r| <= ln2/2 (truncation error < 1.3e-7 relative).
 * Inputs are clamped to [EXP_LO, EXP_HI] so 2^n stays a normal float. */
#define EXP_LO (-86.5f)
#define EXP_HI (88.3f)
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693145751953125f
#define LN2_LO 1.42860682030941723e-6f
#define P6 (1.0f / 720.0f)
#define P5 (1.0f / 120.0f)
#define P4 (1.0f / 24.0f)
#define P3 (1.0f / 6.0f)
#define P2 0.5f

/* ---- scalar ---------------------------------------------------------- */

static float lse_scalar(const float *x, size_t n, float mx)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += expf(x[i] - mx);
    return mx + (float)log(sum);
}

static void sigmoid_scalar(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f / (1.0f + expf(-x[i]));
}

static void tanh_scalar(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = tanhf(x[i]);
}

/* ---- AVX-512 --------------------------------------------------------- */

__attribute__((target("avx512f"))) static inline __m512 exp512(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(P6);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f"))) static float lse_avx512(const float *x, size_t n, float mx)
{
    __m512 m = _mm512_set1_ps(mx), acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_add_ps(acc0, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m)));
        acc1 = _mm512_add_ps(acc1, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), m)));
    }
    for (; i + 16 <= n; i += 16)
        acc0 = _mm512_add_ps(acc0, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m)));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
        acc1 = _mm512_add_ps(acc1, _mm512_maskz_mov_ps(k, e));
    }
    double sum = (double)_mm512_reduce_add_ps(acc0) + (double)_mm512_reduce_add_ps(acc1);
    return mx + (float)log(sum);
}

__attribute__((target("avx512f"))) static float max_avx512(const float *x, size_t n)
{
    /* four chains: one max per cycle instead of one per max latency */
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(x + i + 32));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(x + i + 48));
    }
    for (; i + 16 <= n; i += 16)
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* y[i] = exp(x[i] - m); the sum accumulated in double lanes. */
__attribute__((target("avx512f"))) static double expsum_avx512(float *y, const float *x, size_t n, float mx)
{
    __m512 m = _mm512_set1_ps(mx);
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m)));
        _mm512_mask_storeu_ps(y + i, k, e);
        acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc1 = _mm512_add_pd(acc1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
}

/* e_i = exp(θ d_i - s), Σ e_i and Σ_{vals_i = x} e_i in one pass (the
 * neural cache's window): the match is a vector compare and masked add. */
__attribute__((target("avx512f"))) static double cachesum_avx512(float *y, const float *d, const int *vals,
                                                                 size_t n, float theta, float s, int x,
                                                                 double *match)
{
    const __m512 th = _mm512_set1_ps(theta), ns = _mm512_set1_ps(-s);
    const __m512i xv = _mm512_set1_epi32(x);
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    __m512 hit = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_fmadd_ps(th, _mm512_maskz_loadu_ps(k, d + i), ns)));
        if (y)
            _mm512_mask_storeu_ps(y + i, k, e);
        __mmask16 eq = _mm512_mask_cmpeq_epi32_mask(k, _mm512_maskz_loadu_epi32(k, vals + i), xv);
        hit = _mm512_mask_add_ps(hit, eq, hit, e);
        acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc1 = _mm512_add_pd(acc1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    *match = (double)_mm512_reduce_add_ps(hit);
    return _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
}

/* binary16 <-> float32 with the CPU's converters (round to nearest even,
 * as nc_float_to_half), 16 at a time. */
__attribute__((target("avx512f"))) static void h2f_avx512(const uint16_t *h, float *f, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(f + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    for (; i < n; i++)
        f[i] = nc_half_to_float(h[i]);
}

__attribute__((target("avx512f"))) static void f2h_avx512(const float *f, uint16_t *h, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(h + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        h[i] = nc_float_to_half(f[i]);
}

/* sigmoid(x) = 1 / (1 + e^-x); tanh(x) = 1 - 2 / (e^{2x} + 1). */
__attribute__((target("avx512f"))) static void act_avx512(float *x, size_t n, int tanh_mode)
{
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    const __m512 s = _mm512_set1_ps(tanh_mode ? 2.0f : -1.0f);
    size_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __m512 e = exp512(_mm512_mul_ps(v, s));
        __m512 y = tanh_mode ? _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(e, one)))
                             : _mm512_div_ps(one, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(x + i, k, y);
    }
}

/* ---- AVX2 + FMA ------------------------------------------------------ */

__attribute__((target("avx2,fma"))) static inline __m256 exp256(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(P6);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n through the exponent field: n in [-125, 127] keeps it normal. */
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

__attribute__((target("avx2,fma"))) static float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static float lse_avx2(const float *x, size_t n, float mx)
{
    __m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_add_ps(acc, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
    double sum = hsum256(acc);
    for (; i < n; i++)
        sum += expf(x[i] - mx);
    return mx + (float)log(sum);
}

__attribute__((target("avx2,fma"))) static double expsum_avx2(float *y, const float *x, size_t n, float mx)
{
    __m256 m = _mm256_set1_ps(mx);
    __m256d acc = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(y + i, e);
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double t[4];
    _mm256_storeu_pd(t, acc);
    double sum = t[0] + t[1] + t[2] + t[3];
    for (; i < n; i++)
        sum += (y[i] = expf(x[i] - mx));
    return sum;
}

__attribute__((target("avx2,fma,f16c"))) static void h2f_avx2(const uint16_t *h, float *f, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++)
        f[i] = nc_half_to_float(h[i]);
}

__attribute__((target("avx2,fma,f16c"))) static void f2h_avx2(const float *f, uint16_t *h, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        h[i] = nc_float_to_half(f[i]);
}

/* The scalar kernel of vm_cache_exp_sum, also the AVX2 kernel's tail. */
static double cachesum_scalar(float *y, const float *d, const int *vals, size_t n, float theta, float s, int x,
                              double *match)
{
    double sum = 0.0, mt = 0.0;
    for (size_t i = 0; i < n; i++) {
        float e = expf(fmaf(theta, d[i], -s));
        if (y)
            y[i] = e;
        sum += e;
        if (vals[i] == x)
            mt += e;
    }
    *match = mt;
    return sum;
}

__attribute__((target("avx2,fma"))) static double cachesum_avx2(float *y, const float *d, const int *vals,
                                                              size_t n, float theta, float s, int x,
                                                              double *match)
{
    const __m256 th = _mm256_set1_ps(theta), ns = _mm256_set1_ps(-s);
    const __m256i xv = _mm256_set1_epi32(x);
    __m256d acc = _mm256_setzero_pd();
    __m256 hit = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_fmadd_ps(th, _mm256_loadu_ps(d + i), ns));
        if (y)
            _mm256_storeu_ps(y + i, e);
        __m256i eq = _mm256_cmpeq_epi32(_mm256_loadu_si256((const __m256i *)(vals + i)), xv);
        hit = _mm256_add_ps(hit, _mm256_and_ps(e, _mm256_castsi256_ps(eq)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double t[4];
    _mm256_storeu_pd(t, acc);
    double tail_match, sum = t[0] + t[1] + t[2] + t[3];
    sum += cachesum_scalar(y ? y + i : NULL, d + i, vals + i, n - i, theta, s, x, &tail_match);
    *match = hsum256(hit) + tail_match;
    return sum;
}

__attribute__((target("avx2,fma"))) static void act_avx2(float *x, size_t n, int tanh_mode)
{
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 s = _mm256_set1_ps(tanh_mode ? 2.0f : -1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_mul_ps(_mm256_loadu_ps(x + i), s));
        __m256 y = tanh_mode ? _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)))
                             : _mm256_div_ps(one, _mm256_add_ps(one, e));
        _mm256_storeu_ps(x + i, y);
    }
    if (tanh_mode)
        tanh_scalar(x + i, n - i);
    else
        sigmoid_scalar(x + i, n - i);
}

/* ---- y += W x with W in binary16 (the LSTM recurrence) ----------------- */

/* Four rows at a time share each load of x; one accumulator per row, summed
 * across lanes at the end. The vector kernels take whole vectors of columns
 * (H = 256, any multiple of 16); other shapes and the last rows go scalar. */
static void gemv_f16_scalar(const uint16_t *W, int rows, int cols, const float *x, float *y)
{
    for (int r = 0; r < rows; r++) {
        const uint16_t *w = W + (size_t)r * cols;
        float acc = 0.0f;
        for (int k = 0; k < cols; k++)
            acc += nc_half_to_float(w[k]) * x[k];
        y[r] += acc;
    }
}

__attribute__((target("avx512f"))) static void gemv_f16_avx512(const uint16_t *W, int rows, int cols,
                                                                const float *x, float *y)
{
    int r = 0;
    for (; r + 4 <= rows && cols % 16 == 0; r += 4) {
        const uint16_t *w0 = W + (size_t)r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < cols; k += 16) {
            __m512 xv = _mm512_loadu_ps(x + k);
            a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + k))), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w1 + k))), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w2 + k))), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w3 + k))), xv, a3);
        }
        y[r] += _mm512_reduce_add_ps(a0);
        y[r + 1] += _mm512_reduce_add_ps(a1);
        y[r + 2] += _mm512_reduce_add_ps(a2);
        y[r + 3] += _mm512_reduce_add_ps(a3);
    }
    if (r < rows)
        gemv_f16_scalar(W + (size_t)r * cols, rows - r, cols, x, y + r);
}

__attribute__((target("avx2,fma,f16c"))) static void gemv_f16_avx2(const uint16_t *W, int rows, int cols,
                                                                    const float *x, float *y)
{
    int r = 0;
    for (; r + 4 <= rows && cols % 8 == 0; r += 4) {
        const uint16_t *w0 = W + (size_t)r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < cols; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + k);
            a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w0 + k))), xv, a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w1 + k))), xv, a1);
            a2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w2 + k))), xv, a2);
            a3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w3 + k))), xv, a3);
        }
        y[r] += hsum256(a0);
        y[r + 1] += hsum256(a1);
        y[r + 2] += hsum256(a2);
        y[r + 3] += hsum256(a3);
    }
    if (r < rows)
        gemv_f16_scalar(W + (size_t)r * cols, rows - r, cols, x, y + r);
}

/* ---- small-M products against the decoder (dynamic evaluation) ------- */

/* y[r, j] += sum_i x[r, i] w[j, i] and y[r, c] = sum_j p[r, j] w[j, c] for a
 * few rows r against a large row-major w (the decoder, [V, H]): read in
 * place, never copied. OpenBLAS's sgemm packs the whole of w on every call,
 * which for 20 rows costs as much as the product itself. Scalar versions
 * are the plain loops; the vector ones change only the summation order. */
static void gemm_nt_scalar(const float *x, const float *w, float *y, int rows, int n, int k)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int i = 0; i < k; i++)
                acc += x[(size_t)r * k + i] * w[(size_t)j * k + i];
            y[(size_t)r * n + j] += acc;
        }
}

/* gemm_nn's columns [c0, k) (all of them, or a vector kernel's tail) */
typedef struct {
    int rows, n, k, c0;
} nn_shape;

static void gemm_nn_scalar(const float *p, const float *w, float *y, const nn_shape *sh)
{
    const int rows = sh->rows, n = sh->n, k = sh->k, c0 = sh->c0;
    for (int r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * k;
        for (int c = c0; c < k; c++)
            yr[c] = 0.0f;
        for (int j = 0; j < n; j++) {
            const float pj = p[(size_t)r * n + j], *wj = w + (size_t)j * k;
            for (int c = c0; c < k; c++)
                yr[c] += pj * wj[c];
        }
    }
}

/* nt: four rows of w against two rows of x per tile (8 dot products), the
 * rows of x reused from L1 while w streams once. Every dot product, in a
 * tile or in a tail (rows of w or x repeated, their sums dropped), is
 * summed in the same order: a row's result does not depend on where it
 * sits -- a ring of keys read in two runs gives the dots it gives in one. */
__attribute__((target("avx2,fma"))) static __m128 hsum4_256(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

__attribute__((target("avx2,fma"))) static void nt_tile_avx2(const float *x0, const float *x1,
                                                             const float *const w[4], int k, float *y0, float *y1)
{
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int i = 0; i < k; i += 8) {
        __m256 u = _mm256_loadu_ps(x0 + i), v = _mm256_loadu_ps(x1 + i), q;
        q = _mm256_loadu_ps(w0 + i), a0 = _mm256_fmadd_ps(u, q, a0), b0 = _mm256_fmadd_ps(v, q, b0);
        q = _mm256_loadu_ps(w1 + i), a1 = _mm256_fmadd_ps(u, q, a1), b1 = _mm256_fmadd_ps(v, q, b1);
        q = _mm256_loadu_ps(w2 + i), a2 = _mm256_fmadd_ps(u, q, a2), b2 = _mm256_fmadd_ps(v, q, b2);
        q = _mm256_loadu_ps(w3 + i), a3 = _mm256_fmadd_ps(u, q, a3), b3 = _mm256_fmadd_ps(v, q, b3);
    }
    _mm_storeu_ps(y0, _mm_add_ps(_mm_loadu_ps(y0), hsum4_256(a0, a1, a2, a3)));
    _mm_storeu_ps(y1, _mm_add_ps(_mm_loadu_ps(y1), hsum4_256(b0, b1, b2, b3)));
}

/* a lone row of x (a predict's window, a one-word feed): nt_tile_avx2's
 * a-chains alone, the same sums without the b-chains' wasted work */
__attribute__((target("avx2,fma"))) static void nt_tile1_avx2(const float *x0, const float *const w[4], int k,
                                                              float *y0)
{
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < k; i += 8) {
        __m256 u = _mm256_loadu_ps(x0 + i);
        a0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w0 + i), a0), a1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w1 + i), a1);
        a2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w2 + i), a2), a3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w3 + i), a3);
    }
    _mm_storeu_ps(y0, _mm_add_ps(_mm_loadu_ps(y0), hsum4_256(a0, a1, a2, a3)));
}

__attribute__((target("avx2,fma"))) static void gemm_nt_avx2(const float *x, const float *w, float *y, int rows, int n,
                                                             int k)
{
    if (k % 8 != 0) {
        gemm_nt_scalar(x, w, y, rows, n, k);
        return;
    }
    for (int j = 0; j < n; j += 4) {
        const int nw = n - j < 4 ? n - j : 4;
        const float *wr[4];
        for (int q = 0; q < 4; q++)
            wr[q] = w + (size_t)(j + (q < nw ? q : nw - 1)) * k;
        for (int r = 0; r < rows; r += 2) {
            const bool pair = r + 1 < rows;
            float *y0 = y + (size_t)r * n + j, *y1 = pair ? y0 + n : NULL;
            float s0[4] = {0}, s1[4] = {0};
            memcpy(s0, y0, (size_t)nw * sizeof(float));
            if (pair)
                memcpy(s1, y1, (size_t)nw * sizeof(float));
            if (pair)
                nt_tile_avx2(x + (size_t)r * k, x + (size_t)(r + 1) * k, wr, k, s0, s1);
            else
                nt_tile1_avx2(x + (size_t)r * k, wr, k, s0);
            memcpy(y0, s0, (size_t)nw * sizeof(float));
            if (pair)
                memcpy(y1, s1, (size_t)nw * sizeof(float));
        }
    }
}

/* nn: four rows of p times 2 vectors of columns of w per tile, over a block
 * of w's rows (NN_BLOCK_BYTES, contiguous) that stays in L2 while the tiles
 * of the other rows and columns reuse it: w is read from memory once. */
#define NN_BLOCK_BYTES (256 * 1024)
__attribute__((target("avx2,fma"))) static void gemm_nn_avx2(const float *p, const float *w, float *y, int rows, int n,
                                                             int k)
{
    const int kv = k - k % 16, blk = NN_BLOCK_BYTES / (4 * k) > 16 ? NN_BLOCK_BYTES / (4 * k) : 16;
    for (int j0 = 0; j0 < n; j0 += blk) {
        const int j1 = n - j0 < blk ? n : j0 + blk;
        for (int c = 0; c < kv; c += 16)
            for (int r = 0; r < rows; r += 4) {
                const int nr = rows - r < 4 ? rows - r : 4;
                const float *p0 = p + (size_t)r * n, *p1 = p0 + (nr > 1 ? n : 0), *p2 = p0 + (nr > 2 ? 2 * (size_t)n : 0),
                            *p3 = p0 + (nr > 3 ? 3 * (size_t)n : 0);
                float *y0 = y + (size_t)r * k + c, *y1 = y0 + k, *y2 = y1 + k, *y3 = y2 + k;
                /* named accumulators: an array indexed by nr would live on the stack */
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
                if (j0 > 0) {
                    a0 = _mm256_loadu_ps(y0), a1 = _mm256_loadu_ps(y0 + 8);
                    if (nr > 1)
                        b0 = _mm256_loadu_ps(y1), b1 = _mm256_loadu_ps(y1 + 8);
                    if (nr > 2)
                        c0 = _mm256_loadu_ps(y2), c1 = _mm256_loadu_ps(y2 + 8);
                    if (nr > 3)
                        d0 = _mm256_loadu_ps(y3), d1 = _mm256_loadu_ps(y3 + 8);
                }
                for (int j = j0; j < j1; j++) {
                    const float *wj = w + (size_t)j * k + c;
                    __m256 q0 = _mm256_loadu_ps(wj), q1 = _mm256_loadu_ps(wj + 8), e;
                    e = _mm256_broadcast_ss(p0 + j), a0 = _mm256_fmadd_ps(e, q0, a0), a1 = _mm256_fmadd_ps(e, q1, a1);
                    e = _mm256_broadcast_ss(p1 + j), b0 = _mm256_fmadd_ps(e, q0, b0), b1 = _mm256_fmadd_ps(e, q1, b1);
                    e = _mm256_broadcast_ss(p2 + j), c0 = _mm256_fmadd_ps(e, q0, c0), c1 = _mm256_fmadd_ps(e, q1, c1);
                    e = _mm256_broadcast_ss(p3 + j), d0 = _mm256_fmadd_ps(e, q0, d0), d1 = _mm256_fmadd_ps(e, q1, d1);
                }
                _mm256_storeu_ps(y0, a0), _mm256_storeu_ps(y0 + 8, a1);
                if (nr > 1)
                    _mm256_storeu_ps(y1, b0), _mm256_storeu_ps(y1 + 8, b1);
                if (nr > 2)
                    _mm256_storeu_ps(y2, c0), _mm256_storeu_ps(y2 + 8, c1);
                if (nr > 3)
                    _mm256_storeu_ps(y3, d0), _mm256_storeu_ps(y3 + 8, d1);
            }
    }
    const nn_shape tail = {rows, n, k, kv};
    if (kv < k)
        gemm_nn_scalar(p, w, y, &tail);
}

/* ---- the decoder in binary16: batch-invariant rows (issue 26) -------- */

/* y[r, j] += sum_i x[r, i] w[j, i] with w in binary16. Each dot product
 * has one summation order fixed by the level and k alone: accumulator
 * lanes over i in ascending vector steps, one FMA a step, then a fixed
 * horizontal sum -- whichever tile (one row of x or two, any rows of w,
 * rows of w repeated at the tail with their sums dropped) computes it. A
 * row's logits are thus the same bits alone (a lone predict) as in a batch
 * of sessions (the batcher), which is what lets the batcher's rows be the
 * session's memo. */
static void gemm_nt_f16_scalar(const float *x, const uint16_t *w, float *y, int rows, int n, int k)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int i = 0; i < k; i++)
                acc += x[(size_t)r * k + i] * nc_half_to_float(w[(size_t)j * k + i]);
            y[(size_t)r * n + j] += acc;
        }
}

/* rows j .. j+q of w, the last one repeated past n (their sums dropped) */
static void tile_rows_f16(const uint16_t *w, int n, int k, int j, int q, const uint16_t **wr)
{
    for (int t = 0; t < q; t++)
        wr[t] = w + (size_t)(j + t < n ? j + t : n - 1) * k;
}

static void add_dropped(float *y, const float *s, int nw)
{
    for (int t = 0; t < nw; t++)
        y[t] += s[t];
}

#define H8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))

/* one row of x against eight rows of w (eight FMA chains: a lone row is
 * bound by the FMA latency with four) */
__attribute__((target("avx2,fma,f16c"))) static void f16_tile1_avx2(const float *x, const uint16_t *const *w, int k,
                                                                     float *s)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int i = 0; i < k; i += 8) {
        __m256 u = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(u, H8(w[0] + i), a0), a1 = _mm256_fmadd_ps(u, H8(w[1] + i), a1);
        a2 = _mm256_fmadd_ps(u, H8(w[2] + i), a2), a3 = _mm256_fmadd_ps(u, H8(w[3] + i), a3);
        a4 = _mm256_fmadd_ps(u, H8(w[4] + i), a4), a5 = _mm256_fmadd_ps(u, H8(w[5] + i), a5);
        a6 = _mm256_fmadd_ps(u, H8(w[6] + i), a6), a7 = _mm256_fmadd_ps(u, H8(w[7] + i), a7);
    }
    _mm_storeu_ps(s, hsum4_256(a0, a1, a2, a3));
    _mm_storeu_ps(s + 4, hsum4_256(a4, a5, a6, a7));
}

/* two rows of x against four rows of w: each w vector converted once for both */
__attribute__((target("avx2,fma,f16c"))) static void f16_tile2_avx2(const float *x0, const float *x1,
                                                                     const uint16_t *const *w, int k, float *s)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int i = 0; i < k; i += 8) {
        __m256 u = _mm256_loadu_ps(x0 + i), v = _mm256_loadu_ps(x1 + i), q;
        q = H8(w[0] + i), a0 = _mm256_fmadd_ps(u, q, a0), b0 = _mm256_fmadd_ps(v, q, b0);
        q = H8(w[1] + i), a1 = _mm256_fmadd_ps(u, q, a1), b1 = _mm256_fmadd_ps(v, q, b1);
        q = H8(w[2] + i), a2 = _mm256_fmadd_ps(u, q, a2), b2 = _mm256_fmadd_ps(v, q, b2);
        q = H8(w[3] + i), a3 = _mm256_fmadd_ps(u, q, a3), b3 = _mm256_fmadd_ps(v, q, b3);
    }
    _mm_storeu_ps(s, hsum4_256(a0, a1, a2, a3));
    _mm_storeu_ps(s + 4, hsum4_256(b0, b1, b2, b3));
}

/* A level's two tiles; the driver below runs either level's. */
typedef struct {
    void (*one)(const float *x, const uint16_t *const *w, int k, float *s);   /* x against 8 rows of w */
    void (*two)(const float *x0, const float *x1, const uint16_t *const *w, int k, float *s);   /* 2 x 4 */
} f16_tiles;

typedef struct {
    int rows, n, k;
} nt_shape;

/* w is read once for all rows of x: a tile of w (a few KB) stays in L1
 * while every row pair of x passes over it; a last odd row takes eight
 * rows of w at a time. */
static void gemm_nt_f16_tiled(const f16_tiles *t, const float *x, const uint16_t *w, float *y, const nt_shape *sh)
{
    const int rows = sh->rows, n = sh->n, k = sh->k;
    const uint16_t *wr[8];
    float s[8];
    for (int j = 0; j < n; j += 4) {
        const int nw = n - j < 4 ? n - j : 4;
        tile_rows_f16(w, n, k, j, 4, wr);
        int r = 0;
        for (; r + 2 <= rows; r += 2) {
            t->two(x + (size_t)r * k, x + (size_t)(r + 1) * k, wr, k, s);
            add_dropped(y + (size_t)r * n + j, s, nw);
            add_dropped(y + (size_t)(r + 1) * n + j, s + 4, nw);
        }
        if (r < rows && j % 8 == 0) {
            const int nw8 = n - j < 8 ? n - j : 8;
            tile_rows_f16(w, n, k, j, 8, wr);
            t->one(x + (size_t)r * k, wr, k, s);
            add_dropped(y + (size_t)r * n + j, s, nw8);
        }
    }
}

static void gemm_nt_f16_avx2(const float *x, const uint16_t *w, float *y, int rows, int n, int k)
{
    static const f16_tiles tiles = {f16_tile1_avx2, f16_tile2_avx2};
    const nt_shape sh = {rows, n, k};
    if (k % 8 != 0)
        gemm_nt_f16_scalar(x, w, y, rows, n, k);
    else
        gemm_nt_f16_tiled(&tiles, x, w, y, &sh);
}
#undef H8

#define H16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))

__attribute__((target("avx512f"))) static void f16_tile1_avx512(const float *x, const uint16_t *const *w, int k,
                                                                 float *s)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int i = 0; i < k; i += 16) {
        __m512 u = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(u, H16(w[0] + i), a0), a1 = _mm512_fmadd_ps(u, H16(w[1] + i), a1);
        a2 = _mm512_fmadd_ps(u, H16(w[2] + i), a2), a3 = _mm512_fmadd_ps(u, H16(w[3] + i), a3);
        a4 = _mm512_fmadd_ps(u, H16(w[4] + i), a4), a5 = _mm512_fmadd_ps(u, H16(w[5] + i), a5);
        a6 = _mm512_fmadd_ps(u, H16(w[6] + i), a6), a7 = _mm512_fmadd_ps(u, H16(w[7] + i), a7);
    }
    s[0] = _mm512_reduce_add_ps(a0), s[1] = _mm512_reduce_add_ps(a1), s[2] = _mm512_reduce_add_ps(a2);
    s[3] = _mm512_reduce_add_ps(a3), s[4] = _mm512_reduce_add_ps(a4), s[5] = _mm512_reduce_add_ps(a5);
    s[6] = _mm512_reduce_add_ps(a6), s[7] = _mm512_reduce_add_ps(a7);
}

__attribute__((target("avx512f"))) static void f16_tile2_avx512(const float *x0, const float *x1,
                                                                 const uint16_t *const *w, int k, float *s)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int i = 0; i < k; i += 16) {
        __m512 u = _mm512_loadu_ps(x0 + i), v = _mm512_loadu_ps(x1 + i), q;
        q = H16(w[0] + i), a0 = _mm512_fmadd_ps(u, q, a0), b0 = _mm512_fmadd_ps(v, q, b0);
        q = H16(w[1] + i), a1 = _mm512_fmadd_ps(u, q, a1), b1 = _mm512_fmadd_ps(v, q, b1);
        q = H16(w[2] + i), a2 = _mm512_fmadd_ps(u, q, a2), b2 = _mm512_fmadd_ps(v, q, b2);
        q = H16(w[3] + i), a3 = _mm512_fmadd_ps(u, q, a3), b3 = _mm512_fmadd_ps(v, q, b3);
    }
    s[0] = _mm512_reduce_add_ps(a0), s[1] = _mm512_reduce_add_ps(a1), s[2] = _mm512_reduce_add_ps(a2);
    s[3] = _mm512_reduce_add_ps(a3), s[4] = _mm512_reduce_add_ps(b0), s[5] = _mm512_reduce_add_ps(b1);
    s[6] = _mm512_reduce_add_ps(b2), s[7] = _mm512_reduce_add_ps(b3);
}
#undef H16

/* 16-lane tiles; other k go to the AVX2 ones (k alone decides, so still
 * one order a result) */
static void gemm_nt_f16_avx512(const float *x, const uint16_t *w, float *y, int rows, int n, int k)
{
    static const f16_tiles tiles = {f16_tile1_avx512, f16_tile2_avx512};
    const nt_shape sh = {rows, n, k};
    if (k % 16 != 0)
        gemm_nt_f16_avx2(x, w, y, rows, n, k);
    else
        gemm_nt_f16_tiled(&tiles, x, w, y, &sh);
}

/* ---- dispatch -------------------------------------------------------- */

/* ---- double-precision exp of the unbounded kernel (vm_gauss_d2) ---- */

/* exp(x) in double, the same bits at every level (gauss_avx512/avx2/plain
 * below: the same operations in the same order, lane by lane; C11 fuses no
 * multiply-add): 2^n e^r with n = rint(x log2 e) (by the 1.5 2^52 shift),
 * r = x - n ln2 in two parts (Cody and Waite; ln2_hi has 32 significant
 * bits, so n ln2_hi is exact for |n| < 2^21), 2^n from n's bits (the shifted
 * sum's low bits are n: + 1023, << 52 drops the rest), e^r by its Taylor series to
 * r^13 in Horner's form (|r| <= ln2/2: truncation < 0.347^14/14! = 4e-18,
 * the rounding of 13 steps a few 2^-53): relative error < 1e-15 against
 * libm's exp, far below what the tests' references resolve. x < -708
 * gives 0 (libm: at most 3.3e-308, subnormal below -708.4; the weights are summed with
 * O(1) ones), NaN gives NaN. Domain x <= 709 (2^n's exponent field);
 * vm_gauss_d2 passes a Gaussian kernel's -u²/2 <= 0. (Double precision and
 * one set of bits at every level: the unbounded cache's kernel weights,
 * where 1,024 neighbours' tiny weights are summed.) */
#define EXPD_SHIFT 6755399441055744.0   /* 1.5 2^52: x + it rounds x to an integer, ties to even */
static const double expd_c[14] = {1.0,
                                    1.0,
                                    1.0 / 2,
                                    1.0 / 6,
                                    1.0 / 24,
                                    1.0 / 120,
                                    1.0 / 720,
                                    1.0 / 5040,
                                    1.0 / 40320,
                                    1.0 / 362880,
                                    1.0 / 3628800,
                                    1.0 / 39916800,
                                    1.0 / 479001600,
                                    1.0 / 6227020800.0};
static const double EXPD_LOG2E = 1.4426950408889634, EXPD_LN2_HI = 6.93147180369123816490e-01,
                    EXPD_LN2_LO = 1.90821492927058770002e-10;

static double exp_d(double x)
{
    if (!(x >= VM_EXP_D_MIN))
        return x != x ? x : 0.0;
    double n = (x * EXPD_LOG2E + EXPD_SHIFT) - EXPD_SHIFT;
    double r = (x - n * EXPD_LN2_HI) - n * EXPD_LN2_LO, p = expd_c[13];
    for (int i = 12; i >= 0; i--)
        p = p * r + expd_c[i];
    uint64_t bits = (uint64_t)((int64_t)n + 1023) << 52;
    double s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
}

/* One chunk's Gaussian weights (θ > 0): w[i] = exp(-u²/2), u² = max(d2[i],
 * 0) / θ², 0 where skip[i] < 0; the same operations at each level */
typedef struct {
    const float *d2;
    const int *skip;               /* < 0: no neighbour, weight 0 */
    int n;
    double theta2;
    double *w;
} gauss_job;

static void gauss_plain(const gauss_job *j, int i)
{
    for (; i < j->n; i++) {
        double u2 = (j->d2[i] > 0.0f ? j->d2[i] : 0.0) / j->theta2;
        j->w[i] = j->skip[i] < 0 ? 0.0 : exp_d(-0.5 * u2);
    }
}

__attribute__((target("avx2"))) static void gauss_avx2(const gauss_job *j)
{
    const __m256d shift = _mm256_set1_pd(EXPD_SHIFT), lo = _mm256_set1_pd(VM_EXP_D_MIN), t2 = _mm256_set1_pd(j->theta2);
    int i = 0;
    for (; i + 4 <= j->n; i += 4) {
        __m256d d = _mm256_max_pd(_mm256_cvtps_pd(_mm_loadu_ps(j->d2 + i)), _mm256_setzero_pd());
        __m256d v = _mm256_mul_pd(_mm256_set1_pd(-0.5), _mm256_div_pd(d, t2));
        __m256d ok = _mm256_cmp_pd(v, lo, _CMP_GE_OQ), vc = _mm256_max_pd(v, lo);
        __m256d nn = _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(vc, _mm256_set1_pd(EXPD_LOG2E)), shift), shift);
        __m256d r = _mm256_sub_pd(_mm256_sub_pd(vc, _mm256_mul_pd(nn, _mm256_set1_pd(EXPD_LN2_HI))),
                                  _mm256_mul_pd(nn, _mm256_set1_pd(EXPD_LN2_LO)));
        __m256d p = _mm256_set1_pd(expd_c[13]);
        for (int c = 12; c >= 0; c--)
            p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(expd_c[c]));
        __m256i e = _mm256_slli_epi64(
            _mm256_add_epi64(_mm256_castpd_si256(_mm256_add_pd(nn, shift)), _mm256_set1_epi64x(1023)), 52);
        __m128i neg = _mm_cmplt_epi32(_mm_loadu_si128((const __m128i *)(j->skip + i)), _mm_setzero_si128());
        ok = _mm256_andnot_pd(_mm256_castsi256_pd(_mm256_cvtepi32_epi64(neg)), ok);
        _mm256_storeu_pd(j->w + i, _mm256_and_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(e)), ok));
    }
    gauss_plain(j, i);
}

__attribute__((target("avx512f"))) static void gauss_avx512(const gauss_job *j)
{
    const __m512d shift = _mm512_set1_pd(EXPD_SHIFT), lo = _mm512_set1_pd(VM_EXP_D_MIN), t2 = _mm512_set1_pd(j->theta2);
    int i = 0;
    for (; i + 8 <= j->n; i += 8) {
        __m512d d = _mm512_max_pd(_mm512_cvtps_pd(_mm256_loadu_ps(j->d2 + i)), _mm512_setzero_pd());
        __m512d v = _mm512_mul_pd(_mm512_set1_pd(-0.5), _mm512_div_pd(d, t2));
        __mmask8 ok = _mm512_cmp_pd_mask(v, lo, _CMP_GE_OQ);
        __m512d vc = _mm512_max_pd(v, lo);
        __m512d nn = _mm512_sub_pd(_mm512_add_pd(_mm512_mul_pd(vc, _mm512_set1_pd(EXPD_LOG2E)), shift), shift);
        __m512d r = _mm512_sub_pd(_mm512_sub_pd(vc, _mm512_mul_pd(nn, _mm512_set1_pd(EXPD_LN2_HI))),
                                  _mm512_mul_pd(nn, _mm512_set1_pd(EXPD_LN2_LO)));
        __m512d p = _mm512_set1_pd(expd_c[13]);
        for (int c = 12; c >= 0; c--)
            p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(expd_c[c]));
        __m512i e = _mm512_slli_epi64(
            _mm512_add_epi64(_mm512_castpd_si512(_mm512_add_pd(nn, shift)), _mm512_set1_epi64(1023)), 52);
        /* (AVX-512F alone: the 8 skip entries compared in a 512-bit register's low half) */
        ok &= (__mmask8)_mm512_cmp_epi32_mask(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(j->skip + i))),
                                              _mm512_setzero_si512(), _MM_CMPINT_NLT);
        _mm512_storeu_pd(j->w + i, _mm512_maskz_mov_pd(ok, _mm512_mul_pd(p, _mm512_castsi512_pd(e))));
    }
    gauss_plain(j, i);
}

typedef enum { ISA_UNKNOWN, ISA_SCALAR, ISA_AVX2, ISA_AVX512 } vm_isa_t;
static const char *const isa_names[] = {[ISA_SCALAR] = "scalar", [ISA_AVX2] = "avx2", [ISA_AVX512] = "avx512"};
static vm_isa_t isa_cached = ISA_UNKNOWN;

/* CPUID.1:ECX bit 29 (clang has no __builtin_cpu_supports("f16c")); every
 * AVX2 CPU has it, but the AVX2 kernels convert halves with it */
static bool has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* The best kernel this CPU can run. */
static vm_isa_t isa_best(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
        return ISA_AVX2;
    return ISA_SCALAR;
}

/* name -> level; ISA_UNKNOWN if the name is none of ours */
static vm_isa_t isa_parse(const char *name)
{
    for (int v = ISA_SCALAR; v <= ISA_AVX512; v++)
        if (!strcmp(name, isa_names[v]))
            return (vm_isa_t)v;
    return ISA_UNKNOWN;
}

/* The level NEUROCACHE_SIMD asks for (the best one when unset or empty);
 * ISA_UNKNOWN with a message when it names no level or one the CPU lacks. */
static vm_isa_t isa_configured(char *err, size_t errlen)
{
    vm_isa_t best = isa_best();
    const char *want = getenv(VM_SIMD_ENV);
    if (!want || !*want)
        return best;
    vm_isa_t v = isa_parse(want);
    if (v == ISA_UNKNOWN) {
        nc_error(err, errlen, NC_EINVAL, "%s=%s: expected scalar, avx2 or avx512", VM_SIMD_ENV, want);
        return ISA_UNKNOWN;
    }
    if (v > best) {
        nc_error(err, errlen, NC_EINVAL, "%s=%s: this CPU supports %s at most", VM_SIMD_ENV, want,
                 isa_names[best]);
        return ISA_UNKNOWN;
    }
    return v;
}

/* First use without vm_simd_init (a library caller that never asked):
 * the configured level, or the best one when the variable is unusable --
 * the programs call vm_simd_init first and refuse to start instead. */
static vm_isa_t isa(void)
{
    vm_isa_t v = __atomic_load_n(&isa_cached, __ATOMIC_RELAXED);
    if (v != ISA_UNKNOWN)
        return v;
    v = isa_configured(NULL, 0);
    if (v == ISA_UNKNOWN)
        v = isa_best();
    __atomic_store_n(&isa_cached, v, __ATOMIC_RELAXED);
    return v;
}

int vm_simd_init(char *err, size_t errlen)
{
    vm_isa_t v = isa_configured(err, errlen);
    if (v == ISA_UNKNOWN)
        return NC_EINVAL;
    __atomic_store_n(&isa_cached, v, __ATOMIC_RELAXED);
    return NC_OK;
}

const char *vm_isa(void)
{
    return isa_names[isa()];
}

const char *vm_isa_supported(void)
{
    switch (isa_best()) {
    case ISA_AVX512: return "scalar avx2 avx512";
    case ISA_AVX2: return "scalar avx2";
    default: return "scalar";
    }
}

int vm_set_isa(const char *name)
{
    vm_isa_t want = name ? isa_parse(name) : isa_configured(NULL, 0);
    if (want == ISA_UNKNOWN || want > isa_best())
        return NC_EINVAL;
    __atomic_store_n(&isa_cached, want, __ATOMIC_RELAXED);
    return NC_OK;
}

float vm_logsumexp(const float *x, size_t n)
{
    if (n == 0)
        return -INFINITY;
    vm_isa_t v = isa();
    float mx;
    if (v == ISA_AVX512) {
        mx = max_avx512(x, n);
    } else {
        mx = x[0];
        for (size_t i = 1; i < n; i++)
            mx = x[i] > mx ? x[i] : mx;
    }
    if (!isfinite(mx))
        return mx;                /* +inf or NaN propagates; all -inf gives -inf */
    switch (v) {
    case ISA_AVX512: return lse_avx512(x, n, mx);
    case ISA_AVX2: return lse_avx2(x, n, mx);
    default: return lse_scalar(x, n, mx);
    }
}

float vm_max(const float *x, size_t n)
{
    if (n == 0)
        return -INFINITY;
    if (isa() == ISA_AVX512)
        return max_avx512(x, n);
    float mx = x[0];
    for (size_t i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    return mx;
}

double vm_exp_sum(float *y, const float *x, size_t n, float m)
{
    switch (isa()) {
    case ISA_AVX512: return expsum_avx512(y, x, n, m);
    case ISA_AVX2: return expsum_avx2(y, x, n, m);
    default: {
        double sum = 0.0;
        for (size_t i = 0; i < n; i++)
            sum += (y[i] = expf(x[i] - m));
        return sum;
    }
    }
}

double vm_cache_exp_sum(float *y, const float *d, const int *vals, size_t n, float theta, float s, int x,
                        double *match)
{
    switch (isa()) {
    case ISA_AVX512: return cachesum_avx512(y, d, vals, n, theta, s, x, match);
    case ISA_AVX2: return cachesum_avx2(y, d, vals, n, theta, s, x, match);
    default: return cachesum_scalar(y, d, vals, n, theta, s, x, match);
    }
}

void vm_gauss_d2(double *w, const float *d2, const int *skip, int n, double theta2)
{
    NC_ASSERT(theta2 > 0.0, "vm_gauss_d2: bandwidth %g", theta2);
    const gauss_job j = {d2, skip, n, theta2, w};
    switch (isa()) {
    case ISA_AVX512: gauss_avx512(&j); break;
    case ISA_AVX2: gauss_avx2(&j); break;
    default: gauss_plain(&j, 0);
    }
}

void vm_half_to_float(const uint16_t *h, float *f, size_t n)
{
    switch (isa()) {
    case ISA_AVX512: h2f_avx512(h, f, n); break;
    case ISA_AVX2: h2f_avx2(h, f, n); break;
    default:
        for (size_t i = 0; i < n; i++)
            f[i] = nc_half_to_float(h[i]);
    }
}

void vm_float_to_half(const float *f, uint16_t *h, size_t n)
{
    switch (isa()) {
    case ISA_AVX512: f2h_avx512(f, h, n); break;
    case ISA_AVX2: f2h_avx2(f, h, n); break;
    default:
        for (size_t i = 0; i < n; i++)
            h[i] = nc_float_to_half(f[i]);
    }
}

void vm_round_to_half(float *x, size_t n)
{
    uint16_t buf[256];
    for (size_t i = 0; i < n; i += 256) {
        size_t m = n - i < 256 ? n - i : 256;
        vm_float_to_half(x + i, buf, m);
        vm_half_to_float(buf, x + i, m);
    }
}

void vm_sigmoid(float *x, size_t n)
{
    switch (isa()) {
    case ISA_AVX512: act_avx512(x, n, 0); break;
    case ISA_AVX2: act_avx2(x, n, 0); break;
    default: sigmoid_scalar(x, n); break;
    }
}

void vm_tanh(float *x, size_t n)
{
    switch (isa()) {
    case ISA_AVX512: act_avx512(x, n, 1); break;
    case ISA_AVX2: act_avx2(x, n, 1); break;
    default: tanh_scalar(x, n); break;
    }
}

void vm_gemv_f16(const uint16_t *W, int rows, int cols, const float *x, float *y)
{
    switch (isa()) {
    case ISA_AVX512: gemv_f16_avx512(W, rows, cols, x, y); break;
    case ISA_AVX2: gemv_f16_avx2(W, rows, cols, x, y); break;
    default: gemv_f16_scalar(W, rows, cols, x, y); break;
    }
}

/* The AVX-512 level runs the AVX2 kernels here: on the benchmark machine
 * (Zen 4) a 512-bit FMA issues at half the rate of a 256-bit one, so the
 * wider registers buy no throughput for these tiles. */
void vm_gemm_nt(const float *x, const float *w, float *y, int rows, int n, int k)
{
    if (isa() == ISA_SCALAR)
        gemm_nt_scalar(x, w, y, rows, n, k);
    else
        gemm_nt_avx2(x, w, y, rows, n, k);
}

void vm_gemm_nn(const float *p, const float *w, float *y, int rows, int n, int k)
{
    const nn_shape all = {rows, n, k, 0};
    if (isa() == ISA_SCALAR)
        gemm_nn_scalar(p, w, y, &all);
    else
        gemm_nn_avx2(p, w, y, rows, n, k);
}

void vm_gemm_nt_f16(const float *x, const uint16_t *w, float *y, int rows, int n, int k)
{
    switch (isa()) {
    case ISA_AVX512: gemm_nt_f16_avx512(x, w, y, rows, n, k); break;
    case ISA_AVX2: gemm_nt_f16_avx2(x, w, y, rows, n, k); break;
    default: gemm_nt_f16_scalar(x, w, y, rows, n, k); break;
    }
}
