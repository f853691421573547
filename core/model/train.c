/* train.c -- the training loop: corpus, batchify, truncated BPTT with SGD or
 * Adagrad, validation, best-model saving and exact checkpoint/resume. */
#include "train.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "atomicfile.h"
#include "binio.h"
#include "buf.h"
#include "model.h"
#include "optim.h"
#include "rng.h"
#include "tokenizer.h"
#include "fault.h"

#define STATE_FILE "train-state.bin"
#define STATE_MAGIC "NCTRAIN1"
#define STATE_VERSION 1u
#define CURVE_FILE "curve.csv"

void train_default_params(nc_train_params *p)
{
    NC_ASSERT(p, "train_default_params: no p");
    memset(p, 0, sizeof *p);
    p->embedding_size = 256;
    p->hidden_size = 256;
    p->num_layers = 2;
    p->tie_weights = true;
    snprintf(p->unk_token, sizeof p->unk_token, "<unk>");
    snprintf(p->eos_token, sizeof p->eos_token, "<eos>");
    p->bptt = 35;
    p->batch_size = 20;
    p->eval_batch_size = 10;
    p->optimizer = NC_OPT_SGD;
    p->lr = 20.0f;
    p->lr_decay = 4.0f;
    p->clip = 0.25f;
    p->init_range = 0.1f;
    p->adagrad_eps = 1e-10f;
    p->dropout.emb = p->dropout.hid = p->dropout.out = 0.25f;
    p->epochs = 40;
    p->seed = 1111;
    p->checkpoint_every = 300;
}

/* ---- corpus ------------------------------------------------------------ */

/* The whole file at path (free() *buf). */
static int read_file(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
    nc_buf b = NC_BUF_INIT;
    int rc = buf_read_file(&b, path, err, errlen);
    if (rc == NC_OK && !(*buf = buf_detach(&b, len)))
        rc = nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
    if (rc != NC_OK)
        *buf = NULL;
    buf_free(&b);
    return rc;
}

/* Feeds the file to the shared tokenizer (so that training sees exactly the
 * words, white space and lower-casing that serving sees) in chunks ending at
 * a newline, calling fn for every token. */
typedef int (*token_fn)(const nc_tokens *t, void *ud, char *err, size_t errlen);

static int tokenize_file(const char *path, const nc_model *m, token_fn fn, void *ud, char *err,
                         size_t errlen)
{
    char *buf;
    size_t len;
    int rc = read_file(path, &buf, &len, err, errlen);
    if (rc != NC_OK)
        return rc;
    nc_tokens t;
    tokens_init(&t);
    size_t pos = 0;
    while (rc == NC_OK && pos < len) {
        size_t end = pos + (1 << 20) < len ? pos + (1 << 20) : len;
        if (end < len) {
            /* at a blank line when one is near (it ends a paragraph, which a
             * chunk boundary must not hide from sentence conventions), else a newline */
            size_t win = len - end < (1 << 16) ? len - end : (1 << 16);
            const char *bl = memmem(buf + end, win, "\n\n", 2);
            const char *nl = bl ? bl + 1 : memchr(buf + end, '\n', len - end);
            end = nl ? (size_t)(nl - buf) + 1 : len;
        }
        tokens_clear(&t);
        rc = tokenize(m, buf + pos, end - pos, end == len, &t, err, errlen);
        if (rc != NC_OK) {
            char tmp[NC_ERRLEN];
            snprintf(tmp, sizeof tmp, "%s", err ? err : "");
            nc_error(err, errlen, rc, "%s: %s (in the chunk at byte %zu)", path, tmp, pos);
        } else {
            rc = fn(&t, ud, err, errlen);
        }
        pos = end;
    }
    tokens_clear(&t);
    free(buf);
    return rc;
}

/* A model shell carrying only what tokenize() reads: v, and p's text
 * conventions, lower-casing and unk/eos tokens (their ids in v, -1 while
 * v lacks them). */
static void tok_model(nc_model *m, nc_vocab *v, const nc_train_params *p)
{
    memset(m, 0, sizeof *m);
    m->vocab = v;
    m->cfg.lowercase = p->lowercase;
    m->cfg.text = p->text;
    snprintf(m->cfg.unk_token, sizeof m->cfg.unk_token, "%s", p->unk_token);
    snprintf(m->cfg.eos_token, sizeof m->cfg.eos_token, "%s", p->eos_token);
    m->unk_id = vocab_lookup(v, p->unk_token, strlen(p->unk_token));
    m->eos_id = vocab_lookup(v, p->eos_token, strlen(p->eos_token));
}

typedef struct {
    nc_vocab *v;
    long *count;
    int cap;
} count_ctx;

static int count_tokens(const nc_tokens *t, void *ud, char *err, size_t errlen)
{
    count_ctx *c = ud;
    for (size_t i = 0; i < t->n; i++) {
        int id = vocab_add(c->v, t->words[i], strlen(t->words[i]));
        if (id < 0)
            return nc_error(err, errlen, NC_ENOMEM, "out of memory building the vocabulary");
        if (id >= c->cap) {
            int ncap = c->cap ? c->cap * 2 : 1024;
            long *nc = nc_realloc(c->count, (size_t)ncap * sizeof(long));
            if (!nc)
                return nc_error(err, errlen, NC_ENOMEM, "out of memory building the vocabulary");
            memset(nc + c->cap, 0, (size_t)(ncap - c->cap) * sizeof(long));
            c->count = nc, c->cap = ncap;
        }
        c->count[id]++;
    }
    return NC_OK;
}

/* Adds word with count 0 unless the corpus had it. */
static int count_absent(count_ctx *c, const char *word, char *err, size_t errlen)
{
    if (vocab_lookup(c->v, word, strlen(word)) >= 0)
        return NC_OK;
    char *w = (char *)word;
    int zero = 0;
    size_t off = 0;
    nc_tokens t = {.ids = &zero, .words = &w, .offsets = &off, .n = 1};
    int rc = count_tokens(&t, c, err, errlen);
    if (rc == NC_OK)
        c->count[vocab_lookup(c->v, word, strlen(word))] = 0;
    return rc;
}

static const long *sort_counts;
static int by_count_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (sort_counts[x] != sort_counts[y])
        return sort_counts[x] > sort_counts[y] ? -1 : 1;
    return x - y;
}

static int by_id(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

int train_build_vocab(const char *path, const nc_train_params *p, nc_vocab **out, char *err, size_t errlen)
{
    NC_ASSERT(p, "train_build_vocab: no p");
    const char *unk = p->unk_token, *eos = p->eos_token;
    const int vocab_max = p->vocab_max;
    *out = NULL;
    count_ctx c = {vocab_new(), NULL, 0};
    if (!c.v)
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    nc_model m;
    tok_model(&m, c.v, p);
    int rc = tokenize_file(path, &m, count_tokens, &c, err, errlen);
    /* unk must exist (it stands for every word outside the vocabulary), and
     * eos too, even in a corpus without newlines. */
    if (rc == NC_OK)
        rc = count_absent(&c, eos, err, errlen);
    if (rc == NC_OK)
        rc = count_absent(&c, unk, err, errlen);
    int n = vocab_size(c.v);
    if (rc == NC_OK && vocab_max > 0 && n > vocab_max) {
        if (vocab_max < 2) {
            rc = nc_error(err, errlen, NC_EINVAL, "vocabulary cap %d is too small (eos and unk)", vocab_max);
        } else {
            int *order = nc_malloc((size_t)n * sizeof(int));
            nc_vocab *nv = vocab_new();
            if (!order || !nv) {
                rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
            } else {
                int eos_id = vocab_lookup(c.v, eos, strlen(eos)), unk_id = vocab_lookup(c.v, unk, strlen(unk));
                /* eos and unk first (forced in), then by frequency. */
                c.count[eos_id] += (long)1 << 60;
                c.count[unk_id] += (long)1 << 60;
                for (int i = 0; i < n; i++)
                    order[i] = i;
                sort_counts = c.count;
                qsort(order, (size_t)n, sizeof(int), by_count_desc);
                /* Keep the survivors in order of first appearance. */
                qsort(order, (size_t)vocab_max, sizeof(int), by_id);
                for (int i = 0; i < vocab_max && rc == NC_OK; i++) {
                    const char *w = vocab_word(c.v, order[i]);
                    if (vocab_add(nv, w, strlen(w)) < 0)
                        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
                }
            }
            free(order);
            if (rc == NC_OK) {
                vocab_free(c.v);
                c.v = nv;
            } else {
                vocab_free(nv);
            }
        }
    }
    free(c.count);
    if (rc != NC_OK) {
        vocab_free(c.v);
        return rc;
    }
    *out = c.v;
    return NC_OK;
}

typedef struct {
    int *ids;
    size_t n, cap;
} ids_ctx;

static int collect_ids(const nc_tokens *t, void *ud, char *err, size_t errlen)
{
    ids_ctx *c = ud;
    if (c->n + t->n > c->cap) {
        size_t ncap = c->cap ? c->cap : 1 << 16;
        while (ncap < c->n + t->n)
            ncap *= 2;
        int *ni = nc_realloc(c->ids, ncap * sizeof(int));
        if (!ni)
            return nc_error(err, errlen, NC_ENOMEM, "out of memory reading the corpus");
        c->ids = ni, c->cap = ncap;
    }
    memcpy(c->ids + c->n, t->ids, t->n * sizeof(int));
    c->n += t->n;
    return NC_OK;
}

int train_read_corpus(const char *path, const nc_train_params *p, const nc_vocab *v, int **ids, size_t *n, char *err,
                      size_t errlen)
{
    *ids = NULL;
    *n = 0;
    nc_model m;
    tok_model(&m, (nc_vocab *)v, p);
    ids_ctx c = {0};
    int rc = tokenize_file(path, &m, collect_ids, &c, err, errlen);
    if (rc != NC_OK) {
        free(c.ids);
        return rc;
    }
    *ids = c.ids;
    *n = c.n;
    return NC_OK;
}

/* PyTorch's batchify: the stream is trimmed to a multiple of B and cut into
 * B contiguous streams; stored time-major (row t holds step t of every
 * stream) so that a segment's inputs and targets are contiguous slices. */
static int *batchify(const int *ids, size_t n, int B, size_t *rows)
{
    size_t nb = n / (size_t)B;
    *rows = nb;
    if (nb == 0)
        return NULL;
    int *d = nc_malloc(nb * (size_t)B * sizeof(int));
    if (!d)
        return NULL;
    for (int b = 0; b < B; b++)
        for (size_t t = 0; t < nb; t++)
            d[t * B + b] = ids[(size_t)b * nb + t];
    return d;
}

/* ---- trainer state ----------------------------------------------------- */

typedef struct {
    double epoch;                 /* fractional epochs done at this validation */
    int64_t step;
    double elapsed;
    double lr;
    double train_loss;
    double val_loss;
} curve_row;

typedef struct {
    nc_train_params p;
    nc_vocab *vocab;
    int unk_id, eos_id;
    int *train, *valid;           /* batchified, time-major */
    size_t train_rows, valid_rows;
    lstm_grad_net *net;
    lstm_grad_work *work, *ework;
    float *acc;                   /* Adagrad accumulators [net->n] (NULL for SGD) */
    nc_model *model;              /* save buffer (weights copied in) */
    /* Resumable state. */
    nc_rng rng;
    int32_t epoch;                /* 1-based */
    int64_t row;                  /* next segment starts at this row of train */
    int64_t step;
    double lr, best_val, elapsed;
    double epoch_loss;            /* sum of nll this epoch */
    int64_t epoch_tokens;
    curve_row *curve;
    uint32_t n_curve, cap_curve;
} trainer;

static void trainer_free(trainer *t)
{
    vocab_free(t->vocab);
    free(t->train);
    free(t->valid);
    lstm_grad_work_free(t->work);
    lstm_grad_work_free(t->ework);
    lstm_grad_net_free(t->net);
    nc_free(t->acc);
    model_free(t->model);
    free(t->curve);
}

static int mkdir_p(const char *dir, char *err, size_t errlen)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *s = tmp + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return nc_error(err, errlen, NC_EIO, "%s: cannot create directory: %s", tmp, strerror(errno));
        *s = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return nc_error(err, errlen, NC_EIO, "%s: cannot create directory: %s", tmp, strerror(errno));
    return NC_OK;
}

static void path_in(char *buf, size_t n, const char *dir, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

/* ---- checkpoint file ----------------------------------------------------
 * "NCTRAIN1", u32 version, then the fields in the order state_write puts
 * them, sealed by the u32 CRC-32 of everything before it (binio.h).
 * Fields are host-endian: the file resumes a run on the machine (and build)
 * that wrote it; it is not an interchange format (the model directory is). */

static int state_write(trainer *t, char *err, size_t errlen)
{
    char path[1100];
    path_in(path, sizeof path, t->p.out_dir, STATE_FILE);
    nc_atomicfile a;
    int rc = atomicfile_open(&a, path, err, errlen);
    if (rc != NC_OK)
        return rc;
    binio_writer bw, *w = &bw;
    binio_writer_file(w, a.f);
    uint32_t version = STATE_VERSION, psize = sizeof t->p;
    uint64_t n = t->net->n, sc = lstm_grad_work_state_floats(t->work);
    uint8_t has_acc = t->acc != NULL;
    binio_put(w, STATE_MAGIC, 8);
    binio_put(w, &version, sizeof version);
    binio_put(w, &psize, sizeof psize);
    binio_put(w, &t->p, sizeof t->p);
    binio_put(w, &n, sizeof n);
    binio_put(w, t->net->w, n * sizeof(float));
    binio_put(w, &has_acc, 1);
    if (has_acc)
        binio_put(w, t->acc, n * sizeof(float));
    binio_put(w, &t->rng, sizeof t->rng);
    binio_put(w, &t->epoch, sizeof t->epoch);
    binio_put(w, &t->row, sizeof t->row);
    binio_put(w, &t->step, sizeof t->step);
    binio_put(w, &t->lr, sizeof t->lr);
    binio_put(w, &t->best_val, sizeof t->best_val);
    binio_put(w, &t->elapsed, sizeof t->elapsed);
    binio_put(w, &t->epoch_loss, sizeof t->epoch_loss);
    binio_put(w, &t->epoch_tokens, sizeof t->epoch_tokens);
    binio_put(w, &sc, sizeof sc);
    binio_put(w, lstm_grad_work_state_h(t->work), sc * sizeof(float));
    binio_put(w, lstm_grad_work_state_c(t->work), sc * sizeof(float));
    binio_put(w, &t->n_curve, sizeof t->n_curve);
    binio_put(w, t->curve, t->n_curve * sizeof(curve_row));
    if (binio_seal(w) != NC_OK)
        rc = nc_error(err, errlen, NC_EIO, "%s: cannot write the training state: %s", path, strerror(errno));
    /* renamed into place and the directory synced: a crash leaves the
     * previous checkpoint or this one */
    return atomicfile_commit(&a, rc, err, errlen);
}

/* Reads and checks dir/train-state.bin; on success *buf holds the file and
 * r is positioned after the parameters (which are copied into p). */
static int state_open(const char *dir, unsigned char **buf, binio_reader *r, nc_train_params *p, char *err,
                      size_t errlen)
{
    char path[1100];
    path_in(path, sizeof path, dir, STATE_FILE);
    size_t len;
    int rc = read_file(path, (char **)buf, &len, err, errlen);
    if (rc != NC_OK)
        return rc;
    if (len < 8 + 8 + sizeof *p + 4 || memcmp(*buf, STATE_MAGIC, 8) != 0) {
        free(*buf);
        return nc_error(err, errlen, NC_EFORMAT, "%s: not a neurocache training state", path);
    }
    if (!binio_open(r, *buf, len, 8)) {
        free(*buf);
        return nc_error(err, errlen, NC_EFORMAT, "%s: checksum mismatch (corrupt or truncated)", path);
    }
    uint32_t version, psize;
    binio_get(r, &version, sizeof version);
    binio_get(r, &psize, sizeof psize);
    if (version != STATE_VERSION || psize != sizeof *p) {
        free(*buf);
        return nc_error(err, errlen, NC_EFORMAT,
                        "%s: training state version %u (parameter block %u bytes) was written by "
                        "another build (expected version %u, %zu bytes)", path, version, psize,
                        STATE_VERSION, sizeof *p);
    }
    binio_get(r, p, sizeof *p);
    return NC_OK;
}

int train_load_params(const char *dir, nc_train_params *p, char *err, size_t errlen)
{
    unsigned char *buf;
    binio_reader r;
    int rc = state_open(dir, &buf, &r, p, err, errlen);
    if (rc == NC_OK)
        free(buf);
    return rc;
}

int train_load_state_weights(const char *dir, float **w, size_t *n, char *err, size_t errlen)
{
    unsigned char *buf;
    binio_reader r;
    nc_train_params p;
    *w = NULL;
    int rc = state_open(dir, &buf, &r, &p, err, errlen);
    if (rc != NC_OK)
        return rc;
    uint64_t cnt;
    binio_get(&r, &cnt, sizeof cnt);
    if (r.bad || cnt > binio_left(&r) / sizeof(float)) {
        free(buf);
        return nc_error(err, errlen, NC_EFORMAT, "%s: truncated training state", dir);
    }
    *w = nc_malloc(cnt * sizeof(float) + 1);
    if (!*w) {
        free(buf);
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    }
    binio_get(&r, *w, cnt * sizeof(float));
    *n = cnt;
    free(buf);
    return NC_OK;
}

static int state_restore(trainer *t, char *err, size_t errlen)
{
    unsigned char *buf;
    binio_reader r;
    nc_train_params stored;
    int rc = state_open(t->p.out_dir, &buf, &r, &stored, err, errlen);
    if (rc != NC_OK)
        return rc;
    uint64_t n, sc;
    uint8_t has_acc;
    binio_get(&r, &n, sizeof n);
    if (n != t->net->n) {
        free(buf);
        return nc_error(err, errlen, NC_EFORMAT, "training state holds %llu parameters, the network %zu",
                        (unsigned long long)n, t->net->n);
    }
    binio_get(&r, t->net->w, n * sizeof(float));
    binio_get(&r, &has_acc, 1);
    if (has_acc != (t->acc != NULL)) {
        free(buf);
        return nc_error(err, errlen, NC_EFORMAT, "training state optimiser does not match");
    }
    if (has_acc)
        binio_get(&r, t->acc, n * sizeof(float));
    binio_get(&r, &t->rng, sizeof t->rng);
    binio_get(&r, &t->epoch, sizeof t->epoch);
    binio_get(&r, &t->row, sizeof t->row);
    binio_get(&r, &t->step, sizeof t->step);
    binio_get(&r, &t->lr, sizeof t->lr);
    binio_get(&r, &t->best_val, sizeof t->best_val);
    binio_get(&r, &t->elapsed, sizeof t->elapsed);
    binio_get(&r, &t->epoch_loss, sizeof t->epoch_loss);
    binio_get(&r, &t->epoch_tokens, sizeof t->epoch_tokens);
    binio_get(&r, &sc, sizeof sc);
    if (!r.bad && sc != lstm_grad_work_state_floats(t->work)) {
        free(buf);
        return nc_error(err, errlen, NC_EFORMAT, "training state: recurrent state size mismatch");
    }
    binio_get(&r, lstm_grad_work_state_h(t->work), sc * sizeof(float));
    binio_get(&r, lstm_grad_work_state_c(t->work), sc * sizeof(float));
    uint32_t nc = 0;
    binio_get(&r, &nc, sizeof nc);
    if (!r.bad && nc > 0) {
        if (nc > binio_left(&r) / sizeof(curve_row)) {
            r.bad = true;
        } else {
            t->curve = nc_malloc(nc * sizeof(curve_row));
            if (!t->curve) {
                free(buf);
                return nc_error(err, errlen, NC_ENOMEM, "out of memory");
            }
            t->cap_curve = t->n_curve = nc;
            binio_get(&r, t->curve, nc * sizeof(curve_row));
        }
    }
    bool bad = !binio_done(&r);
    free(buf);
    if (bad)
        return nc_error(err, errlen, NC_EFORMAT, "%s/%s: truncated or malformed training state",
                        t->p.out_dir, STATE_FILE);
    if (t->row < 0 || (size_t)t->row >= t->train_rows)
        return nc_error(err, errlen, NC_EFORMAT, "training state position %lld is outside the corpus "
                        "(%zu rows): was the training file changed?", (long long)t->row, t->train_rows);
    return NC_OK;
}

/* ---- curve ------------------------------------------------------------- */

static int curve_add(trainer *t, double val_loss, double train_loss, char *err, size_t errlen)
{
    if (t->n_curve == t->cap_curve) {
        uint32_t ncap = t->cap_curve ? t->cap_curve * 2 : 64;
        curve_row *nr = nc_realloc(t->curve, ncap * sizeof(curve_row));
        if (!nr)
            return nc_error(err, errlen, NC_ENOMEM, "out of memory");
        t->curve = nr, t->cap_curve = ncap;
    }
    double frac = t->row == 0 ? 1.0 : (double)t->row / (double)(t->train_rows - 1);
    t->curve[t->n_curve++] = (curve_row){t->epoch - 1 + frac, t->step, t->elapsed, t->lr, train_loss, val_loss};
    /* Rewritten whole (it is small) so it always matches the state. */
    char path[1100];
    path_in(path, sizeof path, t->p.out_dir, CURVE_FILE);
    nc_atomicfile a;
    int rc = atomicfile_open(&a, path, err, errlen);
    if (rc != NC_OK)
        return rc;
    FILE *f = a.f;
    fprintf(f, "epoch,step,elapsed_s,lr,train_loss,train_ppl,val_loss,val_ppl\n");
    for (uint32_t i = 0; i < t->n_curve; i++) {
        const curve_row *c = &t->curve[i];
        fprintf(f, "%.4f,%lld,%.1f,%.6g,%.5f,%.3f,%.5f,%.3f\n", c->epoch, (long long)c->step, c->elapsed,
                c->lr, c->train_loss, exp(c->train_loss), c->val_loss, exp(c->val_loss));
    }
    return atomicfile_commit(&a, NC_OK, err, errlen);
}

/* ---- loop -------------------------------------------------------------- */

/* Mean negative log-likelihood of the validation stream in eval mode (no
 * dropout), B = eval_batch_size streams, state carried across segments. */
static double validate(trainer *t)
{
    lstm_grad_work_reset_state(t->ework);
    double nll = 0;
    size_t count = 0;
    int B = t->p.eval_batch_size;
    for (size_t row = 0; row + 1 < t->valid_rows; row += (size_t)t->p.bptt) {
        int T = (int)(t->valid_rows - 1 - row < (size_t)t->p.bptt ? t->valid_rows - 1 - row : (size_t)t->p.bptt);
        nll += lstm_grad_segment(t->net, t->ework, t->valid + row * B, t->valid + (row + 1) * B, T, NULL);
        count += (size_t)T * B;
    }
    return count ? nll / (double)count : NAN;
}

static int save_best(trainer *t, char *err, size_t errlen)
{
    int rc = lstm_grad_to_model(t->net, t->model, err, errlen);
    if (rc == NC_OK)
        rc = model_save(t->model, t->p.out_dir, t->p.save_f16, err, errlen);
    return rc;
}

static int check_params(const nc_train_params *p, char *err, size_t errlen)
{
    if (!p->train_path[0] || !p->out_dir[0])
        return nc_error(err, errlen, NC_EINVAL, "a training file and an output directory are required");
    if (p->embedding_size < 1 || p->hidden_size < 1 || p->num_layers < 1 || p->num_layers > 8)
        return nc_error(err, errlen, NC_EINVAL, "bad model size (embedding %d, hidden %d, layers %d)",
                        p->embedding_size, p->hidden_size, p->num_layers);
    if (p->tie_weights && p->embedding_size != p->hidden_size)
        return nc_error(err, errlen, NC_EINVAL, "tied weights need --emsize == --nhid (%d != %d)",
                        p->embedding_size, p->hidden_size);
    if (p->bptt < 1 || p->batch_size < 1 || p->eval_batch_size < 1)
        return nc_error(err, errlen, NC_EINVAL, "bptt, batch and eval batch must be >= 1");
    if (p->optimizer != NC_OPT_SGD && p->optimizer != NC_OPT_ADAGRAD)
        return nc_error(err, errlen, NC_EINVAL, "unknown optimiser %d", p->optimizer);
    if (!(p->lr > 0) || !(p->lr_decay >= 1) || p->clip < 0 || p->init_range < 0)
        return nc_error(err, errlen, NC_EINVAL, "learning rate must be > 0, decay >= 1, clip and init range >= 0");
    const float d[3] = {p->dropout.emb, p->dropout.hid, p->dropout.out};
    for (int i = 0; i < 3; i++)
        if (!(d[i] >= 0 && d[i] < 1))
            return nc_error(err, errlen, NC_EINVAL, "dropout must be in [0, 1)");
    if (p->epochs < 0 || p->time_budget < 0 || (p->epochs == 0 && p->time_budget == 0))
        return nc_error(err, errlen, NC_EINVAL, "give a number of epochs or a time budget");
    return NC_OK;
}

/* What the loop carries between its phases besides the resumable state:
 * the caller's callback and result, the progress record, the clocks. */
typedef struct {
    nc_train_callback cb;
    void *ud;
    nc_train_result *res;
    nc_train_progress pr;
    char msg[2048];
    long spe;                     /* steps per epoch */
    double t_prev;                /* when elapsed was last charged */
    double last_ckpt;
    double rate_t0, rate_tok, rate, step_time;   /* tokens/s over a sliding window */
    double proc_train_time;       /* this process's time in training steps */
    int64_t proc_tokens;
} train_loop;

/* Charges the wall time since the last call to the run. Returns now. */
static double tick(trainer *t, train_loop *L)
{
    double tn = nc_now_s();
    t->elapsed += tn - L->t_prev;
    L->t_prev = tn;
    return tn;
}

static void progress_eta(const trainer *t, long spe, double step_time, nc_train_progress *pr)
{
    double eta = -1;
    if (step_time > 0 && t->p.epochs > 0) {
        long steps_done_epoch = (long)((t->row + t->p.bptt - 1) / t->p.bptt);
        long left = (long)(t->p.epochs - t->epoch) * spe + (spe - steps_done_epoch);
        eta = left * step_time;
    }
    if (t->p.time_budget > 0) {
        double b = t->p.time_budget - t->elapsed;
        b = b < 0 ? 0 : b;
        if (eta < 0 || b < eta)
            eta = b;
    }
    pr->eta = eta;
}

/* ---- set-up phases ------------------------------------------------------ */

/* Vocabulary: from the training file, or on resume from the run's own
 * vocab.run.txt (written at the start) so it cannot drift. */
static int setup_vocab(trainer *t, bool resume, char *err, size_t errlen)
{
    const nc_train_params *p = &t->p;
    char vpath[1100];
    path_in(vpath, sizeof vpath, p->out_dir, "vocab.run.txt");
    int rc;
    if (resume) {
        rc = vocab_load(vpath, &t->vocab, err, errlen);
    } else {
        rc = train_build_vocab(p->train_path, p, &t->vocab, err, errlen);
        if (rc == NC_OK)
            rc = vocab_save(t->vocab, vpath, err, errlen);
    }
    if (rc != NC_OK)
        return rc;
    t->unk_id = vocab_lookup(t->vocab, p->unk_token, strlen(p->unk_token));
    t->eos_id = vocab_lookup(t->vocab, p->eos_token, strlen(p->eos_token));
    if (t->unk_id < 0 || t->eos_id < 0)
        return nc_error(err, errlen, NC_EFORMAT, "%s lacks the unk or eos token", vpath);
    return NC_OK;
}

/* Reads the corpus at path and cuts it into B streams (batchify). */
static int load_streams(trainer *t, const char *path, int B, int **out, size_t *rows, char *err, size_t errlen)
{
    const nc_train_params *p = &t->p;
    int *ids = NULL;
    size_t n = 0;
    int rc = train_read_corpus(path, p, t->vocab, &ids, &n, err, errlen);
    if (rc == NC_OK) {
        *out = batchify(ids, n, B, rows);
        if (*rows < 2)
            rc = nc_error(err, errlen, NC_EINVAL, "%s: %zu tokens are too few for %d streams", path, n, B);
        else if (!*out)
            rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
    }
    free(ids);
    return rc;
}

/* The network, its work areas, the optimiser's accumulators and the model
 * the best weights are saved through. */
static int setup_network(trainer *t, char *err, size_t errlen)
{
    const nc_train_params *p = &t->p;
    int V = vocab_size(t->vocab);
    const lstm_grad_shape shape = {
        .V = V, .E = p->embedding_size, .H = p->hidden_size, .L = p->num_layers, .tied = p->tie_weights};
    int rc = lstm_grad_net_new(&shape, &t->net, err, errlen);
    if (rc == NC_OK)
        rc = lstm_grad_work_new(t->net, p->bptt, p->batch_size, &t->work, err, errlen);
    if (rc == NC_OK && t->valid)
        rc = lstm_grad_work_new(t->net, p->bptt, p->eval_batch_size, &t->ework, err, errlen);
    if (rc == NC_OK && p->optimizer == NC_OPT_ADAGRAD && !(t->acc = nc_calloc(t->net->n, sizeof(float))))
        rc = nc_error(err, errlen, NC_ENOMEM, "out of memory");
    if (rc != NC_OK)
        return rc;
    nc_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.model_type, sizeof cfg.model_type, "lstm");
    cfg.vocab_size = V;
    cfg.embedding_size = p->embedding_size;
    cfg.hidden_size = p->hidden_size;
    cfg.num_layers = p->num_layers;
    cfg.tie_weights = p->tie_weights;
    cfg.lowercase = p->lowercase;
    cfg.text = p->text;
    snprintf(cfg.unk_token, sizeof cfg.unk_token, "%s", p->unk_token);
    snprintf(cfg.eos_token, sizeof cfg.eos_token, "%s", p->eos_token);
    nc_vocab *vc = vocab_clone(t->vocab);
    if (!vc)
        return nc_error(err, errlen, NC_ENOMEM, "out of memory");
    return model_create(&cfg, vc, &t->model, err, errlen);
}

/* A new run: weights from the seed, the first epoch. */
static void start_fresh(trainer *t)
{
    const nc_train_params *p = &t->p;
    rng_seed(&t->rng, p->seed);
    lstm_grad_init_uniform(t->net, &t->rng, p->init_range, p->lstm_init_range);
    t->epoch = 1;
    t->row = 0;
    t->step = 0;
    t->lr = p->lr;
    t->best_val = INFINITY;
    t->elapsed = 0;
    lstm_grad_work_reset_state(t->work);
}

/* Says what is about to run (event START). Returns the callback's stop. */
static bool announce_start(trainer *t, bool resume, train_loop *L)
{
    const nc_train_params *p = &t->p;
    const int B = p->batch_size;
    nc_train_progress *pr = &L->pr;
    snprintf(L->msg, sizeof L->msg,
             "%s %s: vocabulary %d, %zu training tokens (%ld steps of %dx%d per epoch), %zu validation "
             "tokens, %zu parameters%s",
             resume ? "resuming" : "training", p->out_dir, vocab_size(t->vocab), t->train_rows * (size_t)B, L->spe,
             p->bptt, B, t->valid_rows * (size_t)p->eval_batch_size, model_num_params(t->model), resume ? "" : "");
    if (resume) {
        size_t l = strlen(L->msg);
        snprintf(L->msg + l, sizeof L->msg - l, " at epoch %d, step %lld, lr %.4g, %.0f s done", t->epoch,
                 (long long)t->step, t->lr, t->elapsed);
    }
    pr->epochs = p->epochs;
    pr->steps_per_epoch = L->spe;
    pr->best_val_ppl = exp(t->best_val);
    pr->event = NC_TRAIN_EV_START;
    pr->message = L->msg;
    pr->epoch = t->epoch;
    pr->step = t->step;
    pr->lr = t->lr;
    pr->elapsed = t->elapsed;
    pr->eta = -1;
    return L->cb && L->cb(pr, L->ud);
}

/* ---- loop phases --------------------------------------------------------- */

/* Reports a validation (event VALID) of loss vl after train loss tl.
 * Returns the callback's stop. */
static bool report_validation(trainer *t, train_loop *L, double vl, double tl)
{
    nc_train_progress *pr = &L->pr;
    L->res->last_val_ppl = exp(vl);
    pr->event = NC_TRAIN_EV_VALID;
    pr->val_loss = vl;
    pr->val_ppl = exp(vl);
    pr->best_val_ppl = exp(t->best_val);
    pr->train_loss = tl;
    pr->elapsed = t->elapsed;
    return L->cb && L->cb(pr, L->ud);
}

/* The epochs or the time budget ran out mid-epoch: validate what we have. */
static int validate_partial(trainer *t, train_loop *L, char *err, size_t errlen)
{
    double vl = validate(t);
    double tl = t->epoch_tokens ? t->epoch_loss / (double)t->epoch_tokens : NAN;
    tick(t, L);
    int rc = NC_OK;
    L->pr.improved = vl < t->best_val;
    if (L->pr.improved) {
        t->best_val = vl;
        rc = save_best(t, err, errlen);
    }
    if (rc == NC_OK)
        rc = curve_add(t, vl, tl, err, errlen);
    if (rc == NC_OK)
        report_validation(t, L, vl, tl);
    else
        L->res->last_val_ppl = exp(vl);
    return rc;
}

/* One segment of truncated BPTT (the last one of an epoch may be shorter,
 * as in PyTorch's get_batch): forward, backward, clipping, the optimiser
 * step. NC_ESTATE when the loss is no longer finite. */
static int train_segment(trainer *t, train_loop *L, char *err, size_t errlen)
{
    const nc_train_params *p = &t->p;
    const int B = p->batch_size;
    int T = (int)((size_t)t->row + (size_t)p->bptt < t->train_rows - 1 ? (size_t)p->bptt
                                                                        : t->train_rows - 1 - (size_t)t->row);
    double ts = nc_now_s();
    const int *x = t->train + (size_t)t->row * B, *y = x + B;
    const lstm_grad_pass pass = {.train = true, .drop = &p->dropout, .rng = &t->rng, .backward = true};
    double nll = lstm_grad_segment(t->net, t->work, x, y, T, &pass);
    optim_clip_grad_norm(t->net->g, t->net->n, p->clip);
    if (t->acc)
        optim_adagrad(t->net->w, t->acc, t->net->g, t->net->n, (float)t->lr, p->adagrad_eps);
    else
        optim_sgd(t->net->w, t->net->g, t->net->n, (float)t->lr);
    t->step++;
    t->row += T;
    t->epoch_loss += nll;
    t->epoch_tokens += (int64_t)T * B;
    double tn = tick(t, L);
    L->proc_train_time += tn - ts;
    L->proc_tokens += (int64_t)T * B;
    L->rate_tok += (double)T * B;
    if (tn - L->rate_t0 >= 2.0 || L->rate == 0) {
        L->rate = L->rate_tok / (tn - L->rate_t0);
        L->step_time = (double)p->bptt * B / L->rate;
        if (tn - L->rate_t0 >= 10.0)
            L->rate_t0 = tn, L->rate_tok = 0;
    }
    if (!isfinite(nll))
        return nc_error(err, errlen, NC_ESTATE, "training diverged at step %lld (loss %g): lower the "
                        "learning rate", (long long)t->step, nll);
    return NC_OK;
}

/* Reports the step just taken (event STEP). Returns true when the caller
 * or stop_at_step asks to stop. */
static bool report_step(trainer *t, train_loop *L)
{
    nc_train_progress *pr = &L->pr;
    pr->event = NC_TRAIN_EV_STEP;
    pr->epoch = t->epoch;
    pr->step = t->step;
    pr->epoch_frac = (double)t->row / (double)(t->train_rows - 1);
    pr->tokens_per_s = L->rate;
    pr->train_loss = t->epoch_loss / (double)t->epoch_tokens;
    pr->lr = t->lr;
    pr->elapsed = t->elapsed;
    progress_eta(t, L->spe, L->step_time, pr);
    pr->message = NULL;
    bool stop = L->cb && L->cb(pr, L->ud);
    return stop || (t->p.stop_at_step > 0 && t->step >= t->p.stop_at_step);
}

/* The end of an epoch: validation, saving the best model, the learning
 * rate schedule (PyTorch's example: divide when validation does not
 * improve), the curve, and the next epoch's start. Sets *stop when the
 * callback asks to. */
static int end_epoch(trainer *t, train_loop *L, bool *stop, char *err, size_t errlen)
{
    const nc_train_params *p = &t->p;
    nc_train_progress *pr = &L->pr;
    double tl = t->epoch_loss / (double)t->epoch_tokens, vl = NAN;
    int rc = NC_OK;
    if (t->valid) {
        vl = validate(t);
        pr->improved = vl < t->best_val;
        if (pr->improved) {
            t->best_val = vl;
            rc = save_best(t, err, errlen);
        } else if (p->optimizer == NC_OPT_SGD) {
            /* PyTorch's example: no improvement -> divide lr. */
            t->lr /= p->lr_decay;
        }
    } else {
        pr->improved = true;
        rc = save_best(t, err, errlen);
    }
    if (p->lr_decay_start > 0 && t->epoch >= p->lr_decay_start && pr->improved)
        t->lr /= p->lr_decay;
    if (p->min_lr > 0 && t->lr < p->min_lr)
        t->lr = p->min_lr;
    tick(t, L);
    if (rc == NC_OK)
        rc = curve_add(t, vl, tl, err, errlen);
    L->res->epochs_done = t->epoch;
    if (rc == NC_OK) {
        if (report_validation(t, L, vl, tl))
            *stop = true;
    } else {
        L->res->last_val_ppl = exp(vl);
    }
    t->epoch++;
    t->row = 0;
    t->epoch_loss = 0;
    t->epoch_tokens = 0;
    lstm_grad_work_reset_state(t->work);
    return rc;
}

/* Writes train-state.bin and says so (event CHECKPOINT). */
static int checkpoint(trainer *t, train_loop *L, char *err, size_t errlen)
{
    int rc = state_write(t, err, errlen);
    L->last_ckpt = nc_now_s();
    if (rc == NC_OK && L->cb) {
        snprintf(L->msg, sizeof L->msg, "checkpoint %s/%s (epoch %d, step %lld)", t->p.out_dir, STATE_FILE,
                 t->epoch, (long long)t->step);
        L->pr.event = NC_TRAIN_EV_CHECKPOINT;
        L->pr.message = L->msg;
        L->cb(&L->pr, L->ud);
    }
    return rc;
}

/* Steps until the epochs or the time budget run out (*finished), the
 * caller stops the run, or an error. */
static int train_loop_run(trainer *t, train_loop *L, bool stop, bool *finished, char *err, size_t errlen)
{
    const nc_train_params *p = &t->p;
    int rc = NC_OK;
    *finished = false;
    while (rc == NC_OK) {
        bool epochs_done = p->epochs > 0 && t->epoch > p->epochs;
        bool budget_done = p->time_budget > 0 && t->elapsed >= p->time_budget;
        if (epochs_done || budget_done) {
            if (t->row > 0 && t->valid && L->proc_tokens > 0)
                rc = validate_partial(t, L, err, errlen);
            *finished = true;
            break;
        }
        if ((rc = train_segment(t, L, err, errlen)) != NC_OK)
            break;
        bool epoch_end = (size_t)t->row >= t->train_rows - 1;
        if (report_step(t, L))
            stop = true;
        if (epoch_end && (rc = end_epoch(t, L, &stop, err, errlen)) != NC_OK)
            break;
        if (stop || epoch_end || L->t_prev - L->last_ckpt >= p->checkpoint_every)
            rc = checkpoint(t, L, err, errlen);
        if (stop)
            break;
    }
    return rc;
}

/* The result and the last event (DONE, or STOPPED: resumable). */
static void report_done(trainer *t, train_loop *L, bool finished)
{
    nc_train_result *res = L->res;
    res->steps = t->step;
    res->best_val_ppl = exp(t->best_val);
    res->elapsed = t->elapsed;
    res->tokens_per_s = L->proc_train_time > 0 ? L->proc_tokens / L->proc_train_time : 0;
    res->stopped = !finished;
    if (res->epochs_done == 0)
        res->epochs_done = t->epoch - 1;
    L->pr.event = finished ? NC_TRAIN_EV_DONE : NC_TRAIN_EV_STOPPED;
    L->pr.elapsed = t->elapsed;
    L->pr.best_val_ppl = res->best_val_ppl;
    L->pr.message = NULL;
    if (L->cb)
        L->cb(&L->pr, L->ud);
}

int train_run(const nc_train_params *params, bool resume, nc_train_callback cb, void *ud,
              nc_train_result *res, char *err, size_t errlen)
{
    trainer T0, *t = &T0;
    memset(t, 0, sizeof *t);
    t->p = *params;
    nc_train_result dummy;
    if (!res)
        res = &dummy;
    memset(res, 0, sizeof *res);
    res->best_val_ppl = res->last_val_ppl = INFINITY;
    const nc_train_params *p = &t->p;
    int rc = check_params(p, err, errlen);
    if (rc == NC_OK)
        rc = mkdir_p(p->out_dir, err, errlen);
    if (rc != NC_OK)
        return rc;
    if (p->threads > 0)
        openblas_set_num_threads(p->threads);
    rc = setup_vocab(t, resume, err, errlen);
    if (rc == NC_OK)
        rc = load_streams(t, p->train_path, p->batch_size, &t->train, &t->train_rows, err, errlen);
    if (rc == NC_OK && p->valid_path[0])
        rc = load_streams(t, p->valid_path, p->eval_batch_size, &t->valid, &t->valid_rows, err, errlen);
    if (rc == NC_OK)
        rc = setup_network(t, err, errlen);
    if (rc == NC_OK && resume)
        rc = state_restore(t, err, errlen);
    else if (rc == NC_OK)
        start_fresh(t);
    if (rc == NC_OK) {
        train_loop L = {.cb = cb, .ud = ud, .res = res,
                        .spe = (long)((t->train_rows - 2) / (size_t)p->bptt + 1)};
        bool stop = announce_start(t, resume, &L), finished;
        L.t_prev = L.last_ckpt = L.rate_t0 = nc_now_s();
        rc = train_loop_run(t, &L, stop, &finished, err, errlen);
        if (rc == NC_OK && finished)
            rc = state_write(t, err, errlen);
        if (rc == NC_OK)
            report_done(t, &L, finished);
    }
    trainer_free(t);
    return rc;
}
