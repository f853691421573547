/* memstats.c -- where the daemon's memory is (memstats.h): /proc/self and
 * glibc malloc's own accounting, read at a scrape of /metrics. */
#include "memstats.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"

void memstats_tune_malloc(void)
{
    /* glibc raises its mmap threshold to the size of every mmapped block
     * that is freed (up to 32 MB), so after the first large free, blocks of
     * up to that size come from the arenas instead: the unbounded caches'
     * index and value arrays grow by doubling (FAISS's std::vector), and
     * their freed generations of a few MB each stay in the arenas as holes
     * that later, smaller allocations pin. Setting the threshold fixes it
     * (it turns the dynamic adjustment off): every block of 256 kB or more
     * is its own mapping, returned to the kernel when freed. The trim
     * threshold likewise stays at its value, so the main arena's top is
     * given back instead of being kept to the largest free seen. */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
    /* One arena a core, not glibc's eight (16 here for 26 threads): each
     * arena keeps free memory resident -- malloc_trim returns the main
     * arena's top and the free pages inside every arena, not a thread
     * arena's top (14.8 MB of the soak's 16 arenas' free memory at the end
     * of 600 s) -- and more arenas than cores buy no parallel allocation.
     * One soak each: 6.1 and 8.6 MB held free and resident with 2 arenas
     * against 9.4 and 11.3 with 16 (docs/memory.md). MALLOC_ARENA_MAX,
     * when set, wins. */
    if (!getenv("MALLOC_ARENA_MAX")) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        mallopt(M_ARENA_MAX, cores < 2 ? 2 : (int)cores);
    }
}

double memstats_trim(void)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    /* glibc's malloc_trim walks every arena and madvises away the whole
     * pages of its free chunks, not only the top: the holes that requests
     * of many threads leave between live blocks */
    malloc_trim(0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}

/* One "Name:   N kB" line of /proc/self/status, in bytes (-1 = absent). */
static long long status_field(const char *text, const char *name)
{
    const char *p = strstr(text, name);
    if (!p)
        return -1;
    return atoll(p + strlen(name)) * (strstr(p, "kB") ? 1024LL : 1LL);
}

char *memstats_malloc_info(void)
{
    char *xml = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&xml, &len);
    if (!f)
        return NULL;
    malloc_info(0, f);
    fclose(f);
    return xml;
}

/* Arenas malloc_info describes ("<heap nr=" once per arena). */
static int count_arenas(void)
{
    char *xml = memstats_malloc_info();
    int n = 0;
    for (const char *p = xml; p && (p = strstr(p, "<heap nr=")); p++)
        n++;
    free(xml);
    return n;
}

/* Series of an exposition: its lines that are not comments. */
static long count_series(const char *text)
{
    long n = 0;
    for (const char *p = text; p && *p;) {
        if (*p != '#' && *p != '\n')
            n++;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return n;
}

char *memstats_metrics(char *text)
{
    if (!text)
        return NULL;
    metrics_text b = {text, strlen(text), strlen(text) + 1, 0};
    char st[4096] = "";
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        size_t n = fread(st, 1, sizeof st - 1, f);
        st[n] = 0;
        fclose(f);
    }
    metrics_printf(&b, "# HELP neurocache_process_resident_bytes Resident memory of the process, by kind "
                       "(/proc/self/status RssAnon, RssFile, RssShmem).\n"
                       "# TYPE neurocache_process_resident_bytes gauge\n"
                       "neurocache_process_resident_bytes{kind=\"anon\"} %lld\n"
                       "neurocache_process_resident_bytes{kind=\"file\"} %lld\n"
                       "neurocache_process_resident_bytes{kind=\"shmem\"} %lld\n",
                   status_field(st, "RssAnon:"), status_field(st, "RssFile:"), status_field(st, "RssShmem:"));
    metrics_printf(&b, "# HELP neurocache_process_threads Threads of the process.\n"
                       "# TYPE neurocache_process_threads gauge\nneurocache_process_threads %lld\n",
                   status_field(st, "Threads:"));
    /* mallinfo2: arena = bytes the arenas took from the system (not
     * mmapped blocks), uordblks of it in use, fordblks free inside them
     * (fragmentation when it grows), hblkhd = blocks mmapped on their own. */
    struct mallinfo2 mi = mallinfo2();
    metrics_printf(&b, "# HELP neurocache_malloc_bytes glibc malloc: bytes in use and free inside its arenas, "
                       "and in blocks mmapped on their own.\n"
                       "# TYPE neurocache_malloc_bytes gauge\n"
                       "neurocache_malloc_bytes{state=\"arena_in_use\"} %zu\n"
                       "neurocache_malloc_bytes{state=\"arena_free\"} %zu\n"
                       "neurocache_malloc_bytes{state=\"mmapped\"} %zu\n",
                   mi.uordblks, mi.fordblks, mi.hblkhd);
    metrics_printf(&b, "# HELP neurocache_malloc_arenas glibc malloc arenas.\n"
                       "# TYPE neurocache_malloc_arenas gauge\nneurocache_malloc_arenas %d\n", count_arenas());
    /* the line below is one more series */
    metrics_printf(&b, "# HELP neurocache_metrics_series Series in this exposition (label sets that grow "
                       "without bound would show here).\n"
                       "# TYPE neurocache_metrics_series gauge\nneurocache_metrics_series %ld\n",
                   count_series(b.s) + 1);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
