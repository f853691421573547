/* components.c -- the rows of component_table.h gathered (components.h). */
#include "components.h"
#include "fault.h"

#include <pthread.h>
#include <string.h>

#define NC_ROW_DECL_(ID, name, npre, npost) extern const nc_component nc_component_##name;
NC_COMPONENT_TABLE(NC_ROW_DECL_)
#undef NC_ROW_DECL_

#define NC_ROW_PTR_(ID, name, npre, npost) &nc_component_##name,
const nc_component *const nc_component_rows[NC_NCOMP] = {NC_COMPONENT_TABLE(NC_ROW_PTR_)};
#undef NC_ROW_PTR_
#define NC_ROW_NPRE_(ID, name, npre, npost) npre,
const int nc_component_npre[NC_NCOMP] = {NC_COMPONENT_TABLE(NC_ROW_NPRE_)};
#undef NC_ROW_NPRE_
#define NC_ROW_NPOST_(ID, name, npre, npost) npost,
const int nc_component_npost[NC_NCOMP] = {NC_COMPONENT_TABLE(NC_ROW_NPOST_)};
#undef NC_ROW_NPOST_

static const char *feature_names[NC_GATE_NFEAT];
static unsigned searched_rows;
static pthread_once_t rows_once = PTHREAD_ONCE_INIT;

/* Once: the rows agree with the table (name, feature counts, only a
 * searched row has post features and each has its search hooks, at most
 * one row joins the first row's softmax) -- a row that
 * does not is a programming error, caught at the first use -- and the
 * feature names in the gate's order. */
static void rows_init(void)
{
    int pre = 0, post = NC_GATE_NPRE, explaining = 0, joining = 0;
    for (int c = 0; c < NC_NCOMP; c++) {
        const nc_component *r = nc_component_rows[c];
        int nf = 0;
        while (r->features && r->features[nf])
            nf++;
        NC_ASSERT(!strcmp(r->name, nc_comp_names[c]), "row %d is named '%s', the table says '%s'", c, r->name,
                  nc_comp_names[c]);
        NC_ASSERT(nf == nc_component_npre[c] + nc_component_npost[c], "component %s: %d feature names, table %d+%d",
                  r->name, nf, nc_component_npre[c], nc_component_npost[c]);
        NC_ASSERT(c == 0 ? r->step && !r->lambda : r->lambda && (r->dense || r->step) && r->prob,
                  "component %s: incomplete row", r->name);
        NC_ASSERT(!nc_component_npost[c] || r->searched, "component %s: post-search features but no search",
                  r->name);
        NC_ASSERT(!r->joint || (c > 0 && r->joint_prob && r->joint_step && ++joining == 1),
                  "component %s: a second or incomplete joint row", r->name);
        if (r->explain)
            explaining++;
        NC_ASSERT(explaining <= NC_EXPLAIN_ROWS, "more than %d components explain", NC_EXPLAIN_ROWS);
        if (r->searched) {
            NC_ASSERT(r->state_new && r->can_search && r->search_h && r->scan_open && r->scan_search,
                      "component %s: searched without its search hooks", r->name);
            searched_rows |= 1u << c;
        }
        NC_ASSERT(!r->state_new || (r->state_free && r->state_clear && r->state_resize && r->push && r->mark &&
                                    r->rollback && r->memory),
                  "component %s: session state without its life's hooks", r->name);
        for (int i = 0; i < nc_component_npre[c]; i++)
            feature_names[pre++] = r->features[i];
        for (int i = 0; i < nc_component_npost[c]; i++)
            feature_names[post++] = r->features[nc_component_npre[c] + i];
    }
}

unsigned components_searched(void)
{
    pthread_once(&rows_once, rows_init);
    return searched_rows;
}

bool components_post(const struct nc_cache_params_s *p, unsigned avail)
{
    NC_ASSERT(p, "components_post: no p");
    unsigned on = components_searched() & components_on(p);
    return on && (avail & on) == on;
}

const char *components_feature_name(int i)
{
    pthread_once(&rows_once, rows_init);
    return i >= 0 && i < NC_GATE_NFEAT ? feature_names[i] : NULL;
}

const nc_component *components_joint(const struct nc_cache_params_s *p, const nc_mix_input *in)
{
    NC_ASSERT(p && in, "components_joint: no p or in");
    for (int c = 1; c < NC_NCOMP; c++)
        if (nc_component_rows[c]->joint && nc_component_rows[c]->joint(p, in))
            return nc_component_rows[c];
    return NULL;
}

unsigned components_on(const struct nc_cache_params_s *p)
{
    unsigned a = 0;
    for (int c = 0; c < NC_NCOMP; c++)
        if (!nc_component_rows[c]->on || nc_component_rows[c]->on(p))
            a |= 1u << c;
    return a;
}

unsigned components_available(const struct nc_cache_params_s *p, const nc_mix_input *in)
{
    unsigned a = 0;
    for (int c = 0; c < NC_NCOMP; c++)
        if (!nc_component_rows[c]->available || nc_component_rows[c]->available(p, in))
            a |= 1u << c;
    return a;
}

size_t components_state_bytes(const struct nc_cache_params_s *p, int H)
{
    const nc_state_args a = {.p = p, .H = H};
    size_t n = 0;
    for (int c = 0; c < NC_NCOMP; c++)
        if (nc_component_rows[c]->state_bytes)
            n += nc_component_rows[c]->state_bytes(&a);
    return n;
}

int components_validate(const struct nc_cache_params_s *p, char *err, size_t errlen)
{
    for (int c = 0; c < NC_NCOMP; c++) {
        int rc = nc_component_rows[c]->validate ? nc_component_rows[c]->validate(p, err, errlen) : NC_OK;
        if (rc != NC_OK)
            return rc;
    }
    return NC_OK;
}

/* Selection, not a sort: max is a handful. */
int components_heaviest(int *cand, int n, const double *w, const float *key, int max)
{
    int got = 0;
    for (; got < max; got++) {
        int best = -1;
        for (int j = got; j < n; j++) {
            int i = cand[j], b = best < 0 ? -1 : cand[best];
            if (w[i] <= 0.0)
                continue;
            if (best < 0 || w[i] > w[b] || (w[i] == w[b] && key && key[i] > key[b]))
                best = j;
        }
        if (best < 0)
            break;
        int t = cand[got];
        cand[got] = cand[best];
        cand[best] = t;
    }
    return got;
}

int blob_word_ref(nc_blob_words *x, int id)
{
    NC_ASSERT(x, "blob_word_ref: no x");
    if (id < x->V)
        return id;
    for (int i = 0; i < x->n; i++)
        if (x->ids[i] == id)
            return x->V + i;
    if (x->n == x->cap) {
        int c = x->cap ? 2 * x->cap : 64;
        int *p = nc_realloc(x->ids, (size_t)c * sizeof(int));
        if (!p)
            return -1;
        x->ids = p;
        x->cap = c;
    }
    x->ids[x->n++] = id;
    return x->V + x->n - 1;
}

int blob_word_id(const nc_blob_words *x, int32_t ref)
{
    NC_ASSERT(x, "blob_word_id: no x");
    if (ref >= 0 && ref < x->V)
        return ref;
    if (ref >= x->V && ref - x->V < x->n)
        return x->ids[ref - x->V];
    return -1;
}
