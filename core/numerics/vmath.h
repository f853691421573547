/* vmath.h -- vectorised elementwise math on float arrays (exp-based
 * activations and log-sum-exp), AVX-512 / AVX2 with a portable fallback,
 * chosen at run time. Relative error of the exp kernel < 3e-7. */
#ifndef NC_VMATH_H
#define NC_VMATH_H

#include <stddef.h>
#include <stdint.h>

/* log(sum_i exp(x[i])), max subtracted first (stable). n == 0 gives -inf;
 * a +inf or NaN maximum is returned as is. */
float vm_logsumexp(const float *x, size_t n);

/* Largest element (-inf when n == 0; NaN handling as the ISA's max). */
float vm_max(const float *x, size_t n);

/* y[i] = exp(x[i] - m) (y may be x) and returns their sum, accumulated in
 * double: the softmax numerators of the full distribution. */
double vm_exp_sum(float *y, const float *x, size_t n, float m);

/* The neural cache's window terms: e_i = exp(θ d_i - s) (s: the max and
 * the bias folded in), written to y unless y is NULL; returns Σ e_i
 * (double) and puts Σ_{vals[i] = x} e_i in *match (x = -1: none) -- the
 * softmax numerator of the target and the normaliser in one pass. */
double vm_cache_exp_sum(float *y, const float *d, const int *vals, size_t n, float theta, float s, int x,
                        double *match);

/* The Gaussian kernel's weights in double: w[i] = exp(-max(d2[i], 0) /
 * (2 theta2)) (theta2 > 0), 0 where skip[i] < 0 (no neighbour) or where
 * the exponent is below VM_EXP_D_MIN; one set of bits at every level (its
 * own polynomial exp, unfused, lane by lane; relative error < 1e-15). */
#define VM_EXP_D_MIN (-708.0)
void vm_gauss_d2(double *w, const float *d2, const int *skip, int n, double theta2);

/* IEEE binary16 <-> float32, round to nearest even (nc_half_to_float /
 * nc_float_to_half, with the CPU's converters when it has them; NaN
 * payloads may differ). vm_round_to_half: x <- float(half(x)) in place,
 * what a float16 key store keeps of a key. */
void vm_half_to_float(const uint16_t *h, float *f, size_t n);
void vm_float_to_half(const float *f, uint16_t *h, size_t n);
void vm_round_to_half(float *x, size_t n);

/* In place: x <- 1 / (1 + exp(-x)). */
void vm_sigmoid(float *x, size_t n);

/* In place: x <- tanh(x) = 1 - 2 / (exp(2x) + 1). */
void vm_tanh(float *x, size_t n);

/* y[r] += sum_k W[r, k] x[k] for a row-major [rows, cols] matrix of IEEE
 * binary16 values (the LSTM's recurrent weights when the model file stored
 * them as F16): half the bytes of a float32 GEMV, which is what a
 * sequential recurrence step is bound by. Products and sums in float32. */
void vm_gemv_f16(const uint16_t *W, int rows, int cols, const float *x, float *y);

/* Products of a few rows against a large row-major matrix w [n, k] (the
 * decoder [V, H]) read in place -- OpenBLAS's sgemm copies ("packs") the
 * whole of w on every call, as costly as the product for ~20 rows:
 *   vm_gemm_nt: y[r, j] += sum_i x[r, i] w[j, i]   (x [rows, k], y [rows, n])
 *   vm_gemm_nn: y[r, c]  = sum_j p[r, j] w[j, c]   (p [rows, n], y [rows, k])
 * Float32 sums in an order of the level's choosing: each result within
 * gamma_m * sum |terms| of the exact one (m = terms summed + 1, gamma_m =
 * m u / (1 - m u), u = 2^-24; Higham, Accuracy and Stability, eq. 3.4). */
void vm_gemm_nt(const float *x, const float *w, float *y, int rows, int n, int k);
void vm_gemm_nn(const float *p, const float *w, float *y, int rows, int n, int k);

/* vm_gemm_nt with w [n, k] in IEEE binary16 (the decoder of a model stored
 * as F16: half the bytes of the memory-bound product), batch-invariant:
 * each y[r, j] is summed in one order fixed by the level and k alone --
 * whatever rows and how many are computed together, a row's results are
 * the same bits (a lone predict's logits equal a batch's row, so the
 * batcher's rows can be a session's memo). Products of float32 x and the
 * exactly widened weights, float32 FMA accumulation: each result within
 * gamma_m * sum |terms| of the exact one, m = k + 1 (the k products' sum
 * and the add to y; Higham eq. 3.4, an FMA rounds a product and its add
 * once, so its terms round no more than the bound counts). */
void vm_gemm_nt_f16(const float *x, const uint16_t *w, float *y, int rows, int n, int k);

/* The kernels come in three levels: "scalar" (any x86-64), "avx2" (AVX2 +
 * FMA + F16C) and "avx512" (AVX-512F). The best level the CPU runs is used
 * unless the environment variable NEUROCACHE_SIMD names a lower one, which
 * is how the tests prove every level on one machine and how a user rules
 * out a kernel. Levels differ only in float rounding (summation order, the
 * polynomial exp against libm's expf): tests/tolerance.h bounds the
 * difference, docs/testing.md says how the suites run at each level. */
#define VM_SIMD_ENV "NEUROCACHE_SIMD"

/* Reads NEUROCACHE_SIMD and fixes the level: NC_EINVAL with a message if it
 * names no level or one this CPU lacks. Programs call it first and refuse
 * to start on an error; without it the first kernel call takes the
 * variable's level when it is usable and the best one otherwise. */
int vm_simd_init(char *err, size_t errlen);

/* The level in use: "avx512", "avx2" or "scalar". */
const char *vm_isa(void);

/* The levels this CPU can run, lowest first, space-separated. */
const char *vm_isa_supported(void);

/* Forces a level ("avx512", "avx2", "scalar"; tests and benchmarks), or
 * with NULL goes back to the configured one (NEUROCACHE_SIMD or the best).
 * NC_EINVAL (-1) if unknown or not supported by this CPU. Not thread-safe
 * with concurrent math calls. */
int vm_set_isa(const char *name);

#endif
