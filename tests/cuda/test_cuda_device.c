/* test_cuda_device.c - the CUDA device's runtime (sdk/cuda/device.cu) on a
 * GPU: copies (pageable and pinned), conversions against the CPU's
 * rounding, memset, streams and events, the per-thread current stream,
 * workspaces, and the "vh.cuda.memory" extension. Without a GPU it prints
 * one SKIPPED line and exits 77 (gpu_twin.h). */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_twin.h"
#include "vithost/vh_cuda_ext.h"

static gpu_twin twin;
#define OPS (&twin.gpu)
#define DEV (twin.gpu.device)

/* (The test of the former tests/test_cuda.c.) */
static void test_copy_and_convert(void **state) {
    (void)state;
    float src[1000], back[1000];
    for (int i = 0; i < 1000; i++) src[i] = (float)(i - 500) * 0.25f;
    void *d32 = NULL, *d16 = NULL;
    assert_int_equal(OPS->alloc(DEV, sizeof src, &d32), VH_STATUS_OK);
    assert_int_equal(OPS->alloc(DEV, 1000 * 2, &d16), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, d32, src, sizeof src, VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
    assert_int_equal(OPS->convert(DEV, d16, VH_DTYPE_BF16, d32, VH_DTYPE_F32, 1000, NULL), VH_STATUS_OK);
    assert_int_equal(OPS->memset_zero(DEV, d32, sizeof src, NULL), VH_STATUS_OK);
    assert_int_equal(OPS->convert(DEV, d32, VH_DTYPE_F32, d16, VH_DTYPE_BF16, 1000, NULL), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, back, d32, sizeof back, VH_COPY_KIND_DEVICE_TO_HOST, NULL), VH_STATUS_OK);
    /* Same rounding as the CPU reference, element for element. */
    for (int i = 0; i < 1000; i++) assert_true(back[i] == vh_bf16_to_f32(vh_f32_to_bf16(src[i])));
    OPS->free(DEV, d32);
    OPS->free(DEV, d16);
}

/* Every pair of dtypes, odd counts and offsets (the vector path, the
 * unaligned path and the tail), against the CPU device's convert. */
static void test_convert_all_pairs(void **state) {
    (void)state;
    const vh_dtype dt[3] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};
    const int64_t counts[] = {1, 3, 4, 1027};
    float x[1031], got[1031], want[1031];
    gpu_twin_fill(x, 1031, 7, -70000.0f, 70000.0f); /* f16 overflows to inf, as on the CPU */
    for (int i = 0; i < 64; i++) x[i] *= 1e-5f; /* and some small values */
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++)
            for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
                for (int off = 0; off < 2; off++) {
                    const int64_t n = counts[c];
                    void *src = gpu_twin_upload(&twin, x, n + off, dt[s]);
                    void *dst = NULL;
                    assert_int_equal(OPS->alloc(DEV, (size_t)(n + off) * 4, &dst), VH_STATUS_OK);
                    char *dsrc = (char *)src + off * vh_dtype_size(dt[s]);
                    char *ddst = (char *)dst + off * vh_dtype_size(dt[d]);
                    assert_int_equal(OPS->convert(DEV, ddst, dt[d], dsrc, dt[s], (size_t)n, NULL),
                                     VH_STATUS_OK);
                    gpu_twin_download(&twin, got, ddst, n, dt[d]);
                    void *hs = gpu_twin_host(x + off, n, dt[s]);
                    void *hd = malloc((size_t)n * 4);
                    assert_int_equal(twin.cpu->convert(twin.cpu->device, hd, dt[d], hs, dt[s],
                                                       (size_t)n, NULL), VH_STATUS_OK);
                    gpu_twin_widen(want, hd, n, dt[d]);
                    for (int64_t i = 0; i < n; i++)
                        if (memcmp(&got[i], &want[i], 4) != 0) {
                            printf("convert %d -> %d, n %lld, off %d: [%lld] gpu %g cpu %g\n", s,
                                   d, (long long)n, off, (long long)i, got[i], want[i]);
                            fail();
                        }
                    free(hs);
                    free(hd);
                    gpu_twin_free(&twin, src);
                    gpu_twin_free(&twin, dst);
                }
    assert_int_equal(OPS->convert(DEV, NULL, 7, NULL, VH_DTYPE_F32, 4, NULL), VH_STATUS_ERR_UNSUPPORTED);
}

/* Pinned host memory: the copies stay asynchronous and ordered on the stream. */
static void test_pinned_copies_on_a_stream(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    vh_stream *s = NULL;
    float *h = NULL, *back = NULL;
    void *d = NULL, *d2 = NULL;
    assert_int_equal(OPS->stream_create(DEV, &s), VH_STATUS_OK);
    assert_int_equal(OPS->host_alloc(DEV, N * sizeof(float), (void **)&h), VH_STATUS_OK);
    assert_int_equal(OPS->host_alloc(DEV, N * sizeof(float), (void **)&back), VH_STATUS_OK);
    for (int i = 0; i < N; i++) h[i] = (float)i;
    assert_int_equal(OPS->alloc(DEV, N * sizeof(float), &d), VH_STATUS_OK);
    assert_int_equal(OPS->alloc(DEV, N * sizeof(float), &d2), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, d, h, N * sizeof(float), VH_COPY_KIND_HOST_TO_DEVICE, s), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, d2, d, N * sizeof(float), VH_COPY_KIND_DEVICE_TO_DEVICE, s), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, back, d2, N * sizeof(float), VH_COPY_KIND_DEVICE_TO_HOST, s), VH_STATUS_OK);
    vh_event *ev = NULL;
    assert_int_equal(OPS->event_create(DEV, &ev), VH_STATUS_OK);
    assert_int_equal(OPS->event_record(DEV, ev, s), VH_STATUS_OK);
    assert_int_equal(OPS->event_synchronize(DEV, ev), VH_STATUS_OK);
    int done = 0;
    assert_int_equal(OPS->event_query(DEV, ev, &done), VH_STATUS_OK);
    assert_int_equal(done, 1);
    for (int i = 0; i < N; i += 997) assert_true(back[i] == (float)i);
    OPS->event_destroy(DEV, ev);
    OPS->free(DEV, d);
    OPS->free(DEV, d2);
    OPS->host_free(DEV, h);
    OPS->host_free(DEV, back);
    OPS->stream_destroy(DEV, s);
}

/* Two streams ordered by an event: stream 2 reads what stream 1 wrote. */
static void test_events_order_streams(void **state) {
    (void)state;
    enum { N = 1 << 22 };
    vh_stream *s1 = NULL, *s2 = NULL;
    vh_event *ev = NULL;
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (int i = 0; i < N; i++) x[i] = (float)(i % 1000);
    void *a = NULL, *b = NULL;
    assert_int_equal(OPS->stream_create(DEV, &s1), VH_STATUS_OK);
    assert_int_equal(OPS->stream_create(DEV, &s2), VH_STATUS_OK);
    assert_int_equal(OPS->event_create(DEV, &ev), VH_STATUS_OK);
    assert_int_equal(OPS->alloc(DEV, N * sizeof(float), &a), VH_STATUS_OK);
    assert_int_equal(OPS->alloc(DEV, N * 2, &b), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, a, x, N * sizeof(float), VH_COPY_KIND_HOST_TO_DEVICE, s1), VH_STATUS_OK);
    assert_int_equal(OPS->event_record(DEV, ev, s1), VH_STATUS_OK);
    assert_int_equal(OPS->stream_wait_event(DEV, s2, ev), VH_STATUS_OK);
    assert_int_equal(OPS->convert(DEV, b, VH_DTYPE_BF16, a, VH_DTYPE_F32, N, s2), VH_STATUS_OK);
    assert_int_equal(OPS->convert(DEV, a, VH_DTYPE_F32, b, VH_DTYPE_BF16, N, s2), VH_STATUS_OK);
    assert_int_equal(OPS->stream_synchronize(DEV, s2), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, y, a, N * sizeof(float), VH_COPY_KIND_DEVICE_TO_HOST, s2), VH_STATUS_OK);
    for (int i = 0; i < N; i += 4099) assert_true(y[i] == vh_bf16_to_f32(vh_f32_to_bf16(x[i])));
    OPS->free(DEV, a);
    OPS->free(DEV, b);
    OPS->event_destroy(DEV, ev);
    OPS->stream_destroy(DEV, s1);
    OPS->stream_destroy(DEV, s2);
    assert_int_equal(OPS->synchronize(DEV), VH_STATUS_OK);
    free(x);
    free(y);
}

/* stream_set: the thread's current stream, and what it replaced. */
static void test_current_stream(void **state) {
    (void)state;
    vh_stream *s = NULL, *prev = (vh_stream *)&twin;
    assert_int_equal(OPS->stream_create(DEV, &s), VH_STATUS_OK);
    assert_int_equal(OPS->stream_set(DEV, s, &prev), VH_STATUS_OK);
    assert_null(prev); /* the default stream */
    float v = 3.5f, w = 0.0f;
    void *d = NULL;
    assert_int_equal(OPS->alloc(DEV, sizeof v, &d), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, d, &v, sizeof v, VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
    assert_int_equal(OPS->copy(DEV, &w, d, sizeof w, VH_COPY_KIND_DEVICE_TO_HOST, NULL), VH_STATUS_OK);
    assert_true(w == 3.5f);
    assert_int_equal(OPS->stream_set(DEV, NULL, &prev), VH_STATUS_OK);
    assert_ptr_equal(prev, s);
    OPS->free(DEV, d);
    OPS->stream_destroy(DEV, s);
}

static void test_workspace_and_memory(void **state) {
    (void)state;
    const vh_cuda_memory *mem = OPS->get_extension(DEV, VH_CUDA_MEMORY_EXTENSION);
    assert_non_null(mem);
    /* the oldest size a reader accepts (its last member), not this build's sizeof */
    assert_true(VH_STRUCT_HAS(mem, vh_cuda_memory, trim));
    assert_null(OPS->get_extension(DEV, "vh.no.such.thing"));
    vh_cuda_memory_info before = {.struct_size = sizeof before}, after = before, peak = before;
    assert_int_equal(mem->read(DEV, &before), VH_STATUS_OK);
    void *w1 = NULL, *w2 = NULL, *w3 = NULL;
    assert_int_equal(OPS->workspace(DEV, 1000, NULL, &w1), VH_STATUS_OK);
    assert_int_equal(OPS->workspace(DEV, 500, NULL, &w2), VH_STATUS_OK);
    assert_ptr_equal(w1, w2); /* big enough: the same buffer */
    assert_int_equal(OPS->workspace(DEV, 10 << 20, NULL, &w3), VH_STATUS_OK);
    assert_non_null(w3);
    assert_int_equal(OPS->memset_zero(DEV, w3, 10 << 20, NULL), VH_STATUS_OK);
    void *big = NULL;
    assert_int_equal(OPS->alloc(DEV, 64 << 20, &big), VH_STATUS_OK);
    assert_int_equal(mem->read(DEV, &peak), VH_STATUS_OK);
    assert_true(peak.bytes_in_use >= before.bytes_in_use + (74 << 20));
    assert_true(peak.peak_bytes >= peak.bytes_in_use);
    assert_true(peak.reserved_bytes >= peak.bytes_in_use);
    OPS->free(DEV, big);
    assert_int_equal(mem->read(DEV, &after), VH_STATUS_OK);
    assert_int_equal(after.bytes_in_use, peak.bytes_in_use - (64 << 20));
    assert_int_equal(after.peak_bytes, peak.peak_bytes);
    mem->reset_peak(DEV);
    assert_int_equal(mem->read(DEV, &after), VH_STATUS_OK);
    assert_int_equal(after.peak_bytes, after.bytes_in_use);
    assert_int_equal(OPS->synchronize(DEV), VH_STATUS_OK);
    mem->trim(DEV);
    assert_int_equal(mem->read(DEV, &after), VH_STATUS_OK);
    assert_int_equal(after.reserved_bytes, after.bytes_in_use);
    /* An older caller's smaller struct is filled up to its size. */
    vh_cuda_memory_info small = {.struct_size = offsetof(vh_cuda_memory_info, peak_bytes)};
    small.peak_bytes = 12345;
    assert_int_equal(mem->read(DEV, &small), VH_STATUS_OK);
    assert_int_equal(small.struct_size, offsetof(vh_cuda_memory_info, peak_bytes));
    assert_int_equal(small.peak_bytes, 12345);
}

/* The cache hands a freed block back to the next allocation of its size. */
static void test_alloc_reuses(void **state) {
    (void)state;
    void *p = NULL, *q = NULL;
    assert_int_equal(OPS->alloc(DEV, 3 << 20, &p), VH_STATUS_OK);
    OPS->free(DEV, p);
    assert_int_equal(OPS->alloc(DEV, 3 << 20, &q), VH_STATUS_OK);
    assert_ptr_equal(p, q);
    OPS->free(DEV, q);
    assert_int_equal(OPS->copy(DEV, NULL, &p, 4, VH_COPY_KIND_HOST_TO_DEVICE, NULL),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(OPS->copy(DEV, NULL, NULL, 0, VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
}

int main(void) {
    gpu_twin_open(&twin, "test_cuda_device");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_and_convert),
        cmocka_unit_test(test_convert_all_pairs),
        cmocka_unit_test(test_pinned_copies_on_a_stream),
        cmocka_unit_test(test_events_order_streams),
        cmocka_unit_test(test_current_stream),
        cmocka_unit_test(test_workspace_and_memory),
        cmocka_unit_test(test_alloc_reuses),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_twin_close(&twin);
    return failed;
}
