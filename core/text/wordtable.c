/* wordtable.c -- open-vocabulary word table: nc_vocab behind a rwlock. */
#include "wordtable.h"
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nc_wordtable {
    pthread_rwlock_t lock;
    nc_vocab *v;
    int model_size;
};

int wordtable_new(const nc_vocab *model_vocab, nc_wordtable **out, char *err, size_t errlen)
{
    *out = NULL;
    nc_wordtable *t = nc_zalloc(1, sizeof *t);
    if (!t)
        return nc_error(err, errlen, NC_ENOMEM, "word table");
    t->v = model_vocab ? vocab_clone(model_vocab) : vocab_new();
    if (!t->v) {
        free(t);
        return nc_error(err, errlen, NC_ENOMEM, "word table");
    }
    t->model_size = vocab_size(t->v);
    pthread_rwlock_init(&t->lock, NULL);
    *out = t;
    return NC_OK;
}

void wordtable_free(nc_wordtable *t)
{
    if (!t)
        return;
    pthread_rwlock_destroy(&t->lock);
    vocab_free(t->v);
    free(t);
}

int wordtable_id(nc_wordtable *t, const char *word, size_t len, bool add)
{
    NC_ASSERT(t, "wordtable_id: no t");
    pthread_rwlock_rdlock(&t->lock);
    int id = vocab_lookup(t->v, word, len);
    pthread_rwlock_unlock(&t->lock);
    if (id >= 0 || !add)
        return id;
    pthread_rwlock_wrlock(&t->lock);
    id = vocab_add(t->v, word, len);   /* re-checks: another writer may have added it */
    pthread_rwlock_unlock(&t->lock);
    return id;
}

const char *wordtable_word(nc_wordtable *t, int id)
{
    NC_ASSERT(t, "wordtable_word: no t");
    pthread_rwlock_rdlock(&t->lock);
    const char *w = vocab_word(t->v, id);
    pthread_rwlock_unlock(&t->lock);
    return w;
}

int wordtable_size(nc_wordtable *t)
{
    NC_ASSERT(t, "wordtable_size: no t");
    pthread_rwlock_rdlock(&t->lock);
    int n = vocab_size(t->v);
    pthread_rwlock_unlock(&t->lock);
    return n;
}

int wordtable_model_size(const nc_wordtable *t)
{
    NC_ASSERT(t, "wordtable_model_size: no t");
    return t->model_size;
}

int wordtable_save(nc_wordtable *t, const char *path, char *err, size_t errlen)
{
    NC_ASSERT(t, "wordtable_save: no t");
    FILE *f = nc_fopen(path, "w");
    if (!f)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    pthread_rwlock_rdlock(&t->lock);
    int n = vocab_size(t->v);
    for (int i = t->model_size; i < n; i++)
        fprintf(f, "%s\n", vocab_word(t->v, i));
    pthread_rwlock_unlock(&t->lock);
    if (fflush(f) != 0 || ferror(f)) {
        int e = errno;
        fclose(f);
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(e));
    }
    if (fclose(f) != 0)
        return nc_error(err, errlen, NC_EIO, "%s: %s", path, strerror(errno));
    return NC_OK;
}

int wordtable_load(nc_wordtable *t, const char *path, char *err, size_t errlen)
{
    NC_ASSERT(t, "wordtable_load: no t");
    FILE *f = nc_fopen(path, "r");
    if (!f)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: %s", path,
                        strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = NC_OK, expect = t->model_size;
    pthread_rwlock_wrlock(&t->lock);
    /* -1 is the end of the file or an error: errno tells them apart */
    errno = 0;
    while ((len = nc_getline(&line, &cap, f)) >= 0) {
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        if (len == 0) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: empty word at id %d", path, expect);
            break;
        }
        int id = vocab_add(t->v, line, (size_t)len);
        if (id < 0) {
            rc = nc_error(err, errlen, NC_ENOMEM, "%s: word table", path);
            break;
        }
        if (id != expect) {
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: word '%s' has id %d in the table, %d in the file",
                          path, line, id, expect);
            break;
        }
        expect++;
        errno = 0;
    }
    if (rc == NC_OK && (ferror(f) || errno != 0))
        rc = nc_error(err, errlen, NC_EIO, "%s: read error: %s", path, strerror(errno ? errno : EIO));
    pthread_rwlock_unlock(&t->lock);
    free(line);
    fclose(f);
    return rc;
}

size_t wordtable_memory(nc_wordtable *t)
{
    /* approximate: entry + hash handle + average word */
    return sizeof *t + (size_t)wordtable_size(t) * 96;
}
