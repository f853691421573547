/* lstm_grad.c -- training forward/backward of the LSTM language model on
 * OpenBLAS: whole-segment GEMMs, a sequential recurrence, no allocation. */
#if defined(__GNUC__) && !defined(__clang__)
/* The elementwise loops below are written to be auto-vectorised; -O2's
 * "very cheap" cost model refuses loops whose trip count is not a known
 * multiple of the vector width, so this file asks for the O3 vectoriser. */
#pragma GCC optimize("O3")
#endif
#include "lstm_grad.h"
#include "vmath.h"
#include "fault.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lstm_grad_work {
    int Tmax, B, L, H, E, V;
    float *state_h, *state_c;     /* [L, B, H] carried across segments */
    float *mask_emb;              /* [Tmax*B, E] 0 or 1/(1-p) */
    float **xin;                  /* [L] layer inputs after dropout: [Tmax*B, in_k] */
    float **mask_hid;             /* [L] (k >= 1) [Tmax*B, H] */
    float **gates;                /* [L] activated gates i,f,g,o [Tmax*B, 4H] */
    float **hbuf;                 /* [L] [(Tmax+1)*B, H]; block 0 = h_{-1} */
    float **cbuf;                 /* [L] [(Tmax+1)*B, H]; block 0 = c_{-1} */
    float **tc;                   /* [L] tanh(c_t) [Tmax*B, H] */
    float *dout;                  /* top output after dropout [Tmax*B, H] */
    float *mask_out;              /* [Tmax*B, H] */
    float *logits;                /* [Tmax*B, V]; becomes d loss / d logits */
    float *dgates;                /* [Tmax*B, 4H] */
    float *dbuf[2];               /* [Tmax*B, max(E,H)] gradients flowing down */
    float *dh_next, *dc_next;     /* [B, H] */
    float *bias;                  /* [L, 4H] b_ih + b_hh of the current weights */
};

/* ---- network ---------------------------------------------------------- */

int lstm_grad_net_new(const lstm_grad_shape *shape, lstm_grad_net **out, char *err, size_t errlen)
{
    NC_ASSERT(shape, "lstm_grad_net_new: no shape");
    const int V = shape->V, E = shape->E, H = shape->H, L = shape->L;
    const bool tied = shape->tied;
    *out = NULL;
    if (V < 2 || E < 1 || H < 1 || L < 1 || L > 64)
        return nc_error(err, errlen, NC_EINVAL, "bad network shape V=%d E=%d H=%d L=%d", V, E, H, L);
    if (tied && E != H)
        return nc_error(err, errlen, NC_EINVAL,
                        "tied weights need embedding size == hidden size (%d != %d)", E, H);
    lstm_grad_net *n = nc_zalloc(1, sizeof *n);
    if (!n)
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    n->V = V, n->E = E, n->H = H, n->L = L, n->tied = tied;
    n->off_w_ih = nc_zalloc((size_t)L, sizeof(size_t));
    n->off_w_hh = nc_zalloc((size_t)L, sizeof(size_t));
    n->off_b_ih = nc_zalloc((size_t)L, sizeof(size_t));
    n->off_b_hh = nc_zalloc((size_t)L, sizeof(size_t));
    if (!n->off_w_ih || !n->off_w_hh || !n->off_b_ih || !n->off_b_hh) {
        lstm_grad_net_free(n);
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    }
    /* Each tensor starts on a 16-float boundary so BLAS sees aligned rows. */
#define LG_ALIGN(x) (((x) + 15) & ~(size_t)15)
    size_t o = 0;
    n->off_enc = o;
    o = LG_ALIGN(o + (size_t)V * E);
    for (int k = 0; k < L; k++) {
        size_t in = k == 0 ? (size_t)E : (size_t)H;
        n->off_w_ih[k] = o;
        o = LG_ALIGN(o + 4 * (size_t)H * in);
        n->off_w_hh[k] = o;
        o = LG_ALIGN(o + 4 * (size_t)H * H);
        n->off_b_ih[k] = o;
        o = LG_ALIGN(o + 4 * (size_t)H);
        n->off_b_hh[k] = o;
        o = LG_ALIGN(o + 4 * (size_t)H);
    }
    if (tied) {
        n->off_dec_w = n->off_enc;
    } else {
        n->off_dec_w = o;
        o = LG_ALIGN(o + (size_t)V * H);
    }
    n->off_dec_b = o;
    o = LG_ALIGN(o + (size_t)V);
#undef LG_ALIGN
    n->n = o;
    n->n_tensors = 1 + 4 * L + (tied ? 1 : 2);
    n->w = nc_calloc(o, sizeof(float));
    n->g = nc_calloc(o, sizeof(float));
    if (!n->w || !n->g) {
        lstm_grad_net_free(n);
        return nc_error(err, errlen, NC_ENOMEM, "out of memory for %zu parameters", o);
    }
    *out = n;
    return NC_OK;
}

void lstm_grad_net_free(lstm_grad_net *n)
{
    if (!n)
        return;
    free(n->off_w_ih);
    free(n->off_w_hh);
    free(n->off_b_ih);
    free(n->off_b_hh);
    nc_free(n->w);
    nc_free(n->g);
    free(n);
}

int lstm_grad_tensor(const lstm_grad_net *n, int idx, const char **name, float **w,
                     float **g, size_t *count)
{
    static __thread char buf[64];
    size_t off, cnt;
    if (idx < 0 || idx >= n->n_tensors)
        return NC_EINVAL;
    if (idx == LG_T_ENCODER) {
        off = n->off_enc, cnt = (size_t)n->V * n->E;
        snprintf(buf, sizeof buf, "encoder.weight");
    } else if (idx < LG_T_LAYER0 + 4 * n->L) {
        int k = (idx - LG_T_LAYER0) / 4, which = (idx - LG_T_LAYER0) % 4;
        size_t in = k == 0 ? (size_t)n->E : (size_t)n->H, H4 = 4 * (size_t)n->H;
        static const char *fmt[4] = {"rnn.weight_ih_l%d", "rnn.weight_hh_l%d",
                                     "rnn.bias_ih_l%d", "rnn.bias_hh_l%d"};
        size_t offs[4] = {n->off_w_ih[k], n->off_w_hh[k], n->off_b_ih[k], n->off_b_hh[k]};
        size_t cnts[4] = {H4 * in, H4 * n->H, H4, H4};
        off = offs[which], cnt = cnts[which];
        snprintf(buf, sizeof buf, fmt[which], k);
    } else if (!n->tied && idx == LG_T_LAYER0 + 4 * n->L) {
        off = n->off_dec_w, cnt = (size_t)n->V * n->H;
        snprintf(buf, sizeof buf, "decoder.weight");
    } else {
        off = n->off_dec_b, cnt = (size_t)n->V;
        snprintf(buf, sizeof buf, "decoder.bias");
    }
    if (name)
        *name = buf;
    if (w)
        *w = n->w + off;
    if (g)
        *g = n->g + off;
    if (count)
        *count = cnt;
    return NC_OK;
}

static void fill_uniform(float *x, size_t cnt, nc_rng *rng, float a)
{
    for (size_t i = 0; i < cnt; i++)
        x[i] = (2.0f * rng_uniform(rng) - 1.0f) * a;
}

void lstm_grad_init_uniform(lstm_grad_net *n, nc_rng *rng, float init_range, float lstm_range)
{
    NC_ASSERT(n, "lstm_grad_init_uniform: no n");
    if (lstm_range <= 0)
        lstm_range = 1.0f / sqrtf((float)n->H);
    memset(n->w, 0, n->n * sizeof(float));
    for (int t = 0; t < n->n_tensors; t++) {
        const char *name;
        float *w;
        size_t cnt;
        lstm_grad_tensor(n, t, &name, &w, NULL, &cnt);
        if (!strcmp(name, "decoder.bias"))
            continue;                     /* zeros, as PyTorch's example */
        fill_uniform(w, cnt, rng, strncmp(name, "rnn.", 4) ? init_range : lstm_range);
    }
}

/* ---- workspace -------------------------------------------------------- */

void lstm_grad_work_free(lstm_grad_work *w)
{
    if (!w)
        return;
    nc_free(w->state_h);
    nc_free(w->state_c);
    nc_free(w->mask_emb);
    for (int k = 0; k < w->L; k++) {
        if (w->xin && k > 0)
            nc_free(w->xin[k]);
        if (w->mask_hid)
            nc_free(w->mask_hid[k]);
        if (w->gates)
            nc_free(w->gates[k]);
        if (w->hbuf)
            nc_free(w->hbuf[k]);
        if (w->cbuf)
            nc_free(w->cbuf[k]);
        if (w->tc)
            nc_free(w->tc[k]);
    }
    if (w->xin)
        nc_free(w->xin[0]);
    free(w->xin);
    free(w->mask_hid);
    free(w->gates);
    free(w->hbuf);
    free(w->cbuf);
    free(w->tc);
    nc_free(w->dout);
    nc_free(w->mask_out);
    nc_free(w->logits);
    nc_free(w->dgates);
    nc_free(w->dbuf[0]);
    nc_free(w->dbuf[1]);
    nc_free(w->dh_next);
    nc_free(w->dc_next);
    nc_free(w->bias);
    free(w);
}

int lstm_grad_work_new(const lstm_grad_net *n, int Tmax, int B, lstm_grad_work **out,
                       char *err, size_t errlen)
{
    NC_ASSERT(n, "lstm_grad_work_new: no n");
    *out = NULL;
    if (Tmax < 1 || B < 1)
        return nc_error(err, errlen, NC_EINVAL, "bad segment shape T=%d B=%d", Tmax, B);
    lstm_grad_work *w = nc_zalloc(1, sizeof *w);
    if (!w)
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    int L = n->L, H = n->H, E = n->E, V = n->V;
    w->Tmax = Tmax, w->B = B, w->L = L, w->H = H, w->E = E, w->V = V;
    size_t TB = (size_t)Tmax * B, maxin = (size_t)(E > H ? E : H);
    bool ok = true;
#define A(ptr, cnt) do { (ptr) = nc_calloc((cnt), sizeof(float)); ok = ok && (ptr); } while (0)
    A(w->state_h, (size_t)L * B * H);
    A(w->state_c, (size_t)L * B * H);
    A(w->mask_emb, TB * E);
    w->xin = nc_zalloc((size_t)L, sizeof(float *));
    w->mask_hid = nc_zalloc((size_t)L, sizeof(float *));
    w->gates = nc_zalloc((size_t)L, sizeof(float *));
    w->hbuf = nc_zalloc((size_t)L, sizeof(float *));
    w->cbuf = nc_zalloc((size_t)L, sizeof(float *));
    w->tc = nc_zalloc((size_t)L, sizeof(float *));
    if (!w->xin || !w->mask_hid || !w->gates || !w->hbuf || !w->cbuf || !w->tc) {
        lstm_grad_work_free(w);
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    }
    A(w->xin[0], TB * E);
    for (int k = 0; k < L; k++) {
        if (k > 0) {
            A(w->xin[k], TB * H);
            A(w->mask_hid[k], TB * H);
        }
        A(w->gates[k], TB * 4 * H);
        A(w->hbuf[k], (TB + B) * H);
        A(w->cbuf[k], (TB + B) * H);
        A(w->tc[k], TB * H);
    }
    A(w->dout, TB * H);
    A(w->mask_out, TB * H);
    A(w->logits, TB * V);
    A(w->dgates, TB * 4 * H);
    A(w->dbuf[0], TB * maxin);
    A(w->dbuf[1], TB * maxin);
    A(w->dh_next, (size_t)B * H);
    A(w->dc_next, (size_t)B * H);
    A(w->bias, (size_t)L * 4 * H);
#undef A
    if (!ok) {
        lstm_grad_work_free(w);
        return nc_error(err, errlen, NC_ENOMEM, "out of memory for a %dx%d segment workspace", Tmax, B);
    }
    *out = w;
    return NC_OK;
}

void lstm_grad_work_reset_state(lstm_grad_work *w)
{
    NC_ASSERT(w, "lstm_grad_work_reset_state: no w");
    size_t cnt = (size_t)w->L * w->B * w->H;
    memset(w->state_h, 0, cnt * sizeof(float));
    memset(w->state_c, 0, cnt * sizeof(float));
}

float *lstm_grad_work_state_h(lstm_grad_work *w) { return w->state_h; }
float *lstm_grad_work_state_c(lstm_grad_work *w) { return w->state_c; }
size_t lstm_grad_work_state_floats(const lstm_grad_work *w)
{
    NC_ASSERT(w, "lstm_grad_work_state_floats: no w");
    return (size_t)w->L * w->B * w->H;
}

/* ---- forward / backward ----------------------------------------------- */

/* Inverted dropout mask: each unit kept with probability 1-p, scaled by
 * 1/(1-p) so the expectation is unchanged (Srivastava et al. 2014). */
static void draw_mask(float *mask, size_t cnt, float p, nc_rng *rng)
{
    float keep = 1.0f - p, scale = 1.0f / keep;
    for (size_t i = 0; i < cnt; i++)
        mask[i] = rng_uniform(rng) < keep ? scale : 0.0f;
}

static void mul_inplace(float *restrict x, const float *restrict m, size_t cnt)
{
    for (size_t i = 0; i < cnt; i++)
        x[i] *= m[i];
}

static void mul_into(float *restrict dst, const float *restrict x, const float *restrict m, size_t cnt)
{
    for (size_t i = 0; i < cnt; i++)
        dst[i] = x[i] * m[i];
}

/* One LSTM step's elementwise part for B rows (nn.LSTM, gate order i,f,g,o):
 * i = σ(a_i), f = σ(a_f), g = tanh(a_g), o = σ(a_o),
 * c' = f c + i g, h' = o tanh(c'). The pre-activations a already hold
 * W_ih x + W_hh h; bias is b_ih + b_hh. Gates are overwritten by their
 * activations (kept for the backward pass). The activations are vmath's,
 * the exp inference uses (lstm.c), so training and serving share one. */
static void lstm_cell_forward(int B, int H, float *restrict gates, const float *restrict bias,
                              const float *restrict c_prev, float *restrict c, float *restrict tc,
                              float *restrict h)
{
    for (int b = 0; b < B; b++) {
        float *gi = gates + (size_t)b * 4 * H, *gf = gi + H, *gg = gf + H, *go = gg + H;
        const float *cp = c_prev + (size_t)b * H;
        float *cn = c + (size_t)b * H, *tn = tc + (size_t)b * H, *hn = h + (size_t)b * H;
        for (int j = 0; j < 4 * H; j++)
            gi[j] += bias[j];
        vm_sigmoid(gi, 2 * (size_t)H);   /* i and f are adjacent */
        vm_tanh(gg, (size_t)H);
        vm_sigmoid(go, (size_t)H);
        for (int j = 0; j < H; j++)
            tn[j] = cn[j] = gf[j] * cp[j] + gi[j] * gg[j];
        vm_tanh(tn, (size_t)H);
        for (int j = 0; j < H; j++)
            hn[j] = go[j] * tn[j];
    }
}

/* Backward of lstm_cell_forward for B rows: from dh (total gradient of h_t)
 * and dc_next (gradient of c_t arriving from step t+1), writes the gradients
 * of the pre-activations into dg and the gradient of c_{t-1} into dc_next. */
static void lstm_cell_backward(int B, int H, const float *restrict gates, const float *restrict tc,
                               const float *restrict c_prev, const float *restrict dh_out,
                               const float *restrict dh_next, float *restrict dc_next,
                               float *restrict dg)
{
    for (int b = 0; b < B; b++) {
        const float *gi = gates + (size_t)b * 4 * H, *gf = gi + H, *gg = gf + H, *go = gg + H;
        const float *t = tc + (size_t)b * H, *cp = c_prev + (size_t)b * H;
        const float *d1 = dh_out + (size_t)b * H, *d2 = dh_next + (size_t)b * H;
        float *dcn = dc_next + (size_t)b * H;
        float *di = dg + (size_t)b * 4 * H, *df = di + H, *dgg = df + H, *dO = dgg + H;
        for (int j = 0; j < H; j++) {
            float i = gi[j], f = gf[j], g = gg[j], o = go[j], tj = t[j];
            float dh = d1[j] + d2[j];
            float dc = dcn[j] + dh * o * (1.0f - tj * tj);
            dO[j] = dh * tj * o * (1.0f - o);
            di[j] = dc * g * i * (1.0f - i);
            dgg[j] = dc * i * (1.0f - g * g);
            df[j] = dc * cp[j] * f * (1.0f - f);
            dcn[j] = dc * f;
        }
    }
}

/* Softmax cross-entropy of one row of logits (bias added here). Returns
 * -log p(y) = logsumexp(s) - s_y; with grad, the row becomes
 * scale * (softmax(s) - onehot(y)), the gradient of scale * -log p(y). */
static double softmax_xent_row(float *restrict row, const float *restrict bias, int V, int y,
                               bool grad, float scale)
{
    for (int j = 0; j < V; j++)
        row[j] += bias[j];
    float m = vm_max(row, (size_t)V);
    float target = row[y];
    double s = vm_exp_sum(row, row, (size_t)V, m);   /* the one exp of vmath.c */
    double nll = (double)m + log(s) - (double)target;
    if (grad) {
        float k = (float)(scale / s);
        for (int j = 0; j < V; j++)
            row[j] *= k;
        row[y] -= scale;
    }
    return nll;
}

/* Forward of layer k over the segment: input projections of all T*B
 * positions in one GEMM, then the recurrence; the state carries over to
 * the next segment; the output (dropped out) becomes the next layer's
 * input, or the decoder's (w->dout) after the last layer. */
static void forward_layer(const lstm_grad_net *n, lstm_grad_work *w, int k, int T, const lstm_grad_dropout *drop,
                          nc_rng *rng)
{
    const int B = w->B, H = w->H, H4 = 4 * H, TB = T * B, in = k == 0 ? w->E : H;
    const float *W = n->w, *w_ih = W + n->off_w_ih[k], *w_hh = W + n->off_w_hh[k];
    float *bias = w->bias + (size_t)k * H4;
    for (int j = 0; j < H4; j++)
        bias[j] = W[n->off_b_ih[k] + j] + W[n->off_b_hh[k] + j];
    float *G = w->gates[k], *hb = w->hbuf[k], *cb = w->cbuf[k], *tc = w->tc[k];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, TB, H4, in, 1.0f, w->xin[k], in, w_ih, in, 0.0f, G, H4);
    memcpy(hb, w->state_h + (size_t)k * B * H, (size_t)B * H * sizeof(float));
    memcpy(cb, w->state_c + (size_t)k * B * H, (size_t)B * H * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *Gt = G + (size_t)t * B * H4;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H4, H, 1.0f, hb + (size_t)t * B * H, H, w_hh, H,
                    1.0f, Gt, H4);
        lstm_cell_forward(B, H, Gt, bias, cb + (size_t)t * B * H, cb + (size_t)(t + 1) * B * H,
                          tc + (size_t)t * B * H, hb + (size_t)(t + 1) * B * H);
    }
    memcpy(w->state_h + (size_t)k * B * H, hb + (size_t)T * B * H, (size_t)B * H * sizeof(float));
    memcpy(w->state_c + (size_t)k * B * H, cb + (size_t)T * B * H, (size_t)B * H * sizeof(float));
    const float *hout = hb + (size_t)B * H;
    bool last = k + 1 == w->L;
    float p = last ? drop->out : drop->hid;
    float *dst = last ? w->dout : w->xin[k + 1], *mask = last ? w->mask_out : w->mask_hid[k + 1];
    if (p > 0) {
        draw_mask(mask, (size_t)TB * H, p, rng);
        mul_into(dst, hout, mask, (size_t)TB * H);
    } else {
        memcpy(dst, hout, (size_t)TB * H * sizeof(float));
    }
}

/* Backward of the decoder: its weight gradient dL^T D and bias gradient,
 * and the gradient of its input dL W_dec into w->dbuf[0] (dropout mask
 * applied); with tied weights the first also initialises the encoder's. */
static void backward_decoder(lstm_grad_net *n, lstm_grad_work *w, int TB, const lstm_grad_dropout *drop)
{
    const int H = w->H, V = w->V;
    float *g = n->g, *dl = w->logits;
    const float *dec_w = n->w + n->off_dec_w;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, H, TB, 1.0f, dl, V, w->dout, H, 0.0f, g + n->off_dec_w,
                H);
    float *gdb = g + n->off_dec_b;
    memset(gdb, 0, (size_t)V * sizeof(float));
    for (int p = 0; p < TB; p++) {
        const float *row = dl + (size_t)p * V;
        for (int j = 0; j < V; j++)
            gdb[j] += row[j];
    }
    float *dh = w->dbuf[0];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, TB, H, V, 1.0f, dl, V, dec_w, H, 0.0f, dh, H);
    if (drop->out > 0)
        mul_inplace(dh, w->mask_out, (size_t)TB * H);
}

/* Backward of layer k: the recurrence from w->dbuf[cur] (gradient of the
 * layer's output), then its weight and bias gradients over the whole
 * segment, and the gradient of its input into w->dbuf[cur ^ 1]. */
static void backward_layer(lstm_grad_net *n, lstm_grad_work *w, int k, int T, int cur, const lstm_grad_dropout *drop)
{
    const int B = w->B, H = w->H, H4 = 4 * H, TB = T * B, in = k == 0 ? w->E : H;
    const float *w_ih = n->w + n->off_w_ih[k], *w_hh = n->w + n->off_w_hh[k];
    float *g = n->g, *G = w->gates[k], *hb = w->hbuf[k], *cb = w->cbuf[k], *tc = w->tc[k];
    float *dG = w->dgates, *dh_out = w->dbuf[cur];
    memset(w->dh_next, 0, (size_t)B * H * sizeof(float));
    memset(w->dc_next, 0, (size_t)B * H * sizeof(float));
    for (int t = T - 1; t >= 0; t--) {
        float *dGt = dG + (size_t)t * B * H4;
        lstm_cell_backward(B, H, G + (size_t)t * B * H4, tc + (size_t)t * B * H, cb + (size_t)t * B * H,
                           dh_out + (size_t)t * B * H, w->dh_next, w->dc_next, dGt);
        if (t > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, H4, 1.0f, dGt, H4, w_hh, H, 0.0f,
                        w->dh_next, H);
    }
    /* Weight gradients over the whole segment, after the recurrence:
     * dW_hh = dG^T [h_{-1} .. h_{T-2}], dW_ih = dG^T X. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H4, H, TB, 1.0f, dG, H4, hb, H, 0.0f, g + n->off_w_hh[k], H);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H4, in, TB, 1.0f, dG, H4, w->xin[k], in, 0.0f,
                g + n->off_w_ih[k], in);
    float *gbi = g + n->off_b_ih[k], *gbh = g + n->off_b_hh[k];
    memset(gbi, 0, (size_t)H4 * sizeof(float));
    for (int p = 0; p < TB; p++) {
        const float *row = dG + (size_t)p * H4;
        for (int j = 0; j < H4; j++)
            gbi[j] += row[j];
    }
    memcpy(gbh, gbi, (size_t)H4 * sizeof(float));
    float *dIn = w->dbuf[cur ^ 1];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, TB, in, H4, 1.0f, dG, H4, w_ih, in, 0.0f, dIn, in);
    if (k > 0) {
        if (drop->hid > 0)
            mul_inplace(dIn, w->mask_hid[k], (size_t)TB * H);
    } else if (drop->emb > 0) {
        mul_inplace(dIn, w->mask_emb, (size_t)TB * w->E);
    }
}

double lstm_grad_segment(lstm_grad_net *n, lstm_grad_work *w, const int *x, const int *y, int T,
                         const lstm_grad_pass *pass)
{
    NC_ASSERT(w, "lstm_grad_segment: no w");
    const bool train = pass && pass->train, backward = pass && pass->backward;
    const lstm_grad_dropout *drop = pass ? pass->drop : NULL;
    nc_rng *rng = pass ? pass->rng : NULL;
    const int B = w->B, H = w->H, E = w->E, V = w->V, L = w->L;
    const int TB = T * B;
    const float *W = n->w;
    lstm_grad_dropout nod = {0, 0, 0};
    if (!train || !drop)
        drop = &nod;

    /* Embedding lookup (+ dropout). */
    float *x0 = w->xin[0];
    for (int p = 0; p < TB; p++)
        memcpy(x0 + (size_t)p * E, W + n->off_enc + (size_t)x[p] * E, (size_t)E * sizeof(float));
    if (drop->emb > 0) {
        draw_mask(w->mask_emb, (size_t)TB * E, drop->emb, rng);
        mul_inplace(x0, w->mask_emb, (size_t)TB * E);
    }
    for (int k = 0; k < L; k++)
        forward_layer(n, w, k, T, drop, rng);

    /* Decoder over all positions: one GEMM, then softmax cross-entropy. */
    const float *dec_w = W + n->off_dec_w, *dec_b = W + n->off_dec_b;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, TB, V, H, 1.0f, w->dout, H, dec_w, H,
                0.0f, w->logits, V);
    double nll = 0.0;
    float scale = 1.0f / (float)TB;
    for (int p = 0; p < TB; p++)
        nll += softmax_xent_row(w->logits + (size_t)p * V, dec_b, V, y[p], backward, scale);
    if (!backward)
        return nll;

    backward_decoder(n, w, TB, drop);
    int cur = 0;
    for (int k = L - 1; k >= 0; k--, cur ^= 1)
        backward_layer(n, w, k, T, cur, drop);
    /* Embedding gradient: scatter-add the rows (the tied decoder's gradient
     * is already there; otherwise start from zero). */
    float *ge = n->g + n->off_enc, *dx = w->dbuf[cur];
    if (!n->tied)
        memset(ge, 0, (size_t)V * E * sizeof(float));
    for (int p = 0; p < TB; p++) {
        float *dst = ge + (size_t)x[p] * E;
        const float *src = dx + (size_t)p * E;
        for (int j = 0; j < E; j++)
            dst[j] += src[j];
    }
    return nll;
}

/* ---- conversion to / from nc_model ------------------------------------ */

static int check_shape(const lstm_grad_net *n, const nc_model *m, char *err, size_t errlen)
{
    const nc_model_config *c = &m->cfg;
    if (c->vocab_size != n->V || c->embedding_size != n->E || c->hidden_size != n->H ||
        c->num_layers != n->L || c->tie_weights != n->tied)
        return nc_error(err, errlen, NC_EINVAL,
                        "model shape V=%d E=%d H=%d L=%d tied=%d does not match the network "
                        "V=%d E=%d H=%d L=%d tied=%d", c->vocab_size, c->embedding_size,
                        c->hidden_size, c->num_layers, c->tie_weights, n->V, n->E, n->H, n->L,
                        n->tied);
    return NC_OK;
}

int lstm_grad_to_model(const lstm_grad_net *n, nc_model *m, char *err, size_t errlen)
{
    NC_ASSERT(m, "lstm_grad_to_model: no m");
    int rc = check_shape(n, m, err, errlen);
    if (rc != NC_OK)
        return rc;
    size_t H4 = 4 * (size_t)n->H;
    memcpy(m->encoder, n->w + n->off_enc, (size_t)n->V * n->E * sizeof(float));
    for (int k = 0; k < n->L; k++) {
        size_t in = k == 0 ? (size_t)n->E : (size_t)n->H;
        memcpy(m->layers[k].w_ih, n->w + n->off_w_ih[k], H4 * in * sizeof(float));
        memcpy(m->layers[k].w_hh, n->w + n->off_w_hh[k], H4 * n->H * sizeof(float));
        memcpy(m->layers[k].b_ih, n->w + n->off_b_ih[k], H4 * sizeof(float));
        memcpy(m->layers[k].b_hh, n->w + n->off_b_hh[k], H4 * sizeof(float));
    }
    if (!n->tied)
        memcpy(m->decoder_w, n->w + n->off_dec_w, (size_t)n->V * n->H * sizeof(float));
    memcpy(m->decoder_b, n->w + n->off_dec_b, (size_t)n->V * sizeof(float));
    model_refresh_derived(m);
    return NC_OK;
}

int lstm_grad_from_model(lstm_grad_net *n, const nc_model *m, char *err, size_t errlen)
{
    NC_ASSERT(m, "lstm_grad_from_model: no m");
    int rc = check_shape(n, m, err, errlen);
    if (rc != NC_OK)
        return rc;
    size_t H4 = 4 * (size_t)n->H;
    memcpy(n->w + n->off_enc, m->encoder, (size_t)n->V * n->E * sizeof(float));
    for (int k = 0; k < n->L; k++) {
        size_t in = k == 0 ? (size_t)n->E : (size_t)n->H;
        memcpy(n->w + n->off_w_ih[k], m->layers[k].w_ih, H4 * in * sizeof(float));
        memcpy(n->w + n->off_w_hh[k], m->layers[k].w_hh, H4 * n->H * sizeof(float));
        memcpy(n->w + n->off_b_ih[k], m->layers[k].b_ih, H4 * sizeof(float));
        memcpy(n->w + n->off_b_hh[k], m->layers[k].b_hh, H4 * sizeof(float));
    }
    if (!n->tied)
        memcpy(n->w + n->off_dec_w, m->decoder_w, (size_t)n->V * n->H * sizeof(float));
    memcpy(n->w + n->off_dec_b, m->decoder_b, (size_t)n->V * sizeof(float));
    return NC_OK;
}
