/* lstm.c -- LSTM forward pass (PyTorch nn.LSTM), decoder and log-softmax. */
#include "lstm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "vmath.h"
#include "fault.h"

/* Positions per block in lstm_forward_seq: bounds scratch to
 * LSTM_BLOCK * (4H + H) floats while keeping the GEMMs large. */
#define LSTM_BLOCK 256

/* ------------------------------------------------------------------------ */
/* State                                                                     */

nc_state *lstm_state_new(const nc_model *m)
{
    NC_ASSERT(m, "lstm_state_new: no m");
    nc_state *s = nc_zalloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->num_layers = m->cfg.num_layers;
    s->hidden_size = m->cfg.hidden_size;
    size_t n = (size_t)s->num_layers * (size_t)s->hidden_size;
    s->h = nc_calloc(n, sizeof(float));
    s->c = nc_calloc(n, sizeof(float));
    if (!s->h || !s->c) {
        lstm_state_free(s);
        return NULL;
    }
    return s;
}

void lstm_state_free(nc_state *s)
{
    if (!s)
        return;
    nc_free(s->h);
    nc_free(s->c);
    free(s);
}

void lstm_state_reset(nc_state *s)
{
    NC_ASSERT(s, "lstm_state_reset: no s");
    size_t n = (size_t)s->num_layers * (size_t)s->hidden_size;
    memset(s->h, 0, n * sizeof(float));
    memset(s->c, 0, n * sizeof(float));
}

void lstm_state_copy(nc_state *dst, const nc_state *src)
{
    NC_ASSERT(src, "lstm_state_copy: no src");
    NC_ASSERT(dst, "lstm_state_copy: no dst");
    size_t n = (size_t)src->num_layers * (size_t)src->hidden_size;
    if (dst == src)
        return;
    memcpy(dst->h, src->h, n * sizeof(float));
    memcpy(dst->c, src->c, n * sizeof(float));
}

/* Blob layout (little-endian): "NCST", u32 L, u32 H, u32 reserved (0),
 * then h[L*H] and c[L*H] as IEEE float32. */
#define STATE_MAGIC "NCST"
#define STATE_HDR 16

size_t lstm_state_blob_size(const nc_state *s)
{
    NC_ASSERT(s, "lstm_state_blob_size: no s");
    return STATE_HDR + 2 * (size_t)s->num_layers * (size_t)s->hidden_size * sizeof(float);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void lstm_state_to_blob(const nc_state *s, void *blob)
{
    NC_ASSERT(s, "lstm_state_to_blob: no s");
    unsigned char *p = blob;
    size_t n = (size_t)s->num_layers * (size_t)s->hidden_size;
    memcpy(p, STATE_MAGIC, 4);
    put_u32(p + 4, (uint32_t)s->num_layers);
    put_u32(p + 8, (uint32_t)s->hidden_size);
    put_u32(p + 12, 0);
    /* x86-64 is little-endian: the float arrays are the wire format. */
    memcpy(p + STATE_HDR, s->h, n * sizeof(float));
    memcpy(p + STATE_HDR + n * sizeof(float), s->c, n * sizeof(float));
}

int lstm_state_from_blob(nc_state *s, const void *blob, size_t len, char *err, size_t errlen)
{
    NC_ASSERT(s, "lstm_state_from_blob: no s");
    const unsigned char *p = blob;
    if (!blob || len < STATE_HDR || memcmp(p, STATE_MAGIC, 4) != 0)
        return nc_error(err, errlen, NC_EFORMAT, "state blob: bad magic or too short (%zu bytes)", len);
    uint32_t L = get_u32(p + 4), H = get_u32(p + 8);
    if ((int)L != s->num_layers || (int)H != s->hidden_size)
        return nc_error(err, errlen, NC_EFORMAT, "state blob: shape %u layers x %u units, model has %d x %d", L, H,
                        s->num_layers, s->hidden_size);
    if (len != lstm_state_blob_size(s))
        return nc_error(err, errlen, NC_EFORMAT, "state blob: %zu bytes, expected %zu", len,
                        lstm_state_blob_size(s));
    size_t n = (size_t)L * H;
    const unsigned char *src = p + STATE_HDR;
    /* Validate before touching s so a bad blob leaves the state unchanged. */
    for (size_t i = 0; i < 2 * n; i++) {
        float v;
        memcpy(&v, src + i * sizeof(float), sizeof v);
        if (!isfinite(v))
            return nc_error(err, errlen, NC_EFORMAT, "state blob: value %zu is not finite", i);
    }
    memcpy(s->h, src, n * sizeof(float));
    memcpy(s->c, src + n * sizeof(float), n * sizeof(float));
    return NC_OK;
}

/* ------------------------------------------------------------------------ */
/* Cell                                                                      */

struct nc_lstm_work {
    float *gates;                 /* [4H] */
};

nc_lstm_work *lstm_work_new(const nc_model *m)
{
    NC_ASSERT(m, "lstm_work_new: no m");
    nc_lstm_work *w = nc_zalloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->gates = nc_calloc(4 * (size_t)m->cfg.hidden_size, sizeof(float));
    if (!w->gates) {
        free(w);
        return NULL;
    }
    return w;
}

void lstm_work_free(nc_lstm_work *w)
{
    if (!w)
        return;
    nc_free(w->gates);
    free(w);
}

/* PyTorch nn.LSTM cell, given the pre-activations g[4H] (rows i, f, g, o):
 *   c' = sigmoid(f) * c + sigmoid(i) * tanh(g),   h' = sigmoid(o) * tanh(c').
 * Updates h and c in place and writes tanh(c') to tc; g is scratch
 * (overwritten: its rows hold the activated gates unless tc is g). */
static void lstm_cell_keep(float *g, float *h, float *c, float *tc, int H)
{
    float *gi = g, *gf = g + H, *gg = g + 2 * H, *go = g + 3 * H;
    vm_sigmoid(gi, 2 * (size_t)H);            /* i and f are adjacent */
    vm_tanh(gg, (size_t)H);
    vm_sigmoid(go, (size_t)H);
    for (int j = 0; j < H; j++) {
        c[j] = gf[j] * c[j] + gi[j] * gg[j];
        tc[j] = c[j];
    }
    vm_tanh(tc, (size_t)H);
    for (int j = 0; j < H; j++)
        h[j] = go[j] * tc[j];
}

/* The step's cell: tanh(c') written over the input gate. */
static void lstm_cell(float *g, float *h, float *c, int H)
{
    lstm_cell_keep(g, h, c, g, H);
}

static inline int clamp_token(const nc_model *m, int token)
{
    /* Callers validate ids; an out-of-range one must still never read
     * outside the embedding table. */
    return (token < 0 || token >= m->cfg.vocab_size) ? m->unk_id : token;
}

/* gates += W_hh h: the one step of the recurrence that cannot be batched,
 * bound by reading W_hh (1 MB in float32 for H = 256), hence the binary16
 * copy when the model has one. */
static inline void recurrent_gemv(const nc_lstm_layer *ly, int G, int H, const float *h, float *gates)
{
    if (ly->w_hh_f16)
        vm_gemv_f16(ly->w_hh_f16, G, H, h, gates);
    else
        cblas_sgemv(CblasRowMajor, CblasNoTrans, G, H, 1.0f, ly->w_hh, H, h, 1, 1.0f, gates, 1);
}

/* gates[t] = b_ih + b_hh + W_ih x[t] for nb input rows, W_ih read in
 * place: its binary16 copy when it has one (vm_gemm_nt_f16: half the bytes,
 * read once for all rows; a row's sums the same bits however many rows),
 * else float32 (vm_gemm_nt). For a daemon's feed of a word or a few:
 * OpenBLAS's GEMM packs all of W_ih (1 MB) before multiplying one row. */
static void input_rows(const nc_lstm_layer *ly, int G, const float *x, size_t nb, float *gates)
{
    for (size_t t = 0; t < nb; t++)
        memcpy(gates + t * (size_t)G, ly->b_sum, (size_t)G * sizeof(float));
    if (ly->w_ih_f16)
        vm_gemm_nt_f16(x, ly->w_ih_f16, gates, (int)nb, G, ly->input_size);
    else
        vm_gemm_nt(x, ly->w_ih, gates, (int)nb, G, ly->input_size);
}

/* Up to this many positions lstm_forward_seq's input projection is
 * input_rows (as lstm_step's); longer blocks are one GEMM. */
#define LSTM_ROWS_MAX 32

void lstm_step(const nc_model *m, nc_state *s, int token, nc_lstm_work *w)
{
    NC_ASSERT(m, "lstm_step: no m");
    const int H = m->cfg.hidden_size, G = 4 * H;
    token = clamp_token(m, token);
    const float *x = m->encoder + (size_t)token * (size_t)m->cfg.embedding_size;
    for (int k = 0; k < m->cfg.num_layers; k++) {
        const nc_lstm_layer *ly = &m->layers[k];
        float *h = s->h + (size_t)k * H, *c = s->c + (size_t)k * H;
        /* gates = W_ih x + W_hh h + (b_ih + b_hh) */
        input_rows(ly, G, x, 1, w->gates);
        recurrent_gemv(ly, G, H, h, w->gates);
        lstm_cell(w->gates, h, c, H);
        x = h;
    }
}

int lstm_forward_seq(const nc_model *m, nc_state *s, const int *tokens, size_t T, float *hidden, char *err,
                     size_t errlen)
{
    NC_ASSERT(m, "lstm_forward_seq: no m");
    if (T == 0)
        return NC_OK;
    const int E = m->cfg.embedding_size, H = m->cfg.hidden_size, G = 4 * H, L = m->cfg.num_layers;
    size_t B = T < LSTM_BLOCK ? T : LSTM_BLOCK;
    int maxin = E > H ? E : H;
    float *gates = nc_alloc(B * (size_t)G * sizeof(float));
    float *xin = nc_alloc(B * (size_t)maxin * sizeof(float));   /* layer input rows */
    float *xout = nc_alloc(B * (size_t)H * sizeof(float));      /* layer output rows */
    const nc_lstm_hook *hk = m->hook;
    float *tc = hk ? nc_alloc((size_t)H * sizeof(float)) : NULL;
    if (!gates || !xin || !xout || (hk && !tc)) {
        nc_free(tc);
        nc_free(gates);
        nc_free(xin);
        nc_free(xout);
        return nc_error(err, errlen, NC_ENOMEM, "lstm_forward_seq: out of memory for %zu positions", B);
    }
    if (hk)
        hk->begin(hk->ctx, s, tokens, T);
    for (size_t t0 = 0; t0 < T; t0 += B) {
        size_t nb = T - t0 < B ? T - t0 : B;
        for (size_t t = 0; t < nb; t++)
            memcpy(xin + t * (size_t)E, m->encoder + (size_t)clamp_token(m, tokens[t0 + t]) * (size_t)E,
                   (size_t)E * sizeof(float));
        for (int k = 0; k < L; k++) {
            const nc_lstm_layer *ly = &m->layers[k];
            float *h = s->h + (size_t)k * H, *c = s->c + (size_t)k * H;
            float *out = k == L - 1 ? hidden + t0 * (size_t)H : xout;
            /* Input projections of the whole block in one GEMM:
             * gates[nb, 4H] = xin[nb, in] W_ih^T + b_sum. */
            if (nb <= LSTM_ROWS_MAX) {
                input_rows(ly, G, xin, nb, gates);
            } else {
                for (size_t t = 0; t < nb; t++)
                    memcpy(gates + t * (size_t)G, ly->b_sum, (size_t)G * sizeof(float));
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, G, ly->input_size, 1.0f, xin,
                            ly->input_size, ly->w_ih, ly->input_size, 1.0f, gates, G);
            }
            /* The recurrence is inherently sequential. */
            for (size_t t = 0; t < nb; t++) {
                float *g = gates + t * (size_t)G;
                recurrent_gemv(ly, G, H, h, g);
                if (hk) {
                    lstm_cell_keep(g, h, c, tc, H);
                    const float *const rows[5] = {xin + t * (size_t)ly->input_size, g, c, tc, h};
                    hk->step(hk->ctx, k, t0 + t, rows);
                } else {
                    lstm_cell(g, h, c, H);
                }
                memcpy(out + t * (size_t)H, h, (size_t)H * sizeof(float));
            }
            if (k < L - 1)
                memcpy(xin, xout, nb * (size_t)H * sizeof(float));
        }
    }
    nc_free(gates);
    nc_free(xin);
    nc_free(xout);
    nc_free(tc);
    return NC_OK;
}

/* ------------------------------------------------------------------------ */
/* Decoder and softmax                                                       */

/* One row is lstm_logits_rows of one: the same bits as that row in any
 * batch (a session's memo may come from the batcher). */
void lstm_logits(const nc_model *m, const float *h, float *logits)
{
    lstm_logits_rows(m, h, 1, logits);
}

void lstm_logits_batch(const nc_model *m, const float *hidden, size_t T, float *logits)
{
    NC_ASSERT(m, "lstm_logits_batch: no m");
    const int V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    if (T == 0)
        return;
    /* a few rows (a daemon's feed of a few words): OpenBLAS's GEMM packs the
     * whole V x H decoder first (10 MB for the demo model), which took ~1.5
     * ms of a one-word feed's ~4 ms in the daemon; lstm_logits_rows reads
     * it in place, once for all rows, as fast as the GEMM up to ~64 rows
     * with the binary16 copy (V = 10,000, H = 256: 60-70 us a row from 8
     * rows on, GEMM 120-150 at 8 rows, 70 at 64) */
    if (T <= LSTM_LOGITS_ROWS_MAX) {
        lstm_logits_rows(m, hidden, T, logits);
        return;
    }
    for (size_t t = 0; t < T; t++)
        memcpy(logits + t * (size_t)V, m->decoder_b, (size_t)V * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, V, H, 1.0f, hidden, H, m->decoder_w, H, 1.0f,
                logits, V);
}

void lstm_logits_rows(const nc_model *m, const float *hidden, size_t T, float *logits)
{
    NC_ASSERT(m, "lstm_logits_rows: no m");
    const int V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    for (size_t t = 0; t < T; t++)
        memcpy(logits + t * (size_t)V, m->decoder_b, (size_t)V * sizeof(float));
    if (T == 0)
        return;
    /* both kernels are batch-invariant (vmath.h); the binary16 copy is the
     * same weights at half the bytes read */
    if (m->decoder_f16)
        vm_gemm_nt_f16(hidden, m->decoder_f16, logits, (int)T, V, H);
    else
        vm_gemm_nt(hidden, m->decoder_w, logits, (int)T, V, H);
}

float nc_logsumexp(const float *x, size_t n)
{
    return vm_logsumexp(x, n);
}

void nc_log_softmax(float *x, size_t n)
{
    float lse = nc_logsumexp(x, n);
    for (size_t i = 0; i < n; i++)
        x[i] -= lse;
}
