/* attention.h - what attention.c (the fp32 path) shares with
 * attention_small.c (the fused small-head blocks), attention16.c (bf16
 * operands on the native kernels) and attention_dot16.c (its fused blocks
 * on bf16 dot products). */
#ifndef VH_CPU_ATTENTION_H
#define VH_CPU_ATTENTION_H

#include "cpu_ops.h"

/* The routes an attention call can take, counted for vh_cpu_attention_routes. */
typedef enum vh_cpu_attention_route {
    VH_CPU_ATTENTION_ROUTE_SMALL = 0, /* attention_small.c */
    VH_CPU_ATTENTION_ROUTE_DOT16,     /* attention_dot16.c */
    VH_CPU_ATTENTION_ROUTE_ONEDNN16,  /* attention16.c's tasks on oneDNN's bf16 matmuls */
    VH_CPU_ATTENTION_ROUTE_BATCHED,   /* attention.c's batched f32 matmuls */
    VH_CPU_ATTENTION_ROUTE_COUNT
} vh_cpu_attention_route;

/* Counts a call that ran on `route`. */
VH_CPU_HIDDEN void vh_cpu_attention_count(vh_cpu_attention_route route);
/* A forward call that wrote its f32 probabilities past the caches
 * (attention_small.c), counted for vh_cpu_attention_routes. */
VH_CPU_HIDDEN void vh_cpu_attention_count_streamed(void);

/* Rows of the softmax loops per task: whole rows to each thread, few calls. */
#define ROW_BLOCK 64

/* A strided (B, H, rows, cols) operand of dtype t; strides in elements. */
typedef struct view4 {
    void *p;
    vh_dtype t;
    int64_t s[4];
} view4;

/* C (+)= alpha A B over (B, H) blocks: A (rows m, k), B (k, n), C (m, n); A
 * and B of one dtype (f32, or bf16 where the native kernels run), C f32 or
 * 16-bit (rounded once). One oneDNN matmul when it takes the strides, else
 * one per sample, else one per block. */
VH_CPU_HIDDEN vh_status vh_cpu_attention_bmm(int64_t nb, int64_t nh, int64_t m, int64_t n,
                                             int64_t k, float alpha, const view4 *a,
                                             const view4 *b, const view4 *c, int accumulate);

/* q, k or v (which 0, 1, 2) of a qkv tensor as (B, H, tokens, head_dim), or
 * transposed (B, H, head_dim, tokens); out/dout as (B, H, tokens, head_dim);
 * a probs-shaped (B, H, N, N) dense tensor, or transposed. */
VH_CPU_HIDDEN view4 vh_cpu_attention_qkv(const vh_attention_args *a, void *qkv, vh_dtype t,
                                         int which, int transposed);
VH_CPU_HIDDEN view4 vh_cpu_attention_out(const vh_attention_args *a, void *out, vh_dtype t);
VH_CPU_HIDDEN view4 vh_cpu_attention_square(const vh_attention_args *a, void *p, vh_dtype t,
                                            int transposed);

/* Zeroes the q, k and v elements of every row of dqkv (not the gaps between
 * rows): the routes that only add run this first on a call with overwrite
 * (ABI 2.6), which then gives the bits the caller's own zeroing would. */
VH_CPU_HIDDEN void vh_cpu_attention_zero_dqkv(const vh_attention_args *a);

/* Blocks a thread takes at a time in the fused kernels' (sample, head)
 * loops: a sample's H (whole samples in each thread's share, deal.c; and
 * the chunk when they are dealt one at a time). A block's sums do not
 * depend on its thread. Not one block at a time: a sample's heads write neighbouring parts of the
 * same rows (16-wide bf16 heads share cache lines), which two threads taking
 * alternate heads bounce between their caches; the main job's AMP attention
 * ran 25-30% slower so. */
static inline int vh_cpu_attention_head_chunk(int64_t heads) {
    return heads > 0 && heads < 4096 ? (int)heads : 1;
}

/* dS = P * (dP - rowsum(dP * P)) in place of dP, `rows` rows of n. */
VH_CPU_HIDDEN void vh_cpu_softmax_grad_rows(float *ds, const float *p, int64_t rows, int64_t n);
/* The same, dS rounded to bf16 into ds16 (dp is not written), and P rounded
 * into p16 (NULL: not wanted), one pass a row. */
VH_CPU_HIDDEN void vh_cpu_softmax_grad_rows16(uint16_t *ds16, uint16_t *p16, const float *dp,
                                              const float *p, int64_t rows, int64_t n);

/* attention_small.c: the op for small heads (head_dim 8..32, a multiple of
 * 8, on an AVX2 or AVX-512 CPU; f32 up to 64 on AVX-512), one (sample, head) block per thread at a
 * time, any dtype. Returns VH_STATUS_ERR_UNSUPPORTED (having written
 * nothing) when it does not apply. `a` is checked and not empty. */
VH_CPU_HIDDEN vh_status vh_cpu_attention_small_forward(const vh_attention_args *a);
VH_CPU_HIDDEN vh_status vh_cpu_attention_small_backward(const vh_attention_args *a);

/* attention16.c: the op with bf16 qkv/out/probs where the engine's per-shape
 * choice says its native bf16 kernels are faster. _dot_: on
 * attention_dot16.c's blocks, tried first, before the small-head blocks;
 * without _dot_: on oneDNN's bf16 kernels. Each returns
 * VH_STATUS_ERR_UNSUPPORTED (having written nothing) when it does not apply:
 * the caller then tries the next route. `a` is checked and not empty. */
VH_CPU_HIDDEN vh_status vh_cpu_attention16_dot_forward(const vh_attention_args *a);
VH_CPU_HIDDEN vh_status vh_cpu_attention16_dot_backward(const vh_attention_args *a);
VH_CPU_HIDDEN vh_status vh_cpu_attention16_forward(const vh_attention_args *a);
VH_CPU_HIDDEN vh_status vh_cpu_attention16_backward(const vh_attention_args *a);

/* attention_dot16.c: attention16.c's numbers for heads of 16..96 (a
 * multiple of 16) in fused blocks on AVX512-BF16's dot products; called by
 * attention16.c once it has chosen the native route. Returns
 * VH_STATUS_ERR_UNSUPPORTED (having written nothing) when it does not apply;
 * _applies says beforehand whether it would (dtypes, head, CPU). */
VH_CPU_HIDDEN int vh_cpu_attention_dot16_applies(const vh_attention_args *a);
VH_CPU_HIDDEN vh_status vh_cpu_attention_dot16_forward(const vh_attention_args *a);
VH_CPU_HIDDEN vh_status vh_cpu_attention_dot16_backward(const vh_attention_args *a);

/* attention_small.c's AVX-512 softmax of `rows` score rows in place (ld
 * floats apart, ld a multiple of 16 and >= n): n values each, the rest of
 * the row set to 0. inv not NULL: each row left as its exponentials (the
 * padding 0), 1 / its sum in inv[row], for the caller to multiply. Only on
 * a CPU with AVX-512 (x86-64-v4). */
VH_CPU_HIDDEN void vh_cpu_attention_softmax_v4(float *s, int64_t rows, int64_t ld, int64_t n,
                                               float *inv);

/* The same on any CPU and build: the AVX-512 rows where this build has them
 * and the CPU runs them, else row by row (vh_cpu_softmax_rows; with inv, the
 * rows whole and inv[row] = 1). Safe to call from several threads at once. */
VH_CPU_HIDDEN void vh_cpu_attention_softmax_padded(float *s, int64_t rows, int64_t ld, int64_t n,
                                                   float *inv);

#endif
