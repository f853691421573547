/* cache_knobs.h -- the one table of the mixture's knobs (design §4-§5).
 *
 * Every knob of nc_cache_params is one row here: its name (the JSON field of
 * a request's "cache" object, the [cache] key of the daemon's config file and
 * the field of nc_cache_params; its command-line option is the same name
 * with '-' for '_': --neural-theta), the option's older alias if it had
 * one, its type, its bounds, its default and its documentation. The CLI,
 * the JSON decoder, the config file, /v1/model and the validation all read
 * this table, so a name and a bound are written once; tests/test_knobs.c
 * checks proto/openapi.yaml against it.
 *
 * X(name, alias, type, min, max, def, needs, doc)
 *   alias the command-line option this knob had before it took its name
 *         (--theta for --neural-theta), still accepted; NULL if none
 *   type  INT, FLOAT, FLOAT_BELOW_MAX (max itself excluded: uniform_mu = 1
 *         would leave the uniform distribution alone), BOOL or KERNEL (a
 *         name: gaussian | epanechnikov)
 *   min, max  bounds of INT and FLOAT knobs
 *   def   the default, as text (parsed by the same code as user input)
 *   needs the knob that must be on for this one to mean anything (its
 *         cache's size or switch: neural_theta needs neural_size), as a
 *         name; NULL for a knob that needs none -- a component's switch,
 *         or one read without a switch (dyn_decay, dyn_segment, dyn_params
 *         serve tune's --dyn without --dyn-lr). The CLI refuses a knob
 *         given without what it needs, and eval's sweep switches it on.
 *
 * Which component owns a knob is its row's `knobs` list (component.h),
 * read once into nc_cache_knob.owner: the table says what a knob is, the
 * row what it belongs to, and neither is written twice. */
#ifndef NC_CACHE_KNOBS_H
#define NC_CACHE_KNOBS_H

#include <stdbool.h>
#include <stddef.h>

#include "component_table.h"

/* Hard limits, so a request cannot ask for absurd memory. */
#define NC_CACHE_MAX_WINDOW 1000000
#define NC_CACHE_MAX_KNN 16384
#define NC_CACHE_MAX_NPROBE 65536

#define NC_CACHE_KNOBS(X)                                                                              \
    NC_TEST_KNOBS(X)   /* the test build's component's (component_table.h) */                             \
    X(unigram_size, "unigram-cache", INT, 0, NC_CACHE_MAX_WINDOW, "0", NULL,                                 \
      "unigram cache window (tokens), 0 = off")                                                        \
    X(unigram_lambda, NULL, FLOAT, 0, 1, "0.1", "unigram_size", "unigram cache interpolation weight")     \
    X(neural_size, "neural-cache", INT, 0, NC_CACHE_MAX_WINDOW, "0", NULL,                                  \
      "neural cache window ((h, word) pairs), 0 = off")                                                \
    X(neural_theta, "theta", FLOAT, 0, 1e4, "0.3", "neural_size", "neural cache flatness theta: softmax_i(theta h_t.h_i)") \
    X(neural_lambda, "lambda", FLOAT, 0, 1, "0.1", "neural_size", "neural cache interpolation weight (linear mode)") \
    X(global_norm, NULL, BOOL, 0, 1, "false", "neural_size",                                               \
      "neural cache with global normalisation instead of linear interpolation")                       \
    X(neural_alpha, "alpha", FLOAT, -100, 100, "0", "global_norm", "global normalisation bias alpha")               \
    X(neural_f16, "f16-keys", BOOL, 0, 1, "false", "neural_size", "store the neural cache's keys as float16")       \
    X(unbounded, NULL, BOOL, 0, 1, "false", NULL, "read the namespace's unbounded cache")           \
    X(knn, NULL, INT, 1, NC_CACHE_MAX_KNN, "1024", "unbounded", "unbounded cache: neighbours searched")           \
    X(nprobe, NULL, INT, 0, NC_CACHE_MAX_NPROBE, "0", "unbounded",                                          \
      "unbounded cache: IVF lists probed; 0 = the namespace's own, chosen at its index's training")  \
    X(unbounded_lambda, NULL, FLOAT, 0, 1, "0.3", "unbounded", "unbounded cache interpolation weight") \
    X(kernel, NULL, KERNEL, 0, 1, "gaussian", "unbounded", "unbounded cache kernel: gaussian | epanechnikov") \
    X(exact, NULL, BOOL, 0, 1, "false", "unbounded", "unbounded cache: exact (flat) search instead of IVFPQ")  \
    X(open_vocab, NULL, BOOL, 0, 1, "false", NULL,                                                 \
      "remember out-of-vocabulary words under their own name")                                        \
    X(uniform_mu, NULL, FLOAT_BELOW_MAX, 0, 1, "0", "open_vocab",                                                    \
      "open vocabulary: weight mu of the uniform distribution, in [0, 1)")                            \
    X(vocab_size_full, NULL, INT, 0, 2000000000, "0", "open_vocab",                                   \
      "open vocabulary: |V_full| of the uniform term, 0 = V + words seen")                            \
    X(gate, NULL, BOOL, 0, 1, "false", NULL,                                                               \
      "weigh the components per token with the model's gate (gate.safetensors, neurocache fit-gate)") \
    X(gate_skip, NULL, FLOAT, -1, 1, "-1", "gate",                                                      \
      "with the gate: skip the unbounded search when the gate's pre-search unbounded weight is below " \
      "this; -1 = the gate's own threshold (picked on validation), 0 = always search")              \
    X(dyn_lr, NULL, FLOAT, 0, 1000, "0", NULL,                                                           \
      "dynamic evaluation: learning rate eta of the RMS-normalised step on each segment's loss "       \
      "(Krause et al. 2018; needs the model's dyneval statistics), 0 = off")                           \
    X(dyn_decay, NULL, FLOAT, 0, 1, "0.02", NULL,                                                     \
      "dynamic evaluation: decay lambda of the adapted weights towards the trained ones, per segment") \
    X(dyn_segment, NULL, INT, 1, 10000, "20", NULL, "dynamic evaluation: tokens per gradient step")  \
    X(dyn_params, NULL, INT, 0, 3, "1", NULL,                                                        \
      "dynamic evaluation: weights adapted, each with the decoder bias: 0 = the LSTM biases (sparse), " \
      "1 = the last LSTM layer, 2 = every LSTM layer, 3 = all weights")

/* The unbounded cache's kernel K of eq. 5 (unbounded_cache.h), a knob's type. */
typedef enum { NC_KERNEL_GAUSSIAN = 0, NC_KERNEL_EPANECHNIKOV = 1 } nc_kernel;

/* Every knob of the mixture: one field per row of NC_CACHE_KNOBS
 * (cache_knobs.h), where its type, bounds, default and meaning are defined. */
#define NC_KNOB_CTYPE_INT int
#define NC_KNOB_CTYPE_FLOAT float
#define NC_KNOB_CTYPE_FLOAT_BELOW_MAX float
#define NC_KNOB_CTYPE_BOOL bool
#define NC_KNOB_CTYPE_KERNEL nc_kernel
#define NC_KNOB_FIELD(name, flag, type, min, max, def, needs, doc) NC_KNOB_CTYPE_##type name;
typedef struct nc_cache_params_s {
    NC_CACHE_KNOBS(NC_KNOB_FIELD)
} nc_cache_params;
#undef NC_KNOB_FIELD

typedef enum { NC_KNOB_INT, NC_KNOB_FLOAT, NC_KNOB_FLOAT_BELOW_MAX, NC_KNOB_BOOL, NC_KNOB_KERNEL } nc_knob_type;

typedef struct nc_cache_knob_s {
    const char *name;      /* JSON field, config key, nc_cache_params field */
    const char *flag;      /* command-line option, without "--": name with '-' for '_' */
    const char *alias;     /* older command-line option still accepted, or NULL */
    nc_knob_type type;
    size_t offset;         /* of the field in nc_cache_params */
    double min, max;       /* bounds (INT, FLOAT) */
    const char *def;       /* default, as text */
    const char *doc;
    /* the row of the knob it needs (cache_knobs.h "needs"), or NULL */
    const struct nc_cache_knob_s *needs;
    /* the component row whose `knobs` list it (NC_COMP_<ID>), or -1: a
     * knob of the mixture as a whole (gate, dynamic evaluation) */
    int owner;
} nc_cache_knob;

struct nc_cache_params_s;

/* The table, in the order above; n gets its length. */
const nc_cache_knob *cache_knobs(size_t *n);
/* The row named name (JSON/config name) or with that flag (or alias);
 * NULL if none. */
const nc_cache_knob *cache_knob_find(const char *name);
const nc_cache_knob *cache_knob_by_flag(const char *flag);
/* The knob name nearest to a misspelt one (neural_sise -> "neural_size"),
 * NULL if none is near (suggest.h). flags: compare with the command-line
 * options instead (neural-size, and the older aliases) and answer with the
 * knob's option (thetaa -> "neural-theta", never the alias). */
const char *cache_knob_suggest(const char *word, bool flags);

/* Sets k in p from a number (INT: must be whole; BOOL: 0 or 1), checking
 * its bounds. NC_EINVAL with the one message every front end shows:
 * "neural_theta = 2e+06 is out of range [0, 10000]". */
int cache_knob_set_number(struct nc_cache_params_s *p, const nc_cache_knob *k, double v, char *err,
                          size_t errlen);
/* The same from text (command line, config file): a number, true|false
 * (also yes/no/on/off/1/0) or a kernel name. */
int cache_knob_set_text(struct nc_cache_params_s *p, const nc_cache_knob *k, const char *text, char *err,
                        size_t errlen);
/* The value of k in p as a number (BOOL 0/1, KERNEL its index). */
double cache_knob_get(const struct nc_cache_params_s *p, const nc_cache_knob *k);
/* The kernel's name ("gaussian", "epanechnikov"), or NULL for another value;
 * and the kernel of a name, -1 if none. */
const char *cache_kernel_name(int kernel);
int cache_kernel_from_name(const char *name);

#endif
