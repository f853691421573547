/* suggest.h -- "did you mean": the nearest of a set of names to a misspelt
 * one, by edit distance (the CLI's options, a request's fields, the config
 * file's keys and the knob table all offer their names to the same test). */
#ifndef NC_SUGGEST_H
#define NC_SUGGEST_H

/* The restricted Damerau-Levenshtein (optimal string alignment) distance:
 * insertions, deletions, substitutions and swaps of two neighbours cost 1.
 * Letters compare case-insensitively and '-' equals '_', so a JSON name
 * written as a flag (neural-size) is at distance 0 from neural_size. Names
 * longer than 63 bytes are far from everything (returns a large number). */
int suggest_distance(const char *a, const char *b);

/* One search: init with the unknown word, offer every candidate, read the
 * best (NULL when none is near enough: a distance of at most 1 for words of
 * up to 4 characters, 2 up to 8, else 3, and less than the candidate's own
 * length). The first of equally near candidates wins. Borrowed pointers:
 * the result is one of the offered strings. */
typedef struct {
    const char *word;
    const char *best;
    int best_d;
} nc_suggest;

void suggest_init(nc_suggest *s, const char *word);
void suggest_offer(nc_suggest *s, const char *candidate);
/* The same, answering with another name when candidate is nearest (an old
 * alias answers with the current name). */
void suggest_offer_as(nc_suggest *s, const char *candidate, const char *answer);
const char *suggest_best(const nc_suggest *s);

#endif
