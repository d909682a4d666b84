/* dnnl_engine.c - every oneDNN call of vithost (oneDNN 2.x C API, Debian 12's
 * libdnnl 2.6). See dnnl_engine.h for the operation; here is how it runs.
 *
 * - One CPU engine for the process (oneDNN engines are thread-safe).
 * - Per thread: a stream and a table of up to CACHE_SIZE matmul primitives,
 *   keyed by the whole vh_dnnl_matmul description (shape, strides, dtypes,
 *   alpha, post-ops), each with its memory objects, whose data handles are
 *   set at every call. Creating a primitive costs 0.1-1 ms, executing a small
 *   one a few microseconds, so the table is what makes per-layer calls cheap;
 *   a full table evicts its least recently used entry. Per thread because a
 *   oneDNN stream and memory objects must not be used by two threads at once
 *   (ranks on threads in the tests), and so no lock is ever taken.
 * - Scratchpad in user mode, from our per-thread scratch arena: oneDNN's
 *   library-mode scratchpad is shared between primitives and not safe for
 *   concurrent execution in its default build, and ours allocates nothing in
 *   steady state.
 * - The implementation is oneDNN's first choice, or its gemm driver where the
 *   description asks for it (vh_dnnl_kernel): the primitive-descriptor
 *   iterator walks oneDNN's list to it.
 * - B packed once for many calls (vh_dnnl_matmul_pack_b): a "query" entry
 *   per plain description holds its kernel's B layout (weights "any") and
 *   the reorder into it; descriptions with b_layout set take that layout
 *   and check its fingerprint when created, so B packed for another kernel
 *   (another shape or thread count) is refused, never misread.
 * - A description oneDNN cannot implement, or can only with its reference
 *   (scalar) implementation, is remembered as unsupported and reported to the
 *   caller, which then takes a plain-f32 route.
 * - Threads: Debian's libdnnl uses OpenMP (libgomp), the same pool as our
 *   `omp` loops; a matmul issued outside a parallel region uses all of it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "dnnl_engine.h"

#define CACHE_SIZE 256
#define MAX_DIMS (VH_DNNL_MAX_BATCH_DIMS + 2)

enum { MEM_A, MEM_B, MEM_BIAS, MEM_C, MEM_AUX, MEM_RESIDUAL, MEM_SCRATCH, MEM_COUNT };
enum { PACK_FROM, PACK_TO, PACK_SCRATCH, PACK_COUNT };

/* The b_layout of the entry that answers vh_dnnl_matmul_packed_b_bytes and
 * runs vh_dnnl_matmul_pack_b: the kernel's B layout, and the reorder into
 * it, with no matmul primitive. A fingerprint is never this value. */
#define B_LAYOUT_QUERY UINT64_MAX

typedef struct entry {
    vh_dnnl_matmul key;
    uint64_t hash;
    uint64_t last_use; /* 0: empty slot */
    int unsupported;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[MEM_COUNT];
    size_t scratch_bytes;
    /* key.b_layout == B_LAYOUT_QUERY: the kernel's B layout (its
     * fingerprint; packed_bytes 0 where it is B's plain one) and the reorder
     * from plain B into it */
    uint64_t layout;
    size_t packed_bytes;
    dnnl_primitive_t reorder;
    dnnl_memory_t pack[PACK_COUNT];
    size_t pack_scratch_bytes;
} entry;

typedef struct thread_cache {
    dnnl_stream_t stream;
    uint64_t tick;
    uint64_t created;
    entry entries[CACHE_SIZE];
} thread_cache;

static dnnl_engine_t g_engine;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;

/* Destroys the entry's oneDNN objects; the key stays. */
static void entry_release(entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim), e->prim = NULL;
    for (int i = 0; i < MEM_COUNT; i++)
        if (e->mem[i]) dnnl_memory_destroy(e->mem[i]), e->mem[i] = NULL;
    if (e->reorder) dnnl_primitive_destroy(e->reorder), e->reorder = NULL;
    for (int i = 0; i < PACK_COUNT; i++)
        if (e->pack[i]) dnnl_memory_destroy(e->pack[i]), e->pack[i] = NULL;
}

static void entry_clear(entry *e) {
    entry_release(e);
    memset(e, 0, sizeof *e);
}

static void cache_free(void *p) {
    thread_cache *tc = p;
    if (!tc) return;
    for (int i = 0; i < CACHE_SIZE; i++) entry_clear(&tc->entries[i]);
    if (tc->stream) dnnl_stream_destroy(tc->stream);
    free(tc);
}

static void global_init(void) {
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) g_engine = NULL;
    (void)pthread_key_create(&g_key, cache_free);
}

static thread_cache *this_cache(void) {
    static _Thread_local thread_cache *cached;
    if (cached) return cached;
    pthread_once(&g_once, global_init);
    if (!g_engine) return NULL;
    thread_cache *tc = calloc(1, sizeof *tc);
    if (!tc) return NULL;
    if (dnnl_stream_create(&tc->stream, g_engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(g_key, tc) != 0) {
        if (tc->stream) dnnl_stream_destroy(tc->stream);
        free(tc);
        return NULL;
    }
    cached = tc;
    return tc;
}

void vh_dnnl_matmul_init(vh_dnnl_matmul *mm) { memset(mm, 0, sizeof *mm); }

static dnnl_data_type_t dt_of(vh_dtype t) {
    switch (t) {
    case VH_DTYPE_BF16: return dnnl_bf16;
    case VH_DTYPE_F16: return dnnl_f16;
    default: return dnnl_f32;
    }
}

/* FNV-1a over n bytes, from h (FNV_OFFSET to start). */
#define FNV_OFFSET 1469598103934665603ull

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_of(const vh_dnnl_matmul *mm) { return fnv1a(FNV_OFFSET, mm, sizeof *mm); }

/* A plain strided descriptor: batch dims then the two matrix dims. A batch
 * stride of 0 makes that dim 1 (broadcast). */
static int md_init(dnnl_memory_desc_t *md, const vh_dnnl_matmul *mm, int64_t rows,
                   int64_t cols, const int64_t *strides, vh_dtype t) {
    dnnl_dims_t dims, st;
    const int nb = mm->batch_dims;
    for (int i = 0; i < nb; i++) {
        dims[i] = strides[i] == 0 ? 1 : mm->batch[i];
        st[i] = strides[i];
    }
    dims[nb] = rows;
    dims[nb + 1] = cols;
    st[nb] = strides[nb];
    st[nb + 1] = strides[nb + 1];
    /* oneDNN wants a stride for a dim of size 1 that keeps the layout legal:
     * any value works; use the next dim's extent. */
    for (int i = 0; i < nb; i++)
        if (dims[i] == 1 && st[i] == 0) st[i] = rows * cols;
    return dnnl_memory_desc_init_by_strides(md, nb + 2, dims, dt_of(t), st) == dnnl_success;
}

/* A fingerprint of a memory layout (oneDNN 2.x's descriptor is a public
 * struct; its padding bytes are not defined, so field by field). */
static uint64_t mix(uint64_t h, int64_t v) { return fnv1a(h, &v, sizeof v); }

static uint64_t layout_of(const dnnl_memory_desc_t *md) {
    uint64_t h = FNV_OFFSET;
    h = mix(h, md->ndims), h = mix(h, md->data_type), h = mix(h, md->format_kind);
    h = mix(h, md->offset0), h = mix(h, (int64_t)md->extra.flags);
    for (int i = 0; i < md->ndims; i++)
        h = mix(mix(mix(h, md->dims[i]), md->padded_dims[i]), md->padded_offsets[i]);
    if (md->format_kind == dnnl_blocked) {
        const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
        for (int i = 0; i < md->ndims; i++) h = mix(h, b->strides[i]);
        h = mix(h, b->inner_nblks);
        for (int i = 0; i < b->inner_nblks; i++) h = mix(mix(h, b->inner_blks[i]), b->inner_idxs[i]);
    }
    return h == 0 || h == B_LAYOUT_QUERY ? 1 : h;
}

/* The query entry's reorder from B as given (plain) into the kernel's
 * layout `to`. */
static int create_reorder(entry *e, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ==
                 dnnl_success &&
             dnnl_reorder_primitive_desc_create(&pd, from, g_engine, to, g_engine, attr) ==
                 dnnl_success &&
             dnnl_primitive_create(&e->reorder, pd) == dnnl_success;
    if (ok) {
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->pack_scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        ok = dnnl_memory_create(&e->pack[PACK_FROM], from, g_engine, DNNL_MEMORY_NONE) ==
                 dnnl_success &&
             dnnl_memory_create(&e->pack[PACK_TO], to, g_engine, DNNL_MEMORY_NONE) ==
                 dnnl_success &&
             (!e->pack_scratch_bytes ||
              dnnl_memory_create(&e->pack[PACK_SCRATCH], sp, g_engine, DNNL_MEMORY_NONE) ==
                  dnnl_success);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok;
}

/* The gemm implementation of a matmul ("gemm:jit"), or NULL when oneDNN
 * has none for it. */
static dnnl_primitive_desc_t gemm_kernel(const dnnl_matmul_desc_t *desc,
                                         const_dnnl_primitive_attr_t attr) {
    dnnl_primitive_desc_iterator_t it = NULL;
    dnnl_primitive_desc_t found = NULL;
    if (dnnl_primitive_desc_iterator_create(&it, desc, attr, g_engine, NULL) != dnnl_success)
        return NULL;
    do {
        dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
        const char *impl = NULL;
        if (pd && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) ==
                      dnnl_success && impl && strncmp(impl, "gemm", 4) == 0) {
            found = pd;
            break;
        }
        if (pd) dnnl_primitive_desc_destroy(pd);
    } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    return found;
}

static int create(entry *e) {
    const vh_dnnl_matmul *mm = &e->key;
    const int nb = mm->batch_dims;
    dnnl_memory_desc_t a, b, c, bias;
    if (!md_init(&a, mm, mm->m, mm->k, mm->sa, mm->ab_dtype) ||
        !md_init(&b, mm, mm->k, mm->n, mm->sb, mm->ab_dtype) ||
        !md_init(&c, mm, mm->m, mm->n, mm->sc, mm->c_dtype))
        return 0;
    if (mm->has_bias) {
        dnnl_dims_t dims, st;
        for (int i = 0; i < nb + 1; i++) dims[i] = 1, st[i] = mm->n;
        dims[nb + 1] = mm->n;
        st[nb + 1] = 1;
        if (dnnl_memory_desc_init_by_strides(&bias, nb + 2, dims, dnnl_f32, st) != dnnl_success)
            return 0;
    }

    /* oneDNN 2.x scales after the bias, alpha (A B + bias): not ours. */
    if (mm->has_bias && mm->alpha != 1.0f) return 0;
    /* Packed B: the kernel's choice of layout ("any"), unbatched only. */
    const int packed = mm->b_layout != 0;
    dnnl_memory_desc_t b_any;
    if (packed) {
        const dnnl_dims_t dims = {mm->k, mm->n};
        if (nb != 0 ||
            dnnl_memory_desc_init_by_tag(&b_any, 2, dims, dt_of(mm->ab_dtype),
                                         dnnl_format_tag_any) != dnnl_success)
            return 0;
    }
    dnnl_matmul_desc_t desc;
    if (dnnl_matmul_desc_init(&desc, &a, packed ? &b_any : &b, mm->has_bias ? &bias : NULL,
                              &c) != dnnl_success)
        return 0;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ==
                 dnnl_success &&
             dnnl_post_ops_create(&po) == dnnl_success;
    if (ok && mm->alpha != 1.0f)
        ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &mm->alpha) == dnnl_success;
    if (ok && mm->gelu && mm->mul_aux) ok = 0; /* one or the other: post-op 0 */
    if (ok && mm->gelu) {
        /* v2.x's eltwise post-op has a scale argument (gone in 3.x). */
        ok = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_erf, 0.0f, 0.0f) ==
             dnnl_success;
    }
    /* ABI 2.5's VH_EPILOGUE_MUL_AUX: the GELU's derivative applied while a
     * block of C is in cache, as the residual below. */
    if (ok && mm->mul_aux)
        ok = dnnl_post_ops_append_binary(po, dnnl_binary_mul, &c) == dnnl_success;
    /* The residual is read in the epilogue of each block of C while it is in
     * cache (gemm:jit's post-processing), where a copy into C before the
     * matmul (and the sum post-op) costs two more passes over memory. */
    if (ok && mm->residual)
        ok = dnnl_post_ops_append_binary(po, dnnl_binary_add, &c) == dnnl_success;
    if (ok && mm->sum != 0.0f) ok = dnnl_post_ops_append_sum(po, mm->sum) == dnnl_success;
    if (ok) ok = dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (ok && mm->kernel == VH_DNNL_KERNEL_GEMM) pd = gemm_kernel(&desc, attr);
    if (ok && !pd)
        ok = dnnl_primitive_desc_create(&pd, &desc, attr, g_engine, NULL) == dnnl_success;
    if (ok) {
        /* The reference implementation is scalar: slower than converting. */
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
            !impl || strncmp(impl, "ref", 3) == 0)
            ok = 0;
    }
    const dnnl_memory_desc_t *b_md = &b;
    const int query = mm->b_layout == B_LAYOUT_QUERY; /* runs no matmul */
    if (ok && packed) {
        b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        ok = b_md != NULL;
        if (ok && query) {
            /* brgemm only: it copies a plain B into these blocks itself, so
             * that packed and plain run the same sums. gemm:jit packs its own
             * panels; its "any" merely transposes B, which changes its order
             * of summation (seen on AVX2). */
            const char *impl = NULL;
            const int brgemm =
                dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) ==
                    dnnl_success &&
                impl && strncmp(impl, "brg", 3) == 0;
            e->layout = layout_of(b_md);
            if (brgemm && !dnnl_memory_desc_equal(b_md, &b)) {
                e->packed_bytes = dnnl_memory_desc_get_size(b_md);
                ok = create_reorder(e, &b, b_md);
            }
        } else if (ok && layout_of(b_md) != mm->b_layout) {
            ok = 0; /* packed for another kernel's layout (another shape, or thread count) */
        }
    }
    if (ok && !query) ok = dnnl_primitive_create(&e->prim, pd) == dnnl_success;
    if (ok && !query) {
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        ok = dnnl_memory_create(&e->mem[MEM_A], &a, g_engine, DNNL_MEMORY_NONE) == dnnl_success &&
             dnnl_memory_create(&e->mem[MEM_B], b_md, g_engine, DNNL_MEMORY_NONE) == dnnl_success &&
             dnnl_memory_create(&e->mem[MEM_C], &c, g_engine, DNNL_MEMORY_NONE) == dnnl_success;
        if (ok && mm->has_bias)
            ok = dnnl_memory_create(&e->mem[MEM_BIAS], &bias, g_engine, DNNL_MEMORY_NONE) ==
                 dnnl_success;
        if (ok && mm->mul_aux)
            ok = dnnl_memory_create(&e->mem[MEM_AUX], &c, g_engine, DNNL_MEMORY_NONE) ==
                 dnnl_success;
        if (ok && mm->residual)
            ok = dnnl_memory_create(&e->mem[MEM_RESIDUAL], &c, g_engine, DNNL_MEMORY_NONE) ==
                 dnnl_success;
        if (ok && e->scratch_bytes)
            ok = dnnl_memory_create(&e->mem[MEM_SCRATCH], sp, g_engine, DNNL_MEMORY_NONE) ==
                 dnnl_success;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok;
}

static entry *lookup(thread_cache *tc, const vh_dnnl_matmul *mm) {
    const uint64_t h = hash_of(mm);
    entry *oldest = &tc->entries[0];
    for (int i = 0; i < CACHE_SIZE; i++) {
        entry *e = &tc->entries[i];
        if (e->last_use && e->hash == h && memcmp(&e->key, mm, sizeof *mm) == 0) {
            e->last_use = ++tc->tick;
            return e;
        }
        if (e->last_use < oldest->last_use) oldest = e;
    }
    entry_clear(oldest);
    memcpy(&oldest->key, mm, sizeof *mm);
    oldest->hash = h;
    oldest->last_use = ++tc->tick;
    tc->created++;
    if (!create(oldest)) {
        entry_release(oldest);
        oldest->unsupported = 1;
    }
    return oldest;
}

vh_status vh_dnnl_matmul_run(const vh_dnnl_matmul *mm, const void *a, const void *b,
                             const float *bias, void *c) {
    return vh_dnnl_matmul_run_binary(mm, a, b, bias, NULL, NULL, c);
}

vh_status vh_dnnl_matmul_run_binary(const vh_dnnl_matmul *mm, const void *a, const void *b,
                                    const float *bias, const void *aux, const void *residual,
                                    void *c) {
    if ((mm->residual && !residual) || (mm->mul_aux && !aux) || mm->b_layout == B_LAYOUT_QUERY)
        return VH_STATUS_ERR_INVALID_ARG;
    thread_cache *tc = this_cache();
    if (!tc) return VH_STATUS_ERR_UNSUPPORTED;
    entry *e = lookup(tc, mm);
    if (e->unsupported) return VH_STATUS_ERR_UNSUPPORTED;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    void *scratch = NULL;
    if (e->scratch_bytes) {
        scratch = vh_cpu_scratch_alloc(e->scratch_bytes);
        if (!scratch) {
            vh_cpu_scratch_end(mark);
            return VH_STATUS_ERR_NOMEM;
        }
    }
    dnnl_exec_arg_t args[MEM_COUNT];
    int n = 0;
    /* oneDNN never writes through its source handles; its API is not const. */
    dnnl_memory_set_data_handle(e->mem[MEM_A], (void *)(uintptr_t)a);
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, e->mem[MEM_A]};
    dnnl_memory_set_data_handle(e->mem[MEM_B], (void *)(uintptr_t)b);
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, e->mem[MEM_B]};
    dnnl_memory_set_data_handle(e->mem[MEM_C], c);
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, e->mem[MEM_C]};
    if (mm->has_bias) {
        dnnl_memory_set_data_handle(e->mem[MEM_BIAS], (void *)(uintptr_t)bias);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->mem[MEM_BIAS]};
    }
    if (mm->mul_aux) { /* post-op 0 */
        dnnl_memory_set_data_handle(e->mem[MEM_AUX], (void *)(uintptr_t)aux);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                                      e->mem[MEM_AUX]};
    }
    if (mm->residual) {
        /* the binary post-op's operand: its index in the chain (after gelu or mul) */
        dnnl_memory_set_data_handle(e->mem[MEM_RESIDUAL], (void *)(uintptr_t)residual);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(mm->gelu || mm->mul_aux ? 1 : 0) |
                                          DNNL_ARG_SRC_1,
                                      e->mem[MEM_RESIDUAL]};
    }
    if (scratch) {
        dnnl_memory_set_data_handle(e->mem[MEM_SCRATCH], scratch);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->mem[MEM_SCRATCH]};
    }
    dnnl_status_t st = dnnl_primitive_execute(e->prim, tc->stream, n, args);
    if (st == dnnl_success) st = dnnl_stream_wait(tc->stream);
    vh_cpu_scratch_end(mark);
    return st == dnnl_success ? VH_STATUS_OK : VH_STATUS_ERR_DEVICE;
}

/* The query entry of plain description mm (NULL: no packing for it). */
static entry *query_entry(thread_cache *tc, const vh_dnnl_matmul *mm) {
    if (!tc || mm->b_layout != 0) return NULL;
    vh_dnnl_matmul q = *mm;
    q.b_layout = B_LAYOUT_QUERY;
    entry *e = lookup(tc, &q);
    return e->unsupported || !e->packed_bytes ? NULL : e;
}

size_t vh_dnnl_matmul_packed_b_bytes(const vh_dnnl_matmul *mm) {
    const entry *e = query_entry(this_cache(), mm);
    return e ? e->packed_bytes : 0;
}

vh_status vh_dnnl_matmul_pack_b(const vh_dnnl_matmul *mm, const void *b, void *packed,
                                uint64_t *layout) {
    thread_cache *tc = this_cache();
    entry *e = query_entry(tc, mm);
    if (!e) return VH_STATUS_ERR_UNSUPPORTED;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    void *scratch = e->pack_scratch_bytes ? vh_cpu_scratch_alloc(e->pack_scratch_bytes) : NULL;
    if (e->pack_scratch_bytes && !scratch) {
        vh_cpu_scratch_end(mark);
        return VH_STATUS_ERR_NOMEM;
    }
    dnnl_memory_set_data_handle(e->pack[PACK_FROM], (void *)(uintptr_t)b);
    dnnl_memory_set_data_handle(e->pack[PACK_TO], packed);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, e->pack[PACK_FROM]},
                               {DNNL_ARG_TO, e->pack[PACK_TO]},
                               {DNNL_ARG_SCRATCHPAD, e->pack[PACK_SCRATCH]}};
    if (scratch) dnnl_memory_set_data_handle(e->pack[PACK_SCRATCH], scratch);
    dnnl_status_t st = dnnl_primitive_execute(e->reorder, tc->stream, scratch ? 3 : 2, args);
    if (st == dnnl_success) st = dnnl_stream_wait(tc->stream);
    vh_cpu_scratch_end(mark);
    if (st != dnnl_success) return VH_STATUS_ERR_DEVICE;
    *layout = e->layout;
    return VH_STATUS_OK;
}

uint64_t vh_dnnl_primitives_created(void) {
    thread_cache *tc = this_cache();
    return tc ? tc->created : 0;
}

static char version_buf[48];

static void fill_version(void) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(version_buf, sizeof version_buf, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
}

int vh_dnnl_isa_has(vh_dnnl_isa level) {
    static const dnnl_cpu_isa_t isas[] = {dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core,
                                          dnnl_cpu_isa_avx512_core_bf16,
                                          dnnl_cpu_isa_avx512_core_amx};
    pthread_once(&g_once, global_init);
    /* the ISAs are nested bit sets: a level is in every one above it */
    return (dnnl_get_effective_cpu_isa() & isas[level]) == isas[level];
}

const char *vh_dnnl_version_name(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_version);
    return version_buf;
}

const char *vh_dnnl_isa_name(void) {
    pthread_once(&g_once, global_init);
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    default: return "other";
    }
}
