/* components.h -- the rows of component_table.h gathered (components.c):
 * what the mixture, the gate, the validation, the export blob and
 * /v1/model loop over instead of naming components. */
#ifndef NC_COMPONENTS_H
#define NC_COMPONENTS_H

#include "component.h"

/* The rows, in the table's order, and their feature counts. */
extern const nc_component *const nc_component_rows[NC_NCOMP];
extern const int nc_component_npre[NC_NCOMP], nc_component_npost[NC_NCOMP];

/* The searched rows (component.h's searched), as bits (bit c: row c). */
unsigned components_searched(void);
/* Whether the gate's full net weighs this position: every searched row on
 * under p is available in avail (their post-search features exist); at
 * least one is on. Else the pre-search net does (design §4, "Several
 * searched rows"). */
bool components_post(const struct nc_cache_params_s *p, unsigned avail);
/* The gate's feature i, 0 <= i < NC_GATE_NFEAT: the rows' pre features in
 * table order, then their post features. */
const char *components_feature_name(int i);
/* The row whose terms join the first row's softmax here (component.h
 * joint), or NULL. */
const nc_component *components_joint(const struct nc_cache_params_s *p, const nc_mix_input *in);
/* The components p switches on, as bits (bit c: row c's on). */
unsigned components_on(const struct nc_cache_params_s *p);
/* Bit c set: row c is available at this position. */
unsigned components_available(const struct nc_cache_params_s *p, const nc_mix_input *in);
/* The rows' validate in order: the first error. */
/* The rows' session states at full size under p for a model of hidden
 * size H (component.h state_bytes): a session's budget before it exists. */
size_t components_state_bytes(const struct nc_cache_params_s *p, int H);
int components_validate(const struct nc_cache_params_s *p, char *err, size_t errlen);
/* Moves the heaviest of the n candidates cand[] (weight w[i] > 0; ties: the
 * larger key[i] when key is non-NULL, then the earlier candidate) to the
 * front, at most max of them, in that order; returns how many (the rows'
 * explain). */
int components_heaviest(int *cand, int n, const double *w, const float *key, int max);
/* Export: the ref of word id in the blob (component.h nc_blob_words),
 * listing it when it is new; -1 on a failed allocation. */
int blob_word_ref(nc_blob_words *x, int id);
/* Import: the stream's id of a ref, -1 if it names nothing. */
int blob_word_id(const nc_blob_words *x, int32_t ref);

#endif
