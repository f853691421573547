/* memstats.h -- where the daemon's memory is: the process's resident set by
 * kind, glibc malloc's heap (in use, free inside its arenas, mmapped), the
 * number of malloc arenas and threads; as Prometheus gauges for /metrics,
 * and malloc_info's full XML for the log. */
#ifndef NC_SERVER_MEMSTATS_H
#define NC_SERVER_MEMSTATS_H

#include <stddef.h>

/* Bounds glibc malloc's behaviour for a long-running server; called once at
 * start-up, before any thread is created (memstats.c says why). */
void memstats_tune_malloc(void);

/* Gives the free pages inside malloc's arenas back to the kernel
 * (malloc_trim); returns the seconds it took. */
double memstats_trim(void);

/* Appends the memory gauges to text (a malloc'd exposition, which it
 * reallocates; NULL stays NULL) and a count of the series the whole text
 * holds. Returns the new text; on a failed allocation the old one. */
char *memstats_metrics(char *text);

/* malloc_info(3)'s XML as a malloc'd string (caller frees), or NULL. */
char *memstats_malloc_info(void);

#endif
