/* strbuf.h -- text of words in a growable buffer: the handlers' answers
 * and generation's text (generate.c, a domain module, below the API). */
#ifndef NC_SERVER_STRBUF_H
#define NC_SERVER_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

/* Text of words: words separated by spaces, eos as a newline (design §3's
 * eos_token ends a line). A growable buffer, always NUL-terminated once
 * anything was added; s == NULL after an allocation failure (oom set). */
typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} strbuf;

int sb_add(strbuf *b, const char *s, size_t n);
/* Appends one word as detokenised text (a space before it unless at the
 * start or after white space; eos_token as "\n"); returns the offset the
 * word (or the newline) starts at. */
size_t sb_add_word(strbuf *b, const char *word, bool is_eos);

#endif
