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

#define KNOB_ROW(name_, alias_, type_, min_, max_, def_, doc_)                                       \
    {.name = #name_, .alias = alias_, .type = NC_KNOB_##type_, .offset = offsetof(nc_cache_params, name_), \
     .min = (min_), .max = (max_), .def = def_, .doc = doc_},

#define KNOB_COUNT(...) +1
enum { NKNOBS = 0 NC_CACHE_KNOBS(KNOB_COUNT) };
#undef KNOB_COUNT

/* The flags are the names with '-' for '_', written once at first use (the
 * preprocessor cannot spell them): the table is read-only after that. */
static nc_cache_knob knob_table[NKNOBS] = {NC_CACHE_KNOBS(KNOB_ROW)};
static char knob_flags[NKNOBS][32];
static pthread_once_t knob_flags_once = PTHREAD_ONCE_INIT;

static void knob_flags_init(void)
{
    for (size_t i = 0; i < NKNOBS; i++) {
        size_t j = 0;
        for (; knob_table[i].name[j] && j + 1 < sizeof knob_flags[i]; j++)
            knob_flags[i][j] = knob_table[i].name[j] == '_' ? '-' : knob_table[i].name[j];
        knob_flags[i][j] = 0;
        knob_table[i].flag = knob_flags[i];
    }
}

const nc_cache_knob *cache_knobs(size_t *n)
{
    pthread_once(&knob_flags_once, knob_flags_init);
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
