/* fixture.h - golden fixtures written by tests/reference/make_fixtures.py.
 *
 * A fixture holds one model configuration, its parameters, an input batch and
 * what PyTorch computes from them: logits, loss and every parameter's
 * gradient. A C test loads one, runs the plugin on the same parameters and
 * input, and compares tensor by tensor with vh_fixture_compare.
 *
 * File format, version 1 (integers u32 little-endian, data little-endian):
 *
 *   magic      4 bytes   "VHFX"
 *   version    u32       VH_FIXTURE_VERSION
 *   n_config   u32
 *   n_config x { u32 key_len, key bytes, u32 value_len, value bytes }
 *              the value is the YAML text the vit plugin's schema takes
 *              ("dim" -> "48", "classifier" -> "token", "layout" -> "batch_first")
 *   n_tensors  u32
 *   n_tensors x { u32 name_len, name bytes, u32 dtype (0 f32, 1 i32), u32 ndim,
 *                 ndim x u32 dims, prod(dims) x 4 bytes of row-major data }
 *   nothing after the last tensor
 *
 * Tensors, in file order: every parameter under its timm name (state_dict
 * order: cls_token, pos_embed, patch_embed.proj.*, blocks.{i}.*, norm.* or
 * fc_norm.*, head.*), "input" (B, C, H, W) f32 in NCHW whatever the layout,
 * "labels" (B) i32, "logits" (B, classes) f32, "loss" (1) f32, then
 * "grad." + name for every parameter in the same order and shape.
 * The results were computed in float64 from the stored float32 parameters and
 * input, and rounded to float32 once: they are exact to float32 rounding.
 *
 * Config keys: image_height, image_width, channels, patch_size, dim, depth,
 * heads, mlp_dim, num_classes, classifier (token|pooled), layout
 * (batch_first|batch_second), batch, label_smoothing, eps.
 *
 * AMP fixtures (vit_token_bf_amp_bf16) have one more key, autocast ->
 * "bf16": the same format and tensors, the float64 twin's parameters and
 * input, but the results are those of a PyTorch step under
 * torch.autocast("cpu", torch.bfloat16), not exact ones (make_fixtures.py
 * says what ran in bf16).
 *
 * Errors (missing file, bad magic, other version, truncated, trailing bytes,
 * malformed entries) come back as -1 with one line in errbuf; a version
 * mismatch or a damaged file carries VH_FIXTURE_HINT.
 */
#ifndef VITHOST_TESTS_FIXTURE_H
#define VITHOST_TESTS_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VH_FIXTURE_MAGIC "VHFX"
#define VH_FIXTURE_VERSION 1u
#define VH_FIXTURE_MAX_DIMS 8
#define VH_FIXTURE_HINT "HINT: regenerate with /usr/bin/python3 tests/reference/make_fixtures.py"

typedef enum vh_fixture_dtype {
    VH_FIXTURE_DTYPE_F32 = 0,
    VH_FIXTURE_DTYPE_I32 = 1,
} vh_fixture_dtype;

/* One stored tensor; owned by its vh_fixture. */
typedef struct vh_fixture_array {
    const char *name;
    vh_fixture_dtype dtype;
    uint32_t ndim;
    int64_t dims[VH_FIXTURE_MAX_DIMS];
    size_t numel;       /* product of dims (1 for ndim == 0) */
    const void *data;   /* numel elements, aligned for either dtype */
    const float *f32;   /* == data when dtype is F32, else NULL */
    const int32_t *i32; /* == data when dtype is I32, else NULL */
} vh_fixture_array;

typedef struct vh_fixture_kv {
    const char *key;
    const char *value;
} vh_fixture_kv;

/* Filled by vh_fixture_load, released by vh_fixture_free. */
typedef struct vh_fixture {
    char *path;
    uint32_t version;
    size_t config_count;
    vh_fixture_kv *config;       /* file order */
    size_t tensor_count;
    vh_fixture_array *tensors;   /* file order */
} vh_fixture;

/* Reads a fixture. 0 on success; -1 with one line in errbuf (which may be
 * NULL) and *fx zeroed on failure. */
int vh_fixture_load(const char *path, vh_fixture *fx, char *errbuf, size_t errlen);
/* Frees what load allocated and zeroes *fx; safe on a zeroed or freed one. */
void vh_fixture_free(vh_fixture *fx);

/* The config value of key, or NULL when the fixture has none. */
const char *vh_fixture_config(const vh_fixture *fx, const char *key);
/* The value of key read as a whole integer / number: 0, or -1 when the key is
 * missing or its text is not one. */
int vh_fixture_config_int(const vh_fixture *fx, const char *key, int64_t *out);
int vh_fixture_config_double(const vh_fixture *fx, const char *key, double *out);

/* The tensor called name, or NULL. */
const vh_fixture_array *vh_fixture_tensor(const vh_fixture *fx, const char *name);

/* The error metric of every comparison, relative to the tensor's largest
 * entry (robust for gradients, whose entries go through zero):
 *
 *   err = max_i |got[i] - want[i]| / max(max_i |want[i]|, FLT_MIN)
 *
 * computed in double. A NaN or infinity in got or want makes err +infinity;
 * n == 0 gives 0. *where (may be NULL) receives the index of the largest
 * |got[i] - want[i]| (or of the first non-finite value). */
double vh_fixture_error(const float *got, const float *want, size_t n, size_t *where);

/* true when vh_fixture_error(got, want, n) <= rel_tol. Writes one line to
 * report (may be NULL), e.g.
 *   "logits: ok   err 3.1e-07 <= tol 1.0e-05 (at [5] got 0.1234 want 0.1234, max|want| 0.32)"
 *   "grad.head.bias: FAIL err 2.0e-02 > tol 1.0e-04 (at [3] got ... want ..., max|want| ...)" */
bool vh_fixture_compare(const char *name, const float *got, const float *want, size_t n,
                        double rel_tol, char *report, size_t len);

#ifdef __cplusplus
}
#endif
#endif
