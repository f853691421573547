/* safetensors.c -- the safetensors reader shared by the model and the gate. */
#include "safetensors.h"
#include "nc_common.h"
#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#define ST_MAX_HEADER (100u << 20)   /* safetensors' own limit is 100 MB */

/* safetensors dtypes and their element sizes; the model uses F32, F16 and
 * BF16 (dyn-stats' statistics),
 * the gate F64, the others are recognised so their byte ranges can be
 * checked. */
int safetensors_dtype_size(const char *dt)
{
    static const struct { const char *name; int size; } t[] = {
        {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8}, {"U64", 8},
        {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1},
        {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(dt, t[i].name))
            return t[i].size;
    return 0;
}

static int cmp_entry_begin(const void *a, const void *b)
{
    const nc_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Parses and checks one header entry: dtype known, shape non-negative,
 * byte range consistent with dtype x shape and inside the data section. */
static int parse_entry(const char *file, const char *name, json_t *v, size_t datalen, nc_st_tensor *e, char *err,
                       size_t errlen)
{
    e->name = name;
    if (!json_is_object(v))
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s': header entry is not an object", file, name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *of = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s': missing or non-string 'dtype'", file, name);
    e->dtype = json_string_value(dt);
    int dsize = safetensors_dtype_size(e->dtype);
    if (!dsize)
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s' has unknown dtype '%s'", file, name, e->dtype);
    if (!json_is_array(sh) || json_array_size(sh) > 8)
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s': 'shape' must be an array of at most 8 integers",
                        file, name);
    e->rank = (int)json_array_size(sh);
    size_t numel = 1;
    for (int i = 0; i < e->rank; i++) {
        json_t *d = json_array_get(sh, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > (json_int_t)1 << 40)
            return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s': shape[%d] is not a valid dimension", file,
                            name, i);
        e->dims[i] = (long)json_integer_value(d);
        if (__builtin_mul_overflow(numel, (size_t)e->dims[i], &numel))
            return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s': shape overflows", file, name);
    }
    if (!json_is_array(of) || json_array_size(of) != 2 || !json_is_integer(json_array_get(of, 0)) ||
        !json_is_integer(json_array_get(of, 1)))
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s': 'data_offsets' must be [begin, end]", file, name);
    json_int_t b = json_integer_value(json_array_get(of, 0)), en = json_integer_value(json_array_get(of, 1));
    if (b < 0 || en < b)
        return nc_error(err, errlen, NC_EFORMAT, "%s: tensor '%s' has invalid data_offsets [%lld,%lld]", file, name,
                        (long long)b, (long long)en);
    if ((unsigned long long)en > datalen)
        return nc_error(err, errlen, NC_EFORMAT,
                        "%s: tensor '%s' has data_offsets [%lld,%lld] past the end of the data (%zu bytes)", file,
                        name, (long long)b, (long long)en, datalen);
    e->begin = (size_t)b;
    e->end = (size_t)en;
    size_t nbytes;
    if (__builtin_mul_overflow(numel, (size_t)dsize, &nbytes) || nbytes != e->end - e->begin)
        return nc_error(err, errlen, NC_EFORMAT,
                        "%s: tensor '%s': data_offsets [%zu,%zu] span %zu bytes, but %s x %zu elements need %zu",
                        file, name, e->begin, e->end, e->end - e->begin, e->dtype, numel, numel * (size_t)dsize);
    return NC_OK;
}

/* Maps path and locates its header: st->map, maplen, data, datalen. */
static int map_file(nc_safetensors *st, const char *path, uint64_t *hlen, char *err, size_t errlen)
{
    int fd = nc_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return nc_error(err, errlen, errno == ENOENT ? NC_ENOTFOUND : NC_EIO, "%s: cannot open: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return nc_error(err, errlen, NC_EIO, "%s: stat failed: %s", path, strerror(e));
    }
    size_t fsize = (size_t)sb.st_size;
    if (fsize < 8) {
        close(fd);
        return nc_error(err, errlen, NC_EFORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                        path, fsize);
    }
    /* MAP_PRIVATE + PROT_WRITE: F32 tensors are used in place, and a caller
     * that updates weights (fine-tuning) gets private copy-on-write pages
     * instead of a fault or a modified file. */
    void *map = nc_mmap(NULL, fsize, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int merr = errno;
    close(fd);
    if (map == MAP_FAILED)
        return nc_error(err, errlen, NC_EIO, "%s: mmap failed: %s", path, strerror(merr));
    st->map = map;
    st->maplen = fsize;
    const unsigned char *base = map;
    *hlen = 0;
    for (int i = 7; i >= 0; i--)
        *hlen = (*hlen << 8) | base[i];
    if (*hlen > fsize - 8)
        return nc_error(err, errlen, NC_EFORMAT,
                        "%s: header length %llu runs past the end of the file (%zu bytes): truncated or corrupt",
                        path, (unsigned long long)*hlen, fsize);
    if (*hlen > ST_MAX_HEADER)
        return nc_error(err, errlen, NC_EFORMAT, "%s: header length %llu exceeds %u bytes", path,
                        (unsigned long long)*hlen, ST_MAX_HEADER);
    st->data = base + 8 + *hlen;
    st->datalen = fsize - 8 - (size_t)*hlen;
    return NC_OK;
}

/* Overlapping tensors would alias each other's weights. */
static int check_overlaps(const nc_safetensors *st, const char *path, char *err, size_t errlen)
{
    size_t n = st->ntensors;
    nc_st_tensor *sorted = nc_malloc((n + 1) * sizeof *sorted);
    if (!sorted)
        return nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
    memcpy(sorted, st->tensors, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_entry_begin);
    int rc = NC_OK;
    for (size_t i = 1; i < n && rc == NC_OK; i++)
        if (sorted[i].begin < sorted[i - 1].end && sorted[i].end > sorted[i].begin)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: tensors '%s' [%zu,%zu] and '%s' [%zu,%zu] overlap", path,
                          sorted[i - 1].name, sorted[i - 1].begin, sorted[i - 1].end, sorted[i].name,
                          sorted[i].begin, sorted[i].end);
    free(sorted);
    return rc;
}

int safetensors_open(nc_safetensors *st, const char *path, char *err, size_t errlen)
{
    NC_ASSERT(st, "safetensors_open: no st");
    memset(st, 0, sizeof *st);
    uint64_t hlen = 0;
    int rc = map_file(st, path, &hlen, err, errlen);
    json_t *root = NULL;
    if (rc == NC_OK) {
        json_error_t jerr;
        root = json_loadb((const char *)st->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
        st->header = root;
        if (!root)
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: malformed header JSON at byte %d: %s", path, jerr.position,
                          jerr.text);
        else if (!json_is_object(root))
            rc = nc_error(err, errlen, NC_EFORMAT, "%s: header is not a JSON object", path);
        else if (!(st->tensors = nc_zalloc(json_object_size(root) + 1, sizeof *st->tensors)))
            rc = nc_error(err, errlen, NC_ENOMEM, "%s: out of memory", path);
    }
    const char *key;
    json_t *val;
    if (rc == NC_OK) {
        json_object_foreach(root, key, val) {
            if (!strcmp(key, "__metadata__"))
                continue;
            rc = parse_entry(path, key, val, st->datalen, &st->tensors[st->ntensors], err, errlen);
            if (rc != NC_OK)
                break;
            st->ntensors++;
        }
    }
    if (rc == NC_OK)
        rc = check_overlaps(st, path, err, errlen);
    if (rc != NC_OK)
        safetensors_close(st);
    return rc;
}

const nc_st_tensor *safetensors_find(const nc_safetensors *st, const char *name)
{
    NC_ASSERT(st, "safetensors_find: no st");
    for (size_t i = 0; i < st->ntensors; i++)
        if (!strcmp(st->tensors[i].name, name))
            return &st->tensors[i];
    return NULL;
}

void safetensors_keep_map(nc_safetensors *st, void **map, size_t *maplen)
{
    NC_ASSERT(st, "safetensors_keep_map: no st");
    *map = st->map;
    *maplen = st->maplen;
    st->map = NULL;
    st->maplen = 0;
}

void safetensors_close(nc_safetensors *st)
{
    if (!st)
        return;
    free(st->tensors);
    json_decref(st->header);
    if (st->map)
        munmap(st->map, st->maplen);
    memset(st, 0, sizeof *st);
}
