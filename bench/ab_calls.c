/* ab_calls.c - two builds of libvhsdk in one process, one op's calls
 * interleaved call by call (A, B, B, A, A, B, ...), for kernel changes too
 * small for bench/ab_libs.sh: that script alternates whole processes, so a
 * shared machine's change of pace between them (+-30% here) hides a few
 * percent; here both builds see the same seconds. Also says whether the
 * two builds' outputs have the same bits on the same inputs.
 *
 *   build/bench/ab_calls [--b-env VAR=VALUE] LIB_A LIB_B REPS attention B N H Dh [f32|bf16]
 *   build/bench/ab_calls [--b-env VAR=VALUE] LIB_A LIB_B REPS gemm M N K
 *                        [none|gelu|gelu_grad|mul|gelu_backward] [f32|bf16]
 *
 * LIB_A and LIB_B are paths of two copies of libvhsdk.so.0.* (the
 * copies ab_libs.sh takes: cp build/lib/libvhsdk.so* DIR before and after a
 * change); distinct paths load twice, each with its own scratch, choices
 * and threads' work space, and one libgomp and oneDNN for both. This
 * program is not linked to libvhsdk and calls none of its functions but
 * through the two tables: a copy linked in would come first in the global
 * scope, and each loaded copy's calls to the SDK's exported functions would
 * bind to it. attention: the op's forward, then its backward
 * (overwrite, ABI 2.6), on batch-first qkv, probs in qkv's dtype. gemm: C = A B^T
 * + bias as a linear layer's forward, with the epilogue named (aux
 * receives T or gelu'(T)), or with mul and gelu_backward C = A B as the
 * data gradient of fc2 (aux, an input, is gelu'(T) or T); every tensor
 * f32, or bf16 as AMP's (gelu: its fc1); operands pushed out of the caches
 * (64 MiB written) before each pair. Prints, per op, both builds' median
 * and minimum ms and B's median over A's.
 *
 * --b-env VAR=VALUE sets VAR for B's calls alone (unset for A's): a route
 * that the library reads from the environment at every call (such as
 * VITHOST_CPU_PACK_B) compared within one build, two copies of it.
 *
 * Run it again with LIB_A and LIB_B swapped: on Zen 4 one copy of the very
 * same library ran the main job's attention forward (B 128, N 16, H 8, Dh
 * 16, 0.24 ms) 10% slower than another in either load order, so a
 * per-copy bias (where each copy's scratch and code landed) can reach the
 * size of a small kernel change; on T1-T3's shapes copies of one library
 * agreed within 0.2-1.3%. Take the geometric mean of the two runs' ratios,
 * and check a small shape with two copies of one build first.
 * Not a test: ctest never runs it. */
#define _GNU_SOURCE /* dlopen */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_runtime.h"

#include "bench_common.h"

#define FLUSH_BYTES ((size_t)64 << 20)

typedef const vh_device_ops *(*device_ops_fn)(void);

static const vh_device_ops *load(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "ab_calls: %s\n", dlerror());
        exit(2);
    }
    device_ops_fn fn;
    *(void **)&fn = dlsym(h, "vh_cpu_device_ops");
    if (!fn) {
        fprintf(stderr, "ab_calls: %s has no vh_cpu_device_ops\n", path);
        exit(2);
    }
    return fn();
}

static void *alloc_or_die(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "ab_calls: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Sorts both builds' times and prints the line of one op. */
static void report(const char *what, double *ta, double *tb, int reps) {
    qsort(ta, (size_t)reps, sizeof *ta, cmp_double);
    qsort(tb, (size_t)reps, sizeof *tb, cmp_double);
    printf("%-9s A median %8.3f min %8.3f ms | B median %8.3f min %8.3f ms | B/A median %.3f\n",
           what, ta[reps / 2] * 1e3, ta[0] * 1e3, tb[reps / 2] * 1e3, tb[0] * 1e3,
           tb[reps / 2] / ta[reps / 2]);
}

/* --b-env: VAR=VALUE for B's calls; NULL when not given. */
static char *g_b_env_name;
static const char *g_b_env_value;

/* The environment of side i's next call. */
static void side_env(int i) {
    if (!g_b_env_name) return;
    if (i == 1)
        setenv(g_b_env_name, g_b_env_value, 1);
    else
        unsetenv(g_b_env_name);
}

_Noreturn static void die_status(const char *op, vh_status st) {
    fprintf(stderr, "ab_calls: %s failed: status %d\n", op, (int)st);
    exit(1);
}

/* ---- attention ----------------------------------------------------------- */

typedef struct attn_side {
    void *qkv, *out, *dout, *dqkv, *probs;
    size_t es; /* bytes an element of qkv, out, dout and dqkv */
    vh_attention_args a;
} attn_side;

static void attn_init(attn_side *s, int64_t B, int64_t N, int64_t H, int64_t Dh, vh_dtype t) {
    const int64_t D = H * Dh, nqkv = B * N * 3 * D, nout = B * N * D;
    const size_t es = s->es = t == VH_DTYPE_BF16 ? 2 : 4;
    s->qkv = alloc_or_die((size_t)nqkv * es), s->dqkv = alloc_or_die((size_t)nqkv * es);
    s->out = alloc_or_die((size_t)nout * es), s->dout = alloc_or_die((size_t)nout * es);
    s->probs = alloc_or_die((size_t)(B * H * N * N) * sizeof(float));
    bench_fill(s->qkv, t, (size_t)nqkv, 1);
    bench_fill(s->dout, t, (size_t)nout, 2);
    bench_attention_args(&s->a, B, N, H, Dh, t, s->qkv, s->out, s->probs, s->dout, s->dqkv);
    s->a.overwrite = 1;
}

static int run_attention(const vh_device_ops *d[2], int reps, char **arg, int nargs) {
    if (nargs < 4) return 0;
    const int64_t B = atoll(arg[0]), N = atoll(arg[1]), H = atoll(arg[2]), Dh = atoll(arg[3]);
    const char *t_name = nargs > 4 ? arg[4] : "f32";
    vh_dtype t;
    if (strcmp(t_name, "f32") == 0)
        t = VH_DTYPE_F32;
    else if (strcmp(t_name, "bf16") == 0)
        t = VH_DTYPE_BF16;
    else
        return 0;
    if (B < 1 || N < 1 || H < 1 || Dh < 1) return 0;
    attn_side s[2];
    double *t_f[2], *t_b[2];
    for (int i = 0; i < 2; i++) {
        attn_init(&s[i], B, N, H, Dh, t);
        t_f[i] = alloc_or_die((size_t)reps * sizeof(double));
        t_b[i] = alloc_or_die((size_t)reps * sizeof(double));
    }
    for (int r = -1; r < reps; r++) /* r = -1: one warm-up call each */
        for (int j = 0; j < 2; j++) {
            const int i = (r & 1) ? 1 - j : j; /* A B, B A, A B, ... */
            vh_status st;
            side_env(i);
            const double t0 = bench_now();
            if ((st = d[i]->attention_forward(d[i]->device, &s[i].a)) != VH_STATUS_OK)
                die_status("attention_forward", st);
            const double t1 = bench_now();
            if ((st = d[i]->attention_backward(d[i]->device, &s[i].a)) != VH_STATUS_OK)
                die_status("attention_backward", st);
            const double t2 = bench_now();
            if (r >= 0) t_f[i][r] = t1 - t0, t_b[i][r] = t2 - t1;
        }
    const int64_t D = H * Dh;
    const size_t es = s[0].es;
    const int same = memcmp(s[0].out, s[1].out, (size_t)(B * N * D) * es) == 0 &&
                     memcmp(s[0].probs, s[1].probs, (size_t)(B * H * N * N) * es) == 0 &&
                     memcmp(s[0].dqkv, s[1].dqkv, (size_t)(B * N * 3 * D) * es) == 0;
    printf("attention B %lld N %lld H %lld Dh %lld %s, %d calls each:\n", (long long)B,
           (long long)N, (long long)H, (long long)Dh, es == 2 ? "bf16" : "f32", reps);
    report("forward", t_f[0], t_f[1], reps);
    report("backward", t_b[0], t_b[1], reps);
    printf("out, probs and dqkv: %s bits\n", same ? "the same" : "DIFFERENT");
    return 1;
}

/* ---- gemm ------------------------------------------------------------------ */

static int run_gemm(const vh_device_ops *d[2], int reps, char **arg, int nargs) {
    if (nargs < 3) return 0;
    const int64_t m = atoll(arg[0]), n = atoll(arg[1]), k = atoll(arg[2]);
    const char *ep_name = nargs > 3 ? arg[3] : "none";
    const char *dt_name = nargs > 4 ? arg[4] : "f32";
    const vh_epilogue ep = strcmp(ep_name, "gelu") == 0            ? VH_EPILOGUE_GELU
                           : strcmp(ep_name, "gelu_grad") == 0     ? VH_EPILOGUE_GELU_GRAD
                           : strcmp(ep_name, "mul") == 0           ? VH_EPILOGUE_MUL_AUX
                           : strcmp(ep_name, "gelu_backward") == 0 ? VH_EPILOGUE_GELU_BACKWARD
                                                                   : VH_EPILOGUE_NONE;
    /* the backward's epilogues: C = dY W (B not transposed), aux an input */
    const int backward = ep == VH_EPILOGUE_MUL_AUX || ep == VH_EPILOGUE_GELU_BACKWARD;
    const vh_dtype dt = strcmp(dt_name, "bf16") == 0 ? VH_DTYPE_BF16 : VH_DTYPE_F32;
    if (m < 1 || n < 1 || k < 1 || (ep == VH_EPILOGUE_NONE && strcmp(ep_name, "none") != 0) ||
        (dt == VH_DTYPE_F32 && strcmp(dt_name, "f32") != 0))
        return 0;
    const size_t es = dt == VH_DTYPE_BF16 ? 2 : 4; /* not vh_dtype_size: no libvhsdk linked in */
    void *a = alloc_or_die((size_t)(m * k) * es);
    void *b = alloc_or_die((size_t)(n * k) * es);
    void *bias = alloc_or_die((size_t)n * es);
    bench_fill(a, dt, (size_t)(m * k), 1);
    bench_fill(b, dt, (size_t)(n * k), 2);
    bench_fill(bias, dt, (size_t)n, 3);
    void *c[2], *aux[2];
    double *tm[2];
    for (int i = 0; i < 2; i++) {
        c[i] = alloc_or_die((size_t)(m * n) * es);
        aux[i] = alloc_or_die((size_t)(m * n) * es);
        if (backward) bench_fill(aux[i], dt, (size_t)(m * n), 4);
        tm[i] = alloc_or_die((size_t)reps * sizeof(double));
    }
    char *flush = alloc_or_die(FLUSH_BYTES);
    for (int r = -1; r < reps; r++) {
        memset(flush, r & 0xff, FLUSH_BYTES); /* both sides start from memory */
        for (int j = 0; j < 2; j++) {
            const int i = (r & 1) ? 1 - j : j;
            vh_gemm_args g;
            memset(&g, 0, sizeof g);
            g.struct_size = sizeof g;
            g.trans_b = !backward; /* X W^T, W stored out x in; dY W */
            g.m = m, g.n = n, g.k = k, g.alpha = 1.0f;
            g.a = a, g.lda = k, g.b = b, g.ldb = backward ? n : k, g.c = c[i], g.ldc = n;
            g.bias = backward ? NULL : bias;
            g.ab_dtype = g.c_dtype = g.bias_dtype = dt;
            g.epilogue = ep, g.aux = ep != VH_EPILOGUE_NONE ? aux[i] : NULL;
            side_env(i);
            const double t0 = bench_now();
            const vh_status st = d[i]->gemm(d[i]->device, &g);
            const double t1 = bench_now();
            if (st != VH_STATUS_OK) die_status("gemm", st);
            if (r >= 0) tm[i][r] = t1 - t0;
        }
    }
    const size_t bytes = (size_t)(m * n) * es;
    const int same = memcmp(c[0], c[1], bytes) == 0 &&
                     (ep == VH_EPILOGUE_NONE || memcmp(aux[0], aux[1], bytes) == 0);
    printf("gemm %lldx%lldx%lld %s %s, epilogue %s, %d calls each:\n", (long long)m,
           (long long)n, (long long)k, dt_name, backward ? "A.B" : "A.B^T +bias", ep_name, reps);
    report("gemm", tm[0], tm[1], reps);
    printf("C%s: %s bits\n", ep == VH_EPILOGUE_NONE ? "" : " and aux",
           same ? "the same" : "DIFFERENT");
    return 1;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "--b-env") == 0) {
        char *eq = strchr(argv[2], '=');
        if (!eq || eq == argv[2]) {
            fprintf(stderr, "ab_calls: --b-env wants VAR=VALUE, not %s\n", argv[2]);
            return 2;
        }
        *eq = '\0';
        g_b_env_name = argv[2], g_b_env_value = eq + 1;
        argv += 2, argc -= 2;
    }
    const int reps = argc > 3 ? atoi(argv[3]) : 0;
    int ok = 0;
    if (argc > 4 && reps > 0 && strcmp(argv[1], argv[2]) != 0) {
        const vh_device_ops *d[2] = {load(argv[1]), load(argv[2])};
        if (d[0] == d[1]) {
            fprintf(stderr, "ab_calls: %s and %s are one library (copy it: cp, not ln)\n",
                    argv[1], argv[2]);
            return 2;
        }
        if (strcmp(argv[4], "attention") == 0)
            ok = run_attention(d, reps, argv + 5, argc - 5);
        else if (strcmp(argv[4], "gemm") == 0)
            ok = run_gemm(d, reps, argv + 5, argc - 5);
    }
    if (!ok) {
        fprintf(stderr,
                "usage: ab_calls [--b-env VAR=VALUE] LIB_A LIB_B REPS attention B N H Dh "
                "[f32|bf16]\n"
                "       ab_calls [--b-env VAR=VALUE] LIB_A LIB_B REPS gemm M N K "
                "[none|gelu|gelu_grad|mul|gelu_backward] [f32|bf16]\n"
                "(LIB_A and LIB_B: two different paths of libvhsdk.so.0.* copies)\n");
        return 2;
    }
    return 0;
}
