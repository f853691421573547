/* suggest.c -- the nearest name to a misspelt one (suggest.h). */
#include "suggest.h"
#include "nc_common.h"

#include <ctype.h>
#include <string.h>

#define SUGGEST_MAX 64
#define SUGGEST_FAR 1000

static int fold(unsigned char c)
{
    return c == '-' ? '_' : tolower(c);
}

static int min3(int a, int b, int c)
{
    int m = a < b ? a : b;
    return m < c ? m : c;
}

int suggest_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n >= SUGGEST_MAX || m >= SUGGEST_MAX)
        return SUGGEST_FAR;
    /* d[i][j]: distance of a[0..i) and b[0..j) */
    int d[SUGGEST_MAX][SUGGEST_MAX];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int same = fold((unsigned char)a[i - 1]) == fold((unsigned char)b[j - 1]);
            d[i][j] = min3(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + !same);
            if (i > 1 && j > 1 && fold((unsigned char)a[i - 1]) == fold((unsigned char)b[j - 2]) &&
                fold((unsigned char)a[i - 2]) == fold((unsigned char)b[j - 1]) && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[n][m];
}

void suggest_init(nc_suggest *s, const char *word)
{
    NC_ASSERT(s, "suggest_init: no s");
    s->word = word;
    s->best = NULL;
    s->best_d = SUGGEST_FAR;
}

void suggest_offer(nc_suggest *s, const char *candidate)
{
    suggest_offer_as(s, candidate, candidate);
}

void suggest_offer_as(nc_suggest *s, const char *candidate, const char *answer)
{
    if (!candidate || !s->word)
        return;
    size_t len = strlen(s->word);
    /* farther than this, a name is another word rather than a misspelling */
    int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    int d = suggest_distance(s->word, candidate);
    if (d <= limit && d < (int)strlen(candidate) && d < s->best_d) {
        s->best = answer;
        s->best_d = d;
    }
}

const char *suggest_best(const nc_suggest *s)
{
    NC_ASSERT(s, "suggest_best: no s");
    return s->best;
}
