/* cache.h -- the umbrella header of the caches: including it gives the whole
 * cache API (for the programs on top of core; core's own files include the
 * headers they use, so that no core header includes this one). Design §3-§5.
 *
 *   cache_params.h     the settings (nc_cache_params) from the knob table
 *
 *   unigram_cache.h    unigram cache: window counts and its term p_uni
 *   neural_cache.h     neural cache: ring buffer (keys f32 or f16) and its terms
 *   wordtable.h        thread-safe open-vocabulary word table (ids >= V)
 *   unbounded_cache.h  unbounded cache: FAISS index + values + word table, per namespace
 *   dist.h             a next-word distribution with its components' shares
 *   mix_input.h        what the formulas read at one position (nc_mix_input)
 *   mixture.h          design §4's mixture of the terms: full distribution and target-only
 *   doc.h              a prepared document and its batched causal scoring
 *   stream.h           the per-stream predictor (a session): state + local caches
 */
#ifndef NC_CACHE_H
#define NC_CACHE_H

#include "nc_common.h"
#include "model.h"
#include "tokenizer.h"
#include "lstm.h"
#include "cache_params.h"

#include "unigram_cache.h"
#include "neural_cache.h"
#include "wordtable.h"
#include "mixture.h"
#include "doc.h"
#include "stream.h"

#endif
