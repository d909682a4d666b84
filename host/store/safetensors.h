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
    const unsigned char *bytes; /* the whole file, mapped read-only */
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
/* Elements [offset, offset + count) of a tensor as f32 (a rank's piece of a
 * sharded tensor, read without the rest). */
vh_status st_read_f32_range(const vh_st_file *f, const vh_st_tensor *t, int64_t offset,
                           int64_t count, float *out, vh_diag *d);

/* A writer: add tensors (f32 data pointers stay owned by the caller until
 * st_writer_save), then save to path atomically (path.tmp, fsync, rename);
 * or add names and shapes only and stream the values (below). */
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

/* Streaming, for files bigger than what a rank should hold at once: open
 * writes the header from the writer's names and shapes (data may be NULL),
 * put writes the next tensor's values in the writer's order, close checks
 * that every tensor came, fsyncs and renames path.tmp to path. A failure
 * (and abort) removes path.tmp; path is never left half written. */
typedef struct vh_st_stream {
    const vh_st_writer *w;
    int fd;
    int next;          /* the entry put writes next */
    char *path, *tmp;
} vh_st_stream;

void st_writer_init(vh_st_writer *w);
vh_status st_writer_add(vh_st_writer *w, const char *name, int32_t ndim, const int64_t *shape,
                        const float *data, vh_diag *d);
vh_status st_writer_meta(vh_st_writer *w, const char *key, const char *value, vh_diag *d);
vh_status st_writer_save(const vh_st_writer *w, const char *path, vh_diag *d);
void st_writer_free(vh_st_writer *w);

vh_status st_stream_open(vh_st_stream *s, const vh_st_writer *w, const char *path, vh_diag *d);
vh_status st_stream_put(vh_st_stream *s, const float *data, vh_diag *d);
vh_status st_stream_close(vh_st_stream *s, vh_diag *d);
void st_stream_abort(vh_st_stream *s);

#endif
