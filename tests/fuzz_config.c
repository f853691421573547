/* fuzz_config.c -- libFuzzer harness for the daemon's configuration
 * (server/common/config.c): the first byte picks the INI file reader (libinih +
 * the option table) or the command-line parser (the rest split at NUL bytes
 * into argv). Bad options must be refused with a message naming them; what is
 * accepted must be inside the table's ranges. */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

#ifndef FUZZ_ENTRY
#define FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif

int FUZZ_ENTRY(const uint8_t *data, size_t size);

/* Every numeric option inside [min, max], every string NUL-terminated. */
static void fconfig_check(const nc_server_config *c)
{
    for (const config_option *o = config_options(); o->name; o++) {
        const char *p = (const char *)c + o->offset;
        switch (o->type) {
        case OPT_INT: {
            int v = *(const int *)p;
            if (v < o->min || v > o->max) abort();
            break;
        }
        case OPT_LONG: {
            long v = *(const long *)p;
            if (v < o->min || v > o->max) abort();
            break;
        }
        case OPT_DOUBLE: {
            double v = *(const double *)p;
            if (!isfinite(v) || v < o->min || v > o->max) abort();
            break;
        }
        case OPT_STRING:
            if (!memchr(p, 0, o->size)) abort();
            break;
        case OPT_CACHE_KNOB: {   /* within the knob table's bounds */
            const nc_cache_knob *k = cache_knob_find(o->name);
            double v = cache_knob_get(&c->cache, k);
            if (!k || ((k->type == NC_KNOB_INT || k->type == NC_KNOB_FLOAT) && (v < k->min || v > k->max)))
                abort();
            break;
        }
        default:
            break;
        }
    }
}

static char fconfig_path[256];

static void fconfig_cleanup(void)
{
    unlink(fconfig_path);
}

int FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    nc_server_config c;
    config_defaults(&c);
    char err[2048] = "";
    if (data[0] & 1) {
        if (!fconfig_path[0]) {
            const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
            snprintf(fconfig_path, sizeof fconfig_path, "%s/nc-fuzz-config-%d.ini", base, (int)getpid());
            atexit(fconfig_cleanup);
        }
        int fd = open(fconfig_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || write(fd, data + 1, size - 1) != (ssize_t)(size - 1))
            abort();
        close(fd);
        if (config_load_file(&c, fconfig_path, err, sizeof err) != 0) {
            if (!strstr(err, "config file"))
                abort();
            return 0;
        }
        fconfig_check(&c);
        return 0;
    }
    /* argv from NUL-separated arguments (at most 32). */
    char *buf = malloc(size);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    char *argv[34];
    int argc = 0;
    argv[argc++] = "neurocached";
    for (char *q = buf; q < buf + size - 1 && argc < 33; q += strlen(q) + 1) {
        /* --config would read arbitrary files of the machine: not fuzzed. */
        if (strncmp(q, "--config", 8) == 0)
            continue;
        argv[argc++] = q;
    }
    argv[argc] = NULL;
    int rc = config_from_args(&c, argc, argv, err, sizeof err);
    if (rc == 0)
        fconfig_check(&c);
    else if (rc == -1 && !err[0])
        abort();
    free(buf);
    return 0;
}
