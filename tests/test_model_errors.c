/* test_model_errors.c -- broken model directories, built at test time from
 * the fixtures: each must fail with the right rc and a message naming the
 * file (and tensor), without crashing or leaking. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "slurp.h"
#include "harness.h"
#include "model.h"

static char root[] = "/tmp/nc_model_errors_XXXXXX";
static int case_no;

static const char *msg(const char *s)
{
    return s;
}

static void spit(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len)
        fprintf(stderr, "cannot write %s\n", path);
    if (f)
        fclose(f);
}

/* A fresh copy of a fixture under root; returns its path in dir. */
static void copy_fixture(const char *name, char *dir, size_t n)
{
    snprintf(dir, n, "%s/case%02d", root, ++case_no);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "vocab.txt", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char src[1024], dst[1024];
        size_t len;
        snprintf(src, sizeof src, "%s/%s/%s", harness_fixtures(), name, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        char *b = slurp_file(src, &len);
        if (b)
            spit(dst, b, len);
        free(b);
    }
}

static void file_path(char *out, size_t n, const char *dir, const char *file)
{
    snprintf(out, n, "%s/%s", dir, file);
}

/* Replaces the first occurrence of from with to in dir/file (text files). */
static void edit_text(const char *dir, const char *file, const char *from, const char *to)
{
    char p[1024];
    size_t len;
    file_path(p, sizeof p, dir, file);
    char *b = slurp_file(p, &len);
    char *at = b ? strstr(b, from) : NULL;
    CHECKF(at != NULL, "fixture %s lacks \"%s\"", file, from);
    if (!at) {
        free(b);
        return;
    }
    size_t fl = strlen(from), tl = strlen(to);
    char *nb = malloc(len - fl + tl + 1);
    size_t pre = (size_t)(at - b);
    memcpy(nb, b, pre);
    memcpy(nb + pre, to, tl);
    memcpy(nb + pre + tl, at + fl, len - pre - fl);
    spit(p, nb, len - fl + tl);
    free(nb);
    free(b);
}

/* Rewrites model.safetensors with the header JSON edited (from -> to) and
 * the header length fixed up; the data section is kept byte for byte. */
static void edit_header(const char *dir, const char *from, const char *to)
{
    char p[1024];
    size_t len;
    file_path(p, sizeof p, dir, "model.safetensors");
    unsigned char *b = (unsigned char *)slurp_file(p, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | b[i];
    char *hdr = strndup((char *)b + 8, hl);
    char *at = strstr(hdr, from);
    CHECKF(at != NULL, "header lacks \"%s\"", from);
    if (at) {
        size_t fl = strlen(from), tl = strlen(to), nhl = hl - fl + tl;
        size_t pre = (size_t)(at - hdr);
        unsigned char *nb = malloc(8 + nhl + (len - 8 - hl));
        for (int i = 0; i < 8; i++)
            nb[i] = (unsigned char)(nhl >> (8 * i));
        memcpy(nb + 8, hdr, pre);
        memcpy(nb + 8 + pre, to, tl);
        memcpy(nb + 8 + pre + tl, at + fl, hl - pre - fl);
        memcpy(nb + 8 + nhl, b + 8 + hl, len - 8 - hl);
        spit(p, nb, 8 + nhl + (len - 8 - hl));
        free(nb);
    }
    free(hdr);
    free(b);
}

static void truncate_file(const char *dir, const char *file, size_t keep)
{
    char p[1024];
    file_path(p, sizeof p, dir, file);
    CHECK(truncate(p, (off_t)keep) == 0);
}

static void remove_file(const char *dir, const char *file)
{
    char p[1024];
    file_path(p, sizeof p, dir, file);
    CHECK(unlink(p) == 0);
}

/* Loads dir, expecting failure with rc and every needle in the message. */
#define EXPECT_FAIL(dir, want_rc, ...) do { \
        nc_model *m_ = (nc_model *)0x1; \
        char err_[NC_ERRLEN] = ""; \
        int rc_ = model_load(dir, &m_, err_, sizeof err_); \
        CHECKF(rc_ == (want_rc), "%s: rc %d, want %d (%s)", dir, rc_, want_rc, err_); \
        CHECK(m_ == NULL); \
        const char *needles_[] = {__VA_ARGS__}; \
        for (size_t i_ = 0; i_ < sizeof needles_ / sizeof needles_[0]; i_++) \
            CHECK_STR_CONTAINS(msg(err_), needles_[i_]); \
        if (m_ && m_ != (nc_model *)0x1) model_free(m_); \
    } while (0)

TEST(missing_files)
{
    char d[512];
    copy_fixture("lstm-2layer", d, sizeof d);
    remove_file(d, "config.json");
    EXPECT_FAIL(d, NC_ENOTFOUND, "config.json", "cannot open");
    copy_fixture("lstm-2layer", d, sizeof d);
    remove_file(d, "vocab.txt");
    EXPECT_FAIL(d, NC_ENOTFOUND, "vocab.txt");
    copy_fixture("lstm-2layer", d, sizeof d);
    remove_file(d, "model.safetensors");
    EXPECT_FAIL(d, NC_ENOTFOUND, "model.safetensors");
    EXPECT_FAIL("/nonexistent/model/dir", NC_ENOTFOUND, "/nonexistent/model/dir");
}

TEST(bad_config)
{
    char d[512];
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"hidden_size\": 16,", "");
    EXPECT_FAIL(d, NC_EFORMAT, "config.json", "missing required key 'hidden_size'");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"num_layers\": 2", "\"num_layers\": \"2\"");
    EXPECT_FAIL(d, NC_EFORMAT, "config.json", "'num_layers' must be an integer");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"tie_weights\": false", "\"tie_weights\": 0");
    EXPECT_FAIL(d, NC_EFORMAT, "config.json", "'tie_weights' must be true or false");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"num_layers\": 2", "\"num_layers\": 0");
    EXPECT_FAIL(d, NC_EFORMAT, "config.json", "num_layers 0 out of range");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"lstm\"", "\"gru\"");
    EXPECT_FAIL(d, NC_EFORMAT, "config.json", "model_type is 'gru'");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"vocab_size\": 50,", "\"vocab_size\": 50,,");
    EXPECT_FAIL(d, NC_EFORMAT, "config.json", "invalid JSON");
    /* tie_weights needs E == H. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"embedding_size\": 16", "\"embedding_size\": 8");
    edit_text(d, "config.json", "\"tie_weights\": false", "\"tie_weights\": true");
    EXPECT_FAIL(d, NC_EFORMAT, "config.json", "tie_weights needs embedding_size == hidden_size");
    /* Unknown keys are ignored. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"vocab_size\"", "\"future_option\": [1, 2], \"vocab_size\"");
    nc_model *m = NULL;
    char err[NC_ERRLEN];
    CHECKF(model_load(d, &m, err, sizeof err) == NC_OK, "%s", err);
    model_free(m);
}

TEST(bad_vocab)
{
    char d[512];
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "vocab.txt", "w47\n", "");
    EXPECT_FAIL(d, NC_EFORMAT, "vocab.txt", "49 words", "vocab_size 50");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "vocab.txt", "w47\n", "w47\nw48\n");
    EXPECT_FAIL(d, NC_EFORMAT, "vocab.txt", "51 words");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "vocab.txt", "w47\n", "w46\n");
    EXPECT_FAIL(d, NC_EFORMAT, "vocab.txt", "duplicate word 'w46'");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "vocab.txt", "<eos>\n", "<EOS>\n");
    EXPECT_FAIL(d, NC_EFORMAT, "vocab.txt", "eos_token '<eos>'");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_text(d, "config.json", "\"<unk>\"", "\"<UNK>\"");
    EXPECT_FAIL(d, NC_EFORMAT, "vocab.txt", "unk_token '<UNK>'");
}

TEST(truncated_and_header_length)
{
    char d[512];
    copy_fixture("lstm-2layer", d, sizeof d);
    truncate_file(d, "model.safetensors", 5);
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "truncated");
    copy_fixture("lstm-2layer", d, sizeof d);
    truncate_file(d, "model.safetensors", 0);
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "truncated");
    /* Cut inside the header: the length now points past the end. */
    copy_fixture("lstm-2layer", d, sizeof d);
    truncate_file(d, "model.safetensors", 100);
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "header length 880", "past the end");
    /* Cut inside the data: the last tensor's bytes are missing. */
    copy_fixture("lstm-2layer", d, sizeof d);
    truncate_file(d, "model.safetensors", 24800);
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'decoder.bias'", "past the end of the data");
    /* A huge header length. */
    copy_fixture("lstm-2layer", d, sizeof d);
    char p[1024];
    file_path(p, sizeof p, d, "model.safetensors");
    FILE *f = fopen(p, "r+b");
    unsigned char big[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    fwrite(big, 1, 8, f);
    fclose(f);
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "header length", "past the end");
}

TEST(bad_header)
{
    char d[512];
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "{\"encoder.weight\":{", "{\"encoder.weight\":{{");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "malformed header JSON");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "{\"encoder.weight\"", "[{\"encoder.weight\"");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "malformed header JSON");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"rnn.weight_hh_l0\":{\"dtype\":\"F32\"", "\"rnn.weight_hh_l0\":{\"dtype\":\"F33\"");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "tensor 'rnn.weight_hh_l0' has unknown dtype 'F33'");
    /* Known to safetensors but not usable as weights. */
    copy_fixture("lstm-2layer-f16", d, sizeof d);
    edit_header(d, "\"rnn.bias_hh_l1\":{\"dtype\":\"F16\"", "\"rnn.bias_hh_l1\":{\"dtype\":\"I16\"");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "tensor 'rnn.bias_hh_l1' has dtype I16, expected F32, F16 or BF16");
    /* Same byte count, wrong shape. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"rnn.weight_hh_l0\":{\"dtype\":\"F32\",\"shape\":[64,16]",
                "\"rnn.weight_hh_l0\":{\"dtype\":\"F32\",\"shape\":[128,8]");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors: tensor 'rnn.weight_hh_l0' has shape [128,8], expected [64,16]");
    /* Shape and byte range disagree. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"shape\":[64,16],\"data_offsets\":[7296,11392]", "\"shape\":[64,8],\"data_offsets\":[7296,11392]");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'rnn.weight_hh_l0'", "span 4096 bytes", "need 2048");
    /* Overlapping tensors. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"data_offsets\":[3200,7296]", "\"data_offsets\":[3100,7196]");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'encoder.weight'", "'rnn.weight_ih_l0'", "overlap");
    /* Offsets past the data section. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"data_offsets\":[23808,24008]", "\"data_offsets\":[24808,25008]");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'decoder.bias'", "past the end of the data");
    /* Inverted offsets. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"data_offsets\":[23808,24008]", "\"data_offsets\":[24008,23808]");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'decoder.bias'", "invalid data_offsets");
    /* Missing tensor (renamed). */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"rnn.bias_ih_l1\"", "\"rnn.bias_ih_lX\"");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "missing tensor 'rnn.bias_ih_l1'");
    /* Untied model without decoder.weight. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"decoder.weight\"", "\"unused.weight\"");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "missing tensor 'decoder.weight'");
    /* Structurally wrong entries. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"shape\":[64],\"data_offsets\":[11392,11648]", "\"shape\":[-64],\"data_offsets\":[11392,11648]");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'rnn.bias_ih_l0'", "shape[0]");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"data_offsets\":[11392,11648]", "\"data_offsets\":[11392]");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'rnn.bias_ih_l0'", "data_offsets");
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"encoder.weight\":{\"dtype\":\"F32\",", "\"encoder.weight\":{\"dtype\":32,");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "'encoder.weight'", "dtype");
    /* Duplicate tensor names are ambiguous. */
    copy_fixture("lstm-2layer", d, sizeof d);
    edit_header(d, "\"rnn.bias_ih_l1\"", "\"rnn.bias_hh_l1\"");
    EXPECT_FAIL(d, NC_EFORMAT, "model.safetensors", "malformed header JSON");
}

/* Garbage of every length as a safetensors file never crashes the loader. */
TEST(garbage_safetensors)
{
    char d[512], p[1024];
    copy_fixture("lstm-2layer", d, sizeof d);
    file_path(p, sizeof p, d, "model.safetensors");
    size_t len;
    unsigned char *orig = (unsigned char *)slurp_file(p, &len);
    unsigned x = 99;
    int failures = 0;
    for (int trial = 0; trial < 60; trial++) {
        unsigned char *b = malloc(len);
        memcpy(b, orig, len);
        /* Flip a few bytes in the header region. */
        for (int k = 0; k < 3; k++) {
            x = x * 1103515245u + 12345u;
            size_t at = (x >> 8) % 900;
            b[at] ^= (unsigned char)(1 + (x & 0x7f));
        }
        spit(p, b, len);
        nc_model *m = NULL;
        char err[NC_ERRLEN];
        int rc = model_load(d, &m, err, sizeof err);
        /* A flip in padding or inside a digit may still load; any failure
         * must name the file. */
        if (rc != NC_OK && !strstr(err, "model.safetensors")) {
            failures++;
            fprintf(stderr, "unexpected message: %s\n", err);
        }
        model_free(m);
        free(b);
    }
    CHECK(failures == 0);
    free(orig);
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

int main(void)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(missing_files);
    RUN(bad_config);
    RUN(bad_vocab);
    RUN(truncated_and_header_length);
    RUN(bad_header);
    RUN(garbage_safetensors);
    rm_rf(root);
    return harness_summary();
}
