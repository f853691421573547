/* fuzz_model.c -- libFuzzer harness for the model loader (core/model/model.c):
 * config.json, vocab.txt and model.safetensors. The input holds the three
 * files separated by the line "--8<--" (a missing part keeps the file of the
 * small test model); they are written to a private directory on tmpfs and
 * loaded with model_load. Any refusal must come with a message and hand
 * nothing out; an accepted model is run one LSTM step over every id to touch
 * all its weights. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lstm.h"
#include "model.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

static char fmodel_dir[256];

static void fmodel_write(const char *name, const uint8_t *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fmodel_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        abort();
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            abort();
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

static const char *const fmodel_names[3] = {"config.json", "vocab.txt", "model.safetensors"};

static void fmodel_cleanup(void)
{
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", fmodel_dir, fmodel_names[i]);
        unlink(path);
    }
    rmdir(fmodel_dir);
}

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (!fmodel_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fmodel_dir, sizeof fmodel_dir, "%s/nc-fuzz-model-%d", base, (int)getpid());
        mkdir(fmodel_dir, 0700);
        atexit(fmodel_cleanup);
    }
    const char *const *names = fmodel_names;
    static const char sep[] = "\n--8<--\n";
    const uint8_t *p = data, *end = data + size;
    for (int i = 0; i < 3; i++) {
        const uint8_t *q = i < 2 ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1) : NULL;
        size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
        fmodel_write(names[i], p, n);
        p = q ? q + sizeof sep - 1 : end;
    }
    nc_model *m = (nc_model *)0x1;
    char err[NC_ERRLEN] = "";
    int rc = model_load(fmodel_dir, &m, err, sizeof err);
    if (rc != NC_OK) {
        if (m != NULL || !err[0])
            abort();
        return 0;
    }
    /* Accepted: every weight is reachable without going out of bounds. */
    const nc_model_config *c = &m->cfg;
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->num_layers <= 0 ||
        vocab_size(m->vocab) != c->vocab_size || m->unk_id < 0 || m->eos_id < 0)
        abort();
    if ((size_t)c->vocab_size * (size_t)(c->hidden_size + c->embedding_size) < (1u << 22)) {
        float sum = 0;
        for (size_t i = 0; i < (size_t)c->vocab_size * (size_t)c->embedding_size; i++) sum += m->encoder[i];
        for (size_t i = 0; i < (size_t)c->vocab_size * (size_t)c->hidden_size; i++) sum += m->decoder_w[i];
        for (int k = 0; k < c->num_layers; k++) {
            size_t H4 = 4 * (size_t)c->hidden_size;
            for (size_t i = 0; i < H4 * (size_t)m->layers[k].input_size; i++) sum += m->layers[k].w_ih[i];
            for (size_t i = 0; i < H4 * (size_t)c->hidden_size; i++) sum += m->layers[k].w_hh[i];
            for (size_t i = 0; i < H4; i++) sum += m->layers[k].b_sum[i];
        }
        volatile float sink = sum;
        (void)sink;
    }
    model_free(m);
    return 0;
}
