/* component_table.h -- THE table of the mixture's components (design §4
 * "Components"): one line per component, in the mixture's order (mixture.h:
 * each step sees the previous result as p_model). Adding a component is its
 * own file, which defines `const nc_component nc_component_<name>`
 * (component.h), plus one line here.
 *
 * C(ID, name, npre, npost)
 *   ID     NC_COMP_<ID>, its index (dist.h): a position in this table
 *   name   the row's symbol nc_component_<name> and the name predict's
 *          "components", the weights and gate.json show
 *   npre   how many gate features it adds before the unbounded search
 *   npost  how many after it (only a component that searches has them)
 * The counts are here, not only in the row, because the gate's arrays are
 * sized at compile time (gate.h); components.c checks them against the
 * rows' feature names. Pure macros: every layer may include it. */
#ifndef NC_COMPONENT_TABLE_H
#define NC_COMPONENT_TABLE_H

#define NC_COMPONENT_TABLE(C)   \
    C(MODEL, model, 2, 0)       \
    C(NEURAL, neural, 6, 0)     \
    C(UNIGRAM, unigram, 0, 0)   \
    C(UNBOUNDED, unbounded, 0, 7) \
    C(UNIFORM, uniform, 0, 0)   \
    NC_TEST_COMPONENTS(C)

/* The test build's components (tests/component/, `make test` builds a
 * daemon with them: the probe tree). One line each: its row, then its
 * knobs as rows of the knob table (cache_knobs.h X), which cache_knobs.h
 * appends like any other's:
 *   T(C, X) C(ID, name, npre, npost) X(knob...) ... */
#ifdef NC_COMPONENT_PROBE
#define NC_TEST_TABLE(C, X) \
    C(BIGRAM, bigram, 1, 0) X(bigram_size, NULL, INT, 0, NC_CACHE_MAX_WINDOW, "0", NULL, "test build: recent-bigram cache ring (pairs), 0 = off") X(bigram_lambda, NULL, FLOAT, 0, 1, "0.1", "bigram_size", "test build: recent-bigram cache weight") \
    C(PROBE, probe, 1, 0) X(probe_mu, NULL, FLOAT_BELOW_MAX, 0, 1, "0", NULL, "test build: weight of the probe component")
#else
#define NC_TEST_TABLE(C, X)
#endif
#define NC_TEST_NO_ROW_(ID, name, npre, npost)
#define NC_TEST_NO_KNOB_(name, alias, type, min, max, def, needs, doc)
#define NC_TEST_COMPONENTS(C) NC_TEST_TABLE(C, NC_TEST_NO_KNOB_)
#define NC_TEST_KNOBS(X) NC_TEST_TABLE(NC_TEST_NO_ROW_, X)

#endif
