/* model.c -- model directory I/O: config.json, vocab.txt, model.safetensors. */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>

#include "atomicfile.h"
#include "buf.h"
#include "fault.h"
#include "gate.h"
#include "safetensors.h"
#include "vmath.h"

/* Upper bounds that keep every size product far from overflow and reject
 * absurd configs before anything is allocated. */
#define MODEL_MAX_VOCAB   (1 << 24)
#define MODEL_MAX_DIM     (1 << 16)
#define MODEL_MAX_LAYERS  64

/* Storage behind a model: the safetensors mapping (F32 tensors used in place)
 * plus every buffer allocated for it (copies, widened F16, b_sum). */
typedef struct {
    void *map;
    size_t maplen;
    void **bufs;
    int nbufs, capbufs;
} model_impl;

static float *impl_alloc(model_impl *im, size_t nfloats)
{
    if (im->nbufs == im->capbufs) {
        int ncap = im->capbufs ? im->capbufs * 2 : 16;
        void **nb = nc_realloc(im->bufs, (size_t)ncap * sizeof *nb);
        if (!nb)
            return NULL;
        im->bufs = nb;
        im->capbufs = ncap;
    }
    float *p = nc_calloc(nfloats ? nfloats : 1, sizeof(float));
    if (p)
        im->bufs[im->nbufs++] = p;
    return p;
}

static void impl_free(model_impl *im)
{
    if (!im)
        return;
    for (int i = 0; i < im->nbufs; i++)
        nc_free(im->bufs[i]);
    free(im->bufs);
    if (im->map)
        munmap(im->map, im->maplen);
    free(im);
}

void model_free(nc_model *m)
{
    if (!m)
        return;
    impl_free(m->impl);
    gate_free(m->gate);
    model_free(m->dyn_ms);
    vocab_free(m->vocab);
    free(m->layers);
    free(m);
}

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */

static int config_check(const nc_model_config *c, const char *file, char *err, size_t errlen)
{
    if (strcmp(c->model_type, "lstm") != 0)
        return nc_error(err, errlen, NC_EFORMAT, "%s: model_type is '%s', expected 'lstm'", file, c->model_type);
    if (c->vocab_size < 2 || c->vocab_size > MODEL_MAX_VOCAB)
        return nc_error(err, errlen, NC_EFORMAT, "%s: vocab_size %d out of range [2, %d]", file,
                        c->vocab_size, MODEL_MAX_VOCAB);
    if (c->embedding_size < 1 || c->embedding_size > MODEL_MAX_DIM)
        return nc_error(err, errlen, NC_EFORMAT, "%s: embedding_size %d out of range [1, %d]", file,
                        c->embedding_size, MODEL_MAX_DIM);
    if (c->hidden_size < 1 || c->hidden_size > MODEL_MAX_DIM)
        return nc_error(err, errlen, NC_EFORMAT, "%s: hidden_size %d out of range [1, %d]", file,
                        c->hidden_size, MODEL_MAX_DIM);
    if (c->num_layers < 1 || c->num_layers > MODEL_MAX_LAYERS)
        return nc_error(err, errlen, NC_EFORMAT, "%s: num_layers %d out of range [1, %d]", file,
                        c->num_layers, MODEL_MAX_LAYERS);
    if (c->tie_weights && c->embedding_size != c->hidden_size)
        return nc_error(err, errlen, NC_EFORMAT,
                        "%s: tie_weights needs embedding_size == hidden_size (got %d and %d)", file,
                        c->embedding_size, c->hidden_size);
    if (!c->unk_token[0] || !c->eos_token[0])
        return nc_error(err, errlen, NC_EFORMAT, "%s: unk_token and eos_token must be non-empty", file);
    if (!strcmp(c->unk_token, c->eos_token))
        return nc_error(err, errlen, NC_EFORMAT, "%s: unk_token and eos_token must differ", file);
    return NC_OK;
}

typedef enum { CK_STR, CK_INT, CK_BOOL } config_kind;

/* One row per config key: where it goes and how it is typed. */
static const struct {
    const char *key;
    config_kind kind;
    size_t off;
    size_t size;                  /* for strings: buffer size */
    bool optional;                /* may be absent (zero) */
} config_keys[] = {
    {"model_type", CK_STR, offsetof(nc_model_config, model_type), sizeof(((nc_model_config *)0)->model_type), false},
    {"vocab_size", CK_INT, offsetof(nc_model_config, vocab_size), 0, false},
    {"embedding_size", CK_INT, offsetof(nc_model_config, embedding_size), 0, false},
    {"hidden_size", CK_INT, offsetof(nc_model_config, hidden_size), 0, false},
    {"num_layers", CK_INT, offsetof(nc_model_config, num_layers), 0, false},
    {"tie_weights", CK_BOOL, offsetof(nc_model_config, tie_weights), 0, false},
    {"unk_token", CK_STR, offsetof(nc_model_config, unk_token), sizeof(((nc_model_config *)0)->unk_token), false},
    {"eos_token", CK_STR, offsetof(nc_model_config, eos_token), sizeof(((nc_model_config *)0)->eos_token), false},
    /* replaced by "text" (normalize.h); still read, and written for older readers */
    {"lowercase", CK_BOOL, offsetof(nc_model_config, lowercase), 0, true},
};

/* config.json's "text" object (normalize.h): each member a boolean or a
 * string, set through text_conv_set so that the keys are defined once. */
static int config_text(json_t *o, nc_text_conv *t, const char *path, char *err, size_t errlen)
{
    if (!json_is_object(o))
        return nc_error(err, errlen, NC_EFORMAT, "%s: key 'text' must be an object", path);
    *t = (nc_text_conv){.declared = true};
    /* a preset first, so that the other keys refine it whatever their order */
    json_t *preset = json_object_get(o, "preset");
    const char *key;
    json_t *v;
    char e2[NC_ERRLEN];
    if (preset && (!json_is_string(preset) || text_conv_set(t, "preset", json_string_value(preset), e2, sizeof e2)))
        return nc_error(err, errlen, NC_EFORMAT, "%s: %s", path,
                        json_is_string(preset) ? e2 : "text.preset must be a string");
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "preset"))
            continue;
        bool isbool = text_conv_key_is_bool(key);
        if (isbool ? !json_is_boolean(v) : !json_is_string(v))
            return nc_error(err, errlen, NC_EFORMAT, "%s: text.%s must be %s", path, key,
                            isbool ? "true or false" : "a string");
        const char *val = isbool ? (json_is_true(v) ? "true" : "false") : json_string_value(v);
        if (text_conv_set(t, key, val, e2, sizeof e2) != NC_OK)
            return nc_error(err, errlen, NC_EFORMAT, "%s: %s", path, e2);
    }
    return NC_OK;
}

static int config_load(const char *path, nc_model_config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    /* read here, not by jansson, so that injected read faults reach it */
    nc_buf text = NC_BUF_INIT;
    int brc = buf_read_file(&text, path, err, errlen);
    if (brc != NC_OK) {
        buf_free(&text);
        return brc;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text.data, text.len, JSON_REJECT_DUPLICATES, &jerr);
    buf_free(&text);
    if (!root)
        return nc_error(err, errlen, NC_EFORMAT, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    int rc = NC_OK;
    if (!json_is_object(root))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: top level is not a JSON object", path);
    for (size_t i = 0; rc == NC_OK && i < sizeof config_keys / sizeof config_keys[0]; i++) {
        const char *key = config_keys[i].key;
        json_t *v = json_object_get(root, key);
        char *dst = (char *)cfg + config_keys[i].off;
        if (!v && config_keys[i].optional)
            continue;
        if (!v) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: missing required key '%s'", path, key);
            break;
        }
        switch (config_keys[i].kind) {
        case CK_STR:
            if (!json_is_string(v))
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: key '%s' must be a string", path, key);
            else if (json_string_length(v) >= config_keys[i].size || strlen(json_string_value(v)) != json_string_length(v))
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: key '%s' is too long or contains NUL (max %zu bytes)",
                              path, key, config_keys[i].size - 1);
            else
                memcpy(dst, json_string_value(v), json_string_length(v) + 1);
            break;
        case CK_INT:
            if (!json_is_integer(v))
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: key '%s' must be an integer", path, key);
            else if (json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX)
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: key '%s' is out of range", path, key);
            else
                *(int *)dst = (int)json_integer_value(v);
            break;
        case CK_BOOL:
            if (!json_is_boolean(v))
                rc = nc_error(err, errlen, NC_EFORMAT, "%s: key '%s' must be true or false", path, key);
            else
                *(bool *)dst = json_is_true(v);
            break;
        }
    }
    json_t *tobj = rc == NC_OK ? json_object_get(root, "text") : NULL;
    if (tobj)
        rc = config_text(tobj, &cfg->text, path, err, errlen);
    else if (rc == NC_OK && !json_object_get(root, "lowercase"))
        rc = nc_error(err, errlen, NC_EFORMAT, "%s: missing required key 'lowercase' (or a 'text' object)", path);
    json_decref(root);
    if (rc == NC_OK)
        rc = config_check(cfg, path, err, errlen);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

/* Every tensor the model needs, in file order, with its expected shape. */
typedef struct {
    char name[64];
    int rank;
    long dims[2];
    float **dst;
    bool optional;                /* decoder.weight when tied */
} tensor_spec;

static int model_specs(nc_model *m, tensor_spec *specs)
{
    const nc_model_config *c = &m->cfg;
    long V = c->vocab_size, E = c->embedding_size, H = c->hidden_size;
    int n = 0;
#define SPEC(nm, r, d0, d1, dp, opt) do { \
        snprintf(specs[n].name, sizeof specs[n].name, "%s", nm); \
        specs[n].rank = r; specs[n].dims[0] = d0; specs[n].dims[1] = d1; \
        specs[n].dst = dp; specs[n].optional = opt; n++; \
    } while (0)
    SPEC("encoder.weight", 2, V, E, &m->encoder, false);
    for (int k = 0; k < c->num_layers; k++) {
        char nm[64];
        nc_lstm_layer *ly = &m->layers[k];
        snprintf(nm, sizeof nm, "rnn.weight_ih_l%d", k);
        SPEC(nm, 2, 4 * H, ly->input_size, &ly->w_ih, false);
        snprintf(nm, sizeof nm, "rnn.weight_hh_l%d", k);
        SPEC(nm, 2, 4 * H, H, &ly->w_hh, false);
        snprintf(nm, sizeof nm, "rnn.bias_ih_l%d", k);
        SPEC(nm, 1, 4 * H, 0, &ly->b_ih, false);
        snprintf(nm, sizeof nm, "rnn.bias_hh_l%d", k);
        SPEC(nm, 1, 4 * H, 0, &ly->b_hh, false);
    }
    SPEC("decoder.weight", 2, V, H, &m->decoder_w, c->tie_weights);
    SPEC("decoder.bias", 1, V, 0, &m->decoder_b, false);
#undef SPEC
    return n;
}

static size_t spec_numel(const tensor_spec *s)
{
    return s->rank == 1 ? (size_t)s->dims[0] : (size_t)s->dims[0] * (size_t)s->dims[1];
}

static void shape_str(char *buf, size_t n, const long *dims, int rank)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < rank && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%ld", i ? "," : "", dims[i]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
}

/* bfloat16: the upper half of a float32. */
static float bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float32 to bfloat16, rounded to nearest even (NaN stays a quiet NaN). */
static uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Points spec's destination at the file's tensor: in place for an aligned
 * F32 tensor (the mapping is private), else a copy (F16, BF16 widened). The
 * entry's byte range was checked by safetensors_open. */
static int bind_tensor(model_impl *im, const nc_safetensors *st, const tensor_spec *sp, const char *path, char *err,
                       size_t errlen)
{
    const nc_st_tensor *e = safetensors_find(st, sp->name);
    char want[64], got[64];
    shape_str(want, sizeof want, sp->dims, sp->rank);
    if (!e)
        return sp->optional ? NC_OK
                            : nc_error(err, errlen, NC_EFORMAT, "%s: missing tensor '%s' (shape %s)", path, sp->name,
                                       want);
    bool f32 = !strcmp(e->dtype, "F32"), f16 = !strcmp(e->dtype, "F16"), bf16 = !strcmp(e->dtype, "BF16");
    if (!f32 && !f16 && !bf16)
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", path,
                        sp->name, e->dtype);
    bool same = e->rank == sp->rank;
    for (int i = 0; same && i < sp->rank; i++)
        same = e->dims[i] == sp->dims[i];
    if (!same) {
        shape_str(got, sizeof got, e->dims, e->rank);
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s' has shape %s, expected %s", path, sp->name, got,
                        want);
    }
    size_t n = spec_numel(sp);
    /* safetensors_open checked the byte range against dtype x shape */
    NC_ASSERT(e->end - e->begin == n * (f32 ? 4 : 2), "tensor '%s'", sp->name);
    const unsigned char *src = st->data + e->begin;
    if (f32 && ((uintptr_t)src % sizeof(float)) == 0) {
        *sp->dst = (float *)(uintptr_t)src;
        return NC_OK;
    }
    float *buf = impl_alloc(im, n);
    if (!buf)
        return nc_error(err, errlen, NC_ENOMEM, "%s: out of memory for tensor '%s'", path, sp->name);
    if (f32) {
        memcpy(buf, src, n * sizeof(float));
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
            buf[i] = f16 ? nc_half_to_float(h) : bf16_to_float(h);
        }
    }
    *sp->dst = buf;
    return NC_OK;
}

/* Reads model.safetensors (safetensors.h checks the file) and binds every
 * tensor the config implies; the mapping moves to im, which unmaps it. */
static int safetensors_load(nc_model *m, model_impl *im, const char *path, char *err, size_t errlen)
{
    nc_safetensors st;
    int rc = safetensors_open(&st, path, err, errlen);
    if (rc != NC_OK)
        return rc;
    safetensors_keep_map(&st, &im->map, &im->maplen);
    tensor_spec specs[4 + 4 * MODEL_MAX_LAYERS];
    int nspecs = model_specs(m, specs);
    for (int s = 0; s < nspecs && rc == NC_OK; s++)
        rc = bind_tensor(im, &st, &specs[s], path, err, errlen);
    if (rc == NC_OK && !m->decoder_w)
        m->decoder_w = m->encoder;  /* tied, decoder.weight absent */
    safetensors_close(&st);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Construction                                                              */

/* Allocates the layer array and b_sum buffers; weights are set by the caller. */
static int model_shell(nc_model *m, model_impl *im)
{
    const nc_model_config *c = &m->cfg;
    m->layers = nc_calloc((size_t)c->num_layers, sizeof *m->layers);
    if (!m->layers)
        return NC_ENOMEM;
    for (int k = 0; k < c->num_layers; k++) {
        m->layers[k].input_size = k == 0 ? c->embedding_size : c->hidden_size;
        m->layers[k].b_sum = impl_alloc(im, 4 * (size_t)c->hidden_size);
        if (!m->layers[k].b_sum)
            return NC_ENOMEM;
    }
    return NC_OK;
}

static int model_bind_vocab(nc_model *m, const char *file, char *err, size_t errlen)
{
    int n = vocab_size(m->vocab);
    if (n != m->cfg.vocab_size)
        return nc_error(err, errlen, NC_EFORMAT, "%s: has %d words, but config.json says vocab_size %d", file, n,
                        m->cfg.vocab_size);
    m->unk_id = vocab_lookup(m->vocab, m->cfg.unk_token, strlen(m->cfg.unk_token));
    m->eos_id = vocab_lookup(m->vocab, m->cfg.eos_token, strlen(m->cfg.eos_token));
    if (m->unk_id < 0)
        return nc_error(err, errlen, NC_EFORMAT, "%s: unk_token '%s' is not in the vocabulary", file,
                        m->cfg.unk_token);
    if (m->eos_id < 0)
        return nc_error(err, errlen, NC_EFORMAT, "%s: eos_token '%s' is not in the vocabulary", file,
                        m->cfg.eos_token);
    return NC_OK;
}

/* The binary16 copy of n weights w (*copy, storage in *buf), when every
 * one is exactly a half (a model stored as F16): the same weights at half
 * the bytes for the products a sequential step or a predict is bound by
 * reading (W_hh and W_ih: vm_gemv_f16; the decoder: vm_gemm_nt_f16).
 * After a training step the weights are no longer halves and the copy is
 * dropped (the float32 kernels serve); so is it without memory for it. */
static void refresh_f16(model_impl *im, const float *w, size_t n, uint16_t **buf, const uint16_t **copy)
{
    uint16_t *h = *buf, t[256];
    float back[256];
    *copy = NULL;
    for (size_t i = 0; i < n; i += 256) {
        const size_t c = n - i < 256 ? n - i : 256;
        vm_float_to_half(w + i, t, c);
        vm_half_to_float(t, back, c);
        for (size_t j = 0; j < c; j++)
            if (back[j] != w[i + j] && !isnan(w[i + j]))
                return;
    }
    if (!h) {
        h = (uint16_t *)impl_alloc(im, (n + 1) / 2);
        if (!h)
            return;   /* no copy: the float32 path is as exact */
        *buf = h;
    }
    vm_float_to_half(w, h, n);
    *copy = h;
}

void model_refresh_derived(nc_model *m)
{
    NC_ASSERT(m, "model_refresh_derived: no m");
    const size_t G = 4 * (size_t)m->cfg.hidden_size, H = (size_t)m->cfg.hidden_size;
    for (int k = 0; k < m->cfg.num_layers; k++) {
        nc_lstm_layer *ly = &m->layers[k];
        for (size_t i = 0; i < G; i++)
            ly->b_sum[i] = ly->b_ih[i] + ly->b_hh[i];
        refresh_f16(m->impl, ly->w_hh, G * H, &ly->w_hh_f16_buf, &ly->w_hh_f16);
        refresh_f16(m->impl, ly->w_ih, G * (size_t)ly->input_size, &ly->w_ih_f16_buf, &ly->w_ih_f16);
    }
    refresh_f16(m->impl, m->decoder_w, (size_t)m->cfg.vocab_size * H, &m->decoder_f16_buf, &m->decoder_f16);
}

size_t model_num_params(const nc_model *m)
{
    NC_ASSERT(m, "model_num_params: no m");
    const nc_model_config *c = &m->cfg;
    size_t V = (size_t)c->vocab_size, E = (size_t)c->embedding_size, H = (size_t)c->hidden_size;
    size_t n = V * E + V;
    if (m->decoder_w != m->encoder)
        n += V * H;
    for (int k = 0; k < c->num_layers; k++)
        n += 4 * H * ((size_t)m->layers[k].input_size + H + 2);
    return n;
}

static void path_join(char *out, size_t n, const char *dir, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

/* dir/dyneval (dyneval.h), when present: a model directory whose weights
 * are MS_g; it must have m's configuration and vocabulary. Kept as MS_g:
 * dyneval.c takes the root where the update reads it. */
static int dyn_stats_load(nc_model *m, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    path_join(path, sizeof path, dir, "dyneval");
    if (stat(path, &st) != 0)
        return NC_OK;
    char e2[NC_ERRLEN];
    int rc = model_load(path, &m->dyn_ms, e2, sizeof e2);
    if (rc)
        return nc_error(err, errlen, rc, "%s (dynamic evaluation's gradient statistics): %s", path, e2);
    const nc_model_config *a = &m->cfg, *b = &m->dyn_ms->cfg;
    bool same = a->vocab_size == b->vocab_size && a->embedding_size == b->embedding_size &&
                a->hidden_size == b->hidden_size && a->num_layers == b->num_layers &&
                a->tie_weights == b->tie_weights;
    for (int i = 0; same && i < a->vocab_size; i++)
        same = strcmp(vocab_word(m->vocab, i), vocab_word(m->dyn_ms->vocab, i)) == 0;
    if (!same)
        return nc_error(err, errlen, NC_EFORMAT, "%s: gradient statistics of another model (configuration or "
                        "vocabulary differ); measure them again with neurocache dyn-stats", path);
    for (int l = 0; l < m->cfg.num_layers; l++)
        for (size_t j = 0; j < 4 * (size_t)m->cfg.hidden_size; j++)
            if (!(m->dyn_ms->layers[l].b_ih[j] >= 0.0f))
                return nc_error(err, errlen, NC_EFORMAT, "%s: a mean squared gradient is negative or NaN", path);
    return NC_OK;
}

int model_probe(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return nc_error(err, errlen, NC_ENOTFOUND, "%s: not a model directory", dir);
    static const char *const files[] = {"config.json", "vocab.txt", "model.safetensors"};
    char path[4096];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        path_join(path, sizeof path, dir, files[i]);
        if (access(path, R_OK) != 0)
            return nc_error(err, errlen, NC_ENOTFOUND, "%s: %s", path, strerror(errno));
    }
    return NC_OK;
}

int model_load(const char *dir, nc_model **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[4096];
    nc_model *m = nc_calloc(1, sizeof *m);
    model_impl *im = nc_calloc(1, sizeof *im);
    if (!m || !im) {
        free(m);
        free(im);
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    }
    m->impl = im;
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    struct stat st;
    int rc = NC_OK;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        rc = nc_error(err, errlen, NC_ENOTFOUND, "%s: not a model directory", dir);
    if (rc == NC_OK) {
        path_join(path, sizeof path, dir, "config.json");
        rc = config_load(path, &m->cfg, err, errlen);
    }
    if (rc == NC_OK) {
        path_join(path, sizeof path, dir, "vocab.txt");
        rc = vocab_load(path, &m->vocab, err, errlen);
        if (rc == NC_OK)
            rc = model_bind_vocab(m, path, err, errlen);
    }
    if (rc == NC_OK && model_shell(m, im) != NC_OK)
        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
    if (rc == NC_OK) {
        path_join(path, sizeof path, dir, "model.safetensors");
        rc = safetensors_load(m, im, path, err, errlen);
    }
    if (rc == NC_OK) {
        /* the adaptive mixture's gate, when the directory has one */
        rc = gate_load(dir, &m->gate, err, errlen);
        if (rc == NC_ENOTFOUND && !m->gate)
            rc = NC_OK;
    }
    if (rc == NC_OK)
        rc = dyn_stats_load(m, dir, err, errlen);
    if (rc != NC_OK) {
        model_free(m);
        return rc;
    }
    model_refresh_derived(m);
    *out = m;
    return NC_OK;
}

int model_create(const nc_model_config *cfg, nc_vocab *vocab, nc_model **out, char *err, size_t errlen)
{
    *out = NULL;
    nc_model *m = nc_zalloc(1, sizeof *m);
    model_impl *im = nc_zalloc(1, sizeof *im);
    if (!m || !im) {
        free(m);
        free(im);
        vocab_free(vocab);
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    }
    m->impl = im;
    m->cfg = *cfg;
    m->vocab = vocab;
    int rc = config_check(&m->cfg, "model config", err, errlen);
    if (rc == NC_OK)
        rc = model_bind_vocab(m, "vocabulary", err, errlen);
    if (rc == NC_OK && model_shell(m, im) != NC_OK)
        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
    if (rc == NC_OK) {
        tensor_spec specs[4 + 4 * MODEL_MAX_LAYERS];
        int n = model_specs(m, specs);
        for (int s = 0; s < n && rc == NC_OK; s++) {
            if (specs[s].optional)
                continue;   /* tied decoder: aliases the encoder below */
            *specs[s].dst = impl_alloc(im, spec_numel(&specs[s]));
            if (!*specs[s].dst)
                rc = nc_error(err, errlen, NC_ENOMEM, "out of memory for tensor '%s'", specs[s].name);
        }
        if (!m->decoder_w)
            m->decoder_w = m->encoder;
    }
    if (rc != NC_OK) {
        model_free(m);
        return rc;
    }
    model_refresh_derived(m);
    *out = m;
    return NC_OK;
}

/* ------------------------------------------------------------------------ */
/* Saving                                                                    */

static int write_config(const nc_model_config *c, FILE *f)
{
    json_t *o = json_object();
    json_object_set_new(o, "model_type", json_string(c->model_type));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "embedding_size", json_integer(c->embedding_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "num_layers", json_integer(c->num_layers));
    json_object_set_new(o, "tie_weights", json_boolean(c->tie_weights));
    json_object_set_new(o, "unk_token", json_string(c->unk_token));
    json_object_set_new(o, "eos_token", json_string(c->eos_token));
    if (c->text.declared) {
        /* older readers need "lowercase" (this reader ignores it when "text"
         * is there): kept as it was, so that they read text as before */
        json_object_set_new(o, "lowercase", json_boolean(c->lowercase));
        json_t *t = json_object();
        const char *key;
        char val[64];
        for (int i = 0; text_conv_get(&c->text, i, &key, val, sizeof val); i++)
            json_object_set_new(t, key, text_conv_key_is_bool(key) ? json_boolean(!strcmp(val, "true")) : json_string(val));
        json_object_set_new(o, "text", t);
    } else {
        json_object_set_new(o, "lowercase", json_boolean(c->lowercase));
    }
    int r = o ? json_dumpf(o, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : -1;
    json_decref(o);
    if (r == 0)
        fputc('\n', f);
    return r == 0 ? NC_OK : NC_EIO;
}

static int write_safetensors(const nc_model *m, nc_save_dtype dtype, FILE *f)
{
    tensor_spec specs[4 + 4 * MODEL_MAX_LAYERS];
    int n = model_specs((nc_model *)m, specs);
    size_t esize = dtype == NC_SAVE_F32 ? 4 : 2;
    json_t *hdr = json_object();
    size_t off = 0;
    bool tied = m->decoder_w == m->encoder;
    for (int s = 0; s < n; s++) {
        /* A tied decoder is the encoder: design §2 allows leaving it out. */
        if (specs[s].optional && tied) {
            specs[s].dst = NULL;
            continue;
        }
        json_t *e = json_object(), *shape = json_array();
        for (int i = 0; i < specs[s].rank; i++)
            json_array_append_new(shape, json_integer(specs[s].dims[i]));
        size_t nb = spec_numel(&specs[s]) * esize;
        static const char *const dtypes[] = {[NC_SAVE_F32] = "F32", [NC_SAVE_F16] = "F16", [NC_SAVE_BF16] = "BF16"};
        json_object_set_new(e, "dtype", json_string(dtypes[dtype]));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
        json_object_set_new(hdr, specs[s].name, e);
        off += nb;
    }
    json_object_set_new(hdr, "__metadata__", json_pack("{ss}", "format", "pt"));
    char *txt = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    if (!txt)
        return NC_ENOMEM;
    /* Pad with spaces so the data section starts 8-byte aligned: F32
     * tensors can then be used in place from the mapping. */
    size_t hlen = strlen(txt);
    size_t padded = (hlen + 7) & ~(size_t)7;
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (unsigned char)(((uint64_t)padded >> (8 * i)) & 0xff);
    int ok = nc_fwrite(lenb, 1, 8, f) == 8 && nc_fwrite(txt, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    free(txt);
    uint16_t hbuf[1024];
    for (int s = 0; s < n && ok; s++) {
        if (!specs[s].dst)
            continue;
        const float *src = *specs[s].dst;
        size_t cnt = spec_numel(&specs[s]);
        if (dtype == NC_SAVE_F32) {
            ok = nc_fwrite(src, sizeof(float), cnt, f) == cnt;   /* x86-64 is little-endian */
            continue;
        }
        for (size_t i = 0; i < cnt && ok; i += 1024) {
            size_t k = cnt - i < 1024 ? cnt - i : 1024;
            for (size_t j = 0; j < k; j++)
                hbuf[j] = dtype == NC_SAVE_F16 ? nc_float_to_half(src[i + j]) : float_to_bf16(src[i + j]);
            ok = nc_fwrite(hbuf, 2, k, f) == k;
        }
    }
    return ok ? NC_OK : NC_EIO;
}

int model_save(const nc_model *m, const char *dir, nc_save_dtype dtype, char *err, size_t errlen)
{
    NC_ASSERT(m, "model_save: no m");
    if (dtype != NC_SAVE_F32 && dtype != NC_SAVE_F16 && dtype != NC_SAVE_BF16)
        return nc_error(err, errlen, NC_EINVAL, "%s: unknown dtype %d", dir, (int)dtype);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return nc_error(err, errlen, NC_EIO, "%s: cannot create directory: %s", dir, strerror(errno));
    nc_atomicfile files[3];
    memset(files, 0, sizeof files);
    static const char *names[3] = {"config.json", "vocab.txt", "model.safetensors"};
    int rc = NC_OK;
    for (int i = 0; i < 3 && rc == NC_OK; i++) {
        char path[4096];
        path_join(path, sizeof path, dir, names[i]);
        rc = atomicfile_open(&files[i], path, err, errlen);
        if (rc != NC_OK)
            break;
        if (i == 0) {
            rc = write_config(&m->cfg, files[i].f);
        } else if (i == 1) {
            for (int w = 0; w < vocab_size(m->vocab) && rc == NC_OK; w++)
                if (fprintf(files[i].f, "%s\n", vocab_word(m->vocab, w)) < 0)
                    rc = NC_EIO;
        } else {
            rc = write_safetensors(m, dtype, files[i].f);
        }
        if (rc != NC_OK)
            nc_error(err, errlen, rc, "%s: write failed: %s", files[i].tmp,
                     rc == NC_ENOMEM ? "out of memory" : strerror(errno));
        rc = atomicfile_close(&files[i], rc, err, errlen);
    }
    /* Rename only once every file is complete on disk, so a crash leaves
     * either the old files or the new ones, never a half-written one. */
    for (int i = 0; i < 3 && rc == NC_OK; i++)
        rc = atomicfile_rename(&files[i], err, errlen);
    for (int i = 0; i < 3; i++)
        atomicfile_abort(&files[i]);   /* what a failure left */
    /* the renames are durable once the directory is */
    if (rc == NC_OK && atomicfile_sync_dir(dir) != 0)
        rc = nc_error(err, errlen, NC_EIO, "%s: fsync of the directory: %s", dir, strerror(errno));
    return rc;
}

/* ---- fingerprint (model.h) ---------------------------------------------- */

typedef struct { uLong crc, adl; } fp_state;

static void fp_add(fp_state *f, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n > 0) {   /* zlib takes uInt lengths */
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        f->crc = crc32(f->crc, b, k);
        f->adl = adler32(f->adl, b, k);
        b += k;
        n -= k;
    }
}

uint64_t model_fingerprint(const nc_model *m)
{
    NC_ASSERT(m, "model_fingerprint: no m");
    fp_state f = {crc32(0L, Z_NULL, 0), adler32(0L, Z_NULL, 0)};
    const nc_model_config *c = &m->cfg;
    int32_t shape[6] = {c->vocab_size, c->embedding_size, c->hidden_size, c->num_layers,
                        c->tie_weights, c->lowercase};
    fp_add(&f, shape, sizeof shape);
    fp_add(&f, c->unk_token, strlen(c->unk_token) + 1);
    fp_add(&f, c->eos_token, strlen(c->eos_token) + 1);
    for (int i = 0; i < c->vocab_size; i++) {
        const char *w = vocab_word(m->vocab, i);
        fp_add(&f, w, strlen(w) + 1);
    }
    size_t V = (size_t)c->vocab_size, E = (size_t)c->embedding_size, H = (size_t)c->hidden_size;
    fp_add(&f, m->encoder, V * E * sizeof(float));
    for (int l = 0; l < c->num_layers; l++) {
        const nc_lstm_layer *L = &m->layers[l];
        fp_add(&f, L->w_ih, 4 * H * (size_t)L->input_size * sizeof(float));
        fp_add(&f, L->w_hh, 4 * H * H * sizeof(float));
        fp_add(&f, L->b_ih, 4 * H * sizeof(float));
        fp_add(&f, L->b_hh, 4 * H * sizeof(float));
    }
    if (m->decoder_w != m->encoder)
        fp_add(&f, m->decoder_w, V * H * sizeof(float));
    fp_add(&f, m->decoder_b, V * sizeof(float));
    return ((uint64_t)(f.crc & 0xffffffffu) << 32) | (uint64_t)(f.adl & 0xffffffffu);
}
