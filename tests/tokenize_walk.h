/* tokenize_walk.h -- tokenize under every allocation fault, for the suites
 * that check it (test_fault_injection on a white-space model, test_normalize on a
 * model with PTB text conventions). Header-only like harness.h: its CHECKs
 * count in the including test's tally. The caller opts its thread in to
 * fault counting (nc_fault_thread) as its suite does. */
#ifndef NC_TOKENIZE_WALK_H
#define NC_TOKENIZE_WALK_H

#include "fault.h"
#include "harness.h"
#include "tokenizer.h"

/* Fails allocation n = 1, 2, ... of tokenize(m, text) until a run hits no
 * fault (at most max_points): each failed run answers NC_ENOMEM and keeps
 * the token already in the list without appending; the same list then
 * tokenises completely, its new tokens the reference's (ids and offsets).
 * Returns the reference's token count (0 if it could not be made). */
static size_t walk_tokenize_allocations(const nc_model *m, const char *text, long max_points)
{
    char err[NC_ERRLEN] = "";
    nc_tokens ref;
    tokens_init(&ref);
    CHECK(tokenize(m, text, strlen(text), true, &ref, err, sizeof err) == NC_OK && ref.n > 0);
    if (ref.n == 0)
        return 0;
    long n;
    for (n = 1; n <= max_points; n++) {
        nc_tokens t;
        tokens_init(&t);
        CHECK(tokens_push(&t, 0, "x", 1, 0) == NC_OK);   /* already there: must survive */
        nc_fault_arm(NC_FAULT_ALLOC, n, 0);
        int rc = tokenize(m, text, strlen(text), true, &t, err, sizeof err);
        long hits = nc_fault_hits(NC_FAULT_ALLOC);
        nc_fault_disarm();
        if (hits == 0) {
            CHECK(rc == NC_OK && t.n == ref.n + 1);
            tokens_clear(&t);
            break;
        }
        CHECKF(rc == NC_ENOMEM && t.n == 1 && strcmp(t.words[0], "x") == 0,
               "alloc:%ld: rc %d, %zu tokens left", n, rc, t.n);
        /* recovery on the same token list */
        rc = tokenize(m, text, strlen(text), true, &t, err, sizeof err);
        CHECK(rc == NC_OK && t.n == ref.n + 1);
        if (rc == NC_OK && t.n == ref.n + 1)
            CHECK(t.ids[ref.n] == ref.ids[ref.n - 1] && t.offsets[ref.n] == ref.offsets[ref.n - 1]);
        tokens_clear(&t);
    }
    size_t count = ref.n;
    CHECKF(n > (long)count && n <= max_points, "tokenize walk: %ld points for %zu tokens", n - 1, count);
    tokens_clear(&ref);
    return count;
}

#endif
