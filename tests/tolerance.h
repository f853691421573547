/* tolerance.h -- how far two float computations of one quantity may differ,
 * derived once from the arithmetic; the numeric suites cite these names.
 *
 * Why two of our paths differ at all. Every path computes in float32 (unit
 * roundoff u = 2^-24 = 5.96e-8) and most sums are dot products whose order
 * depends on who computes them: GEMM vs GEMV (batched vs step by step;
 * the daemon's rows through our own kernels, vm_gemm_nt_f16 / vm_gemv_f16
 * over binary16 copies of the same weights, against the CLI's GEMM),
 * blocked vs token-by-token scoring, 1 vs 2 BLAS threads (OpenBLAS splits
 * the rows and takes their tails with another kernel), OpenBLAS's kernel
 * sets (Nehalem / Haswell / SkylakeX: picked from the CPU's vendor and
 * features, so an AMD and an Intel AVX-512 CPU differ), our vmath levels
 * (AVX-512 / AVX2 / scalar; besides order, the vector exp is a polynomial
 * with relative error < 3e-7 where the scalar one is libm's expf, < 1 ulp)
 * and FAISS's OpenMP partitions. None of these orders is fixed across CPUs,
 * so no test may demand bit equality between two such paths.
 *
 * The bound used for a reordered sum. For s = sum of n terms t_i, any
 * evaluation order gives |fl(s) - s| <= gamma(n) sum |t_i|; the worst-case
 * gamma(n) = n u / (1 - n u) (Higham, Accuracy and Stability of Numerical
 * Algorithms, 2nd ed., Lemma 3.1) is reached only if every rounding error
 * has the same sign and its maximal size. Rounding errors are independent
 * and mean-zero in practice, and Higham & Mary (SIAM J. Sci. Comput. 41(5),
 * 2019, Thm 2.4) bound them with probability >= 1 - 2 exp(-lambda^2 (1-u)^2
 * / 2) by lambda sqrt(n) u sum |t_i|. With lambda = 6 that probability of
 * failure is below 3e-8 per sum: never seen across a test suite. Two orders
 * then differ by at most REORDER(n, s) = 2 * 6 sqrt(n) u s.
 *
 * From sums to log-probabilities (design §4): log p_vocab(w) = s_w -
 * logsumexp(s), so it moves by at most 2 max_w |delta s_w|; a neural-cache
 * term log sum_i exp(theta h.k_i) likewise by at most 2 max_i |delta theta
 * h.k_i|; and the mixture log((1-lambda) p_a + lambda p_b) is a log of a
 * positive combination of exponentials, 1-Lipschitz in the max norm of its
 * components' logs: a log-probability moves by at most 2 max |delta| of the
 * scores it is made of (plus the exp kernels' 3e-7 between levels). */
#ifndef NC_TOLERANCE_H
#define NC_TOLERANCE_H

#include <math.h>

#define F32_U 5.9604644775390625e-8   /* 2^-24 */
#define F16_ULP_REL 9.765625e-4       /* 2^-10: a binary16 ulp relative to the value's binade */
#define REORDER_LAMBDA 6.0

/* Two float32 evaluations, in different orders, of a sum of n terms whose
 * magnitudes add up to s: Higham & Mary's probabilistic bound, twice. */
static inline double tol_reorder(int n, double s)
{
    return 2.0 * REORDER_LAMBDA * sqrt((double)n) * F32_U * s;
}

/* The fixture models (tests/fixtures: H, E <= 16, V <= 50, one or two
 * layers; every weight and bias within +-0.61, every matrix row's l1 norm
 * <= 7; x is an embedding row or a lower layer's h, so |x|, |h| <= 1):
 *
 *   one gate pre-activation  n = E + H + 2 <= 34 terms, s <= 7 + 7 + 1.22
 *                            -> tol_reorder(34, 15.3) = 6.4e-5 at most;
 *   one decoder logit        n = H + 1 = 17, s <= 7 + 0.61
 *                            -> tol_reorder(17, 7.6) = 2.3e-5.
 *
 * A pre-activation error e moves the cell by <= (1/4 + 1/4 + 1 + 1/4) e
 * (sigma' <= 1/4, tanh' <= 1; |c| stays below 1 on these fixtures) and h by
 * <= 2 e; the next step reads that h through W_hh again. A worst case over
 * T steps would multiply by W_hh's norm each step; the LSTM's forget gate
 * contracts instead (sigma(f) < 1 on every fixture), which is why the
 * measured differences do not grow with T (test_lstm's 300-token
 * batched_equals_step_across_blocks). Budget per log-probability: the
 * decoder's own reordering plus a hidden state off by 2 * 6.4e-5 read
 * through a decoder row (l1 <= 7), twice (log-softmax):
 * 2 * (2.3e-5 + 7 * 1.28e-4) = 1.8e-3. The typical sum is far smaller
 * than these worst-case magnitudes (|t_i| average ~0.1, not 0.45): the
 * differences measured on every level are 1e-7..1e-5, two orders below. */
#define TOL_FIXTURE_PATHS 1.8e-3

/* The same quantity twice along one path (same code, same inputs, same
 * level, same thread count): bit equality is guaranteed -- IEEE operations
 * are deterministic and the order is fixed by the code -- and demanded. */

#endif
