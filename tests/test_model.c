/* test_model.c -- model create/save/load round trips (F32 exact, F16 within
 * half precision), tied decoders, unaligned data, F16 fixture. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "lstm.h"
#include "model.h"

static char root[] = "/tmp/nc_model_XXXXXX";

static const char *msg(const char *s)
{
    return s;
}

static nc_model *load_fixture(const char *name)
{
    char dir[1024], err[NC_ERRLEN];
    nc_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/%s", harness_fixtures(), name);
    int rc = model_load(dir, &m, err, sizeof err);
    CHECKF(rc == NC_OK, "%s", err);
    return m;
}

/* Calls fn on every weight array of a and b (same config). */
typedef void (*pair_fn)(const float *a, const float *b, size_t n, const char *what, void *ctx);

static void each_tensor(const nc_model *a, const nc_model *b, pair_fn fn, void *ctx)
{
    size_t V = (size_t)a->cfg.vocab_size, E = (size_t)a->cfg.embedding_size, H = (size_t)a->cfg.hidden_size;
    fn(a->encoder, b->encoder, V * E, "encoder", ctx);
    for (int k = 0; k < a->cfg.num_layers; k++) {
        size_t in = (size_t)a->layers[k].input_size;
        fn(a->layers[k].w_ih, b->layers[k].w_ih, 4 * H * in, "w_ih", ctx);
        fn(a->layers[k].w_hh, b->layers[k].w_hh, 4 * H * H, "w_hh", ctx);
        fn(a->layers[k].b_ih, b->layers[k].b_ih, 4 * H, "b_ih", ctx);
        fn(a->layers[k].b_hh, b->layers[k].b_hh, 4 * H, "b_hh", ctx);
        fn(a->layers[k].b_sum, b->layers[k].b_sum, 4 * H, "b_sum", ctx);
    }
    fn(a->decoder_w, b->decoder_w, V * H, "decoder_w", ctx);
    fn(a->decoder_b, b->decoder_b, V, "decoder_b", ctx);
}

static void same_bits(const float *a, const float *b, size_t n, const char *what, void *ctx)
{
    (void)ctx;
    CHECKF(memcmp(a, b, n * sizeof(float)) == 0, "%s differs", what);
}

/* float16 keeps 11 significant bits: relative error <= 2^-11 for normals,
 * absolute <= 2^-25 in the subnormal range. */
static void within_half(const float *a, const float *b, size_t n, const char *what, void *ctx)
{
    (void)ctx;
    if (!strcmp(what, "b_sum"))
        return;                   /* derived: cancellation amplifies relative error */
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = fmax(fabs(a[i]) * ldexp(1.0, -11), ldexp(1.0, -25));
        worst = fmax(worst, fabs(a[i] - b[i]) / tol);
    }
    CHECKF(worst <= 1.0, "%s: f16 error %g x the half-precision bound", what, worst);
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."));
    if (d)
        closedir(d);
    return n;
}

/* bfloat16 keeps 8 significant bits and float32's exponent: relative
 * error <= 2^-8 (half a unit of the last place) at any magnitude. */
static void within_bf16(const float *a, const float *b, size_t n, const char *what, void *ctx)
{
    (void)ctx;
    if (!strcmp(what, "b_sum"))
        return;
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(a[i] - b[i]) / (fabs((double)a[i]) * ldexp(1.0, -8)));
    CHECKF(worst <= 1.0, "%s: bf16 error %g x the bound", what, worst);
}

/* BF16 (dyn-stats' statistics): values far below float16's range (mean
 * squared gradients reach 1e-16) survive to 2^-8, where F16 flushes them. */
TEST(bf16_round_trip_keeps_tiny_values)
{
    nc_model *m = load_fixture("lstm-2layer");
    if (!m)
        return;
    float *w = m->layers[0].w_ih;
    w[0] = 1.5e-16f, w[1] = 3.0e-9f, w[2] = 7.77e-5f, w[3] = 0.0f, w[4] = -2.5e-12f;
    char dir[600], err[NC_ERRLEN];
    snprintf(dir, sizeof dir, "%s/bf16", root);
    CHECKF(model_save(m, dir, NC_SAVE_BF16, err, sizeof err) == NC_OK, "%s", err);
    CHECK(count_files(dir) == 3);
    nc_model *a = NULL;
    CHECKF(model_load(dir, &a, err, sizeof err) == NC_OK, "%s", err);
    if (a) {
        each_tensor(m, a, within_bf16, NULL);
        CHECK(a->layers[0].w_ih[0] > 0 && a->layers[0].w_ih[3] == 0.0f && a->layers[0].w_ih[4] < 0);
    }
    model_free(a);
    model_free(m);
}

TEST(save_load_round_trip)
{
    const char *names[] = {"lstm-2layer", "lstm-1layer-tied", "lstm-2layer-f16"};
    for (int i = 0; i < 3; i++) {
        nc_model *m = load_fixture(names[i]);
        if (!m)
            continue;
        char d32[600], d16[600], err[NC_ERRLEN];
        snprintf(d32, sizeof d32, "%s/%s-f32", root, names[i]);
        snprintf(d16, sizeof d16, "%s/%s-f16", root, names[i]);
        CHECKF(model_save(m, d32, false, err, sizeof err) == NC_OK, "%s", err);
        CHECKF(model_save(m, d16, true, err, sizeof err) == NC_OK, "%s", err);
        CHECK(count_files(d32) == 3 && count_files(d16) == 3);   /* no temp files left */
        nc_model *a = NULL, *b = NULL;
        CHECKF(model_load(d32, &a, err, sizeof err) == NC_OK, "%s", err);
        CHECKF(model_load(d16, &b, err, sizeof err) == NC_OK, "%s", err);
        if (a && b) {
            CHECK(!memcmp(&a->cfg, &m->cfg, sizeof m->cfg));
            CHECK(vocab_size(a->vocab) == vocab_size(m->vocab) && a->eos_id == m->eos_id && a->unk_id == m->unk_id);
            CHECK(!strcmp(vocab_word(a->vocab, 7), vocab_word(m->vocab, 7)));
            each_tensor(m, a, same_bits, NULL);
            /* The f16 fixture holds half values: they survive exactly. */
            each_tensor(m, b, i == 2 ? same_bits : within_half, NULL);
        }
        /* Saving over an existing model replaces it. */
        CHECKF(model_save(b ? b : m, d32, false, err, sizeof err) == NC_OK, "%s", err);
        nc_model *c = NULL;
        CHECKF(model_load(d32, &c, err, sizeof err) == NC_OK, "%s", err);
        if (b && c)
            each_tensor(b, c, same_bits, NULL);
        model_free(a);
        model_free(b);
        model_free(c);
        model_free(m);
    }
}

/* Fills every weight with a deterministic pseudo-random value. */
static void fill_random(nc_model *m, unsigned seed)
{
    size_t V = (size_t)m->cfg.vocab_size, E = (size_t)m->cfg.embedding_size, H = (size_t)m->cfg.hidden_size;
    float *arrs[4 + 4 * 8];
    size_t ns[4 + 4 * 8];
    int k = 0;
    arrs[k] = m->encoder, ns[k++] = V * E;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        arrs[k] = m->layers[l].w_ih, ns[k++] = 4 * H * (size_t)m->layers[l].input_size;
        arrs[k] = m->layers[l].w_hh, ns[k++] = 4 * H * H;
        arrs[k] = m->layers[l].b_ih, ns[k++] = 4 * H;
        arrs[k] = m->layers[l].b_hh, ns[k++] = 4 * H;
    }
    if (m->decoder_w != m->encoder)
        arrs[k] = m->decoder_w, ns[k++] = V * H;
    arrs[k] = m->decoder_b, ns[k++] = V;
    for (int a = 0; a < k; a++)
        for (size_t i = 0; i < ns[a]; i++) {
            seed = seed * 1103515245u + 12345u;
            arrs[a][i] = ((float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f) * 0.4f;
        }
    model_refresh_derived(m);
}

static nc_vocab *make_vocab(int n, bool with_unk, bool with_eos)
{
    nc_vocab *v = vocab_new();
    if (with_unk)
        vocab_add(v, "<unk>", 5);
    if (with_eos)
        vocab_add(v, "<eos>", 5);
    for (int i = 0; vocab_size(v) < n; i++) {
        char b[16];
        int l = snprintf(b, sizeof b, "w%d", i);
        vocab_add(v, b, (size_t)l);
    }
    return v;
}

TEST(create_and_tie)
{
    nc_model_config cfg = {.model_type = "lstm", .vocab_size = 30, .embedding_size = 8, .hidden_size = 8,
                           .num_layers = 3, .tie_weights = true, .unk_token = "<unk>", .eos_token = "<eos>"};
    nc_model *m = NULL;
    char err[NC_ERRLEN];
    CHECKF(model_create(&cfg, make_vocab(30, true, true), &m, err, sizeof err) == NC_OK, "%s", err);
    if (!m)
        return;
    CHECK(m->decoder_w == m->encoder);
    CHECK(m->encoder[0] == 0.0f && m->layers[2].w_hh[8 * 32 - 1] == 0.0f);
    /* V*E + V + 3 layers * 4H*(in + H + 2), decoder counted once. */
    CHECK(model_num_params(m) == 30 * 8 + 30 + 3 * 32 * (8 + 8 + 2));
    fill_random(m, 3);
    char d[600];
    snprintf(d, sizeof d, "%s/created-tied", root);
    CHECKF(model_save(m, d, false, err, sizeof err) == NC_OK, "%s", err);
    nc_model *r = NULL;
    CHECKF(model_load(d, &r, err, sizeof err) == NC_OK, "%s", err);
    if (r) {
        CHECK(r->decoder_w == r->encoder);     /* saved without decoder.weight */
        each_tensor(m, r, same_bits, NULL);
        CHECK(model_num_params(r) == model_num_params(m));
    }
    model_free(r);
    model_free(m);

    /* Untied, E != H. */
    cfg.tie_weights = false;
    cfg.embedding_size = 5;
    cfg.num_layers = 2;
    CHECKF(model_create(&cfg, make_vocab(30, true, true), &m, err, sizeof err) == NC_OK, "%s", err);
    if (m) {
        CHECK(m->decoder_w != m->encoder && m->layers[0].input_size == 5 && m->layers[1].input_size == 8);
        fill_random(m, 5);
        snprintf(d, sizeof d, "%s/created-untied", root);
        CHECKF(model_save(m, d, true, err, sizeof err) == NC_OK, "%s", err);
        CHECKF(model_load(d, &r, err, sizeof err) == NC_OK, "%s", err);
        if (r)
            each_tensor(m, r, within_half, NULL);
        model_free(r);
    }
    model_free(m);

    /* Bad configs: the vocab is taken over (and freed) even on failure. */
    cfg.embedding_size = 8;
    CHECK(model_create(&cfg, make_vocab(29, true, true), &m, err, sizeof err) == NC_EFORMAT && !m);
    CHECK_STR_CONTAINS(msg(err), "29 words");
    CHECK(model_create(&cfg, make_vocab(30, false, true), &m, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "unk_token");
    cfg.tie_weights = true;
    cfg.embedding_size = 4;
    CHECK(model_create(&cfg, make_vocab(30, true, true), &m, err, sizeof err) == NC_EFORMAT);
    CHECK_STR_CONTAINS(msg(err), "tie_weights");

    /* Saving into a directory that cannot be created. */
    cfg.embedding_size = 8;
    CHECK(model_create(&cfg, make_vocab(30, true, true), &m, err, sizeof err) == NC_OK);
    CHECK(model_save(m, "/nonexistent/dir/model", false, err, sizeof err) == NC_EIO);
    CHECK_STR_CONTAINS(msg(err), "/nonexistent/dir/model");
    model_free(m);
    model_free(NULL);
}

/* Reads a file and rewrites its safetensors header via a callback-free edit:
 * from -> to in the header, length fixed up, data unchanged. */
static int rewrite_header(const char *src, const char *dst, const char *from, const char *to, size_t pad)
{
    FILE *f = fopen(src, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len);
    size_t got = fread(b, 1, len, f);
    fclose(f);
    if (got != len) {
        free(b);
        return -1;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | b[i];
    char *hdr = strndup((char *)b + 8, hl);
    char *at = from ? strstr(hdr, from) : NULL;
    size_t fl = at ? strlen(from) : 0, tl = at ? strlen(to) : 0, pre = at ? (size_t)(at - hdr) : hl;
    size_t nhl = hl - fl + tl + pad;
    f = fopen(dst, "wb");
    unsigned char lb[8];
    for (int i = 0; i < 8; i++)
        lb[i] = (unsigned char)(nhl >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(hdr, 1, pre, f);
    if (at) {
        fwrite(to, 1, tl, f);
        fwrite(at + fl, 1, hl - pre - fl, f);
    }
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    fwrite(b + 8 + hl, 1, len - 8 - hl, f);
    fclose(f);
    free(hdr);
    free(b);
    return 0;
}

static void copy_file(const char *src, const char *dst)
{
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    char buf[4096];
    size_t n;
    while (a && b && (n = fread(buf, 1, sizeof buf, a)) > 0)
        fwrite(buf, 1, n, b);
    if (a)
        fclose(a);
    if (b)
        fclose(b);
}

static void fixture_variant(const char *name, const char *dir, const char *from, const char *to, size_t pad)
{
    char s[1024], t[1024];
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "vocab.txt"};
    for (int i = 0; i < 2; i++) {
        snprintf(s, sizeof s, "%s/%s/%s", harness_fixtures(), name, files[i]);
        snprintf(t, sizeof t, "%s/%s", dir, files[i]);
        copy_file(s, t);
    }
    snprintf(s, sizeof s, "%s/%s/model.safetensors", harness_fixtures(), name);
    snprintf(t, sizeof t, "%s/model.safetensors", dir);
    CHECK(rewrite_header(s, t, from, to, pad) == 0);
}

/* A tied model whose file lacks decoder.weight uses the encoder, and gives
 * the same answers as the fixture (whose decoder.weight equals encoder). */
TEST(tied_without_decoder_weight)
{
    nc_model *m = load_fixture("lstm-1layer-tied");
    if (!m)
        return;
    char d[600], err[NC_ERRLEN];
    snprintf(d, sizeof d, "%s/tied-nodec", root);
    fixture_variant("lstm-1layer-tied", d, "\"decoder.weight\"", "\"unused.decoder\"", 0);
    nc_model *t = NULL;
    CHECKF(model_load(d, &t, err, sizeof err) == NC_OK, "%s", err);
    if (t) {
        CHECK(t->decoder_w == t->encoder);
        CHECK(m->decoder_w != m->encoder);          /* present in the fixture: used as is */
        CHECK(!memcmp(m->decoder_w, t->decoder_w, 40 * 12 * sizeof(float)));
        nc_state *s = lstm_state_new(t);
        nc_lstm_work *w = lstm_work_new(t);
        float la[40], lb[40];
        lstm_step(t, s, 5, w);
        lstm_logits(t, lstm_state_top(s), la);
        lstm_logits(m, lstm_state_top(s), lb);
        CHECK(!memcmp(la, lb, sizeof la));
        lstm_work_free(w);
        lstm_state_free(s);
    }
    model_free(t);
    model_free(m);
}

/* A header length that leaves the data section unaligned: F32 tensors are
 * then copied instead of used in place, with identical values. */
TEST(unaligned_data_section)
{
    nc_model *m = load_fixture("lstm-2layer");
    if (!m)
        return;
    for (size_t pad = 1; pad <= 3; pad++) {
        char d[600], err[NC_ERRLEN];
        snprintf(d, sizeof d, "%s/unaligned%zu", root, pad);
        fixture_variant("lstm-2layer", d, NULL, NULL, pad);
        nc_model *u = NULL;
        CHECKF(model_load(d, &u, err, sizeof err) == NC_OK, "%s", err);
        if (u) {
            CHECK(((uintptr_t)u->encoder & 3) == 0);
            each_tensor(m, u, same_bits, NULL);
        }
        model_free(u);
    }
    model_free(m);
}

/* Weights from the mapping are private: writing them changes neither the
 * file nor another model loaded from it. */
TEST(mapping_is_private)
{
    nc_model *a = load_fixture("lstm-2layer"), *b = load_fixture("lstm-2layer");
    if (a && b) {
        float old = b->encoder[3];
        a->encoder[3] = 12345.0f;
        a->layers[1].w_hh[7] = -1.0f;
        CHECK(b->encoder[3] == old);
        nc_model *c = load_fixture("lstm-2layer");
        CHECK(c && c->encoder[3] == old);
        model_free(c);
    }
    model_free(a);
    model_free(b);
}

int main(void)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(save_load_round_trip);
    RUN(bf16_round_trip_keeps_tiny_values);
    RUN(create_and_tie);
    RUN(tied_without_decoder_weight);
    RUN(unaligned_data_section);
    RUN(mapping_is_private);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", root);
    return harness_summary();
}
