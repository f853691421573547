/* report.c -- what the commands measure and draw (report.h): the clocks
 * behind every tokens/s and tokens/CPU-s figure, and gnuplot for the
 * PNGs of eval's sweeps and tune's heat map. */
#include "report.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include "nc_common.h"

double co_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

int co_gnuplot(const char *script, char *err, size_t errlen)
{
    FILE *g = popen("gnuplot 2>&1", "w");
    if (!g)
        return nc_error(err, errlen, NC_EIO, "cannot run gnuplot: %s", strerror(errno));
    fputs(script, g);
    int st = pclose(g);
    if (st != 0)
        return nc_error(err, errlen, NC_EIO, "gnuplot failed (status %d; is gnuplot installed? apt-get install gnuplot-nox, or make deps-test)", st);
    return NC_OK;
}
