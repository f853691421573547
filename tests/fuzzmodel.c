/* fuzzmodel.c -- the text fuzzers' small model (fuzzmodel.h). */
#include "fuzzmodel.h"

#include <stdlib.h>
#include <string.h>

#include "vocab.h"

nc_model *fuzz_model_of(const char *const *words, size_t n)
{
    nc_vocab *v = vocab_new();
    for (size_t i = 0; i < n; i++)
        vocab_add(v, words[i], strlen(words[i]));
    nc_model_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.model_type, "lstm");
    c.vocab_size = vocab_size(v);
    c.embedding_size = c.hidden_size = 4;
    c.num_layers = 1;
    strcpy(c.unk_token, "<unk>");
    strcpy(c.eos_token, "<eos>");
    char err[NC_ERRLEN];
    nc_model *m = NULL;
    if (model_create(&c, v, &m, err, sizeof err) != NC_OK)
        abort();
    return m;
}
