/* slurp.h -- test helper: a file read whole with stdio (independent of the
 * code under test). */
#ifndef NC_TEST_SLURP_H
#define NC_TEST_SLURP_H

#include <stddef.h>

/* The bytes of path, NUL-terminated (malloc'd, caller frees), their count
 * in *len; NULL if the file cannot be opened or read whole. */
char *slurp_file(const char *path, size_t *len);

#endif
