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

/* The caches among the rows: a row that keeps pairs -- a session's state
 * (its `push`) or a searched store (`searched`) -- as opposed to a term
 * computed from the model alone (the model's own, the open vocabulary's
 * uniform term). The table eval prints and the stages tune runs are over
 * these. */
bool cache_row_remembers(int comp);
/* The caches of p that are on (components_on masked to the caches): bit c
 * for row c. */
unsigned cache_params_caches_on(const nc_cache_params *p);
/* Every knob the row comp owns (its `knobs`) back to its default: the row
 * is then off, whatever the others say. */
void cache_params_row_off(nc_cache_params *p, int comp);
/* Every knob the row comp owns copied from src. */
void cache_params_row_copy(nc_cache_params *dst, const nc_cache_params *src, int comp);
/* p with every cache off (cache_params_row_off on each): the static model,
 * with what applies to every cache setting kept (open vocabulary, gate,
 * dynamic evaluation). */
void cache_params_caches_off(nc_cache_params *p);
/* A knob as a switch: its value is above 0 (a size, a rate, a true BOOL). */
bool cache_knob_on(const nc_cache_params *p, const nc_cache_knob *k);
/* A knob that counts in p: a switch (a knob that needs none) or a BOOL
 * when on, any other when every knob it needs, in turn, is on
 * (neural_alpha: global_norm and neural_size). */
bool cache_knob_in_effect(const nc_cache_params *p, const nc_cache_knob *k);

/* The rows cache_params_describe (and tune's options line) write in their
 * own words; any other row is written from its knobs in effect. */
bool cache_row_described_by_hand(int comp);

/* One line "neural N=2000 theta=0.3 lambda=0.1 unigram N=..." describing
 * what is on (for logs, CLI tables), "static" when nothing is. Returns buf. */
const char *cache_params_describe(const nc_cache_params *p, char *buf, size_t len);

#endif
