/* safetensors.h - reading and writing the safetensors format.
 *
 * The format (as the Hugging Face safetensors library writes it): an 8-byte
 * little-endian header length n, n bytes of JSON
 *   {"__metadata__": {"k": "v", ...},
 *    "name": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...}
 * then the tensors' bytes, row-major, offsets relative to the end of the
 * header. vithost writes F32; it reads F32, F16 and BF16 (converted to f32).
 *
 * The reader checks everything a hostile file could get wrong (header size,
 * JSON syntax, dtypes, shapes vs byte ranges, ranges inside the file,
 * overlaps) and names the file and the tensor in its message.
 */
#ifndef VITHOST_HOST_SAFETENSORS_H
#define VITHOST_HOST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "diag.h"

#define VH_ST_MAX_DIMS 8

typedef struct vh_st_tensor {
    char *name;
    char dtype[8];     /* "F32", "F16", "BF16", ... as in the file */
    int32_t ndim;
    int64_t shape[VH_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* byte range within the data section */
} vh_st_tensor;

typedef struct vh_st_file {
    char *path;
    unsigned char *bytes; /* the whole file */
    size_t size;
    size_t data_start;    /* 8 + header length */
    vh_st_tensor *tensors;
    int count;
    char **meta_keys, **meta_values;
    int meta_count;
} vh_st_file;

vh_status st_read(vh_st_file *out, const char *path, vh_diag *d);
void st_free(vh_st_file *f);
const vh_st_tensor *st_find(const vh_st_file *f, const char *name);
const char *st_meta(const vh_st_file *f, const char *key);
/* Copies a tensor into count f32 values, converting F16/BF16; fails when
 * the tensor's numel differs from count or its dtype is not a float. */
vh_status st_read_f32(const vh_st_file *f, const vh_st_tensor *t, float *out, int64_t count,
                      vh_diag *d);

/* A writer: add tensors (f32 data pointers stay owned by the caller until
 * st_writer_save), then save to path atomically (path.tmp, fsync, rename). */
typedef struct vh_st_entry {
    char *name;
    int32_t ndim;
    int64_t shape[VH_ST_MAX_DIMS];
    const float *data;
} vh_st_entry;

typedef struct vh_st_writer {
    vh_st_entry *entries;
    int count, capacity;
    char **meta_keys, **meta_values;
    int meta_count;
} vh_st_writer;

void st_writer_init(vh_st_writer *w);
vh_status st_writer_add(vh_st_writer *w, const char *name, int32_t ndim, const int64_t *shape,
                        const float *data, vh_diag *d);
vh_status st_writer_meta(vh_st_writer *w, const char *key, const char *value, vh_diag *d);
vh_status st_writer_save(const vh_st_writer *w, const char *path, vh_diag *d);
void st_writer_free(vh_st_writer *w);

#endif
