/* cache_params.h -- the settings of the caches and the mixture
 * (nc_cache_params, one field per row of the knob table cache_knobs.h),
 * with their defaults, validation and one-line description (cache_params.c).
 * Design §4-§5. */
#ifndef NC_CACHE_PARAMS_H
#define NC_CACHE_PARAMS_H

#include "nc_common.h"
#include "cache_knobs.h"
#include "unbounded_cache.h"   /* nc_kernel, a knob's type */

/* Every knob of the mixture: one field per row of NC_CACHE_KNOBS
 * (cache_knobs.h), where its type, bounds, default and meaning are defined. */
#define NC_KNOB_CTYPE_INT int
#define NC_KNOB_CTYPE_FLOAT float
#define NC_KNOB_CTYPE_FLOAT_BELOW_MAX float
#define NC_KNOB_CTYPE_BOOL bool
#define NC_KNOB_CTYPE_KERNEL nc_kernel
#define NC_KNOB_FIELD(name, flag, type, min, max, def, doc) NC_KNOB_CTYPE_##type name;
typedef struct nc_cache_params_s {
    NC_CACHE_KNOBS(NC_KNOB_FIELD)
} nc_cache_params;
#undef NC_KNOB_FIELD

/* The table's defaults: every cache off; a cache switched on without its
 * knobs takes the defaults of those (cache_knobs.h). */
void cache_params_default(nc_cache_params *p);
/* NC_EINVAL with the offending field named if any value is out of the
 * table's range (the message of cache_knob_set_number) or the combination
 * makes no sense. */
int cache_params_validate(const nc_cache_params *p, char *err, size_t errlen);

/* One line "unigram=N/λ neural=N/θ/λ ..." describing what is on (for logs,
 * CLI tables). Returns buf. */
const char *cache_params_describe(const nc_cache_params *p, char *buf, size_t len);

#endif
