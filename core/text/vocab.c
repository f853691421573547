/* vocab.c -- word table: dense ids, O(1) lookup by surface string (uthash). */
#include "vocab.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"

/* uthash allocates through the fault hook and reports a failed allocation
 * instead of exit()ing (its default): the caller answers NC_ENOMEM. */
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) nc_malloc(sz)
#define uthash_nonfatal_oom(e) (vocab_oom = 1)
static _Thread_local int vocab_oom;
#include <uthash.h>

typedef struct {
    char *word;                   /* NUL-terminated copy */
    size_t len;
    int id;
    UT_hash_handle hh;            /* keyed by word[0..len) */
} vocab_entry;

struct nc_vocab {
    vocab_entry *table;           /* uthash head */
    vocab_entry **by_id;          /* [n]; entries are individually allocated so
                                   * pointers stay valid when by_id grows */
    int n, cap;
};

nc_vocab *vocab_new(void)
{
    nc_vocab *v = nc_malloc(sizeof *v);
    if (v)
        memset(v, 0, sizeof *v);
    return v;
}

void vocab_free(nc_vocab *v)
{
    if (!v)
        return;
    HASH_CLEAR(hh, v->table);
    for (int i = 0; i < v->n; i++) {
        free(v->by_id[i]->word);
        free(v->by_id[i]);
    }
    free(v->by_id);
    free(v);
}

int vocab_add(nc_vocab *v, const char *word, size_t len)
{
    NC_ASSERT(v, "vocab_add: no v");
    int id = vocab_lookup(v, word, len);
    if (id >= 0)
        return id;
    if (v->n == v->cap) {
        int ncap = v->cap ? v->cap * 2 : 64;
        vocab_entry **nb = nc_realloc(v->by_id, (size_t)ncap * sizeof *nb);
        if (!nb)
            return NC_ENOMEM;
        v->by_id = nb;
        v->cap = ncap;
    }
    vocab_entry *e = nc_malloc(sizeof *e);
    char *w = nc_malloc(len + 1);
    if (!e || !w) {
        free(e);
        free(w);
        return NC_ENOMEM;
    }
    memcpy(w, word, len);
    w[len] = '\0';
    e->word = w;
    e->len = len;
    e->id = v->n;
    v->by_id[v->n++] = e;
    vocab_oom = 0;
    HASH_ADD_KEYPTR(hh, v->table, e->word, e->len, e);
    if (vocab_oom) {              /* not in the table: undo */
        v->n--;
        free(w);
        free(e);
        return NC_ENOMEM;
    }
    return e->id;
}

int vocab_lookup(const nc_vocab *v, const char *word, size_t len)
{
    NC_ASSERT(v, "vocab_lookup: no v");
    vocab_entry *e = NULL;
    HASH_FIND(hh, v->table, word, len, e);
    return e ? e->id : -1;
}

const char *vocab_word(const nc_vocab *v, int id)
{
    if (!v || id < 0 || id >= v->n)
        return NULL;
    return v->by_id[id]->word;
}

int vocab_size(const nc_vocab *v)
{
    return v ? v->n : 0;
}

nc_vocab *vocab_clone(const nc_vocab *v)
{
    NC_ASSERT(v, "vocab_clone: no v");
    nc_vocab *c = vocab_new();
    if (!c)
        return NULL;
    for (int i = 0; i < v->n; i++) {
        if (vocab_add(c, v->by_id[i]->word, v->by_id[i]->len) < 0) {
            vocab_free(c);
            return NULL;
        }
    }
    return c;
}

int vocab_load(const char *path, nc_vocab **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = nc_fopen(path, "rb");
    if (!f)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO,
                        "%s: cannot open: %s", path, strerror(errno));
    nc_vocab *v = vocab_new();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = v ? NC_OK : nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
    long lineno = 0;
    /* getline returns -1 at end of file and on errors alike: errno (and
     * ferror) tell them apart. */
    errno = 0;
    while (rc == NC_OK && (n = nc_getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)n;
        if (len > 0 && line[len - 1] == '\n')
            len--;
        if (len > 0 && line[len - 1] == '\r')
            len--;
        if (len == 0) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: line %ld is empty", path, lineno);
        } else if (memchr(line, '\0', len)) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: line %ld contains a NUL byte", path, lineno);
        } else if (vocab_lookup(v, line, len) >= 0) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: line %ld: duplicate word '%.*s' (first at line %d)",
                          path, lineno, (int)len, line, vocab_lookup(v, line, len) + 1);
        } else if (vocab_add(v, line, len) < 0) {
            rc = nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
        }
        errno = 0;
    }
    if (rc == NC_OK && (ferror(f) || errno != 0))
        rc = nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(errno));
    free(line);
    fclose(f);
    if (rc != NC_OK) {
        vocab_free(v);
        return rc;
    }
    *out = v;
    return NC_OK;
}

int vocab_save(const nc_vocab *v, const char *path, char *err, size_t errlen)
{
    NC_ASSERT(v, "vocab_save: no v");
    FILE *f = nc_fopen(path, "wb");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: cannot create: %s", path, strerror(errno));
    int ok = 1;
    for (int i = 0; i < v->n && ok; i++) {
        ok = nc_fwrite(v->by_id[i]->word, 1, v->by_id[i]->len, f) == v->by_id[i]->len &&
             fputc('\n', f) != EOF;
    }
    if (fflush(f) != 0)
        ok = 0;
    if (ok && nc_fsync(fileno(f)) != 0)
        ok = 0;
    int saved = errno;
    if (fclose(f) != 0)
        ok = 0;
    if (!ok)
        return nc_error(err, errlen, NC_EIO, "%s: write failed: %s", path, strerror(saved ? saved : errno));
    return NC_OK;
}
