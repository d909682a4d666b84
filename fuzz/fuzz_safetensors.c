/* fuzz_safetensors.c - the safetensors reader (host/store/safetensors.c).
 *
 * Input: a whole .safetensors file. It is written to a scratch file and read
 * with st_read, as `vithost eval`, `model.pretrained` and --resume read
 * weights. What the reader accepts must hold its promises: every tensor's
 * byte range inside the data, numel matching the shape, names unique, and
 * st_read_f32 able to convert each float tensor.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "safetensors.h"

static char path[4200];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(path, sizeof path, "%s/model.safetensors", fuzz_scratch_dir());
    return 0;
}

static void check_accepted(const vh_st_file *f) {
    uint64_t data_size = f->size - f->data_start;
    fuzz_require(f->data_start >= 8 && f->data_start <= f->size, "data_start outside the file",
                 f->path);
    for (int i = 0; i < f->count; i++) {
        const vh_st_tensor *t = &f->tensors[i];
        fuzz_require(t->name != NULL, "tensor without a name", NULL);
        fuzz_require(t->ndim >= 0 && t->ndim <= VH_ST_MAX_DIMS, "ndim out of range", t->name);
        int64_t numel = 1;
        for (int k = 0; k < t->ndim; k++) {
            fuzz_require(t->shape[k] >= 0, "negative dimension accepted", t->name);
            fuzz_require(t->shape[k] == 0 || numel <= INT64_MAX / t->shape[k],
                         "shape overflows int64 but was accepted", t->name);
            numel *= t->shape[k];
        }
        fuzz_require(numel == t->numel, "numel differs from the shape", t->name);
        fuzz_require(t->begin <= t->end && t->end <= data_size, "byte range outside the data",
                     t->name);
        fuzz_require(st_find(f, t->name) == t, "duplicate tensor name accepted", t->name);
        if (t->numel > 0 && t->numel <= (1 << 20)) {
            float *out = malloc((size_t)t->numel * sizeof *out);
            if (!out) abort();
            vh_diag d = {{0}};
            vh_status st = st_read_f32(f, t, out, t->numel, &d);
            if (st != VH_STATUS_OK) fuzz_require(d.text[0] != '\0', "st_read_f32 silent", t->name);
            free(out);
        }
    }
    for (int i = 0; i < f->meta_count; i++)
        fuzz_require(st_meta(f, f->meta_keys[i]) != NULL, "metadata key not found", NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write_file(fuzz_scratch_dir(), "model.safetensors", data, size);
    vh_st_file f;
    vh_diag d = {{0}};
    vh_status st = st_read(&f, path, &d);
    if (st == VH_STATUS_OK)
        check_accepted(&f);
    else
        fuzz_require(d.text[0] != '\0', "st_read failed without a message", NULL);
    st_free(&f);
    return 0;
}
