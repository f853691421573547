/* safetensors.h -- the one reader of safetensors files (model.safetensors,
 * gate.safetensors): maps the file, parses and checks the header, and lists
 * the tensors; the caller checks names, dtypes and shapes against what it
 * expects and reads the bytes.
 *
 *     nc_safetensors st;
 *     rc = safetensors_open(&st, path, err, errlen);
 *     const nc_st_tensor *t = safetensors_find(&st, "decoder.bias");
 *     ... st.data + t->begin, t->end - t->begin bytes, little-endian ...
 *     safetensors_close(&st);
 *
 * Checked here, in order: the 8-byte header length against the file (and
 * safetensors' own 100 MB limit), the header is a JSON object without
 * duplicate keys, each entry's dtype is known, its shape is non-negative and
 * does not overflow, its data_offsets lie in the data section and span
 * exactly dtype size x elements, and no two tensors overlap. "__metadata__"
 * is skipped. Messages start with the path: "<path>: tensor 'x' has ...". */
#ifndef NC_SAFETENSORS_H
#define NC_SAFETENSORS_H

#include <stddef.h>

typedef struct {
    const char *name;             /* borrowed from the header: valid until close */
    const char *dtype;            /* "F32", "F16", "F64", ... (borrowed) */
    int rank;
    long dims[8];
    size_t begin, end;            /* byte range in the data section */
} nc_st_tensor;

typedef struct {
    void *map;                    /* the file, mmapped MAP_PRIVATE read-write:
                                   * a caller may use tensors in place and
                                   * write to them (copy-on-write pages) */
    size_t maplen;
    const unsigned char *data;    /* the data section, datalen bytes */
    size_t datalen;
    nc_st_tensor *tensors;        /* in header order */
    size_t ntensors;
    void *header;                 /* the parsed header (json_t), owns the names */
} nc_safetensors;

/* Opens and checks path (see above). NC_OK with st filled; NC_ENOTFOUND for
 * a missing file, NC_EIO for an open/stat/mmap failure, NC_EFORMAT for a
 * malformed file, NC_ENOMEM; on failure st holds nothing to close. */
int safetensors_open(nc_safetensors *st, const char *path, char *err, size_t errlen);
/* The tensor called name, or NULL. */
const nc_st_tensor *safetensors_find(const nc_safetensors *st, const char *name);
/* Hands the mapping to the caller (who munmaps map, maplen): tensors used in
 * place outlive the close. */
void safetensors_keep_map(nc_safetensors *st, void **map, size_t *maplen);
/* Frees the header and list and unmaps the file unless kept. NULL-safe. */
void safetensors_close(nc_safetensors *st);
/* Element size of a safetensors dtype in bytes, 0 for an unknown one. */
int safetensors_dtype_size(const char *dtype);

#endif
