/* neural_cache.c -- the neural cache: ring buffer of (h_i, x_{i+1}) pairs and
 * its terms (Grave, Joulin, Usunier 2017, eq. 2 and 4). */
#include "neural_cache.h"
#include "cache_knobs.h"
#include "components.h"
#include "vmath.h"
#include "fault.h"

#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int neural_cache_init(nc_neural_cache *c, int size, int dim, bool f16, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (size <= 0 || dim <= 0)
        return nc_error(err, errlen, NC_EINVAL, "neural cache window %d / dim %d must be positive",
                        size, dim);
    c->size = size;
    c->dim = dim;
    c->f16 = f16;
    c->keys = nc_alloc((size_t)size * dim * (f16 ? sizeof(uint16_t) : sizeof(float)));
    c->values = nc_alloc((size_t)size * sizeof(int));
    if (!c->keys || !c->values) {
        neural_cache_free(c);
        return nc_error(err, errlen, NC_ENOMEM, "neural cache of %d x %d keys", size, dim);
    }
    return NC_OK;
}

void neural_cache_free(nc_neural_cache *c)
{
    if (!c)
        return;
    nc_free(c->keys);
    nc_free(c->values);
    memset(c, 0, sizeof *c);
}

void neural_cache_clear(nc_neural_cache *c)
{
    c->count = c->head = 0;
}

void neural_cache_push(nc_neural_cache *c, const float *h, int w)
{
    size_t off = (size_t)c->head * c->dim;
    if (c->f16) {
        vm_float_to_half(h, (uint16_t *)c->keys + off, (size_t)c->dim);
    } else {
        memcpy((float *)c->keys + off, h, (size_t)c->dim * sizeof(float));
    }
    c->values[c->head] = w;
    c->head = (c->head + 1) % c->size;
    if (c->count < c->size)
        c->count++;
}

int neural_cache_export(const nc_neural_cache *c, float *out, int *vals)
{
    for (int i = 0; i < c->count; i++) {
        int s = neural_cache_slot(c, i);
        if (out) {
            float *o = out + (size_t)i * c->dim;
            if (c->f16) {
                vm_half_to_float((const uint16_t *)c->keys + (size_t)s * c->dim, o, (size_t)c->dim);
            } else {
                memcpy(o, (const float *)c->keys + (size_t)s * c->dim, (size_t)c->dim * sizeof(float));
            }
        }
        if (vals)
            vals[i] = c->values[s];
    }
    return c->count;
}

/* dots[r] = q . key_r for rows float16 keys (the conversion is exact, so
 * both kernels compute the same products; only the summation order
 * differs). AVX-512 when the CPU has it: halving the bytes read is the point
 * of float16 keys, as the dot products are bound by memory bandwidth. */
__attribute__((target("avx512f"))) static void dots_f16_avx512(const uint16_t *keys, int rows, int dim,
                                                                const float *q, float *dots)
{
    for (int r = 0; r < rows; r++) {
        const uint16_t *k = keys + (size_t)r * dim;
        __m512 acc = _mm512_setzero_ps();
        int j = 0;
        for (; j + 16 <= dim; j += 16)
            acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + j))),
                                  _mm512_loadu_ps(q + j), acc);
        float sum = _mm512_reduce_add_ps(acc);
        for (; j < dim; j++)
            sum += q[j] * nc_half_to_float(k[j]);
        dots[r] = sum;
    }
}

static void dots_f16(const uint16_t *keys, int rows, int dim, const float *q, float *dots)
{
    static int avx512 = -1;
    if (avx512 < 0) {
        __builtin_cpu_init();
        avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    if (avx512) {
        dots_f16_avx512(keys, rows, dim, q, dots);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const uint16_t *k = keys + (size_t)r * dim;
        float acc = 0.0f;
        for (int j = 0; j < dim; j++)
            acc += q[j] * nc_half_to_float(k[j]);
        dots[r] = acc;
    }
}

int neural_cache_dots(const nc_neural_cache *c, const float *q, float *dots)
{
    if (c->count == 0)
        return 0;
    /* The ring holds at most two contiguous runs of keys, oldest first: one
     * matrix-vector product each (a scalar loop here was half of a server
     * predict with a 2,000-entry window). */
    int first = neural_cache_slot(c, 0);
    int n1 = c->count < c->size - first ? c->count : c->size - first, n2 = c->count - n1;
    if (!c->f16) {
        /* vm_gemm_nt: a key's dot does not depend on its place in the run
         * (sgemv's row tails sum in another order), so a session imported
         * with its ring unwrapped predicts bit for bit as before */
        const float *keys = c->keys;
        memset(dots, 0, (size_t)c->count * sizeof(float));
        vm_gemm_nt(q, keys + (size_t)first * c->dim, dots, 1, n1, c->dim);
        if (n2 > 0)
            vm_gemm_nt(q, keys, dots + n1, 1, n2, c->dim);
    } else {
        const uint16_t *keys = c->keys;
        dots_f16(keys + (size_t)first * c->dim, n1, c->dim, q, dots);
        if (n2 > 0)
            dots_f16(keys, n2, c->dim, q, dots + n1);
    }
    return c->count;
}

size_t neural_cache_memory(const nc_neural_cache *c)
{
    return sizeof *c + (size_t)c->size * c->dim * (c->f16 ? 2 : 4) + (size_t)c->size * sizeof(int);
}

/* ---- the terms (neural_cache.h) ------------------------------------------- */

double neural_cache_max_logit(const nc_neural_window *w, double bias)
{
    if (w->n <= 0)
        return -INFINITY;
    return w->theta * (double)vm_max(w->dots, (size_t)w->n) + bias;
}

/* With libm's scalar exp these sums were most of the neural cache's cost
 * (2,000 per token), and a scalar match loop after them the next most. */
double neural_cache_exp_sum(float *e, const nc_neural_window *w, double bias, double m, int x, double *match)
{
    if (w->n <= 0) {
        *match = 0.0;
        return 0.0;
    }
    return vm_cache_exp_sum(e, w->dots, w->vals, (size_t)w->n, (float)w->theta, (float)(m - bias), x, match);
}

/* eq. 2: the softmax over the window, shifted by its max */
double neural_cache_prob(const nc_neural_window *w, int x)
{
    if (w->n <= 0)
        return 0.0;
    double num, z = neural_cache_exp_sum(NULL, w, 0.0, neural_cache_max_logit(w, 0.0), x, &num);
    return num / z;
}

/* The shift of eq. 4's exponentials: the larger of the logits' and the
 * cache's maxima (log_z >= max_w s_w stands in for the logits'). */
static double global_shift(const nc_neural_window *w, double alpha, double log_z)
{
    double m = log_z, mc = neural_cache_max_logit(w, alpha);
    return mc > m ? mc : m;
}

double neural_cache_global_prob(const nc_neural_window *w, double alpha, double s_x, double log_z, int x)
{
    double m = global_shift(w, alpha, log_z), nc;
    double zc = neural_cache_exp_sum(NULL, w, alpha, m, x, &nc);
    return (exp(s_x - m) + nc) / (exp(log_z - m) + zc);
}

int neural_cache_weights(const nc_neural_window *w, double alpha, bool global, double log_z, double *out)
{
    if (w->n <= 0)
        return NC_OK;
    float *e = nc_malloc((size_t)w->n * sizeof *e);
    if (!e)
        return NC_ENOMEM;
    double bias = global ? alpha : 0.0, unused;
    double m = global ? global_shift(w, alpha, log_z) : neural_cache_max_logit(w, 0.0);
    double z = neural_cache_exp_sum(e, w, bias, m, -1, &unused);
    if (global)
        z += exp(log_z - m);
    for (int i = 0; i < w->n; i++)
        out[i] = z > 0.0 ? e[i] / z : 0.0;
    free(e);
    return NC_OK;
}

/* ---- the mixture's row (component.h) ------------------------------------
 * Linear interpolation (eq. 3): p <- (1-λ) p + λ p_cache. Under global
 * normalisation the cache is inside the first row's softmax (model_term.c)
 * and is not a component of its own. */

static bool neural_on(const nc_cache_params *p)
{
    return p->neural_size > 0 && !p->global_norm;
}

static int neural_validate(const nc_cache_params *p, char *err, size_t errlen)
{
    if (p->global_norm && p->neural_size == 0)
        return nc_error(err, errlen, NC_EINVAL, "global_norm needs the neural cache (neural_size > 0)");
    if (p->neural_f16 && p->neural_size == 0)
        return nc_error(err, errlen, NC_EINVAL, "neural_f16 needs the neural cache (neural_size > 0)");
    return NC_OK;
}

static double neural_lambda(const nc_cache_params *p)
{
    return p->neural_lambda;
}

static bool neural_available(const nc_cache_params *p, const nc_mix_input *in)
{
    return neural_on(p) && in->nn > 0;
}

static double neural_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    return neural_cache_prob(&NC_NEURAL_WINDOW(in, p), x);
}

/* every word of the window, also under global normalisation (the first
 * row gives them mass then) */
static int neural_max_word(const nc_mix_input *in)
{
    int m = -1;
    for (int i = 0; i < in->nn; i++)
        if (in->nvals[i] > m)
            m = in->nvals[i];
    return m;
}

/* p_cache(w) = Σ_{x_{i+1}=w} softmax_i(θ h·h_i) (eq. 2), sparse over the
 * window: p <- (1-λ) p, then λ softmax_i added at each pair's word. */
static int neural_step(const nc_comp_step *s)
{
    const nc_cache_params *p = s->p;
    const nc_mix_input *in = s->in;
    nc_dist *out = s->out;
    float *e = nc_malloc((size_t)in->nn * sizeof(float));
    if (!e)
        return NC_ENOMEM;
    const nc_neural_window win = NC_NEURAL_WINDOW(in, p);
    double mc = neural_cache_max_logit(&win, 0.0), unused;
    double zc = neural_cache_exp_sum(e, &win, 0.0, mc, -1, &unused);
    float a = (float)(1.0 - s->lambda), lz = (float)(s->lambda / zc);
    for (size_t w = 0; w < out->n; w++)
        out->p[w] *= a;
    for (int c = 0; s->shares && c < s->comp; c++)   /* the later rows' shares are still 0 */
        for (size_t w = 0; w < out->n; w++)
            out->share[c][w] *= a;
    for (int i = 0; i < in->nn; i++) {
        int w = in->nvals[i];
        out->p[w] += lz * e[i];
        if (s->shares)
            out->share[s->comp][w] += lz * e[i];
    }
    free(e);
    return NC_OK;
}

enum { F_FILL, F_MAXDOT, F_LOGMAXATT, F_AGREE_VN, F_LOGTOP, F_VOCAB_OF };

/* The window's statistics; ctx->attended = the best-attended pair's word
 * w* (later rows compare theirs with it). */
static void neural_features(const nc_cache_params *p, const nc_mix_input *in, nc_feat_ctx *ctx, double *pre,
                            double *post)
{
    (void)post;
    if (p->neural_size <= 0 || in->nn <= 0)
        return;
    int im = 0;
    for (int i = 1; i < in->nn; i++)
        if (in->ndots[i] > in->ndots[im])
            im = i;
    double dmax = in->ndots[im], top;
    int best = in->nvals[im];
    ctx->attended = best;
    /* Σ_i exp(θ (d_i - d_max)) = 1 / max attention weight; the pairs of the
     * best-attended word summed: p_neural of that word (eq. 2) */
    double z = neural_cache_exp_sum(NULL, &NC_NEURAL_WINDOW(in, p), 0.0, p->neural_theta * dmax, best, &top);
    pre[F_FILL] = log1p((double)in->nn);         /* log(1 + pairs in the window) */
    pre[F_MAXDOT] = dmax;                        /* max_i h_t·h_i */
    pre[F_LOGMAXATT] = -log(z);                  /* log max_i softmax_i(θ h_t·h_i) */
    pre[F_AGREE_VN] = best == in->v_argmax;      /* argmax p_vocab is w* */
    pre[F_LOGTOP] = log(top / z);                /* log p_neural(w*) */
    pre[F_VOCAB_OF] = mix_vocab_logp(in, best);  /* log p_vocab(w*) */
}

/* The window's pairs of each word asked (component.h explain), weighted as
 * the mixture weights them (eq. 2, or eq. 4 with the decoder's logits in
 * its normaliser); a tie (θ = 0) goes to the larger h_t·h_i, then the
 * older pair. */
static int neural_explain(const nc_explain_ctx *x, nc_explain_entry *out, int *counts, char *err, size_t errlen)
{
    const nc_mix_input *in = x->in;
    const nc_cache_params *p = x->p;
    if (in->nn <= 0)
        return NC_OK;
    double log_z = p->global_norm ? vm_logsumexp(in->logits, (size_t)in->V) : 0.0;
    double *w = nc_malloc((size_t)in->nn * sizeof *w);
    int *cand = nc_malloc((size_t)in->nn * sizeof *cand);
    int rc = w && cand ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "explain");
    if (!rc && (rc = neural_cache_weights(&NC_NEURAL_WINDOW(in, p), p->neural_alpha, p->global_norm, log_z, w)) !=
                   NC_OK)
        nc_error(err, errlen, rc, "explain: neural weights");
    for (size_t q = 0; !rc && q < x->k; q++) {
        int nc = 0;
        for (int i = 0; i < in->nn; i++)
            if (in->nvals[i] == x->ids[q])
                cand[nc++] = i;
        nc = components_heaviest(cand, nc, w, in->ndots, x->per_source);
        for (int j = 0; j < nc; j++)
            out[q * x->stride + (size_t)counts[q]++] = (nc_explain_entry){
                .source = x->comp, .at = x->pos - in->nn + cand[j], .weight = w[cand[j]], .distance = NAN};
    }
    free(w);
    free(cand);
    return rc;
}

/* The window in the export blob (component.h export_state): i32 size,
 * count, f16, then count x (key as stored, i32 word ref), oldest first. */
static int neural_export_state(const void *state, binio_writer *w, nc_blob_words *x)
{
    const nc_neural_cache *c = state;
    int nn = c->size ? c->count : 0;
    size_t ks = c->f16 ? 2 : 4;
    int *vals = nc_malloc(((size_t)nn + 1) * sizeof(int));
    if (!vals)
        return NC_ENOMEM;
    if (nn)
        neural_cache_export(c, NULL, vals);
    binio_put_i32(w, c->size);
    binio_put_i32(w, nn);
    binio_put_i32(w, c->f16);
    int rc = NC_OK;
    for (int i = 0; !rc && i < nn; i++) {
        int ref = blob_word_ref(x, vals[i]);
        rc = ref < 0 ? NC_ENOMEM : NC_OK;
        binio_put(w, (const char *)c->keys + (size_t)neural_cache_slot(c, i) * c->dim * ks, (size_t)c->dim * ks);
        binio_put_i32(w, ref);
    }
    free(vals);
    return rc;
}

static int neural_import_state(void *state, binio_reader *r, const nc_blob_words *x, char *err, size_t errlen)
{
    nc_neural_cache *c = state;
    int32_t nsize = binio_get_i32(r), ncount = binio_get_i32(r), nf16 = binio_get_i32(r);
    if (r->bad || nsize != c->size || ncount < 0 || ncount > nsize || (nsize && (nf16 != 0) != c->f16))
        return nc_error(err, errlen, NC_EFORMAT, "stream blob: neural window does not match its parameters");
    size_t ks = c->f16 ? 2 : 4;
    for (int i = 0; i < ncount; i++) {
        if ((size_t)c->dim * ks + 4 > binio_left(r))
            return nc_error(err, errlen, NC_EFORMAT, "stream blob truncated (neural window)");
        binio_get(r, (char *)c->keys + (size_t)i * c->dim * ks, (size_t)c->dim * ks);
        int32_t ref = binio_get_i32(r);
        int id = blob_word_id(x, ref);
        if (id < 0)
            return nc_error(err, errlen, NC_EFORMAT, "stream blob: bad word reference %d", ref);
        c->values[i] = id;
    }
    if (ncount > 0) {
        c->count = ncount;
        c->head = ncount % c->size;
    }
    return NC_OK;
}

static const char *const neural_knobs[] = {"neural_size", "neural_theta", "neural_lambda", "global_norm",
                                           "neural_alpha", "neural_f16", NULL};
static const char *const neural_feature_names[] = {"neural_fill", "neural_max_dot", "neural_log_max_attention",
                                                   "agree_vocab_neural", "neural_log_top",
                                                   "vocab_log_p_of_neural", NULL};

const nc_component nc_component_neural = {
    .name = "neural",
    .knobs = neural_knobs,
    .on = neural_on,
    .validate = neural_validate,
    .lambda = neural_lambda,
    .available = neural_available,
    .prob = neural_prob,
    .max_word = neural_max_word,
    .step = neural_step,
    .features = neural_feature_names,
    .gate_features = neural_features,
    .explain = neural_explain,
    .export_state = neural_export_state,
    .import_state = neural_import_state,
};
