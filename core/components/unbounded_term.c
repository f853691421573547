/* unbounded_term.c -- the unbounded cache's component row (component.h):
 * the variable-bandwidth kernel density of Grave, Cisse, Joulin 2017, eq.
 * 5-6, over the k nearest neighbours of h_t in the namespace's index store
 * (unbounded_cache.h), its gate features and explain. */
#include "unbounded_term.h"
#include "components.h"
#include "vmath.h"
#include "fault.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the term (unbounded_term.h) ------------------------------------------ */

/* θ(h)², the squared distance to the last neighbour returned; -1 when there
 * is none (ids -1 that an IVF search returns are not neighbours, design §4). */
static double bandwidth2(const float *d2, const int *words, int k)
{
    int last = -1;
    for (int i = 0; i < k; i++)
        if (words[i] >= 0)
            last = i;
    if (last < 0)
        return -1.0;
    return d2[last] > 0.0f ? (double)d2[last] : 0.0;
}

/* w[i] = K(d_i / θ) for i < n from squared distances: u² = d² / θ² (FAISS's
 * d² is clamped at 0 against rounding), 0 where words[i] < 0 (no
 * neighbour); θ = 0 gives weight 1 to all. The Gaussian's at the numeric
 * core's level (vm_gauss_d2), the same bits at each. */
static void kernel_weights(nc_kernel kern, double theta2, const float *d2, const int *words, int n, double *w)
{
    if (kern == NC_KERNEL_GAUSSIAN && theta2 > 0.0) {
        vm_gauss_d2(w, d2, words, n, theta2);
        return;
    }
    for (int i = 0; i < n; i++) {
        double u2 = theta2 > 0.0 ? (d2[i] > 0.0f ? d2[i] : 0.0) / theta2 : 0.0;
        w[i] = words[i] < 0 ? 0.0 : theta2 <= 0.0 ? 1.0 : u2 < 1.0 ? 1.0 - u2 : 0.0;
    }
}

/* Σ w[i] in four interleaved sums (s[i mod 4], i counted from the first
 * chunk), added (s0 + s1) + (s2 + s3) at the end: one order at every level,
 * four independent chains; s[4] carries the sums between chunks (i0 a
 * multiple of 4) */
static void sum4(const double *w, int n, double *s)
{
    double s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
    int i = 0;
    for (; i + 4 <= n; i += 4)
        s0 += w[i], s1 += w[i + 1], s2 += w[i + 2], s3 += w[i + 3];
    if (i < n)
        s0 += w[i];
    if (i + 1 < n)
        s1 += w[i + 1];
    if (i + 2 < n)
        s2 += w[i + 2];
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

/* The k neighbours a kernel pass reads: squared distances, words */
typedef struct {
    nc_kernel kern;
    const float *d2;
    const int *words;
    int k;
} ub_neighbours;

/* The kernel weights of the k neighbours, in chunks of UB_CHUNK (w: all of
 * them, or NULL); their sum, and num (if not NULL) the sum of those whose
 * word is x */
#define UB_CHUNK 256
static double kernel_pass(const ub_neighbours *nb, double *w, int x, double *num)
{
    const nc_kernel kern = nb->kern;
    const float *d2 = nb->d2;
    const int *words = nb->words, k = nb->k;
    double theta2 = bandwidth2(d2, words, k), s[4] = {0, 0, 0, 0}, buf[UB_CHUNK];
    if (theta2 < 0.0)
        return 0.0;
    for (int i0 = 0; i0 < k; i0 += UB_CHUNK) {
        const int n = k - i0 < UB_CHUNK ? k - i0 : UB_CHUNK;
        double *c = w ? w + i0 : buf;
        kernel_weights(kern, theta2, d2 + i0, words + i0, n, c);
        sum4(c, n, s);
        for (int i = 0; num && i < n; i++)
            if (words[i0 + i] == x)
                *num += c[i];
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

double unbounded_term_kernel_sum(nc_kernel kern, const float *d2, const int *words, int k, double *w)
{
    NC_ASSERT(k <= 0 || (d2 && words), "unbounded_term_kernel_sum: %d neighbours, no distances or words", k);
    if (w && bandwidth2(d2, words, k) < 0.0)
        for (int i = 0; i < k; i++)
            w[i] = 0.0;
    const ub_neighbours nb = {kern, d2, words, k};
    return kernel_pass(&nb, w, -1, NULL);
}

double unbounded_term_prob(nc_kernel kern, const float *d2, const int *words, int k, int x)
{
    NC_ASSERT(k <= 0 || (d2 && words), "unbounded_term_prob: %d neighbours, no distances or words", k);
    const ub_neighbours nb = {kern, d2, words, k};
    double num = 0.0, sum = kernel_pass(&nb, NULL, x, &num);
    return sum > 0.0 ? num / sum : 0.0;
}

double unbounded_term_weights(nc_kernel kern, const float *d2, const int *words, int k, double *w)
{
    NC_ASSERT(k <= 0 || (d2 && words), "unbounded_term_weights: %d neighbours, no distances or words", k);
    double sum = unbounded_term_kernel_sum(kern, d2, words, k, w);
    for (int i = 0; i < k; i++)
        w[i] = sum > 0.0 ? w[i] / sum : 0.0;
    return sum;
}

/* ---- the mixture's row (component.h) ------------------------------------
 * (1-λ) p + λ p_kde, p_kde(w) ∝ Σ_{i∈N_k, w_i=w} K(d_i/θ(h)) (eq. 5-6), over
 * the k neighbours searched: its pairs of the mixture input (mix_input.h:
 * scores the squared distances). */
#define UB_PAIRS(in) ((in)->pairs[NC_COMP_UNBOUNDED])

/* What a search at h found: k neighbours' distances, words and (explain)
 * store ids, in one allocation (the caller frees the scratch). */
typedef struct {
    int k;
    float *d2;
    int *words;
    int64_t *ids;                 /* NULL unless explain */
} ub_found;

static bool ub_on(const nc_cache_params *p)
{
    return p->unbounded;
}

static int ub_validate(const nc_cache_params *p, char *err, size_t errlen)
{
    if (p->exact && !p->unbounded)
        return nc_error(err, errlen, NC_EINVAL, "exact applies to the unbounded cache, which is off");
    return NC_OK;
}

static double ub_lambda(const nc_cache_params *p)
{
    return p->unbounded_lambda;
}

/* Whether unbounded_term_kernel_sum is > 0, without its exps: a sum of
 * weights >= 0 is > 0 exactly when one weight is, and a weight is > 0
 * exactly where kernel_weights makes it so: θ = 0 (all 1), the Gaussian's
 * -u²/2 >= VM_EXP_D_MIN (vm_gauss_d2 gives 0 below, a normal number from there),
 * the Epanechnikov's u² < 1; u² computed as there. (Half the kernel's
 * cost a token: the mixture asks this before the probability.) */
static bool kernel_has_mass(nc_kernel kern, const float *d2, const int *words, int k)
{
    double theta2 = bandwidth2(d2, words, k);
    if (theta2 < 0.0)
        return false;
    for (int i = 0; i < k; i++) {
        if (words[i] < 0)
            continue;
        double u2 = theta2 > 0.0 ? (d2[i] > 0.0f ? d2[i] : 0.0) / theta2 : 0.0;
        if (theta2 <= 0.0 || (kern == NC_KERNEL_GAUSSIAN ? -0.5 * u2 >= VM_EXP_D_MIN : u2 < 1.0))
            return true;
    }
    return false;
}

/* on, searched, and some neighbour with kernel mass */
static bool ub_available(const nc_cache_params *p, const nc_mix_input *in)
{
    return p->unbounded && UB_PAIRS(in).n > 0 && !UB_PAIRS(in).skipped &&
           kernel_has_mass(p->kernel, UB_PAIRS(in).score, UB_PAIRS(in).word, UB_PAIRS(in).n);
}

static double ub_prob(const nc_cache_params *p, const nc_mix_input *in, int x)
{
    return unbounded_term_prob(p->kernel, UB_PAIRS(in).score, UB_PAIRS(in).word, UB_PAIRS(in).n, x);
}

static int ub_max_word(const nc_mix_input *in)
{
    const nc_row_pairs *nb = &UB_PAIRS(in);
    int m = -1;
    for (int i = 0; nb->word && i < nb->n; i++)
        if (nb->word[i] > m)
            m = nb->word[i];
    return m;
}

static int ub_dense(const nc_cache_params *p, const nc_mix_input *in, double *q, size_t n)
{
    (void)n;
    const nc_row_pairs *nb = &UB_PAIRS(in);
    double *kw = nc_malloc((size_t)nb->n * sizeof(double));   /* K_i / Σ K */
    if (!kw)
        return NC_ENOMEM;
    unbounded_term_weights(p->kernel, nb->score, nb->word, nb->n, kw);
    for (int i = 0; i < nb->n; i++)
        if (nb->word[i] >= 0)
            q[nb->word[i]] += kw[i];
    free(kw);
    return NC_OK;
}

/* neighbours read by the distinct-word features: the nearest ones, where
 * the kernel's mass is; a fixed number keeps the cost independent of k */
#define UB_NEAR 32
enum { F_D1, F_DK, F_DISTINCT, F_TOPSHARE, F_AGREE_NU, F_AGREE_VU, F_VOCAB_OF };

/* The neighbours' statistics, after the search (post) */
static void ub_features(const nc_cache_params *p, const nc_mix_input *in, nc_feat_ctx *ctx, double *pre,
                        double *post)
{
    (void)p, (void)pre;
    const nc_row_pairs *nb = &UB_PAIRS(in);
    if (!post || nb->n <= 0 || !nb->word || nb->word[0] < 0)
        return;
    int last = 0;
    while (last + 1 < nb->n && nb->word[last + 1] >= 0)
        last++;
    int near = last + 1 < UB_NEAR ? last + 1 : UB_NEAR, distinct = 0, top = 0;
    for (int i = 0; i < near; i++) {
        int w = nb->word[i], seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = nb->word[j] == w;
        distinct += !seen;
        top += w == nb->word[0];
    }
    post[F_D1] = log1p(nb->score[0] > 0.0f ? nb->score[0] : 0.0);           /* log(1 + d²) nearest */
    post[F_DK] = log1p(nb->score[last] > 0.0f ? nb->score[last] : 0.0);     /* ... k-th (bandwidth) */
    post[F_DISTINCT] = (double)distinct / near;       /* distinct words among the 32 nearest */
    post[F_TOPSHARE] = (double)top / near;            /* share of the nearest one's word */
    post[F_AGREE_NU] = nb->word[0] == ctx->attended;
    post[F_AGREE_VU] = nb->word[0] == in->v_argmax;
    post[F_VOCAB_OF] = mix_vocab_logp(in, nb->word[0]);
}

static const char *const ub_knobs[] = {"unbounded", "knn", "nprobe", "unbounded_lambda", "kernel", "exact", NULL};
static const char *const ub_feature_names[] = {"ub_nearest_d2", "ub_kth_d2", "ub_distinct", "ub_top_share",
                                               "agree_neural_ub", "agree_vocab_ub", "vocab_log_p_of_ub", NULL};

/* The neighbours of each word asked (component.h explain), weighted by the
 * kernel as the mixture weights them, with their distance ||h_t - h_i||;
 * a tie goes to the earlier neighbour in the search's order. */
static int ub_explain(const nc_explain_ctx *x, nc_explain_entry *out, int *counts, char *err, size_t errlen)
{
    const nc_mix_input *in = x->in;
    const nc_row_pairs *nb = &UB_PAIRS(in);
    const ub_found *f = x->scratch;   /* ub_search_h's, with the store's ids */
    if (nb->n <= 0 || !f || !f->ids)
        return NC_OK;
    double *w = nc_malloc((size_t)nb->n * sizeof *w);
    int *cand = nc_malloc((size_t)nb->n * sizeof *cand);
    int rc = w && cand ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "explain");
    if (!rc)
        unbounded_term_weights(x->p->kernel, nb->score, nb->word, nb->n, w);
    for (size_t q = 0; !rc && q < x->k; q++) {
        int nc = 0;
        for (int i = 0; i < nb->n; i++)
            if (nb->word[i] == x->ids[q])
                cand[nc++] = i;
        nc = components_heaviest(cand, nc, w, NULL, x->per_source);
        for (int j = 0; j < nc; j++) {
            int i = cand[j];
            out[q * x->stride + (size_t)counts[q]++] = (nc_explain_entry){
                .source = x->comp, .at = f->ids[i], .weight = w[i],
                .distance = sqrt(nb->score[i] > 0.0f ? (double)nb->score[i] : 0.0)};
        }
    }
    free(w);
    free(cand);
    return rc;
}

/* ---- the session's side of the store (component.h's state hooks) --------
 * The store is the namespace's, shared and kept by store/: a session's state
 * is its view of it -- the store, how the session reads its words -- and the
 * memo of the search at the stream's h (issue 26): the coarse search of h,
 * which the next feed's add of h as a key reuses (and a repeated predict),
 * and the neighbours found, which a next feed that does not adapt reads
 * while the store is as the search saw it (count, gen). Only what those
 * would make to the bit is kept; a moved h drops it (nc_at_h.memo false, a
 * pass over the state, clear, resize). Nothing of it is in the export blob
 * (the store is not the session's) nor rolled back (a rescoring adds
 * nothing to the store). */
typedef struct {
    nc_unbounded_cache *ub;       /* borrowed; NULL: none */
    int unk_id;                   /* nc_state_args.unk_id */
    nc_ub_coarse coarse;          /* unbounded_cache_coarse of h for p.nprobe (n = 0: none) */
    bool nb;                      /* d2, words: the search of h (k = p.knn neighbours) */
    float *d2;                    /* [cap] */
    int *words;
    int cap;
    int64_t count;                /* the store's version the search saw */
    uint64_t gen;
} ub_state;

/* How a session or a document reads the store's words (unbounded_cache.h). */
static int ub_reader(const nc_cache_params *p, int unk_id)
{
    return p->open_vocab || unk_id < 0 ? NC_UB_OPEN : unk_id;
}

static void memo_drop(ub_state *u)
{
    u->coarse.n = 0;
    u->nb = false;
}

static int ub_state_new(const nc_state_args *a, void **out, char *err, size_t errlen)
{
    NC_ASSERT(a && out, "ub_state_new: no a or out");
    *out = NULL;
    nc_unbounded_cache *ub = a->store;
    if (a->strict && a->p->unbounded && !ub)
        return nc_error(err, errlen, NC_EINVAL, "unbounded cache requested but none given");
    if (a->strict && ub && unbounded_cache_dim(ub) != a->H)
        return nc_error(err, errlen, NC_EINVAL, "unbounded cache dimension %d, model hidden size %d",
                        unbounded_cache_dim(ub), a->H);
    ub_state *u = nc_zalloc(1, sizeof *u);
    if (!u)
        return nc_error(err, errlen, NC_ENOMEM, "unbounded cache state");
    u->ub = ub;
    u->unk_id = a->unk_id;
    *out = u;
    return NC_OK;
}

static void ub_state_free(void *state)
{
    ub_state *u = state;
    if (!u)
        return;
    ub_coarse_free(&u->coarse);
    free(u->d2);
    free(u->words);
    free(u);
}

static void ub_state_clear(void *state)
{
    NC_ASSERT(state, "ub_state_clear: no state");
    memo_drop(state);
}

/* The same store under new settings (nothing kept: they move the search). */
static int ub_state_resize(const void *old, const nc_state_args *a, void **out, char *err, size_t errlen)
{
    NC_ASSERT(old, "ub_state_resize: no old state");
    const ub_state *o = old;
    *out = NULL;
    if (a->p->unbounded && !o->ub)
        return nc_error(err, errlen, NC_ESTATE, "this stream has no unbounded cache");
    const nc_state_args b = {.p = a->p, .H = a->H, .store = o->ub, .unk_id = o->unk_id};
    return ub_state_new(&b, out, err, errlen);
}

/* The pairs go to the store a block at a time, before its search
 * (ub_scan_search), not one by one after the mixture. */
static int ub_push(void *state, const float *h, int word)
{
    (void)state, (void)h, (void)word;
    return NC_OK;
}

static int ub_mark(const void *state, size_t npush, void **mark, char *err, size_t errlen)
{
    (void)state, (void)npush, (void)err, (void)errlen;
    *mark = NULL;
    return NC_OK;
}

static void ub_rollback(void *state, void *mark)
{
    (void)state, (void)mark;
}

static size_t ub_memory(const void *state)
{
    const ub_state *u = state;
    return u->coarse.cap * (sizeof(float) + sizeof(int64_t)) + (size_t)u->cap * (sizeof(float) + sizeof(int));
}

static bool ub_can_search(const void *state)
{
    return ((const ub_state *)state)->ub != NULL;
}

/* The search of h just made (k neighbours, of the store at count, gen)
 * into the memo; without room for it, none. */
static void memo_keep_neighbours(ub_state *u, const float *d2, const int *words, int k, int64_t count,
                                 uint64_t gen)
{
    if (k > u->cap) {
        float *d = nc_realloc(u->d2, (size_t)k * sizeof(float));
        if (d)
            u->d2 = d;
        int *w = d ? nc_realloc(u->words, (size_t)k * sizeof(int)) : NULL;
        if (w)
            u->words = w;
        if (!d || !w)
            return;
        u->cap = k;
    }
    memcpy(u->d2, d2, (size_t)k * sizeof(float));
    memcpy(u->words, words, (size_t)k * sizeof(int));
    u->count = count;
    u->gen = gen;
    u->nb = true;
}

static ub_found *found_new(int k, bool ids)
{
    size_t n = sizeof(ub_found) + (size_t)k * (sizeof(int64_t) + sizeof(float) + sizeof(int));
    ub_found *f = nc_malloc(n);
    if (!f)
        return NULL;
    char *p = (char *)(f + 1);
    f->k = k;
    f->ids = ids ? (int64_t *)p : NULL;
    f->d2 = (float *)(p + (size_t)k * sizeof(int64_t));
    f->words = (int *)(p + (size_t)k * (sizeof(int64_t) + sizeof(float)));
    return f;
}

/* The k nearest neighbours of h in the store, as the session reads them;
 * the coarse search of h kept for the next feed's add of h (and a repeated
 * predict), the neighbours for its score. */
static int ub_search_h(void *state, const nc_at_h *a, char *err, size_t errlen)
{
    NC_ASSERT(state && a, "ub_search_h: no state or a");
    ub_state *u = state;
    const nc_cache_params *p = a->p;
    if (!a->memo)
        memo_drop(u);
    if (!u->ub || !p->unbounded)
        return NC_OK;
    if (a->skip) {
        UB_PAIRS(a->in).skipped = true;
        return NC_OK;
    }
    const int k = p->knn;
    ub_found *f = found_new(k, a->explain);
    *a->scratch = f;
    if (!f)
        return nc_error(err, errlen, NC_ENOMEM, "neighbours");
    UB_PAIRS(a->in).score = f->d2;
    UB_PAIRS(a->in).word = f->words;
    UB_PAIRS(a->in).n = k;
    if (a->keep && u->coarse.n == 0)
        unbounded_cache_coarse(u->ub, a->h, 1, p->nprobe, &u->coarse);
    else if (a->keep)
        ++*a->memo_reads;
    int64_t count = 0;
    uint64_t gen = 0;
    nc_ub_query q = {.queries = a->h, .nq = 1, .k = k, .nprobe = p->nprobe, .reader = ub_reader(p, u->unk_id),
                     .coarse = a->keep && u->coarse.n ? &u->coarse : NULL, .out_d2 = f->d2,
                     .out_words = f->words, .out_ids = f->ids, .out_count = &count, .out_gen = &gen};
    int rc = unbounded_cache_query(u->ub, &q, err, errlen);
    if (!rc && a->keep)
        memo_keep_neighbours(u, f->d2, f->words, k, count, gen);
    return rc;
}

/* ---- a document pass (component.h scan_*) ---- */

typedef struct {
    ub_state *u;
    const nc_cache_params *p;
    const float *q;               /* the pass's queries = keys [n, H] */
    const int *store_ids;
    size_t first;
    int H, k, reader;
    bool pre, read, add;
    const float *pre_d2;          /* the caller's neighbours [n, k], with pre */
    const int *pre_words;
    /* the state's memo at row 0 (nc_scan_doc.at_h0): its coarse search, and
     * its neighbours while the store is as the search saw it */
    const nc_ub_coarse *coarse0;
    const float *pre0_d2;
    const int *pre0_words;
    float *ud2, *qs;              /* a block's neighbours [B, k], its searched queries [B, H] */
    int *uw, *row_of;
    int64_t *lim;
    nc_ub_coarse coarse;          /* the block's add's coarse search, its search's too */
} ub_scan;

static void ub_scan_close(void *scan)
{
    ub_scan *s = scan;
    if (!s)
        return;
    memo_drop(s->u);   /* the pass moved h: what was kept at the old one is stale */
    free(s->ud2);
    free(s->uw);
    free(s->lim);
    free(s->qs);
    free(s->row_of);
    ub_coarse_free(&s->coarse);
    free(s);
}

/* The state's memo of row 0's h, what of it holds now: the coarse search,
 * and the neighbours when the pass does not add and the store is as the
 * search saw it. */
static void scan_memo(ub_scan *s, const nc_scan_doc *d)
{
    ub_state *u = s->u;
    if (!d->at_h0)
        return;
    s->coarse0 = u->coarse.n ? &u->coarse : NULL;
    if (!s->add && u->nb) {
        int64_t count;
        uint64_t gen;
        unbounded_cache_version(u->ub, &count, &gen);
        if (count == u->count && gen == u->gen) {
            s->pre0_d2 = u->d2;
            s->pre0_words = u->words;
        }
    }
}

static int ub_scan_open(void *state, const nc_scan_doc *d, size_t block, void **out, char *err, size_t errlen)
{
    NC_ASSERT(state && d && out, "ub_scan_open: no state, d or out");
    ub_state *u = state;
    const nc_cache_params *p = d->p;
    *out = NULL;
    const bool pre = d->pre_d2 && d->pre_words, read = p->unbounded && u->ub && !pre, add = d->adapt && u->ub && !pre;
    if (!read && !add && !(pre && p->unbounded))
        return NC_OK;
    ub_scan *s = nc_zalloc(1, sizeof *s);
    if (!s)
        return nc_error(err, errlen, NC_ENOMEM, "scoring buffers");
    *s = (ub_scan){.u = u, .p = p, .q = d->q, .store_ids = d->store_ids, .first = d->first, .H = d->H,
                   .k = p->knn, .reader = ub_reader(p, d->unk_id), .pre = pre, .read = read, .add = add,
                   .pre_d2 = d->pre_d2, .pre_words = d->pre_words};
    *out = s;
    if (!pre && u->ub)
        scan_memo(s, d);
    const size_t B = block, k = (size_t)s->k;
    if (read) {
        s->ud2 = nc_malloc(B * k * sizeof(float));
        s->uw = nc_malloc(B * k * sizeof(int));
        s->lim = nc_malloc(B * sizeof(int64_t));
        s->qs = nc_malloc(B * (size_t)d->H * sizeof(float));
        s->row_of = nc_malloc(B * sizeof(int));
        if (!s->ud2 || !s->uw || !s->lim || !s->qs || !s->row_of)
            return nc_error(err, errlen, NC_ENOMEM, "scoring buffers");
    }
    return NC_OK;
}

/* The block's pairs into the store; their ids bound each position's
 * search (a block's own later pairs are its future). */
static int scan_add(ub_scan *s, size_t b0, size_t nb, char *err, size_t errlen)
{
    const float *Q = s->q + b0 * (size_t)s->H;
    /* the state's coarse search of row 0 (a stream's predict at this h)
     * serves the add and the search, as the add's own would */
    const nc_ub_coarse *c0 = s->coarse0;
    bool made = s->read && c0 && b0 == 0 && c0->n == nb && ub_coarse_copy(&s->coarse, c0, Q) == NC_OK;
    int64_t first_id;
    /* its coarse search of the keys (= the queries) serves the search */
    nc_ub_add a = {.keys = Q, .words = s->store_ids + b0, .n = nb, .nprobe = s->p->nprobe,
                   .coarse = s->read ? &s->coarse : NULL, .coarse_made = made};
    int rc = unbounded_cache_add_block(s->u->ub, &a, &first_id, err, errlen);
    for (size_t r = 0; !rc && s->read && r < nb; r++)
        s->lim[r] = first_id + (int64_t)r;   /* pairs of this block at >= r are the future */
    return rc;
}

/* The search of the block's positions not skipped, as one batch, the
 * results at their rows; b->searched, b->skipped. */
static int scan_read(ub_scan *s, nc_scan_search *b, char *err, size_t errlen)
{
    const size_t b0 = b->b0, nb = b->nb, H = (size_t)s->H, k = (size_t)s->k;
    const float *Q = s->q + b0 * H;
    size_t ns = 0;
    for (size_t r = 0; r < nb; r++)
        if (!b->skip[r])
            s->row_of[ns++] = (int)r;
    /* a skip in the block: its searched rows into qs (all of them, the
     * ones before the first skip included), limits alike */
    for (size_t i = 0; ns < nb && i < ns; i++) {
        memcpy(s->qs + i * H, Q + (size_t)s->row_of[i] * H, H * sizeof(float));
        s->lim[i] = s->lim[s->row_of[i]];
    }
    const float *QS = ns == nb ? Q : s->qs;
    /* row 0's neighbours as the state holds them (its memo) */
    bool held = !s->add && s->pre0_d2 && b0 == 0 && nb == 1 && ns == 1;
    if (held) {
        memcpy(s->ud2, s->pre0_d2, k * sizeof(float));
        memcpy(s->uw, s->pre0_words, k * sizeof(int));
    }
    nc_ub_query q = {.queries = QS, .nq = ns, .k = (int)k, .nprobe = s->p->nprobe,
                     .id_limit = s->add ? s->lim : NULL, .extra = s->add ? (int)nb : 0, .reader = s->reader,
                     .coarse = &s->coarse, .out_d2 = s->ud2, .out_words = s->uw};
    int rc = ns > 0 && !held ? unbounded_cache_query(s->u->ub, &q, err, errlen) : NC_OK;
    /* results to their rows, from the last (row_of[i] >= i) */
    for (size_t i = ns; !rc && i-- > 0;)
        if ((size_t)s->row_of[i] != i) {
            memcpy(s->ud2 + (size_t)s->row_of[i] * k, s->ud2 + i * k, k * sizeof(float));
            memcpy(s->uw + (size_t)s->row_of[i] * k, s->uw + i * k, k * sizeof(int));
        }
    b->searched = ns;
    b->skipped = nb - ns;
    return rc;
}

static int ub_scan_search(void *scan, nc_scan_search *b, char *err, size_t errlen)
{
    NC_ASSERT(scan && b, "ub_scan_search: no scan or b");
    ub_scan *s = scan;
    const size_t k = (size_t)s->k;
    int rc = s->add ? scan_add(s, b->b0, b->nb, err, errlen) : NC_OK;
    b->searched = b->skipped = 0;
    if (!rc && s->read)
        rc = scan_read(s, b, err, errlen);
    for (size_t r = 0; !rc && r < b->nb; r++) {
        nc_mix_input *in = &b->ins[r];
        const size_t t = b->b0 + r;
        if (b->skip[r]) {
            UB_PAIRS(in).skipped = true;
            b->skipped += !s->read;
        } else if (s->read) {
            UB_PAIRS(in).score = s->ud2 + r * k;
            UB_PAIRS(in).word = s->uw + r * k;
            UB_PAIRS(in).n = s->k;
        } else if (s->pre && s->p->unbounded) {
            UB_PAIRS(in).score = s->pre_d2 + t * k;
            UB_PAIRS(in).word = s->pre_words + t * k;
            UB_PAIRS(in).n = s->k;
            b->searched++;
        }
    }
    return rc;
}

const nc_component nc_component_unbounded = {
    .name = "unbounded",
    .knobs = ub_knobs,
    .on = ub_on,
    .validate = ub_validate,
    .lambda = ub_lambda,
    .available = ub_available,
    .prob = ub_prob,
    .max_word = ub_max_word,
    .dense = ub_dense,
    .features = ub_feature_names,
    .gate_features = ub_features,
    .searched = true,
    .explain = ub_explain,
    .entries_in_store = true,
    .state_new = ub_state_new,
    .state_free = ub_state_free,
    .state_clear = ub_state_clear,
    .state_resize = ub_state_resize,
    .push = ub_push,
    .mark = ub_mark,
    .rollback = ub_rollback,
    .memory = ub_memory,
    .scan_open = ub_scan_open,
    .scan_close = ub_scan_close,
    .can_search = ub_can_search,
    .search_h = ub_search_h,
    .scan_search = ub_scan_search,
};
