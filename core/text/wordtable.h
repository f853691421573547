/* wordtable.h -- the open-vocabulary word table: model words [0, V) then
 * words met while streaming (ids >= V), safe for concurrent use (rwlock).
 * Design §4 "open vocabulary": one table per namespace (shared by its
 * unbounded cache and sessions) or per stream. */
#ifndef NC_WORDTABLE_H
#define NC_WORDTABLE_H

#include "nc_common.h"
#include "vocab.h"

typedef struct nc_wordtable nc_wordtable;

/* Starts as a copy of the model vocabulary (model_vocab not retained). */
int wordtable_new(const nc_vocab *model_vocab, nc_wordtable **out, char *err, size_t errlen);
void wordtable_free(nc_wordtable *t);       /* NULL allowed */
/* Id of word[0..len); when absent and add, appends it (new id >= V), else -1.
 * Negative rc (NC_ENOMEM) on allocation failure. */
int wordtable_id(nc_wordtable *t, const char *word, size_t len, bool add);
/* Surface string of id, borrowed: valid while the table lives (entries are
 * never removed or moved). NULL if id is out of range. */
const char *wordtable_word(nc_wordtable *t, int id);
int wordtable_size(nc_wordtable *t);        /* V + dynamic words */
int wordtable_model_size(const nc_wordtable *t);  /* V */
/* Words [V, size) one per line, written to / appended from a file (the
 * dynamic part of a namespace snapshot). load expects the table to hold
 * exactly the model vocabulary plus a prefix of the file's words. */
int wordtable_save(nc_wordtable *t, const char *path, char *err, size_t errlen);
int wordtable_load(nc_wordtable *t, const char *path, char *err, size_t errlen);
size_t wordtable_memory(nc_wordtable *t);

#endif
