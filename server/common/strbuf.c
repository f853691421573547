/* strbuf.c -- text of words in a growable buffer (strbuf.h): what the
 * handlers and generation (a domain module) both write. */
#include "strbuf.h"

#include <stdlib.h>
#include <string.h>

int sb_add(strbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            free(b->s);
            b->s = NULL;
            b->len = b->cap = 0;
            b->oom = true;
            return -1;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
    return 0;
}

/* Appends one word as detokenised text; returns the offset it starts at. */
size_t sb_add_word(strbuf *b, const char *word, bool is_eos)
{
    if (is_eos) {
        size_t off = b->len;
        sb_add(b, "\n", 1);
        return off;
    }
    if (b->len > 0 && b->s[b->len - 1] != '\n' && b->s[b->len - 1] != ' ')
        sb_add(b, " ", 1);
    size_t off = b->len;
    sb_add(b, word, strlen(word));
    return off;
}
