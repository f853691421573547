/* vocab.h -- word table: id <-> surface string, growable for open vocabulary. */
#ifndef NC_VOCAB_H
#define NC_VOCAB_H

#include "nc_common.h"

/* A word table. Ids are dense from 0. The model vocabulary occupies ids
 * [0, V); open-vocabulary tables (per namespace / session) grow past V with
 * vocab_add. Lookups are O(1) (uthash). Not thread-safe for concurrent
 * add + lookup: callers serialise writers. */
typedef struct nc_vocab nc_vocab;

nc_vocab *vocab_new(void);
void vocab_free(nc_vocab *v);                     /* NULL allowed */
/* Deep copy (for forking a namespace table from the model's). */
nc_vocab *vocab_clone(const nc_vocab *v);

/* Adds word (copied) if absent; returns its id (>= 0) or NC_ENOMEM. */
int vocab_add(nc_vocab *v, const char *word, size_t len);
/* Id of word, or -1 when absent. */
int vocab_lookup(const nc_vocab *v, const char *word, size_t len);
/* Surface string of id (borrowed, valid while v lives), NULL if out of range. */
const char *vocab_word(const nc_vocab *v, int id);
int vocab_size(const nc_vocab *v);

/* Reads a vocab.txt: one word per line, line i = id i. Duplicate or empty
 * lines are format errors (they would make ids ambiguous). */
int vocab_load(const char *path, nc_vocab **out, char *err, size_t errlen);
int vocab_save(const nc_vocab *v, const char *path, char *err, size_t errlen);

#endif
