/* tokenizer.h -- text to token ids: the model's text conventions (normalize.h) or whitespace with eos at line ends. */
#ifndef NC_TOKENIZER_H
#define NC_TOKENIZER_H

#include "nc_common.h"
#include "model.h"

/* A token sequence. ids[i] is the model id (unk_id for words outside the model
 * vocabulary); words[i] is the surface string (lower-cased when the model's
 * config says so), kept so that open-vocabulary caches can remember OOV words
 * under their own name. offsets[i] is the byte offset of the token in the
 * input text (for eos: the offset of the newline or of the sentence end);
 * lens[i] the number of bytes of the input it came from (a normalised word's
 * original spelling: "Company's" gives "company" 0..7 and "'s" 7..9). */
typedef struct {
    int *ids;
    char **words;
    size_t *offsets;
    size_t n, cap;
    size_t *lens;                 /* may be NULL in a view over another sequence */
} nc_tokens;

void tokens_init(nc_tokens *t);
void tokens_clear(nc_tokens *t);   /* frees contents, keeps t usable */
int tokens_push(nc_tokens *t, int id, const char *word, size_t len, size_t offset);
/* tokens_push of a word that came from src_len bytes of the input (lens[]);
 * tokens_push records len. */
int tokens_push_src(nc_tokens *t, int id, const char *word, size_t len, size_t offset, size_t src_len);

/* Tokens among t[from..n) that are the model's unk (unknown words). */
size_t tokens_count_unk(const nc_model *m, const nc_tokens *t, size_t from);

/* Tokenises text[0..len): whitespace-separated words; each '\n' ends a line
 * and appends eos_token. If final_eos, a last line without a trailing newline
 * also gets eos (file semantics, as PyTorch's word_language_model reads
 * files); otherwise it does not (a partial text being fed). Invalid UTF-8 or
 * NUL bytes are NC_EFORMAT with the byte offset in the message. Appends to
 * out. On error nothing is appended.
 * Words are split on Unicode White_Space (as Python's str.split()); only
 * '\n' ends a line ('\r' is white space, so CRLF files work). With
 * cfg.lowercase each word is lower-cased (u8_tolower) before lookup and the
 * lower-cased form is the surface string.
 * When the model declares text conventions (cfg.text.declared), the text is
 * normalised to them first (normalize.h): words[i] is the normalised word,
 * offsets[i]/lens[i] the original characters it came from. */
int tokenize(const nc_model *m, const char *text, size_t len, bool final_eos,
             nc_tokens *out, char *err, size_t errlen);

/* tokenize, with normalize = false splitting on white space only, for text
 * already written in the model's conventions (the request field
 * "normalize": false, the CLI's --no-normalize). */
int tokenize_ex(const nc_model *m, const char *text, size_t len, bool final_eos, bool normalize,
                nc_tokens *out, char *err, size_t errlen);

#endif
