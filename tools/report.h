/* report.h -- what the commands measure and draw (report.c): clocks and
 * gnuplot. */
#ifndef NC_REPORT_H
#define NC_REPORT_H

#include <stddef.h>

/* CPU seconds used by the process so far (all threads). */
double co_cpu(void);

/* Runs gnuplot on script (a whole program, ending with the plot command).
 * NC_EIO with the reason if gnuplot is missing or fails. */
int co_gnuplot(const char *script, char *err, size_t errlen);

#endif
