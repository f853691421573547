/* component.h -- one component of the mixture as one row (design §4
 * "Components"): what the mixture (mixture.c), the gate (gate.c), the
 * validation (cache_params.c), the export blob and explain (stream.c) and
 * /v1/model read of it. Each component's own file defines its row,
 *     const nc_component nc_component_<name> = {...};
 * and component_table.h lists it once; they loop over the rows
 * (nc_component_rows, components.c) instead of naming components.
 *
 * The mixture at one position is, in the table's order (mixture.h),
 *     p <- p_first;  p <- (1 - λ_c) p + λ_c p_c  for each later row c available,
 * with λ_c the row's constant weight or, under the gate, w_c / Σ_{c'<=c} w_c'.
 * A row gives p_c two ways that must agree: prob (the target path, one
 * word) and dense or step (the full distribution). */
#ifndef NC_COMPONENT_H
#define NC_COMPONENT_H

#include "nc_common.h"
#include "dist.h"
#include "mix_input.h"
#include "binio.h"

struct nc_cache_params_s;

/* The gate's features (gate.h): the rows' pre-search ones in the table's
 * order, then their post-search ones; counts from component_table.h. */
#define NC_COMP_NPRE_(ID, name, npre, npost) +(npre)
#define NC_COMP_NPOST_(ID, name, npre, npost) +(npost)
enum {
    NC_GATE_NPRE = 0 NC_COMPONENT_TABLE(NC_COMP_NPRE_),
    NC_GATE_NFEAT = NC_GATE_NPRE NC_COMPONENT_TABLE(NC_COMP_NPOST_)
};
#undef NC_COMP_NPRE_
#undef NC_COMP_NPOST_

/* What a row's own step on the full distribution reads and writes. */
typedef struct {
    const struct nc_cache_params_s *p;
    const nc_mix_input *in;
    double lambda;                /* λ_c of this step (unused by the first row) */
    nc_dist *out;                 /* p[n] so far; share[c][n] too when shares */
    bool shares;
    int comp;                     /* the row's index */
} nc_comp_step;

/* What rows' gate features share: the word the neural window attends to
 * most (-2 when none), which later rows' agreement features compare with. */
typedef struct {
    int attended;
} nc_feat_ctx;

/* One entry of explain (stream_explain): a stored pair of a row's memory
 * that gives a predicted word mass. */
typedef struct {
    int source;                   /* the row's index (NC_COMP_<ID>, dist.h) */
    int64_t at;                   /* where the pair is: the row's entries_in_store says which
                                   * (neural: the token position of the pair's word, its key the
                                   * h that predicted it; unbounded: the pair's FAISS id) */
    double weight;                /* the pair's weight in its row's term of the word, normalised
                                   * as the mixture normalises it (neural_cache_weights,
                                   * unbounded_term_weights): over all of a word's pairs of
                                   * one source the weights sum to that row's term */
    double distance;              /* ||h_t - h_i|| where the row's memory is searched; else NAN */
} nc_explain_entry;

/* At most this many rows have an explain (components.c checks): callers of
 * stream_explain size its output for that many sources per word. */
#define NC_EXPLAIN_ROWS 2

/* What a row's explain reads: the mixture input at h as predict builds it
 * (explain's input has no logits unless eq. 4's global normaliser needs
 * them; the searched row's neighbours are there even where the gate would
 * skip the search, and what its search_h kept for explain in its scratch,
 * in->state[comp] its state), and where its entries go. */
typedef struct {
    const struct nc_cache_params_s *p;
    const nc_mix_input *in;
    int64_t pos;                  /* tokens the stream has fed */
    const int *ids;               /* the k words asked */
    size_t k;
    const void *scratch;          /* what the row's at_h and search_h made (their *scratch) */
    int per_source;               /* at most this many entries per word and row */
    size_t stride;                /* word q's entries start at out[q * stride] */
    int comp;                     /* the row's index: the entries' source */
} nc_explain_ctx;

/* The export blob's dynamic words (stream.c): the open-vocabulary ids
 * (>= V) the rows' session state names, listed once before the rows'
 * sections. A section writes a word as its ref: its id below V, else V +
 * its place in the list (components.h blob_word_ref, blob_word_id). */
typedef struct {
    int V;
    int *ids;                     /* export: in first-seen order; import: the stream's id of each */
    int n, cap;
} nc_blob_words;

/* What a row's session state is made for (state_new, state_resize). */
typedef struct {
    const struct nc_cache_params_s *p;
    int H;                        /* the model's hidden size: a key's length */
    /* The memory shared beyond the session that a searched row reads (the
     * namespace's index store, unbounded_cache.h; borrowed, it outlives the
     * state), NULL: none. A row that needs one and is on under p refuses a
     * state without it. */
    void *store;
    int unk_id;                   /* the model's unk id: how a closed-vocabulary
                                   * session reads the store's words (-1: unknown) */
    /* A session's state (stream.c): settings its memory cannot serve (the
     * store missing, or of another dimension) are refused; a scoring
     * pass's own state (doc_score without states) reads none instead. */
    bool strict;
} nc_state_args;

/* A document's scoring pass (doc.c) as a row's scan reads it: the query
 * rows, the words, and the positions before `first` that are context only. */
typedef struct {
    const struct nc_cache_params_s *p;
    const float *q;               /* [n, H] row j = h before token j: query for j, key of pair j */
    const int *ids;               /* [n] word of token j */
    size_t first;
    int H;
    /* The state still holds what its at_h and search_h made at q's row 0
     * (a stream's predict at this h, nothing pushed since: nc_at_h.memo): a
     * scan may read it for a first block of that position alone, the same
     * bits (issue 36: a one-word feed after a predict). */
    bool at_h0;
    /* A searched row's side of the pass: the store's words of the pairs
     * (store_ids[j]: the id the store keeps for word j), added to the
     * store before their block's search when adapt; how the document reads
     * the store's words (unk_id as nc_state_args's); and the neighbours a
     * caller searched beforehand ([n, p->knn] distances and words,
     * doc_neighbours), read instead of searching when non-NULL. */
    const int *store_ids;
    bool adapt;
    int unk_id;
    const float *pre_d2;
    const int *pre_words;
} nc_scan_doc;

/* One block of a document pass as a searched row's scan_search reads it:
 * the gate's decisions, the block's inputs to complete, and the searches
 * made and skipped (out). */
typedef struct {
    size_t b0, nb;
    const bool *skip;             /* [nb] the pre-search gate skips position b0 + r */
    nc_mix_input *ins;            /* [nb] its inputs: the row's post-search fields go here */
    size_t searched, skipped;     /* out */
} nc_scan_search;

/* A stream's h as a row's at_h reads it: the row fills in's fields; what
 * it allocates for them goes to *scratch (or NULL), freed by the caller
 * after the mixture. */
typedef struct {
    const struct nc_cache_params_s *p;
    const float *h;               /* [H] h_t */
    nc_mix_input *in;
    void **scratch;
    /* The state and h are as at this row's previous at_h, whose fields
     * the state may keep (the stream's memo, issue 36): the row may fill
     * in's fields from what it kept, the same bits, instead of reading its
     * memory again (the neural window's dots: 2 MB for 2,000 keys). */
    bool memo;
    bool keep;                    /* the stream keeps a memo (stream_memo_disable
                                   * off): the row may keep what it makes */
    uint64_t *memo_reads;         /* +1 for each use of what the state kept */
    /* search_h only: the pre-search gate skips this search (the row marks
     * in so and searches nothing); explain: keep what explain reads of the
     * search (the store's ids of the neighbours). */
    bool skip;
    bool explain;
} nc_at_h;

typedef struct nc_component {
    const char *name;             /* as in component_table.h */
    const char *const *knobs;     /* its rows of cache_knobs.h, NULL-terminated (/v1/model) */

    /* ---- settings ---- */
    /* Part of the mixture p describes, whatever the memory holds (the
     * components a gate is fitted for: gate.json's "components"). */
    bool (*on)(const struct nc_cache_params_s *p);
    /* Combinations of its knobs that make no sense (NULL: none), with the
     * message cache_params_validate returns. */
    int (*validate)(const struct nc_cache_params_s *p, char *err, size_t errlen);
    /* Its constant weight λ_c (NULL for the first row: it has none). */
    double (*lambda)(const struct nc_cache_params_s *p);

    /* ---- one position ---- */
    /* In the mixture here: on, and its memory gives mass (an empty window,
     * no neighbour or a skipped search leave it out). NULL: always. */
    bool (*available)(const struct nc_cache_params_s *p, const nc_mix_input *in);
    /* p_c(x), the target path (mixture_target, the gate's fitting data). */
    double (*prob)(const struct nc_cache_params_s *p, const nc_mix_input *in, int x);
    /* λ p_c(x) of the constant mixture's target step when it is not
     * lambda * prob bit for bit (NULL: it is). */
    double (*lambda_prob)(const struct nc_cache_params_s *p, const nc_mix_input *in, int x, double lambda);
    /* The largest word id it may give mass to, -1 if none (the full
     * distribution grows to hold it). NULL: none beyond the model's. */
    int (*max_word)(const nc_mix_input *in);
    /* The full path, one of two forms. dense: p_c over [0, n) into q
     * (zeroed); the mixture then blends (1-λ) p + λ q and credits q to the
     * row's share. step: the row changes out itself (the first row fills
     * it; a sparse term adds to it). NC_ENOMEM on a failed allocation. */
    int (*dense)(const struct nc_cache_params_s *p, const nc_mix_input *in, double *q, size_t n);
    int (*step)(const nc_comp_step *s);
    /* Its own terms join the first row's softmax here (the neural cache
     * under global normalisation, eq. 4: then no component of its own, on
     * false): the first row's prob and step are this row's joint_prob (s_x
     * the target's decoder logit, -inf for a word >= V) and joint_step,
     * which credits its terms to its own share. NULL: never. At most one
     * row has them (components.c). */
    bool (*joint)(const struct nc_cache_params_s *p, const nc_mix_input *in);
    double (*joint_prob)(const struct nc_cache_params_s *p, const nc_mix_input *in, double s_x, int x);
    int (*joint_step)(const nc_comp_step *s);

    /* ---- the gate (gate.h) ---- */
    /* Its features' names: component_table.h's npre then npost of them
     * (gate.json's "features", in the table's order). */
    const char *const *features;
    /* Its raw features at this position into pre[npre] and, when post is
     * non-NULL (the searched component is available), post[npost]; they
     * start at 0 and never read the target. */
    void (*gate_features)(const struct nc_cache_params_s *p, const nc_mix_input *in, nc_feat_ctx *ctx,
                          double *pre, double *post);
    /* Its memory is searched, and the gate's pre-search net may skip the
     * search (adaptive retrieval): only such a row has post features. Its
     * search runs after every row's pre-search fields are in (the gate's
     * decision reads them): search_h at a stream's h, scan_search in a
     * document pass. Several rows may be searched: each search is skipped
     * on its own pre-search weight, and the full net weighs a position only
     * where every searched row on is available (components_post; design §4
     * "Several searched rows"). */
    bool searched;

    /* ---- explain (stream_explain) ---- */
    /* For each word ids[q], its stored pairs with weight > 0, heaviest
     * first, at most per_source: appended at out[q * stride + counts[q]++].
     * NULL for a row without stored pairs. */
    int (*explain)(const nc_explain_ctx *x, nc_explain_entry *out, int *counts, char *err, size_t errlen);
    /* Its explain entries' `at` are entry ids of the namespace store (the
     * server shows their provenance); else token positions in the session. */
    bool entries_in_store;

    /* ---- its session state in the export blob (stream.c) ---- */
    /* Its state's section of the blob (state: what stream.c keeps for the
     * row), words by blob_word_ref; the sections follow the blob's words in
     * the table's order. NC_ENOMEM when a word cannot be listed. NULL (and
     * import_state NULL): the row keeps no session state. */
    int (*export_state)(const void *state, binio_writer *w, nc_blob_words *x);
    /* The section read back into the state the stream built for the blob's
     * settings: NC_EFORMAT when it does not match them. */
    int (*import_state)(void *state, binio_reader *r, const nc_blob_words *x, char *err, size_t errlen);

    /* ---- its session state's life (stream.c, doc.c loop over these) ----
     * A row that keeps state per session (a window of the pairs fed) owns
     * all of it: stream.c keeps one opaque pointer per row and doc.c one
     * per scoring pass. state_new NULL: the row keeps none (and every hook
     * below is NULL). */
    /* An empty state for a->p: an object even where p turns the row off
     * (its blob section and memory then say so; push does nothing). */
    int (*state_new)(const nc_state_args *a, void **out, char *err, size_t errlen);
    void (*state_free)(void *state);   /* NULL allowed */
    void (*state_clear)(void *state);  /* emptied, as new */
    /* A new state for a->p holding the newest pairs of old (old unchanged);
     * on error nothing is left allocated. */
    int (*state_resize)(const void *old, const nc_state_args *a, void **out, char *err, size_t errlen);
    /* The pair (h_t, x_{t+1}) after position t's mixture: NC_ENOMEM when
     * it cannot be held. */
    int (*push)(void *state, const float *h, int word);
    /* Undo of a rescoring (stream_rescore): mark saves what the next npush
     * pushes will overwrite (*mark malloc'ed); rollback puts the state back
     * as it was at the mark, bit for bit, and frees the mark (NULL: only
     * nothing to put back after a failed mark). */
    int (*mark)(const void *state, size_t npush, void **mark, char *err, size_t errlen);
    void (*rollback)(void *state, void *mark);
    size_t (*memory)(const void *state);   /* bytes it owns (a session's memory gauge) */
    /* What its state will hold at full size under a->p, before it exists:
     * the session table's budget (sessions_estimate). NULL: nothing. */
    size_t (*state_bytes)(const nc_state_args *a);
    /* The mixture input's fields it reads at a stream's h (stream_predict,
     * stream_explain), from its state. NULL: none but in->state[c]. */
    int (*at_h)(void *state, const nc_at_h *a, char *err, size_t errlen);
    /* A document's scoring pass reads its input a block of positions at a
     * time (doc.c): scan_open makes the pass's scratch (*scan; NULL when
     * the row is off under d->p), scan_block prepares positions [b0, b0 +
     * nb) before any of them is pushed, scan_input fills position b0 + r's
     * fields, scan_close frees the scratch (NULL allowed); scan_block,
     * scan_input and scan_close may be NULL (a scan that is the state
     * itself; a searched row's fields come after its search: scan_search).
     * NULL scan_open: the row reads in->state[c] alone. */
    int (*scan_open)(void *state, const nc_scan_doc *d, size_t block, void **scan, char *err, size_t errlen);
    void (*scan_block)(void *scan, size_t b0, size_t nb);
    void (*scan_input)(const void *scan, size_t r, nc_mix_input *in);
    void (*scan_close)(void *scan);

    /* ---- a searched row's search (searched true; NULL otherwise) ---- */
    /* Its state has a memory to search (the store it was made with): on
     * under the settings, its search runs and the gate is asked whether to
     * skip it. */
    bool (*can_search)(const void *state);
    /* At a stream's h, after at_h and the gate's decision (a->skip): the
     * post-search fields of a->in; what they point at goes to *a->scratch.
     * Called at every predict and explain, searching or not: a->memo false
     * says h moved since the last call (what the state kept is stale). */
    int (*search_h)(void *state, const nc_at_h *a, char *err, size_t errlen);
    /* A document pass's block, after every row's scan_input and the gate's
     * decisions: its pairs into the store (the scan's adapt), then the
     * searches of the positions not skipped, as one batch; the positions'
     * post-search fields into b->ins. Needs scan_open: a NULL scan (the
     * row off, or nothing to search) leaves the inputs as they are. */
    int (*scan_search)(void *scan, nc_scan_search *b, char *err, size_t errlen);
} nc_component;

#endif
