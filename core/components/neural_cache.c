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
    NC_ASSERT(c, "neural_cache_clear: no c");
    c->count = c->head = 0;
}

void neural_cache_push(nc_neural_cache *c, const float *h, int w)
{
    NC_ASSERT(c && c->size > 0 && c->head >= 0 && c->head < c->size && c->count <= c->size,
              "neural_cache_push: ring head %d count %d of size %d", c ? c->head : -1, c ? c->count : -1,
              c ? c->size : -1);
    NC_ASSERT(h && w >= 0, "neural_cache_push: pair (%p, %d)", (const void *)h, w);
    NC_ASSERT(c, "neural_cache_push: no c");
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
    NC_ASSERT(c && c->count >= 0 && c->count <= c->size, "neural_cache_export: %d pairs in a ring of %d",
              c ? c->count : -1, c ? c->size : -1);
    NC_ASSERT(c, "neural_cache_export: no c");
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
    NC_ASSERT(c, "neural_cache_memory: no c");
    return sizeof *c + (size_t)c->size * c->dim * (c->f16 ? 2 : 4) + (size_t)c->size * sizeof(int);
}

/* ---- the terms (neural_cache.h) ------------------------------------------- */

double neural_cache_max_logit(const nc_neural_window *w, double bias)
{
    NC_ASSERT(w, "neural_cache_max_logit: no w");
    if (w->n <= 0)
        return -INFINITY;
    return w->theta * (double)vm_max(w->dots, (size_t)w->n) + bias;
}

/* With libm's scalar exp these sums were most of the neural cache's cost
 * (2,000 per token), and a scalar match loop after them the next most. */
double neural_cache_exp_sum(float *e, const nc_neural_window *w, double bias, double m, int x, double *match)
{
    NC_ASSERT(w, "neural_cache_exp_sum: no w");
    if (w->n <= 0) {
        *match = 0.0;
        return 0.0;
    }
    return vm_cache_exp_sum(e, w->dots, w->vals, (size_t)w->n, (float)w->theta, (float)(m - bias), x, match);
}

/* eq. 2: the softmax over the window, shifted by its max */
double neural_cache_prob(const nc_neural_window *w, int x)
{
    NC_ASSERT(w, "neural_cache_prob: no w");
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
    NC_ASSERT(w, "neural_cache_weights: no w");
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
 * normalisation the cache is inside the first row's softmax (its joint
 * hooks below, which the first row, model_term.c, calls) and is not a
 * component of its own. */

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
    return neural_on(p) && NC_NEURAL_PAIRS(in).n > 0;
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
    for (int i = 0; i < NC_NEURAL_PAIRS(in).n; i++)
        if (NC_NEURAL_PAIRS(in).word[i] > m)
            m = NC_NEURAL_PAIRS(in).word[i];
    return m;
}

/* p_cache(w) = Σ_{x_{i+1}=w} softmax_i(θ h·h_i) (eq. 2), sparse over the
 * window: p <- (1-λ) p, then λ softmax_i added at each pair's word. */
static int neural_step(const nc_comp_step *s)
{
    const nc_cache_params *p = s->p;
    const nc_mix_input *in = s->in;
    nc_dist *out = s->out;
    float *e = nc_malloc((size_t)NC_NEURAL_PAIRS(in).n * sizeof(float));
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
    for (int i = 0; i < NC_NEURAL_PAIRS(in).n; i++) {
        int w = NC_NEURAL_PAIRS(in).word[i];
        out->p[w] += lz * e[i];
        if (s->shares)
            out->share[s->comp][w] += lz * e[i];
    }
    free(e);
    return NC_OK;
}

/* ---- global normalisation (eq. 4): the window inside the first row's
 * softmax (component.h joint) ---- */

static bool neural_joint(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->neural_size > 0 && NC_NEURAL_PAIRS(in).n > 0 && p->global_norm;
}

/* p(x) of the joint softmax: neural_cache_global_prob */
static double neural_joint_prob(const nc_cache_params *p, const nc_mix_input *in, double s_x, int x)
{
    return neural_cache_global_prob(&NC_NEURAL_WINDOW(in, p), p->neural_alpha, s_x, in->log_z, x);
}

/* The window's terms e_i = exp(θ h·h_i + α - m) of eq. 4 added to out
 * (scaled by inv, the shared normaliser's inverse), credited to this row's
 * share. */
static void add_global_terms(const nc_comp_step *s, const float *e, float inv)
{
    const nc_mix_input *in = s->in;
    for (int i = 0; i < NC_NEURAL_PAIRS(in).n; i++) {
        int w = NC_NEURAL_PAIRS(in).word[i];
        float ew = e[i] * inv;
        s->out->p[w] += ew;
        if (s->shares)
            s->out->share[NC_COMP_NEURAL][w] += ew;
    }
}

/* The first row's step under eq. 4: out->p = the joint softmax over
 * [0, n), the vocabulary's exponentials (vectorised, vmath) and the
 * window's sharing one shift (the larger maximum) and one normaliser; the
 * vocabulary's part is the first row's share (s->comp), the window's this
 * row's. */
static int neural_joint_step(const nc_comp_step *s)
{
    const nc_cache_params *p = s->p;
    const nc_mix_input *in = s->in;
    const int V = in->V;
    nc_dist *out = s->out;
    const nc_neural_window win = NC_NEURAL_WINDOW(in, p);
    float *e = nc_malloc((size_t)NC_NEURAL_PAIRS(in).n * sizeof(float));
    if (!e)
        return NC_ENOMEM;
    double m = vm_max(in->logits, (size_t)V);
    double mc = neural_cache_max_logit(&win, p->neural_alpha);
    if (mc > m)
        m = mc;
    double z = vm_exp_sum(out->p, in->logits, (size_t)V, (float)m);
    for (size_t w = (size_t)V; w < out->n; w++)
        out->p[w] = 0.0f;
    double unused, zc = neural_cache_exp_sum(e, &win, p->neural_alpha, m, -1, &unused);
    float inv = (float)(1.0 / (z + zc));
    for (size_t w = 0; w < (size_t)V; w++)
        out->p[w] *= inv;
    if (s->shares)
        memcpy(out->share[s->comp], out->p, out->n * sizeof(float));
    add_global_terms(s, e, inv);
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
    if (p->neural_size <= 0 || NC_NEURAL_PAIRS(in).n <= 0)
        return;
    int im = 0;
    for (int i = 1; i < NC_NEURAL_PAIRS(in).n; i++)
        if (NC_NEURAL_PAIRS(in).score[i] > NC_NEURAL_PAIRS(in).score[im])
            im = i;
    double dmax = NC_NEURAL_PAIRS(in).score[im], top;
    int best = NC_NEURAL_PAIRS(in).word[im];
    ctx->attended = best;
    /* Σ_i exp(θ (d_i - d_max)) = 1 / max attention weight; the pairs of the
     * best-attended word summed: p_neural of that word (eq. 2) */
    double z = neural_cache_exp_sum(NULL, &NC_NEURAL_WINDOW(in, p), 0.0, p->neural_theta * dmax, best, &top);
    pre[F_FILL] = log1p((double)NC_NEURAL_PAIRS(in).n);         /* log(1 + pairs in the window) */
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
    if (NC_NEURAL_PAIRS(in).n <= 0)
        return NC_OK;
    double log_z = p->global_norm ? vm_logsumexp(in->logits, (size_t)in->V) : 0.0;
    double *w = nc_malloc((size_t)NC_NEURAL_PAIRS(in).n * sizeof *w);
    int *cand = nc_malloc((size_t)NC_NEURAL_PAIRS(in).n * sizeof *cand);
    int rc = w && cand ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "explain");
    if (!rc && (rc = neural_cache_weights(&NC_NEURAL_WINDOW(in, p), p->neural_alpha, p->global_norm, log_z, w)) !=
                   NC_OK)
        nc_error(err, errlen, rc, "explain: neural weights");
    for (size_t q = 0; !rc && q < x->k; q++) {
        int nc = 0;
        for (int i = 0; i < NC_NEURAL_PAIRS(in).n; i++)
            if (NC_NEURAL_PAIRS(in).word[i] == x->ids[q])
                cand[nc++] = i;
        nc = components_heaviest(cand, nc, w, NC_NEURAL_PAIRS(in).score, x->per_source);
        for (int j = 0; j < nc; j++)
            out[q * x->stride + (size_t)counts[q]++] = (nc_explain_entry){
                .source = x->comp, .at = x->pos - NC_NEURAL_PAIRS(in).n + cand[j], .weight = w[cand[j]], .distance = NAN};
    }
    free(w);
    free(cand);
    return rc;
}

/* The window in the export blob (component.h export_state): i32 size,
 * count, f16, then count x (key as stored, i32 word ref), oldest first. */
static int neural_export_state(const void *state, binio_writer *w, nc_blob_words *x)
{
    const nc_neural_cache *c = state;   /* neural_state's ring, its first member */
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
    nc_neural_cache *c = state;   /* neural_state's ring, its first member */
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

/* ---- its session state (component.h state_new ...): the ring, and the
 * dot products a stream's predict reads it through ---- */

typedef struct {
    nc_neural_cache c;            /* first: the blob hooks read the state as the ring; size 0 = off */
    float *dots;                  /* [c.size] h_t·h_i at a stream's h (neural_at_h), then [c.size]
                                   * the pairs' words (state_words): kept while the stream's memo
                                   * holds (nc_at_h.memo, nc_scan_doc.at_h0; issue 36) */
} neural_state;

/* The words of the window's pairs, beside their dots in ns->dots (one
 * allocation). */
static int *state_words(const neural_state *ns)
{
    return (int *)(void *)(ns->dots + ns->c.size);
}

static void neural_state_free(void *state)
{
    neural_state *ns = state;
    if (!ns)
        return;
    neural_cache_free(&ns->c);
    nc_free(ns->dots);
    free(ns);
}

static int neural_state_new(const nc_state_args *a, void **out, char *err, size_t errlen)
{
    *out = NULL;
    neural_state *ns = nc_zalloc(1, sizeof *ns);
    if (!ns)
        return nc_error(err, errlen, NC_ENOMEM, "neural cache");
    int rc = NC_OK;
    if (a->p->neural_size > 0)
        rc = neural_cache_init(&ns->c, a->p->neural_size, a->H, a->p->neural_f16, err, errlen);
    if (!rc && a->p->neural_size > 0 &&
        !(ns->dots = nc_alloc((size_t)a->p->neural_size * (sizeof(float) + sizeof(int)))))
        rc = nc_error(err, errlen, NC_ENOMEM, "neural cache scratch");
    if (rc) {
        neural_state_free(ns);
        return rc;
    }
    *out = ns;
    return NC_OK;
}

static void neural_state_clear(void *state)
{
    neural_state *ns = state;
    NC_ASSERT(ns, "neural: no state");
    if (ns->c.size)
        neural_cache_clear(&ns->c);
}

/* A window of a->p's size holding the newest pairs of old's. */
static int neural_state_resize(const void *old, const nc_state_args *a, void **out, char *err, size_t errlen)
{
    const nc_neural_cache *o = &((const neural_state *)old)->c;
    int rc = neural_state_new(a, out, err, errlen);
    if (rc || a->p->neural_size <= 0 || o->count == 0)
        return rc;
    neural_state *ns = *out;
    const int H = a->H;
    NC_ASSERT(o->dim == H, "neural: ring of dim %d resized for H %d", o->dim, H);
    float *tmp = nc_alloc((size_t)o->count * H * sizeof(float));
    int *vals = nc_malloc((size_t)o->count * sizeof(int));
    if (!tmp || !vals) {
        nc_free(tmp);
        free(vals);
        neural_state_free(ns);
        *out = NULL;
        return nc_error(err, errlen, NC_ENOMEM, "neural cache");
    }
    int cnt = neural_cache_export(o, tmp, vals);
    for (int i = cnt > a->p->neural_size ? cnt - a->p->neural_size : 0; i < cnt; i++)
        neural_cache_push(&ns->c, tmp + (size_t)i * H, vals[i]);
    nc_free(tmp);
    free(vals);
    return NC_OK;
}

static int neural_push(void *state, const float *h, int word)
{
    neural_state *ns = state;
    NC_ASSERT(ns && word >= 0, "neural: push of word %d", word);
    if (ns->c.size)
        neural_cache_push(&ns->c, h, word);
    return NC_OK;
}

/* What npush pushes overwrite: the ring slots from head on (at most one a
 * push), head and count. */
typedef struct {
    int head, count, slots;
    void *keys;                   /* [slots, dim] as stored (f32 or f16) */
    int *vals;
} neural_mark;

static size_t key_bytes(const nc_neural_cache *c)
{
    return (c->f16 ? sizeof(uint16_t) : sizeof(float)) * (size_t)c->dim;
}

static int neural_mark_save(const void *state, size_t npush, void **out, char *err, size_t errlen)
{
    const nc_neural_cache *c = &((const neural_state *)state)->c;
    *out = NULL;
    if (!c->size)
        return NC_OK;
    neural_mark *m = nc_zalloc(1, sizeof *m);
    const size_t ks = key_bytes(c);
    if (m) {
        m->head = c->head;
        m->count = c->count;
        m->slots = npush < (size_t)c->size ? (int)npush : c->size;
        m->keys = nc_malloc((size_t)(m->slots ? m->slots : 1) * ks);
        m->vals = nc_malloc((size_t)(m->slots ? m->slots : 1) * sizeof(int));
    }
    if (!m || !m->keys || !m->vals) {
        if (m) {
            free(m->keys);
            free(m->vals);
        }
        free(m);
        return nc_error(err, errlen, NC_ENOMEM, "rescoring");
    }
    for (int k = 0; k < m->slots; k++) {
        int slot = (c->head + k) % c->size;
        memcpy((char *)m->keys + (size_t)k * ks, (char *)c->keys + (size_t)slot * ks, ks);
        m->vals[k] = c->values[slot];
    }
    *out = m;
    return NC_OK;
}

static void neural_rollback(void *state, void *mark)
{
    nc_neural_cache *c = &((neural_state *)state)->c;
    neural_mark *m = mark;
    if (!m)
        return;
    NC_ASSERT(c->size && m->head >= 0 && m->head < c->size && m->count <= c->size,
              "neural: mark (head %d, count %d) not of this ring (size %d)", m->head, m->count, c->size);
    const size_t ks = key_bytes(c);
    NC_ASSERT(m->slots <= c->size, "neural: mark of %d slots, ring of %d", m->slots, c->size);
    for (int k = 0; k < m->slots; k++) {
        int slot = (m->head + k) % c->size;
        memcpy((char *)c->keys + (size_t)slot * ks, (char *)m->keys + (size_t)k * ks, ks);
        c->values[slot] = m->vals[k];
    }
    c->head = m->head;
    c->count = m->count;
    free(m->keys);
    free(m->vals);
    free(m);
}

/* The ring and a stream's dots and words at h; nothing while off. */
static size_t neural_state_memory(const void *state)
{
    const neural_state *ns = state;
    return ns->c.size ? neural_cache_memory(&ns->c) + (size_t)ns->c.size * (sizeof(float) + sizeof(int)) : 0;
}

/* The ring at full size: keys and words, and the words' copy a predict makes. */
static size_t neural_state_bytes(const nc_state_args *a)
{
    const nc_cache_params *p = a->p;
    return p->neural_size > 0 ? (size_t)p->neural_size * ((size_t)a->H * (p->neural_f16 ? 2 : 4) + 2 * sizeof(int))
                              : 0;
}

/* The window as the formulas read it from h (design §4): the dots h·h_i
 * of the ring's pairs into ns->dots and their words into state_words(ns),
 * kept there: a->memo reads them again (the same bits); its pairs (NC_NEURAL_PAIRS)
 * get the last neural_size of them (the window's pair i is the ring's pair
 * count - nn + i). */
static int neural_at_h(void *state, const nc_at_h *a, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    neural_state *ns = state;
    const nc_cache_params *p = a->p;
    nc_mix_input *in = a->in;
    *a->scratch = NULL;
    if (p->neural_size <= 0 || ns->c.count <= 0)
        return NC_OK;
    int *vals = state_words(ns);
    if (!a->memo) {
        neural_cache_dots(&ns->c, a->h, ns->dots);
        neural_cache_export(&ns->c, NULL, vals);
    }
    int cnt = ns->c.count;
    int w = cnt < p->neural_size ? cnt : p->neural_size;
    NC_NEURAL_PAIRS(in).score = ns->dots + (cnt - w);
    NC_NEURAL_PAIRS(in).word = vals + (cnt - w);
    NC_NEURAL_PAIRS(in).n = w;
    return NC_OK;
}

/* A document's pass (doc.c) reads the window a block at a time: the dots
 * of a block's positions against the window and the block's own earlier
 * keys in one GEMM. */
typedef struct {
    nc_scan_doc d;
    const neural_state *ns;       /* the state: its dots at h when d.at_h0 */
    nc_neural_cache *nc;          /* the ring read (and pushed by the pass) */
    int N;                        /* window read: the ring may be bigger than neural_size when a
                                   * stream shrank its params without reallocating */
    bool direct;
    float *keys, *dots;
    int *kv;
    size_t nb;                    /* this block's positions */
    int c0;                       /* this block: window keys before its own */
    const int *kvals;             /* and their words */
} neural_scan;

static void neural_scan_close(void *scan)
{
    neural_scan *s = scan;
    if (!s)
        return;
    nc_free(s->keys);
    free(s->kv);
    nc_free(s->dots);
    free(s);
}

static int neural_scan_open(void *state, const nc_scan_doc *d, size_t block, void **out, char *err, size_t errlen)
{
    nc_neural_cache *nc = &((neural_state *)state)->c;
    *out = NULL;
    if (d->p->neural_size <= 0)
        return NC_OK;
    if (nc->dim != d->H)
        return nc_error(err, errlen, NC_EINVAL, "neural cache dimension %d, model %d", nc->dim, d->H);
    neural_scan *s = nc_zalloc(1, sizeof *s);
    if (!s)
        return nc_error(err, errlen, NC_ENOMEM, "scoring buffers");
    s->d = *d;
    s->ns = state;
    s->nc = nc;
    s->N = d->p->neural_size < nc->size ? d->p->neural_size : nc->size;
    /* A window that starts empty (eval, tune, a new stream) only ever holds
     * this document's pairs: its keys are rows of d->q, read in place by the
     * GEMM instead of copying the ring out for every block. */
    s->direct = nc->count == 0 && !nc->f16;   /* f16: the rounded keys are the ring's */
    /* blocks of one position (doc.c: a one-word feed) read the window in
     * place (neural_scan_block): no copy of it (issue 36) */
    const size_t B = block, H = (size_t)d->H;
    s->keys = !s->direct && B > 1 ? nc_alloc(((size_t)nc->size + B) * H * sizeof(float)) : NULL;
    s->kv = !s->direct ? nc_malloc(((size_t)nc->size + B) * sizeof(int)) : NULL;
    s->dots = nc_alloc(B * ((size_t)nc->size + B) * sizeof(float));
    if ((!s->direct && ((B > 1 && !s->keys) || !s->kv)) || !s->dots) {
        neural_scan_close(s);
        return nc_error(err, errlen, NC_ENOMEM, "scoring buffers");
    }
    *out = s;
    return NC_OK;
}

/* The block's dot products h_t·h_i: K = [window oldest..newest ; this
 * block's own keys but the last]: position b0+r may read window entries
 * and block keys < r. */
static void neural_scan_block(void *scan, size_t b0, size_t nb)
{
    neural_scan *s = scan;
    const nc_scan_doc *d = &s->d;
    const int H = d->H;
    const float *Q = d->q + b0 * H, *K = s->keys;
    nc_neural_cache *nc = s->nc;
    s->nb = nb;
    s->c0 = 0;
    s->kvals = s->kv;
    if (s->direct) {
        size_t lo = b0 > d->first + (size_t)s->N ? b0 - (size_t)s->N : d->first;
        K = d->q + lo * H;
        s->kvals = d->ids + lo;
        s->c0 = (int)(b0 - lo);
    } else if (nb == 1) {
        /* one position (a daemon's one-word feed): the window's dots read
         * in place, as a predict reads them, not a copy of the window (200
         * kB for 200 keys) and a one-row GEMM that packs it again */
        if (d->at_h0 && b0 == 0) {
            /* the stream's at_h at this h (neural_at_h): what the two
             * calls below make */
            s->c0 = nc->count;
            memcpy(s->dots, s->ns->dots, (size_t)s->c0 * sizeof(float));
            memcpy(s->kv, state_words(s->ns), (size_t)s->c0 * sizeof(int));
            return;
        }
        s->c0 = neural_cache_export(nc, NULL, s->kv);
        if (s->c0 > 0)
            neural_cache_dots(nc, Q, s->dots);
        return;
    } else {
        s->c0 = neural_cache_export(nc, s->keys, s->kv);
        if (nb > 1) {
            float *kb = s->keys + (size_t)s->c0 * H;
            memcpy(kb, Q, (nb - 1) * (size_t)H * sizeof(float));
            memcpy(s->kv + s->c0, d->ids + b0, (nb - 1) * sizeof(int));
            /* f16 windows: the block's own keys as the ring will hold
             * them, so that the batch and a stream agree */
            if (nc->f16)
                vm_round_to_half(kb, (nb - 1) * (size_t)H);
        }
    }
    int nk = s->c0 + (int)nb - 1;
    if (nk > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, nk, H, 1.0f, Q, H, K, H, 0.0f, s->dots, nk);
}

static void neural_scan_input(const void *scan, size_t r, nc_mix_input *in)
{
    const neural_scan *s = scan;
    int nk = s->c0 + (int)s->nb - 1, avail = s->c0 + (int)r;
    int w = avail < s->N ? avail : s->N;
    NC_NEURAL_PAIRS(in).score = s->dots + r * (size_t)(nk > 0 ? nk : 0) + (avail - w);
    NC_NEURAL_PAIRS(in).word = s->kvals + (avail - w);
    NC_NEURAL_PAIRS(in).n = w;
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
    .joint = neural_joint,
    .joint_prob = neural_joint_prob,
    .joint_step = neural_joint_step,
    .features = neural_feature_names,
    .gate_features = neural_features,
    .explain = neural_explain,
    .export_state = neural_export_state,
    .import_state = neural_import_state,
    .state_new = neural_state_new,
    .state_free = neural_state_free,
    .state_clear = neural_state_clear,
    .state_resize = neural_state_resize,
    .push = neural_push,
    .mark = neural_mark_save,
    .rollback = neural_rollback,
    .memory = neural_state_memory,
    .state_bytes = neural_state_bytes,
    .at_h = neural_at_h,
    .scan_open = neural_scan_open,
    .scan_block = neural_scan_block,
    .scan_input = neural_scan_input,
    .scan_close = neural_scan_close,
};
