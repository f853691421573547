/* dyneval.c -- dynamic evaluation: per-stream online adaptation of the
 * LSTM's weights (Krause et al. 2018; the update rule is in dyneval.h). */
#include "dyneval.h"
#include "vmath.h"
#include "fault.h"
#include "scratch.h"

#include <cblas.h>
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Which tensor of the model an adapted tensor is. */
enum { K_WIH, K_WHH, K_BIH, K_BHH, K_DECB, K_ENC, K_DECW };

typedef struct {
    int kind, layer;
    size_t n;
    float *w;                     /* the stream's copy (the shadow's tensor) */
    const float *w0;              /* the trained weights */
    const float *ms;              /* MS_g as stored (NULL while measuring MS_g); the update reads
                                   * its square root, dyneval_rms */
    float *g;                     /* gradient of the last dyneval_loss, or NULL */
} dyn_tensor;

#define DYN_MAX_TENSORS 64

struct nc_dyneval {
    const nc_model *base;
    nc_model shadow;              /* shallow copy; adapted tensors are ours */
    nc_lstm_layer *layers;        /* shadow.layers */
    float **bsum;                 /* [L] own b_sum of a layer whose biases adapt, else NULL */
    bool *lw, *lb;                /* [L] layer's matrices / biases adapt */
    int lo;                       /* lowest layer the backward pass reaches (L: none) */
    bool embed;                   /* the embedding / decoder matrix adapts */
    int subset, nt;
    dyn_tensor t[DYN_MAX_TENSORS];
    float rms_mean;               /* mean of sqrt(MS_g) over every weight of the model */
    unsigned long id, steps;      /* unique id, updates taken: what a recorded forward pass is valid for */
    nc_lstm_hook hook;            /* shadow.hook: the scoring pass's activations (dyn_trace) */
    nc_state *seg;                /* state the current segment starts from */
    bool seg_has_h;
    int *seg_tok;
    int seg_len, seg_cap;
};

/* The model's pointer for tensor (kind, layer). */
static float **slot_of(nc_model *m, int kind, int l)
{
    switch (kind) {
    case K_WIH: return &m->layers[l].w_ih;
    case K_WHH: return &m->layers[l].w_hh;
    case K_BIH: return &m->layers[l].b_ih;
    case K_BHH: return &m->layers[l].b_hh;
    case K_DECB: return &m->decoder_b;
    case K_ENC: return &m->encoder;
    default: return &m->decoder_w;
    }
}

static size_t count_of(const nc_model *m, int kind, int l)
{
    const size_t V = (size_t)m->cfg.vocab_size, E = (size_t)m->cfg.embedding_size, H = (size_t)m->cfg.hidden_size;
    switch (kind) {
    case K_WIH: return 4 * H * (size_t)m->layers[l].input_size;
    case K_WHH: return 4 * H * H;
    case K_BIH:
    case K_BHH: return 4 * H;
    case K_DECB: return V;
    case K_ENC: return V * E;
    default: return V * H;
    }
}

/* The tensors subset adapts, in a fixed order (the export blob's). */
static int plan(const nc_model *m, int subset, int *kinds, int *layers)
{
    const int L = m->cfg.num_layers;
    int n = 0;
    for (int l = 0; l < L; l++) {
        bool w = subset == NC_DYN_ALL || subset == NC_DYN_LSTM || (subset == NC_DYN_TOP && l == L - 1);
        bool b = w || subset == NC_DYN_BIAS;
        if (w) {
            kinds[n] = K_WIH, layers[n++] = l;
            kinds[n] = K_WHH, layers[n++] = l;
        }
        if (b) {
            kinds[n] = K_BIH, layers[n++] = l;
            kinds[n] = K_BHH, layers[n++] = l;
        }
    }
    kinds[n] = K_DECB, layers[n++] = 0;
    if (subset == NC_DYN_ALL) {
        kinds[n] = K_ENC, layers[n++] = 0;
        if (m->decoder_w != m->encoder)
            kinds[n] = K_DECW, layers[n++] = 0;
    }
    return n;
}

size_t dyneval_memory_of(const nc_model *m, int subset)
{
    NC_ASSERT(m, "dyneval_memory_of: no m");
    int kinds[DYN_MAX_TENSORS], layers[DYN_MAX_TENSORS];
    int n = plan(m, subset, kinds, layers);
    size_t floats = 0;
    for (int k = 0; k < n; k++) {
        floats += count_of(m, kinds[k], layers[k]);
        if (kinds[k] == K_BIH)
            floats += 4 * (size_t)m->cfg.hidden_size;   /* its layer's b_sum */
    }
    return floats * sizeof(float) + (size_t)m->cfg.num_layers * sizeof(nc_lstm_layer) +
           2 * (size_t)m->cfg.num_layers * m->cfg.hidden_size * sizeof(float) + sizeof(nc_dyneval);
}

void dyneval_free(nc_dyneval *d)
{
    if (!d)
        return;
    for (int k = 0; k < d->nt; k++) {
        nc_free(d->t[k].w);
        nc_free(d->t[k].g);
    }
    for (int l = 0; d->bsum && l < d->base->cfg.num_layers; l++)
        nc_free(d->bsum[l]);
    free(d->bsum);
    free(d->lw);
    free(d->lb);
    free(d->layers);
    lstm_state_free(d->seg);
    free(d->seg_tok);
    free(d);
}

void dyneval_refresh(nc_dyneval *d)
{
    NC_ASSERT(d, "dyneval_refresh: no d");
    const size_t G = 4 * (size_t)d->base->cfg.hidden_size;
    for (int l = 0; l < d->base->cfg.num_layers; l++)
        if (d->bsum[l])
            for (size_t j = 0; j < G; j++)
                d->bsum[l][j] = d->layers[l].b_ih[j] + d->layers[l].b_hh[j];
}

/* Tensor t (kind and layer set) becomes the stream's own copy of the
 * trained weights, put in the shadow model, and its layer is marked as
 * adapting. */
static int adopt_tensor(nc_dyneval *d, dyn_tensor *t, char *err, size_t errlen)
{
    const nc_model *m = d->base, *ms = m->dyn_ms;
    const int l = t->layer;
    int rc = NC_OK;
    t->n = count_of(m, t->kind, l);
    t->w0 = *slot_of((nc_model *)m, t->kind, l);
    t->ms = ms ? *slot_of((nc_model *)ms, t->kind, l) : NULL;
    if (!(t->w = nc_alloc(t->n * sizeof(float))))
        return nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation: %zu weights", t->n);
    memcpy(t->w, t->w0, t->n * sizeof(float));
    *slot_of(&d->shadow, t->kind, l) = t->w;
    /* the copy is F32 and will leave the half grid: the shadow drops the
     * binary16 copies of what adapts (a tied encoder is the decoder) */
    if (t->kind == K_WHH) {
        d->layers[l].w_hh_f16 = NULL;
        d->layers[l].w_hh_f16_buf = NULL;
    }
    if (t->kind == K_WIH) {
        d->layers[l].w_ih_f16 = NULL;
        d->layers[l].w_ih_f16_buf = NULL;
    }
    if (t->kind == K_DECW || (t->kind == K_ENC && m->decoder_w == m->encoder)) {
        d->shadow.decoder_f16 = NULL;
        d->shadow.decoder_f16_buf = NULL;
    }
    if (t->kind == K_WIH || t->kind == K_WHH)
        d->lw[l] = true;
    if (t->kind == K_BIH && !(d->bsum[l] = nc_alloc(4 * (size_t)m->cfg.hidden_size * sizeof(float))))
        rc = nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation");
    if (t->kind == K_BIH) {
        d->lb[l] = true;
        d->layers[l].b_sum = d->bsum[l];
    }
    if ((t->kind <= K_BHH) && l < d->lo)
        d->lo = l;
    if (t->kind == K_ENC || t->kind == K_DECW)
        d->embed = true;
    return rc;
}

/* sqrt(MS_g) of one weight from the stored MS_g: the model keeps the
 * statistics as measured (model.c only loads and checks them) and the
 * update takes the root where it reads them. A negative or NaN mean square
 * (refused at load for the biases) counts as 0. */
static inline float dyneval_rms(float ms)
{
    return sqrtf(ms > 0.0f ? ms : 0.0f);
}

/* RMS_norm's denominator: mean sqrt(MS_g) over the whole model, so that a
 * weight decays at the same rate whichever subset adapts. */
static float rms_mean_of(const nc_model *m, const nc_model *ms)
{
    int ak[DYN_MAX_TENSORS], al[DYN_MAX_TENSORS];
    int na = plan(m, NC_DYN_ALL, ak, al);
    double sum = 0;
    size_t cnt = 0;
    for (int k = 0; k < na; k++) {
        const float *v = *slot_of((nc_model *)ms, ak[k], al[k]);
        size_t n = count_of(m, ak[k], al[k]);
        for (size_t j = 0; j < n; j++)
            sum += (double)dyneval_rms(v[j]);
        cnt += n;
    }
    return cnt && sum > 0 ? (float)(sum / (double)cnt) : 1.0f;
}

static void trace_begin(void *ctx, const nc_state *s, const int *tokens, size_t T);
static void trace_step(void *ctx, int l, size_t t, const float *const rows[5]);

/* The adaptation state; need_ms: the update will need MS_g. */
static int dyn_create(const nc_model *m, int subset, bool need_ms, nc_dyneval **out, char *err, size_t errlen)
{
    *out = NULL;
    if (subset < NC_DYN_BIAS || subset > NC_DYN_ALL)
        return nc_error(err, errlen, NC_EINVAL, "dyn_params = %d is not one of 0 (biases), 1 (last layer), "
                        "2 (LSTM), 3 (all)", subset);
    const nc_model *ms = m->dyn_ms;
    if (need_ms && !ms)
        return nc_error(err, errlen, NC_EINVAL, "dynamic evaluation: the model has no gradient statistics "
                        "(dyneval/model.safetensors; measure them with neurocache dyn-stats)");
    const int L = m->cfg.num_layers;
    nc_dyneval *d = nc_zalloc(1, sizeof *d);
    if (!d)
        return nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation");
    static unsigned long next_id;
    d->base = m;
    d->subset = subset;
    d->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    d->hook = (nc_lstm_hook){d, trace_begin, trace_step};
    d->shadow = *m;
    d->shadow.impl = NULL;
    d->shadow.hook = &d->hook;
    d->layers = nc_malloc((size_t)L * sizeof *d->layers);
    d->bsum = nc_zalloc((size_t)L, sizeof *d->bsum);
    d->lw = nc_zalloc((size_t)L, sizeof *d->lw);
    d->lb = nc_zalloc((size_t)L, sizeof *d->lb);
    d->seg = lstm_state_new(m);
    int rc = d->layers && d->bsum && d->lw && d->lb && d->seg ? NC_OK
                                                              : nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation");
    if (!rc) {
        memcpy(d->layers, m->layers, (size_t)L * sizeof *d->layers);
        d->shadow.layers = d->layers;
    }
    int kinds[DYN_MAX_TENSORS], layers[DYN_MAX_TENSORS];
    d->nt = rc ? 0 : plan(m, subset, kinds, layers);
    d->lo = L;
    for (int k = 0; !rc && k < d->nt; k++) {
        d->t[k].kind = kinds[k];
        d->t[k].layer = layers[k];
        rc = adopt_tensor(d, &d->t[k], err, errlen);
    }
    if (!rc && d->embed && m->decoder_w == m->encoder)
        d->shadow.decoder_w = d->shadow.encoder;    /* tied: one adapted copy */
    if (!rc)
        dyneval_refresh(d);
    if (!rc && ms)
        d->rms_mean = rms_mean_of(m, ms);
    if (rc) {
        dyneval_free(d);
        return rc;
    }
    *out = d;
    return NC_OK;
}

int dyneval_new(const nc_model *m, int subset, const nc_dyn_segment *start, nc_dyneval **out, char *err,
                size_t errlen)
{
    int rc = dyn_create(m, subset, true, out, err, errlen);
    if (!rc) {
        lstm_state_copy((*out)->seg, start->s0);
        (*out)->seg_has_h = start->has_h;
    }
    return rc;
}

const nc_model *dyneval_model(const nc_dyneval *d)
{
    NC_ASSERT(d, "dyneval_model: no d");
    return &d->shadow;
}

int dyneval_subset(const nc_dyneval *d)
{
    NC_ASSERT(d, "dyneval_subset: no d");
    return d->subset;
}

int dyneval_pending(const nc_dyneval *d)
{
    NC_ASSERT(d, "dyneval_pending: no d");
    return d->seg_len;
}

bool dyneval_at_rest(const nc_dyneval *d)
{
    NC_ASSERT(d, "dyneval_at_rest: no d");
    for (int k = 0; k < d->nt; k++)
        if (memcmp(d->t[k].w, d->t[k].w0, d->t[k].n * sizeof(float)) != 0)
            return false;
    return true;
}

size_t dyneval_memory(const nc_dyneval *d)
{
    NC_ASSERT(d, "dyneval_memory: no d");
    size_t b = dyneval_memory_of(d->base, d->subset) + (size_t)d->seg_cap * sizeof(int);
    for (int k = 0; k < d->nt; k++)
        if (d->t[k].g)
            b += d->t[k].n * sizeof(float);
    return b;
}

int dyneval_ntensors(const nc_dyneval *d)
{
    NC_ASSERT(d, "dyneval_ntensors: no d");
    return d->nt;
}

void dyneval_tensor(nc_dyneval *d, int k, float **w, float **g, size_t *count)
{
    NC_ASSERT(d, "dyneval_tensor: no d");
    *w = d->t[k].w;
    *g = d->t[k].g;
    *count = d->t[k].n;
}

/* ---- forward and backward over one segment ------------------------------ */

/* model.c's bound on num_layers */
#define DYN_MAX_LAYERS 64
/* rows of a weight matrix whose gradient is computed and stepped at once */
#define DYN_GRAD_ROWS 32
/* the longest scoring pass recorded (a segment is scored in one pass) */
#define DYN_TRACE_MAX 1024

/* The scoring pass's activations (lstm_forward_seq through the shadow's
 * hook), valid for the adaptation state id after steps updates, from state
 * (h0, c0) over tokens tok[0..T). The record heads the thread's
 * NC_SCRATCH_DYN_TRACE buffer; its rows follow from TRACE_HEAD on. */
typedef struct {
    bool valid;
    unsigned long id, steps;
    size_t T;
    int tok[DYN_TRACE_MAX];
    float *h0, *c0;
    float *x[DYN_MAX_LAYERS], *a[DYN_MAX_LAYERS], *c[DYN_MAX_LAYERS], *tc[DYN_MAX_LAYERS], *h[DYN_MAX_LAYERS];
} dyn_trace;

/* the rows' offset in the trace buffer: 64-byte aligned like the buffer */
#define TRACE_HEAD ((sizeof(dyn_trace) + 63) & ~(size_t)63)

/* The segment's scratch (activations, backward buffers, the fused step's
 * gradient) is carved from one per-thread arena that only grows
 * (NC_SCRATCH_DYN_ARENA, scratch.h): a session holds none of it between
 * segments, and a step touches no fresh pages. The thread's recorded
 * scoring pass lives beside it (NC_SCRATCH_DYN_TRACE). */
static float *arena_get(size_t floats)
{
    return scratch_get(NC_SCRATCH_DYN_ARENA, floats * sizeof(float));
}

/* hook.begin: a forward pass of the shadow starts; record it if short. */
static void trace_begin(void *ctx, const nc_state *s, const int *tokens, size_t T)
{
    const nc_dyneval *d = ctx;
    dyn_trace *tr = scratch_peek(NC_SCRATCH_DYN_TRACE, NULL);
    if (tr)
        tr->valid = false;   /* stays so if this pass is not recorded */
    const size_t L = (size_t)s->num_layers, H = (size_t)s->hidden_size, E = (size_t)d->base->cfg.embedding_size;
    if (T > DYN_TRACE_MAX)
        return;
    const size_t per = E + (L - 1) * H + L * 7 * H;   /* x, a (4H), c, tc, h of every layer, per step */
    const size_t need = T * per + 2 * L * H;
    tr = scratch_get(NC_SCRATCH_DYN_TRACE, TRACE_HEAD + need * sizeof(float));
    if (!tr)
        return;
    tr->valid = false;
    float *p = (float *)((char *)tr + TRACE_HEAD);
    for (size_t l = 0; l < L; l++) {
        tr->x[l] = p, p += T * (l ? H : E);
        tr->a[l] = p, p += T * 4 * H;
        tr->c[l] = p, p += T * H;
        tr->tc[l] = p, p += T * H;
        tr->h[l] = p, p += T * H;
    }
    tr->h0 = p, tr->c0 = p + L * H;
    memcpy(tr->h0, s->h, L * H * sizeof(float));
    memcpy(tr->c0, s->c, L * H * sizeof(float));
    memcpy(tr->tok, tokens, T * sizeof(int));
    tr->T = T;
    tr->id = d->id;
    tr->steps = d->steps;
    tr->valid = true;
}

/* hook.step: one step of one layer. */
static void trace_step(void *ctx, int l, size_t t, const float *const rows[5])
{
    const nc_dyneval *d = ctx;
    dyn_trace *tr = scratch_peek(NC_SCRATCH_DYN_TRACE, NULL);
    if (!tr || !tr->valid || tr->id != d->id)
        return;
    const size_t H = (size_t)d->base->cfg.hidden_size, in = (size_t)d->base->layers[l].input_size;
    memcpy(tr->x[l] + t * in, rows[0], in * sizeof(float));
    memcpy(tr->a[l] + t * 4 * H, rows[1], 4 * H * sizeof(float));
    memcpy(tr->c[l] + t * H, rows[2], H * sizeof(float));
    memcpy(tr->tc[l] + t * H, rows[3], H * sizeof(float));
    memcpy(tr->h[l] + t * H, rows[4], H * sizeof(float));
}

/* The thread's recorded pass when it is d's, with d's current weights, from
 * s0 over the S inputs y[0..S); else NULL. */
static __thread unsigned long trace_uses;

unsigned long dyneval_trace_uses(void)
{
    return trace_uses;
}

static const dyn_trace *trace_for(const nc_dyneval *d, const nc_state *s0, const int *y, int S)
{
    const dyn_trace *tr = scratch_peek(NC_SCRATCH_DYN_TRACE, NULL);
    if (!tr || !tr->valid || tr->id != d->id || tr->steps != d->steps || tr->T < (size_t)S)
        return NULL;
    const size_t LH = (size_t)s0->num_layers * s0->hidden_size * sizeof(float);
    if (memcmp(tr->tok, y, (size_t)S * sizeof(int)) != 0 || memcmp(tr->h0, s0->h, LH) != 0 ||
        memcmp(tr->c0, s0->c, LH) != 0)
        return NULL;
    trace_uses++;
    return tr;
}


/* Activations of the segment's S steps, per layer: input rows [S, in],
 * gates after their non-linearities [S, 4H] (i, f, g, o), c and tanh(c)
 * and h [S, H] each; and where the gradients go. */
typedef struct {
    float *x[DYN_MAX_LAYERS], *a[DYN_MAX_LAYERS], *c[DYN_MAX_LAYERS], *tc[DYN_MAX_LAYERS], *h[DYN_MAX_LAYERS];
    float *rows, *p;              /* decoder inputs [T, H], softmax [T, V] */
    float *dh, *dz, *dn, *hp;     /* backward: [S, max(E,H)] twice, [S, 4H], [S, H] */
    float *hc, *dhc;              /* one step's h, c and the recurrence's dh, dc: [2H] each */
    float *dzt;                   /* dz transposed [4H, S] (the weight gradients' left factor) */
    float *pt;                    /* dlogits transposed [V, T] (the decoder matrix's) */
    int S;
    /* the fused step (dyneval_push): each gradient goes to gs and the
     * tensor (a matrix: each block of rows) steps as soon as it is
     * complete; else (dyneval_loss) into the tensors' g */
    bool fused;
    float lr, decay;
    float *gs;
    bool stepped[DYN_MAX_TENSORS];
} seg_work;

/* Index of tensor (kind, layer) in d->t, or -1 if it does not adapt. */
static int tensor_index(const nc_dyneval *d, int kind, int l)
{
    for (int k = 0; k < d->nt; k++)
        if (d->t[k].kind == kind && (d->t[k].layer == l || kind >= K_DECB))
            return k;
    return -1;
}

/* Where the gradient of tensor (kind, layer) is written, or NULL if it does
 * not adapt. */
static float *grad_of(nc_dyneval *d, seg_work *w, int kind, int l)
{
    int k = tensor_index(d, kind, l);
    if (k < 0)
        return NULL;
    return w->fused ? w->gs : d->t[k].g;
}

static void step_tensor(const dyn_tensor *t, const float *g, float lr, float decay, float rms_mean);
static void step_chunk(const dyn_tensor *t, size_t off, size_t cnt, const float *g, const float k[4]);

/* The gradient of tensor (kind, layer) is complete: the fused step takes
 * it now, while it is in cache; a tensor is never read by the backward
 * pass after its gradient is complete (each layer's weights serve its own
 * backward, done by then; the decoder's dh comes first). */
static void grad_done(nc_dyneval *d, seg_work *w, int kind, int l)
{
    int k = tensor_index(d, kind, l);
    if (!w->fused || k < 0)
        return;
    step_tensor(&d->t[k], grad_of(d, w, kind, l), w->lr, w->decay, d->rms_mean);
    w->stepped[k] = true;
}

/* Carves seg_work out of the thread's arena: T tokens, the logits' room
 * when logits (else the caller's), the fused step's gradient buffers. */
static int work_alloc(const nc_dyneval *d, seg_work *w, int T, bool logits)
{
    const nc_model *m = &d->shadow;
    const size_t L = (size_t)m->cfg.num_layers, H = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    const size_t E = (size_t)m->cfg.embedding_size, S = T > 1 ? (size_t)T - 1 : 1, W = E > H ? E : H;
    /* the fused step's gradient block: a whole bias, or DYN_GRAD_ROWS rows of a matrix */
    size_t gmax = d->embed ? DYN_GRAD_ROWS * W : 0;
    for (int k = 0; w->fused && k < d->nt; k++)
        if (d->t[k].kind != K_ENC && d->t[k].kind != K_DECW && d->t[k].n > gmax)
            gmax = d->t[k].n;
    size_t sizes[10 + 5 * DYN_MAX_LAYERS], n = 0, total = 0;
    for (size_t l = 0; l < L; l++) {
        sizes[n++] = S * (l ? H : E);
        sizes[n++] = S * 4 * H;
        sizes[n++] = S * H;
        sizes[n++] = S * H;
        sizes[n++] = S * H;
    }
    const size_t fixed[10] = {(size_t)T * H, logits ? (size_t)T * V : 0, S * W, S * W, S * 4 * H, S * H, 4 * H,
                             gmax, S * 4 * H, d->embed ? V * (size_t)T : 0};
    for (int i = 0; i < 10; i++)
        sizes[n++] = fixed[i];
    for (size_t i = 0; i < n; i++)
        total += (sizes[i] + 15) & ~(size_t)15;   /* 64-byte aligned pieces */
    float *p = arena_get(total);
    if (!p)
        return NC_ENOMEM;
    float **dst[10] = {&w->rows, &w->p, &w->dh, &w->dn, &w->dz, &w->hp, &w->hc, &w->gs, &w->dzt, &w->pt};
    n = 0;
    for (size_t l = 0; l < L; l++) {
        float **ld[5] = {&w->x[l], &w->a[l], &w->c[l], &w->tc[l], &w->h[l]};
        for (int i = 0; i < 5; i++, n++) {
            *ld[i] = p;
            p += (sizes[n] + 15) & ~(size_t)15;
        }
    }
    for (int i = 0; i < 10; i++, n++) {
        *dst[i] = sizes[n] ? p : NULL;
        p += (sizes[n] + 15) & ~(size_t)15;
    }
    w->dhc = w->hc + 2 * H;
    w->S = (int)S;
    return NC_OK;
}

/* PyTorch nn.LSTM over the segment's S inputs from s0 (as lstm.c steps it),
 * keeping what the backward pass needs. */
static void forward(const nc_model *m, const nc_state *s0, const int *in, int S, seg_work *w)
{
    const int L = m->cfg.num_layers, H = m->cfg.hidden_size, E = m->cfg.embedding_size, G = 4 * H;
    for (int s = 0; s < S; s++)
        memcpy(w->x[0] + (size_t)s * E, m->encoder + (size_t)in[s] * E, (size_t)E * sizeof(float));
    float *h = w->hc, *c = h + H;
    for (int l = 0; l < L; l++) {
        const nc_lstm_layer *ly = &m->layers[l];
        const int NI = ly->input_size;
        float *a = w->a[l];
        if (l > 0)
            memcpy(w->x[l], w->h[l - 1], (size_t)S * H * sizeof(float));
        for (int s = 0; s < S; s++)
            memcpy(a + (size_t)s * G, ly->b_sum, (size_t)G * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, G, NI, 1.0f, w->x[l], NI, ly->w_ih, NI, 1.0f, a, G);
        memcpy(h, s0->h + (size_t)l * H, (size_t)H * sizeof(float));
        memcpy(c, s0->c + (size_t)l * H, (size_t)H * sizeof(float));
        for (int s = 0; s < S; s++) {
            float *z = a + (size_t)s * G, *cs = w->c[l] + (size_t)s * H, *ts = w->tc[l] + (size_t)s * H;
            cblas_sgemv(CblasRowMajor, CblasNoTrans, G, H, 1.0f, ly->w_hh, H, h, 1, 1.0f, z, 1);
            vm_sigmoid(z, 2 * (size_t)H);
            vm_tanh(z + 2 * H, (size_t)H);
            vm_sigmoid(z + 3 * H, (size_t)H);
            for (int j = 0; j < H; j++)
                cs[j] = ts[j] = z[H + j] * c[j] + z[j] * z[2 * H + j];
            vm_tanh(ts, (size_t)H);
            for (int j = 0; j < H; j++)
                h[j] = z[3 * H + j] * ts[j];
            memcpy(c, cs, (size_t)H * sizeof(float));
            memcpy(w->h[l] + (size_t)s * H, h, (size_t)H * sizeof(float));
        }
    }
}

/* The gradient of W_ih or W_hh of layer l, dz^T X [4H, in] (X: the layer's
 * inputs, or its h one step before), as gemm_nn on dz transposed (w->dzt,
 * filled by backward_layer). Fused: in blocks of rows that each step at
 * once, so the gradient never leaves L1/L2 and OpenBLAS packs nothing. */
static void grad_weights(nc_dyneval *d, seg_work *w, int kind, int l)
{
    const int H = d->shadow.cfg.hidden_size, G = 4 * H, S = w->S;
    const int NI = kind == K_WIH ? d->shadow.layers[l].input_size : H;
    const float *x = kind == K_WIH ? w->x[l] : w->hp;
    const int k = tensor_index(d, kind, l);
    if (!w->fused) {
        vm_gemm_nn(w->dzt, x, d->t[k].g, G, S, NI);
        return;
    }
    const float kr[4] = {w->lr, w->decay, NC_DYN_EPS_REL * d->rms_mean, 1.0f / d->rms_mean};
    for (int g0 = 0; g0 < G; g0 += DYN_GRAD_ROWS) {
        const int nr = G - g0 < DYN_GRAD_ROWS ? G - g0 : DYN_GRAD_ROWS;
        vm_gemm_nn(w->dzt + (size_t)g0 * S, x, w->gs, nr, S, NI);
        step_chunk(&d->t[k], (size_t)g0 * NI, (size_t)nr * NI, w->gs, kr);
    }
    w->stepped[k] = true;
}

/* Backward through layer l (truncated BPTT within the segment): dh [S, H]
 * is the loss's gradient at the layer's outputs; fills dz [S, 4H] with the
 * gradient at the gate pre-activations and the layer's weight gradients. */
static void backward_layer(nc_dyneval *d, const nc_state *s0, int l, int S, seg_work *w)
{
    const nc_model *m = &d->shadow;
    const int H = m->cfg.hidden_size, G = 4 * H;
    float *dhn = w->dhc, *dcn = dhn + H;
    memset(dhn, 0, 2 * (size_t)H * sizeof(float));
    for (int s = S - 1; s >= 0; s--) {
        const float *a = w->a[l] + (size_t)s * G, *ts = w->tc[l] + (size_t)s * H;
        const float *cp = s ? w->c[l] + (size_t)(s - 1) * H : s0->c + (size_t)l * H;
        const float *dh = w->dh + (size_t)s * H;
        float *dz = w->dz + (size_t)s * G;
        for (int j = 0; j < H; j++) {
            float i = a[j], f = a[H + j], g = a[2 * H + j], o = a[3 * H + j];
            float dhj = dh[j] + dhn[j];
            float dc = dhj * o * (1.0f - ts[j] * ts[j]) + dcn[j];
            dz[j] = dc * g * i * (1.0f - i);
            dz[H + j] = dc * cp[j] * f * (1.0f - f);
            dz[2 * H + j] = dc * i * (1.0f - g * g);
            dz[3 * H + j] = dhj * ts[j] * o * (1.0f - o);
            dcn[j] = dc * f;
        }
        /* dh_{s-1} = W_hh^T dz_s */
        cblas_sgemv(CblasRowMajor, CblasTrans, G, H, 1.0f, m->layers[l].w_hh, H, dz, 1, 0.0f, dhn, 1);
    }
    if (d->lw[l]) {
        for (int s = 0; s < S; s++)
            memcpy(w->hp + (size_t)s * H, s ? w->h[l] + (size_t)(s - 1) * H : s0->h + (size_t)l * H,
                   (size_t)H * sizeof(float));
        for (int s = 0; s < S; s++)
            for (int g = 0; g < G; g++)
                w->dzt[(size_t)g * S + s] = w->dz[(size_t)s * G + g];
        grad_weights(d, w, K_WHH, l);
    }
    if (d->lb[l]) {
        float *gi = grad_of(d, w, K_BIH, l);
        memset(gi, 0, (size_t)G * sizeof(float));
        for (int s = 0; s < S; s++)
            for (int j = 0; j < G; j++)
                gi[j] += w->dz[(size_t)s * G + j];
        if (!w->fused)
            memcpy(grad_of(d, w, K_BHH, l), gi, (size_t)G * sizeof(float));
        grad_done(d, w, K_BIH, l);
        grad_done(d, w, K_BHH, l);   /* the same gradient: gs still holds it */
    }
}

/* The layer's W_ih gradient (after its inputs' gradient dn = dz W_ih, which
 * reads the weights before their step). */
static void grad_w_ih(nc_dyneval *d, int l, int S, seg_work *w)
{
    (void)S;
    if (d->lw[l])
        grad_weights(d, w, K_WIH, l);   /* dzt: backward_layer's, of this layer */
}

/* The summed loss -log p(y[r]) of the scored rows r >= r0 of the logits p
 * [T, V]; grad: each scored row becomes d(mean loss)/d logits, rows before
 * r0 zero. */
static double rows_loss(float *p, const int *y, int T, int r0, int V, bool grad)
{
    double sum = 0;
    const float scale = T > r0 ? 1.0f / (float)(T - r0) : 0.0f;
    for (int r = 0; r < T; r++) {
        float *pr = p + (size_t)r * V;
        if (r < r0) {
            memset(pr, 0, (size_t)V * sizeof(float));
            continue;
        }
        if (!grad) {
            sum += (double)nc_logsumexp(pr, (size_t)V) - (double)pr[y[r]];
            continue;
        }
        /* one pass of vmath's exp: the row becomes exp(s - max), then
         * d(mean loss)/d logits = (softmax - onehot) / scored */
        const float mx = vm_max(pr, (size_t)V), target = pr[y[r]];
        const double z = vm_exp_sum(pr, pr, (size_t)V, mx);
        sum += (double)mx + log(z) - (double)target;
        const float k = (float)(scale / z);
        for (int v = 0; v < V; v++)
            pr[v] *= k;
        pr[y[r]] -= scale;
    }
    return sum;
}

/* acc += x, vectorised (gcc's -O2 leaves it scalar) */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void add_row(float *restrict acc, const float *restrict x, size_t n)
{
    for (size_t j = 0; j < n; j++)
        acc[j] += x[j];
}

/* The decoder's gradients: the bias's, dh at the top layer's outputs (rows
 * 1..T-1) = dlogits W_dec -- before the decoder's own step -- then dW_dec. */
static void grad_matrix(nc_dyneval *d, seg_work *w, int kind, const int *y, int T);

static void backward_decoder(nc_dyneval *d, int T, int r0, seg_work *w)
{
    const nc_model *m = &d->shadow;
    const int L = m->cfg.num_layers, H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const int S = T - 1;
    float *gb = grad_of(d, w, K_DECB, 0);
    memset(gb, 0, (size_t)V * sizeof(float));
    for (int r = r0; r < T; r++)
        add_row(gb, w->p + (size_t)r * V, (size_t)V);
    grad_done(d, w, K_DECB, 0);
    if (S > 0 && d->lo < L)
        vm_gemm_nn(w->p + V, m->decoder_w, w->dh, S, V, H);
    if (d->embed) {
        for (int r = 0; r < T; r++)
            for (int v = 0; v < V; v++)
                w->pt[(size_t)v * T + r] = w->p[(size_t)r * V + v];
        if (m->decoder_w != m->encoder)
            grad_matrix(d, w, K_DECW, NULL, T);   /* dh above read it: its step may follow */
    }
}

/* The gradient of the embedding (K_ENC: the rows of the segment's inputs,
 * y[0..T-2], get the layer-0 input gradient w->dh; tied, plus the
 * decoder's) or of the untied decoder matrix (K_DECW: dlogits^T rows, as
 * gemm_nn on w->pt), in blocks of DYN_GRAD_ROWS rows; fused, each block
 * steps at once at NC_DYN_EMBED_SCALE of the rate. */
static void grad_matrix(nc_dyneval *d, seg_work *w, int kind, const int *y, int T)
{
    const nc_model *m = &d->shadow;
    const int V = m->cfg.vocab_size, C = kind == K_ENC ? m->cfg.embedding_size : m->cfg.hidden_size, S = T - 1;
    const bool dec = kind == K_DECW || m->decoder_w == m->encoder, rows_in = kind == K_ENC && d->lo == 0;
    const int k = tensor_index(d, kind, 0);
    const float kr[4] = {w->lr * NC_DYN_EMBED_SCALE, w->decay, NC_DYN_EPS_REL * d->rms_mean, 1.0f / d->rms_mean};
    for (int v0 = 0; v0 < V; v0 += DYN_GRAD_ROWS) {
        const int nr = V - v0 < DYN_GRAD_ROWS ? V - v0 : DYN_GRAD_ROWS;
        float *g = w->fused ? w->gs : d->t[k].g + (size_t)v0 * C;
        if (dec)
            vm_gemm_nn(w->pt + (size_t)v0 * T, w->rows, g, nr, T, C);
        else
            memset(g, 0, (size_t)nr * C * sizeof(float));
        for (int s = 0; rows_in && s < S; s++)
            if (y[s] >= v0 && y[s] < v0 + nr)
                add_row(g + (size_t)(y[s] - v0) * C, w->dh + (size_t)s * C, (size_t)C);
        if (w->fused)
            step_chunk(&d->t[k], (size_t)v0 * C, (size_t)nr * C, g, kr);
    }
    w->stepped[k] = w->fused;
}

/* The gradients of every adapted tensor from dlogits (w->p, rows_loss's):
 * the decoder's, then back through the LSTM's layers down to d->lo and,
 * when the embedding adapts, into the rows of the inputs y[0..T-2]. */
static void seg_backward(nc_dyneval *d, const nc_state *s0, const int *y, int T, int r0, seg_work *w)
{
    const nc_model *m = &d->shadow;
    const int L = m->cfg.num_layers, H = m->cfg.hidden_size;
    const int S = T - 1;
    backward_decoder(d, T, r0, w);
    const bool ge = d->embed;
    for (int l = L - 1; S > 0 && l >= d->lo; l--) {
        backward_layer(d, s0, l, S, w);
        const int NI = m->layers[l].input_size;
        if (l > d->lo || (l == 0 && ge)) {
            /* gradient at the layer's inputs = dz W_ih */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, NI, 4 * H, 1.0f, w->dz, 4 * H,
                        m->layers[l].w_ih, NI, 0.0f, w->dn, NI);
            float *tmp = w->dh;
            w->dh = w->dn;
            w->dn = tmp;
        }
        grad_w_ih(d, l, S, w);
    }
    if (ge)
        grad_matrix(d, w, K_ENC, y, T);
}

/* dyneval_loss, and with fused the step of dyneval_push; logits: the
 * segment's decoder logits [T, V] already computed by the scoring pass
 * (overwritten), or NULL to compute them. */
typedef struct {
    const nc_state *s0;
    bool has_h;
    const int *y;
    int T;
    bool grad, fused;
    float lr, decay;
    float *logits;
} seg_job;

static int seg_loss(nc_dyneval *d, const seg_job *j, double *loss, int *nscored, char *err, size_t errlen)
{
    const nc_model *m = &d->shadow;
    const int L = m->cfg.num_layers, H = m->cfg.hidden_size, V = m->cfg.vocab_size, T = j->T;
    const int *y = j->y;
    *loss = 0;
    *nscored = 0;
    if (T <= 0)
        return NC_OK;
    for (int t = 0; t < T; t++)
        if (y[t] < 0 || y[t] >= V)
            return nc_error(err, errlen, NC_EINVAL, "token %d has id %d outside [0, %d)", t, y[t], V);
    for (int k = 0; j->grad && !j->fused && k < d->nt; k++) {
        /* zero: a tensor the backward pass does not reach (a 1-token segment) has gradient 0 */
        if (!d->t[k].g && !(d->t[k].g = nc_alloc(d->t[k].n * sizeof(float))))
            return nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation: gradient");
        memset(d->t[k].g, 0, d->t[k].n * sizeof(float));
    }
    seg_work w = {.fused = j->fused, .lr = j->lr, .decay = j->decay};
    const int S = T - 1, r0 = j->has_h ? 0 : 1;
    if (work_alloc(d, &w, T, j->logits == NULL) != NC_OK)
        return nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation: segment of %d tokens", T);
    /* the scoring pass's activations when it recorded this segment (the
     * stream's usual path), else the forward pass again */
    const dyn_trace *tr = j->fused && S > 0 ? trace_for(d, j->s0, y, S) : NULL;
    for (int l = 0; tr && l < L; l++)
        w.x[l] = tr->x[l], w.a[l] = tr->a[l], w.c[l] = tr->c[l], w.tc[l] = tr->tc[l], w.h[l] = tr->h[l];
    if (S > 0 && !tr)
        forward(m, j->s0, y, S, &w);
    /* row r predicts y[r]: row 0 from s0's h, row r > 0 from h after y[r-1] */
    memcpy(w.rows, lstm_state_top(j->s0), (size_t)H * sizeof(float));
    if (S > 0)
        memcpy(w.rows + H, w.h[L - 1], (size_t)S * H * sizeof(float));
    if (j->logits)
        w.p = j->logits;
    else
        lstm_logits_rows(m, w.rows, (size_t)T, w.p);
    *loss = rows_loss(w.p, y, T, r0, V, j->grad);
    *nscored = T - r0;
    if (j->grad)
        seg_backward(d, j->s0, y, T, r0, &w);
    /* a tensor the backward pass did not reach: gradient 0, decay only */
    for (int k = 0; j->fused && k < d->nt; k++)
        if (!w.stepped[k])
            step_tensor(&d->t[k], NULL, 0.0f, j->decay, d->rms_mean);
    return NC_OK;
}

int dyneval_loss(nc_dyneval *d, const nc_dyn_segment *seg, bool grad, nc_dyn_loss *loss, char *err,
                 size_t errlen)
{
    NC_ASSERT(seg, "dyneval_loss: no seg");
    NC_ASSERT(loss, "dyneval_loss: no loss");
    const seg_job j = {.s0 = seg->s0, .has_h = seg->has_h, .y = seg->y, .T = seg->T, .grad = grad};
    return seg_loss(d, &j, &loss->sum, &loss->nscored, err, errlen);
}

/* ---- the update --------------------------------------------------------- */

/* The step's loop over one tensor (dyneval.h's rule, then the decay) with
 * the root of MS_g taken in it: one pass reading the weights, the trained
 * weights, MS_g and the gradient. k = {lr, decay, eps, 1 / mean RMS}. */
static void step_loop(float *restrict w, const float *restrict w0, const float *restrict ms,
                      const float *restrict g, size_t n, const float *k)
{
    const float lr = k[0], decay = k[1], eps = k[2], inv_mean = k[3];
    for (size_t j = 0; j < n; j++) {
        float re = sqrtf(ms[j] > 0.0f ? ms[j] : 0.0f) + eps;   /* dyneval_rms + eps */
        float f = decay * re * inv_mean;
        f = f > 1.0f ? 1.0f : f;   /* RMS_norm clipped at 1/lambda: never past theta_g */
        float u = g[j] / re;
        /* a guard, not the paper's: at most NC_DYN_CLIP RMS units */
        u = u > NC_DYN_CLIP ? NC_DYN_CLIP : u;
        u = u < -NC_DYN_CLIP ? -NC_DYN_CLIP : u;
        float dlt = (w[j] - w0[j]) * (1.0f - f) - lr * u;
        dlt = fabsf(dlt) < FLT_MIN ? 0.0f : dlt;
        w[j] = w0[j] + dlt;
    }
}

/* step_loop eight weights at a time, the same operations in the same order
 * (no FMA contraction), so bit for bit equal to it; the min/max operand
 * order keeps step_loop's NaN behaviour. The pass is bound by memory (four
 * streams in, one out), which the scalar loop is not. */
__attribute__((target("avx2"))) static void step_loop_avx2(float *restrict w, const float *restrict w0,
                                                         const float *restrict ms, const float *restrict g,
                                                         size_t n, const float *k)
{
    const __m256 lr = _mm256_set1_ps(k[0]), decay = _mm256_set1_ps(k[1]), eps = _mm256_set1_ps(k[2]),
                 inv_mean = _mm256_set1_ps(k[3]), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(),
                 clip = _mm256_set1_ps(NC_DYN_CLIP), nclip = _mm256_set1_ps(-NC_DYN_CLIP),
                 tiny = _mm256_set1_ps(FLT_MIN), sign = _mm256_set1_ps(-0.0f);
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 re = _mm256_add_ps(_mm256_sqrt_ps(_mm256_max_ps(_mm256_loadu_ps(ms + j), zero)), eps);
        __m256 f = _mm256_min_ps(one, _mm256_mul_ps(_mm256_mul_ps(decay, re), inv_mean));
        __m256 u = _mm256_div_ps(_mm256_loadu_ps(g + j), re);
        u = _mm256_min_ps(clip, u);
        u = _mm256_max_ps(nclip, u);
        __m256 a = _mm256_loadu_ps(w0 + j);
        __m256 dlt = _mm256_sub_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(w + j), a), _mm256_sub_ps(one, f)),
                                   _mm256_mul_ps(lr, u));
        __m256 small = _mm256_cmp_ps(_mm256_andnot_ps(sign, dlt), tiny, _CMP_LT_OQ);
        dlt = _mm256_andnot_ps(small, dlt);
        _mm256_storeu_ps(w + j, _mm256_add_ps(a, dlt));
    }
    if (j < n)
        step_loop(w + j, w0 + j, ms + j, g + j, n - j, k);
}

/* Decay alone (lr 0 or no gradient), which brings every weight back to the
 * trained one exactly: within a few ulps of it, w0 + dlt rounds back to
 * where it was (w0 + 5.7 ulp -> w0 + 6 ulp), so such a weight moves one ulp
 * towards it. */
static void decay_loop(float *w, const float *w0, const float *ms, size_t n, float decay, const float *k)
{
    const float eps = k[2], inv_mean = k[3];
    for (size_t j = 0; j < n; j++) {
        float f = decay * (dyneval_rms(ms[j]) + eps) * inv_mean;
        f = f > 1.0f ? 1.0f : f;
        float dlt = (w[j] - w0[j]) * (1.0f - f);
        if (fabsf(dlt) < FLT_MIN)
            dlt = 0.0f;
        float wn = w0[j] + dlt;
        if (wn == w[j] && wn != w0[j] && f > 0.0f)
            wn = nextafterf(wn, w0[j]);
        w[j] = wn;
    }
}

/* The step on weights [off, off + cnt) of tensor t with their gradient g
 * (lr > 0), else their decay. */
static void step_chunk(const dyn_tensor *t, size_t off, size_t cnt, const float *g, const float k[4])
{
    if (k[0] > 0.0f && g && strcmp(vm_isa(), "scalar") != 0)
        step_loop_avx2(t->w + off, t->w0 + off, t->ms + off, g, cnt, k);
    else if (k[0] > 0.0f && g)
        step_loop(t->w + off, t->w0 + off, t->ms + off, g, cnt, k);
    else
        decay_loop(t->w + off, t->w0 + off, t->ms + off, cnt, k[1], k);
}

/* One tensor's update: the step on gradient g (lr > 0), else the decay. */
static void step_tensor(const dyn_tensor *t, const float *g, float lr, float decay, float rms_mean)
{
    const float k[4] = {lr, decay, NC_DYN_EPS_REL * rms_mean, 1.0f / rms_mean};
    step_chunk(t, 0, t->n, g, k);
}

int dyneval_push(nc_dyneval *d, const nc_dyn_fed *fed, const nc_dyn_rule *rule, char *err, size_t errlen)
{
    NC_ASSERT(fed, "dyneval_push: no fed");
    NC_ASSERT(rule, "dyneval_push: no rule");
    NC_ASSERT(d, "dyneval_push: no d");
    const int *ids = fed->ids;
    const size_t k = fed->k;
    float *logits = fed->logits;
    const int n = rule->segment;
    const float lr = rule->lr, decay = rule->decay;
    /* the scoring pass's logits serve when they cover the whole segment */
    if (d->seg_len != 0 || (int)k < n)
        logits = NULL;
    if (d->seg_len + (int)k > d->seg_cap) {
        int cap = d->seg_len + (int)k > 2 * d->seg_cap ? d->seg_len + (int)k : 2 * d->seg_cap;
        int *p = nc_realloc(d->seg_tok, (size_t)cap * sizeof(int));
        if (!p)
            return nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation: segment");
        d->seg_tok = p;
        d->seg_cap = cap;
    }
    memcpy(d->seg_tok + d->seg_len, ids, k * sizeof(int));
    d->seg_len += (int)k;
    if (d->seg_len < n)
        return NC_OK;
    int rc = NC_OK;
    if (lr > 0.0f) {
        /* each tensor steps inside the backward pass, as its gradient completes */
        double loss;
        int ns;
        const seg_job j = {.s0 = d->seg, .has_h = d->seg_has_h, .y = d->seg_tok, .T = d->seg_len, .grad = true,
                           .fused = true, .lr = lr, .decay = decay, .logits = logits};
        rc = seg_loss(d, &j, &loss, &ns, err, errlen);
    } else {
        for (int t = 0; t < d->nt; t++)
            step_tensor(&d->t[t], NULL, 0.0f, decay, d->rms_mean);
    }
    dyneval_refresh(d);
    d->steps++;   /* a recorded pass is of the weights before */
    lstm_state_copy(d->seg, fed->st);
    d->seg_has_h = fed->has_h;
    d->seg_len = 0;
    return rc;
}

/* ---- serialisation ------------------------------------------------------ */

void dyneval_write(const nc_dyneval *d, binio_writer *w)
{
    NC_ASSERT(d, "dyneval_write: no d");
    binio_put(w, "DYN1", 4);
    binio_put_i32(w, d->subset);
    binio_put_i32(w, d->nt);
    for (int k = 0; k < d->nt; k++) {
        binio_put_u64(w, d->t[k].n);
        binio_put(w, d->t[k].w, d->t[k].n * sizeof(float));
    }
    unsigned char hh = d->seg_has_h;
    binio_put(w, &hh, 1);
    size_t sl = lstm_state_blob_size(d->seg);
    binio_put_u64(w, sl);
    unsigned char *tmp = nc_malloc(sl);
    if (!tmp) {
        w->bad = true;
        return;
    }
    lstm_state_to_blob(d->seg, tmp);
    binio_put(w, tmp, sl);
    free(tmp);
    binio_put_i32(w, d->seg_len);
    for (int i = 0; i < d->seg_len; i++)
        binio_put_i32(w, d->seg_tok[i]);
}

int dyneval_read(const nc_model *m, binio_reader *r, nc_dyneval **out, char *err, size_t errlen)
{
    NC_ASSERT(r, "dyneval_read: no r");
    NC_ASSERT(m, "dyneval_read: no m");
    *out = NULL;
    const void *magic = binio_take(r, 4);
    if (!magic || memcmp(magic, "DYN1", 4) != 0)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob: bad dynamic evaluation section");
    int32_t subset = binio_get_i32(r), nt = binio_get_i32(r);
    if (r->bad)
        return nc_error(err, errlen, NC_EFORMAT, "stream blob truncated (dynamic evaluation)");
    nc_dyneval *d;
    int rc = dyn_create(m, subset, true, &d, err, errlen);
    if (rc)
        return rc == NC_EINVAL ? NC_EFORMAT : rc;
    if (nt != d->nt)
        rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: %d adapted tensors, dyn_params %d has %d", nt,
                      subset, d->nt);
    for (int k = 0; !rc && k < nt; k++) {
        uint64_t n = binio_get_u64(r);
        const void *p = n == d->t[k].n ? binio_take(r, n * sizeof(float)) : NULL;
        if (!p)
            rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: adapted tensor %d has %llu weights, expected %zu",
                          k, (unsigned long long)n, d->t[k].n);
        else
            memcpy(d->t[k].w, p, n * sizeof(float));
    }
    unsigned char hh = 0;
    uint64_t sl = 0;
    const void *state = NULL;
    if (!rc) {
        binio_get(r, &hh, 1);
        sl = binio_get_u64(r);
        state = sl <= binio_left(r) ? binio_take(r, sl) : NULL;
        if (!state)
            rc = nc_error(err, errlen, NC_EFORMAT, "stream blob truncated (dynamic evaluation)");
    }
    if (!rc)
        rc = lstm_state_from_blob(d->seg, state, (size_t)sl, err, errlen);
    int32_t len = rc ? 0 : binio_get_i32(r);
    if (!rc && (r->bad || len < 0 || (size_t)len > binio_left(r) / 4))
        rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: bad dynamic evaluation segment");
    if (!rc && len > 0 && !(d->seg_tok = nc_malloc((size_t)len * sizeof(int))))
        rc = nc_error(err, errlen, NC_ENOMEM, "dynamic evaluation: segment");
    for (int i = 0; !rc && i < len; i++) {
        d->seg_tok[i] = binio_get_i32(r);
        if (d->seg_tok[i] < 0 || d->seg_tok[i] >= m->cfg.vocab_size)
            rc = nc_error(err, errlen, NC_EFORMAT, "stream blob: bad token %d in the dynamic evaluation segment",
                          d->seg_tok[i]);
    }
    if (rc) {
        dyneval_free(d);
        return rc;
    }
    d->seg_len = d->seg_cap = len;
    d->seg_has_h = hh != 0;
    dyneval_refresh(d);
    *out = d;
    return NC_OK;
}

/* ---- MS_g --------------------------------------------------------------- */

int dyneval_stats(const nc_model *m, const nc_dyn_stats_text *text, nc_model **out, double *mean_loss, char *err,
                  size_t errlen)
{
    NC_ASSERT(text, "dyneval_stats: no text");
    NC_ASSERT(m, "dyneval_stats: no m");
    const int *toks = text->toks;
    size_t ntok = text->ntok;
    const int n = text->segment;
    const size_t max_tokens = text->max_tokens;
    *out = NULL;
    if (n < 1)
        return nc_error(err, errlen, NC_EINVAL, "segment length %d < 1", n);
    if (max_tokens && max_tokens < ntok)
        ntok = max_tokens;
    if (ntok < (size_t)n)
        return nc_error(err, errlen, NC_EINVAL, "%zu tokens: fewer than one segment of %d", ntok, n);
    nc_dyneval *d;
    int rc = dyn_create(m, NC_DYN_ALL, false, &d, err, errlen);
    if (rc)
        return rc;
    nc_state *st = lstm_state_new(m);
    double **acc = nc_zalloc((size_t)d->nt, sizeof *acc);
    float *hid = nc_malloc(((size_t)n + 1) * m->cfg.hidden_size * sizeof(float));
    if (!st || !acc || !hid)
        rc = nc_error(err, errlen, NC_ENOMEM, "gradient statistics");
    for (int k = 0; !rc && k < d->nt; k++)
        if (!(acc[k] = nc_zalloc(d->t[k].n, sizeof(double))))
            rc = nc_error(err, errlen, NC_ENOMEM, "gradient statistics");
    /* the first segment starts after eos, as a document scored with bos */
    nc_lstm_work *lw = rc ? NULL : lstm_work_new(m);
    if (lw)
        lstm_step(m, st, m->eos_id, lw);
    lstm_work_free(lw);
    size_t segs = 0;
    double lsum = 0;
    long long nsc = 0;
    for (size_t p = 0; !rc && p + (size_t)n <= ntok; p += (size_t)n, segs++) {
        const nc_dyn_segment seg = {.s0 = st, .has_h = true, .y = toks + p, .T = n};
        nc_dyn_loss loss = {0};
        rc = dyneval_loss(d, &seg, true, &loss, err, errlen);
        lsum += loss.sum;
        nsc += loss.nscored;
        for (int k = 0; !rc && k < d->nt; k++)
            for (size_t j = 0; j < d->t[k].n; j++)
                acc[k][j] += (double)d->t[k].g[j] * d->t[k].g[j];
        if (!rc)
            rc = lstm_forward_seq(m, st, toks + p, (size_t)n, hid, err, errlen);
    }
    nc_model *o = NULL;
    if (!rc) {
        nc_vocab *v = vocab_clone(m->vocab);
        rc = v ? model_create(&m->cfg, v, &o, err, errlen) : nc_error(err, errlen, NC_ENOMEM, "vocabulary");
    }
    for (int k = 0; !rc && k < d->nt; k++) {
        float *dst = *slot_of(o, d->t[k].kind, d->t[k].layer);
        for (size_t j = 0; j < d->t[k].n; j++)
            dst[j] = (float)(acc[k][j] / (double)segs);
    }
    if (!rc)
        model_refresh_derived(o);
    for (int k = 0; acc && k < d->nt; k++)
        free(acc[k]);
    free(acc);
    free(hid);
    lstm_state_free(st);
    dyneval_free(d);
    if (rc) {
        model_free(o);
        return rc;
    }
    if (mean_loss)
        *mean_loss = nsc ? lsum / (double)nsc : NAN;
    *out = o;
    return NC_OK;
}
