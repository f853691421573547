/* tokenizer.h -- whitespace tokenisation with eos at line ends. */
#ifndef NC_TOKENIZER_H
#define NC_TOKENIZER_H

#include "nc_common.h"
#include "model.h"

/* A token sequence. ids[i] is the model id (unk_id for words outside the model
 * vocabulary); words[i] is the surface string (lower-cased when the model's
 * config says so), kept so that open-vocabulary caches can remember OOV words
 * under their own name. offsets[i] is the byte offset of the token in the
 * input text (for eos: the offset of the newline). */
typedef struct {
    int *ids;
    char **words;
    size_t *offsets;
    size_t n, cap;
} nc_tokens;

void tokens_init(nc_tokens *t);
void tokens_clear(nc_tokens *t);   /* frees contents, keeps t usable */
int tokens_push(nc_tokens *t, int id, const char *word, size_t len, size_t offset);

/* Tokenises text[0..len): whitespace-separated words; each '\n' ends a line
 * and appends eos_token. If final_eos, a last line without a trailing newline
 * also gets eos (file semantics, as PyTorch's word_language_model reads
 * files); otherwise it does not (a partial text being fed). Invalid UTF-8 or
 * NUL bytes are NC_EFORMAT with the byte offset in the message. Appends to
 * out. On error nothing is appended.
 * Words are split on Unicode White_Space (as Python's str.split()); only
 * '\n' ends a line ('\r' is white space, so CRLF files work). With
 * cfg.lowercase each word is lower-cased (u8_tolower) before lookup and the
 * lower-cased form is the surface string. */
int tokenize(const nc_model *m, const char *text, size_t len, bool final_eos,
             nc_tokens *out, char *err, size_t errlen);

#endif
