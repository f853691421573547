/* cache_params.c -- the knob table (cache_knobs.h) and the defaults,
 * validation and description of nc_cache_params built on it. */
#include "cache_params.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "components.h"
#include "suggest.h"

#define KNOB_ROW(name_, alias_, type_, min_, max_, def_, needs_, doc_)                                     \
    {.name = #name_, .alias = alias_, .type = NC_KNOB_##type_, .offset = offsetof(nc_cache_params, name_), \
     .min = (min_), .max = (max_), .def = def_, .doc = doc_, .owner = -1},
/* the "needs" column by name, resolved into nc_cache_knob.needs at first use */
#define KNOB_NEEDS(name_, alias_, type_, min_, max_, def_, needs_, doc_) needs_,

#define KNOB_COUNT(...) +1
enum { NKNOBS = 0 NC_CACHE_KNOBS(KNOB_COUNT) };
#undef KNOB_COUNT

/* The flags are the names with '-' for '_', the needs and the owners
 * resolved, once at first use (the preprocessor cannot spell a flag, and
 * the owners are the rows' lists): the table is read-only after that. */
static nc_cache_knob knob_table[NKNOBS] = {NC_CACHE_KNOBS(KNOB_ROW)};
static const char *const knob_needs[NKNOBS] = {NC_CACHE_KNOBS(KNOB_NEEDS)};
static char knob_flags[NKNOBS][32];
static pthread_once_t knob_table_once = PTHREAD_ONCE_INIT;

static nc_cache_knob *knob_named(const char *name)
{
    for (size_t i = 0; i < NKNOBS; i++)
        if (strcmp(knob_table[i].name, name) == 0)
            return &knob_table[i];
    return NULL;
}

/* A row's knob that is not in the table, a knob two rows claim or a needs
 * naming no knob are programming errors, caught at the first use. */
static void knob_table_init(void)
{
    for (size_t i = 0; i < NKNOBS; i++) {
        size_t j = 0;
        for (; knob_table[i].name[j] && j + 1 < sizeof knob_flags[i]; j++)
            knob_flags[i][j] = knob_table[i].name[j] == '_' ? '-' : knob_table[i].name[j];
        knob_flags[i][j] = 0;
        knob_table[i].flag = knob_flags[i];
        knob_table[i].needs = knob_needs[i] ? knob_named(knob_needs[i]) : NULL;
        NC_ASSERT(!knob_needs[i] || knob_table[i].needs, "knob %s needs '%s', which is no knob", knob_table[i].name,
                  knob_needs[i]);
    }
    for (int c = 0; c < NC_NCOMP; c++)
        for (int i = 0; nc_component_rows[c]->knobs && nc_component_rows[c]->knobs[i]; i++) {
            nc_cache_knob *k = knob_named(nc_component_rows[c]->knobs[i]);
            NC_ASSERT(k && k->owner < 0, "component %s lists knob '%s': %s", nc_comp_names[c],
                      nc_component_rows[c]->knobs[i], k ? "another row owns it" : "not in the table");
            k->owner = c;
        }
}

const nc_cache_knob *cache_knobs(size_t *n)
{
    pthread_once(&knob_table_once, knob_table_init);
    if (n)
        *n = NKNOBS;
    return knob_table;
}

const nc_cache_knob *cache_knob_find(const char *name)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(k[i].name, name) == 0)
            return &k[i];
    return NULL;
}

const nc_cache_knob *cache_knob_by_flag(const char *flag)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(k[i].flag, flag) == 0 || (k[i].alias && strcmp(k[i].alias, flag) == 0))
            return &k[i];
    return NULL;
}

const char *cache_knob_suggest(const char *word, bool flags)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    nc_suggest s;
    suggest_init(&s, word);
    for (size_t i = 0; i < n; i++)
        suggest_offer(&s, flags ? k[i].flag : k[i].name);
    for (size_t i = 0; flags && i < n; i++)
        suggest_offer_as(&s, k[i].alias, k[i].flag);
    return suggest_best(&s);
}

static const char *const kernel_names[] = {"gaussian", "epanechnikov"};

const char *cache_kernel_name(int kernel)
{
    return kernel >= 0 && kernel < 2 ? kernel_names[kernel] : NULL;
}

int cache_kernel_from_name(const char *name)
{
    for (int i = 0; i < 2; i++)
        if (strcmp(name, kernel_names[i]) == 0)
            return i;
    return -1;
}

/* The one range check and its message (every front end shows it as is). */
static int knob_check(const nc_cache_knob *k, double v, char *err, size_t errlen)
{
    if (k->type == NC_KNOB_BOOL) {
        if (v == 0 || v == 1)
            return NC_OK;
        return nc_error(err, errlen, NC_EINVAL, "%s = %.10g is not a boolean", k->name, v);
    }
    if (k->type == NC_KNOB_KERNEL) {
        if (cache_kernel_name((int)v) && v == floor(v))
            return NC_OK;
        return nc_error(err, errlen, NC_EINVAL, "%s %g unknown (gaussian or epanechnikov)", k->name, v);
    }
    if (k->type == NC_KNOB_INT && isfinite(v) && v != floor(v))
        return nc_error(err, errlen, NC_EINVAL, "%s = %.10g is not an integer", k->name, v);
    if (!isfinite(v) || v < k->min || v > k->max || (k->type == NC_KNOB_FLOAT_BELOW_MAX && v == k->max))
        return nc_error(err, errlen, NC_EINVAL, "%s = %.10g is out of range [%.10g, %.10g%c", k->name, v, k->min,
                        k->max, k->type == NC_KNOB_FLOAT_BELOW_MAX ? ')' : ']');
    return NC_OK;
}

double cache_knob_get(const nc_cache_params *p, const nc_cache_knob *k)
{
    NC_ASSERT(k, "cache_knob_get: no k");
    const char *f = (const char *)p + k->offset;
    switch (k->type) {
    case NC_KNOB_INT: return *(const int *)f;
    case NC_KNOB_FLOAT:
    case NC_KNOB_FLOAT_BELOW_MAX: return *(const float *)f;
    case NC_KNOB_BOOL: return *(const bool *)f;
    case NC_KNOB_KERNEL: return *(const nc_kernel *)f;
    }
    return 0;
}

int cache_knob_set_number(nc_cache_params *p, const nc_cache_knob *k, double v, char *err, size_t errlen)
{
    NC_ASSERT(k, "cache_knob_set_number: no k");
    int rc = knob_check(k, v, err, errlen);
    if (rc != NC_OK)
        return rc;
    char *f = (char *)p + k->offset;
    switch (k->type) {
    case NC_KNOB_INT: *(int *)f = (int)v; break;
    case NC_KNOB_FLOAT:
    case NC_KNOB_FLOAT_BELOW_MAX: *(float *)f = (float)v; break;
    case NC_KNOB_BOOL: *(bool *)f = v != 0; break;
    case NC_KNOB_KERNEL: *(nc_kernel *)f = (nc_kernel)(int)v; break;
    }
    return NC_OK;
}

int cache_knob_set_text(nc_cache_params *p, const nc_cache_knob *k, const char *text, char *err, size_t errlen)
{
    NC_ASSERT(k, "cache_knob_set_text: no k");
    double v;
    if (k->type == NC_KNOB_BOOL) {
        static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
        for (int i = 0; i < 4; i++)
            if (!strcmp(text, yes[i]) || !strcmp(text, no[i]))
                return cache_knob_set_number(p, k, !strcmp(text, yes[i]), err, errlen);
        return nc_error(err, errlen, NC_EINVAL, "%s = '%s' is not a boolean (true|false)", k->name, text);
    }
    if (k->type == NC_KNOB_KERNEL) {
        int kern = cache_kernel_from_name(text);
        if (kern < 0)
            return nc_error(err, errlen, NC_EINVAL, "%s = '%s' is not gaussian or epanechnikov", k->name, text);
        return cache_knob_set_number(p, k, kern, err, errlen);
    }
    char *end;
    errno = 0;
    v = strtod(text, &end);
    if (end == text || *end || (errno && isfinite(v) && v != 0))
        return nc_error(err, errlen, NC_EINVAL, "%s = '%s' is not %s", k->name, text,
                        k->type == NC_KNOB_INT ? "an integer" : "a number");
    return cache_knob_set_number(p, k, v, err, errlen);
}

void cache_params_default(nc_cache_params *p)
{
    char err[NC_ERRLEN];
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    memset(p, 0, sizeof *p);
    for (size_t i = 0; i < n; i++)
        if (cache_knob_set_text(p, &k[i], k[i].def, err, sizeof err) != NC_OK)
            abort();   /* a default outside its own range is a programming error */
}

int cache_params_validate(const nc_cache_params *p, char *err, size_t errlen)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++) {
        int rc = knob_check(&k[i], cache_knob_get(p, &k[i]), err, errlen);
        if (rc != NC_OK)
            return rc;
    }
    /* combinations: each component's own (component.h) */
    return components_validate(p, err, errlen);
}

bool cache_row_remembers(int comp)
{
    NC_ASSERT(comp >= 0 && comp < NC_NCOMP, "cache_row_remembers: no row %d", comp);
    return nc_component_rows[comp]->push != NULL || nc_component_rows[comp]->searched;
}

/* By the caches' switches, not their rows' `on`: the neural cache under
 * global normalisation is on, though its row is not (its term is then
 * inside the model's, model_term.c). */
unsigned cache_params_caches_on(const nc_cache_params *p)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    unsigned caches = 0;
    for (size_t i = 0; i < n; i++)
        if (k[i].owner >= 0 && !k[i].needs && cache_row_remembers(k[i].owner) && cache_knob_on(p, &k[i]))
            caches |= 1u << k[i].owner;
    return caches;
}

void cache_params_row_off(nc_cache_params *p, int comp)
{
    char err[NC_ERRLEN];
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++)
        if (k[i].owner == comp && cache_knob_set_text(p, &k[i], k[i].def, err, sizeof err) != NC_OK)
            abort();   /* a default outside its own range: a programming error */
}

void cache_params_row_copy(nc_cache_params *dst, const nc_cache_params *src, int comp)
{
    char err[NC_ERRLEN];
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++)
        if (k[i].owner == comp && cache_knob_set_number(dst, &k[i], cache_knob_get(src, &k[i]), err, sizeof err))
            abort();   /* src holds a value outside the table's range: validate it first */
}

void cache_params_caches_off(nc_cache_params *p)
{
    for (int c = 0; c < NC_NCOMP; c++)
        if (cache_row_remembers(c))
            cache_params_row_off(p, c);
}

bool cache_knob_on(const nc_cache_params *p, const nc_cache_knob *k)
{
    return cache_knob_get(p, k) > 0;
}

bool cache_knob_in_effect(const nc_cache_params *p, const nc_cache_knob *k)
{
    if ((!k->needs || k->type == NC_KNOB_BOOL) && !cache_knob_on(p, k))
        return false;
    for (const nc_cache_knob *need = k->needs; need; need = need->needs)
        if (!cache_knob_on(p, need))
            return false;
    return true;
}

/* A row without a description of its own (described_by_hand): its name,
 * then each of its knobs in effect as name=value, the row's name dropped
 * from the knob's ("bigram size=20 lambda=0.2"). Returns the new o. */
static size_t describe_row(const nc_cache_params *p, int comp, char *buf, size_t len, size_t o)
{
    size_t n, pre = strlen(nc_comp_names[comp]);
    const nc_cache_knob *k = cache_knobs(&n);
#define ADD(...) do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    ADD("%s", nc_comp_names[comp]);
    for (size_t i = 0; i < n; i++) {
        if (k[i].owner != comp || !cache_knob_in_effect(p, &k[i]))
            continue;
        const char *label = strncmp(k[i].name, nc_comp_names[comp], pre) || k[i].name[pre] != '_'
                                ? k[i].name : k[i].name + pre + 1;
        double v = cache_knob_get(p, &k[i]);
        if (k[i].type == NC_KNOB_BOOL)
            ADD(" %s", label);
        else if (k[i].type == NC_KNOB_KERNEL)
            ADD(" %s", cache_kernel_name((int)v));
        else   /* a float knob as the hand-written ones print theirs */
            ADD(k[i].type == NC_KNOB_INT ? " %s=%.0f" : " %s=%g", label, v);
    }
    ADD(" ");
#undef ADD
    return o;
}

/* The rows the description writes in their own words (their labels are
 * the eval tables' and the logs' since the caches came: "neural N=2000
 * theta=0.3 lambda=0.1"); every other row is written from the table by
 * describe_row, so that a new component needs nothing here. */
static const bool described_by_hand[NC_NCOMP] = {
    [NC_COMP_MODEL] = true, [NC_COMP_NEURAL] = true, [NC_COMP_UNIGRAM] = true, [NC_COMP_UNBOUNDED] = true,
    [NC_COMP_UNIFORM] = true};

bool cache_row_described_by_hand(int comp)
{
    NC_ASSERT(comp >= 0 && comp < NC_NCOMP, "cache_row_described_by_hand: no row %d", comp);
    return described_by_hand[comp];
}

/* Row comp's switch (its knob that needs none) is on. */
static bool row_switch_on(const nc_cache_params *p, int comp)
{
    size_t n;
    const nc_cache_knob *k = cache_knobs(&n);
    for (size_t i = 0; i < n; i++)
        if (k[i].owner == comp && !k[i].needs && cache_knob_on(p, &k[i]))
            return true;
    return false;
}

const char *cache_params_describe(const nc_cache_params *p, char *buf, size_t len)
{
    NC_ASSERT(p, "cache_params_describe: no p");
    size_t o = 0;
    buf[0] = '\0';
#define ADD(...) do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    if (p->neural_size > 0) {
        if (p->global_norm)
            ADD("neural-global N=%d theta=%g alpha=%g ", p->neural_size, (double)p->neural_theta,
                (double)p->neural_alpha);
        else
            ADD("neural N=%d theta=%g lambda=%g ", p->neural_size, (double)p->neural_theta,
                (double)p->neural_lambda);
        if (p->neural_f16)
            ADD("f16 ");
    }
    if (p->unigram_size > 0)
        ADD("unigram N=%d lambda=%g ", p->unigram_size, (double)p->unigram_lambda);
    if (p->unbounded)
        ADD("unbounded k=%d nprobe=%d lambda=%g %s%s ", p->knn, p->nprobe,
            (double)p->unbounded_lambda, cache_kernel_name(p->kernel),
            p->exact ? " exact" : "");
    if (p->open_vocab)
        ADD("open-vocab mu=%g ", (double)p->uniform_mu);
    for (int c = 0; c < NC_NCOMP; c++)
        if (!described_by_hand[c] && row_switch_on(p, c))
            o = describe_row(p, c, buf, len, o);
    if (p->dyn_lr > 0.0f)
        ADD("dyn lr=%g decay=%g n=%d params=%d ", (double)p->dyn_lr, (double)p->dyn_decay, p->dyn_segment,
            p->dyn_params);
    if (p->gate && p->gate_skip >= 0.0f && p->unbounded)
        ADD("gate skip<%g ", (double)p->gate_skip);
    else if (p->gate)
        ADD("gate ");
    if (o == 0)
        ADD("static");
    else if (o < len && o > 0 && buf[o - 1] == ' ')
        buf[o - 1] = '\0';
#undef ADD
    return buf;
}
