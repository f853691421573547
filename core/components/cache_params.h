/* cache_params.h -- the settings of the caches and the mixture
 * (nc_cache_params, one field per row of the knob table cache_knobs.h),
 * with their defaults, validation and one-line description (cache_params.c).
 * Design §4-§5. */
#ifndef NC_CACHE_PARAMS_H
#define NC_CACHE_PARAMS_H

#include "nc_common.h"
#include "cache_knobs.h"

/* nc_cache_params, one field per knob, is defined with the table
 * (cache_knobs.h), so that the components' rows read it without this file. */

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
