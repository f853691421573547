/* fuzz_auth.c -- libFuzzer harness for the API key file parser
 * (server/net/auth.c, auth_parse): arbitrary text must be refused with a message
 * or give a table whose every key is found by its own secret and by no
 * truncation of it, with operations and namespaces as the rules say. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    char err[512] = "";
    auth_table *t = auth_parse((const char *)data, size, err, sizeof err);
    if (!t) {
        if (!err[0])
            abort();
        return 0;
    }
    if (auth_table_count(t) <= 0)
        abort();
    /* Every line that parsed: NAME KEY ...; its key finds it. */
    char *text = malloc(size + 1);
    if (!text)
        abort();
    memcpy(text, data, size);
    text[size] = 0;
    int found = 0;
    for (char *l = text, *next; l; l = next) {
        next = strchr(l, '\n');
        if (next) *next++ = 0;
        char *hash = strchr(l, '#');
        if (hash) *hash = 0;
        char *save = NULL, *name = strtok_r(l, " \t\r", &save), *key = name ? strtok_r(NULL, " \t\r", &save) : NULL;
        if (!key)
            continue;
        const auth_key *k = auth_find(t, key, strlen(key));
        if (!k || strcmp(auth_key_name(k), name) != 0)
            abort();
        if (auth_find(t, key, strlen(key) - 1) == k)
            abort();
        /* "." and ".." are never namespaces, whatever the file says. */
        if (auth_key_allows(k, 0, "..") && !auth_key_allows(k, 0, "some-other-ns"))
            abort();
        found++;
    }
    if (found != auth_table_count(t))
        abort();
    free(text);
    auth_table_free(t);
    return 0;
}
