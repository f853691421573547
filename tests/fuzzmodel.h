/* fuzzmodel.h -- test helper: the small model the text fuzzers
 * (fuzz_tokenizer, fuzz_normalize) tokenise with. */
#ifndef NC_TEST_FUZZMODEL_H
#define NC_TEST_FUZZMODEL_H

#include <stddef.h>

#include "model.h"

/* A 1-layer LSTM of 4 units whose vocabulary is words[0..n) (words[0] the
 * unk token "<unk>", words[1] the eos token "<eos>"); aborts if it cannot
 * be made (a fuzzer has no other way to say so). */
nc_model *fuzz_model_of(const char *const *words, size_t n);

#endif
