/* The CPU's bf16 kernels (kernels.h, value_kernels): bf16 in, fp32
 * arithmetic, bf16 out.
 *
 * Each kernel computes what the fp32 kernel of kernels_cpu.c computes on the
 * bf16 values, and rounds each output once (an accumulating output is
 * widened too, so the add happens in fp32 and is rounded once); every bf16
 * kernel is tested against its fp32 twin by that definition
 * (tests/test_bf16_kernels.c). How each gets its fp32 operands depends on
 * what bounds it (plots/bench_bf16.sh part 4 measures it kind by kind):
 *  - memory-bound ones (the residual adds, the bias gradient) convert in
 *    registers, so each bf16 tensor is read and written once;
 *  - arithmetic-bound and row ones (LayerNorm, the loss, AdamW; GELU with
 *    AVX2) widen L1-sized chunks and run the fp32 kernel on them; the
 *    conversions then add work (with AVX2, about a third of GELU's) but no
 *    memory traffic; GELU, built for AVX2 and AVX-512 like its fp32 twin
 *    (kernels_cpu_math.h, WITH_AVX512), converts in registers with AVX-512
 *    and then costs what fp32's does;
 *  - matrix products, attention's included, run as bf16 products with fp32
 *    sums (oneDNN), or on widened operands (sgemm), below.
 * Sums that run over rows (LayerNorm's dw and db, the bias gradient, dW =
 * dout^T inp, the embedding's) keep an fp32 accumulator across the chunks
 * and round once at the end.
 *
 * The matrix products go through oneDNN's bf16 matmul, which multiplies bf16
 * and accumulates in fp32 (with AVX512-BF16, twice the multiply-adds per
 * instruction of fp32), when the build found libdnnl and the CPU has
 * avx512_bf16 or amx_bf16; otherwise through OpenBLAS's sgemm on the widened
 * operands (Debian's OpenBLAS has no bf16 GEMM). PL_BF16_GEMM=onednn|sgemm
 * chooses either; the start-up line says which runs (run.c). The two paths
 * differ in the order of their fp32 sums, so their results agree to bf16's
 * precision, not bit for bit; within one path a run is deterministic.
 *
 * The scratch (host memory, outside mem.h's categories like OpenBLAS's own
 * buffers) is a few hundred KB for most shapes: the widest piece is one
 * weight matrix on the sgemm path, or the T x T scores of a group of
 * attention heads (ATT_FLOATS). */
#define _GNU_SOURCE
#include "kernels.h"
#include "kernels_cpu_math.h"
#include "device.h"
#include "precision.h"
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef PL_HAVE_ONEDNN
#include <dnnl.h>
#endif

typedef uint16_t bf16;

/* ---- widening and rounding ------------------------------------------------------------ */

/* One value, for loops that convert in registers (gcc vectorises both). */
static inline float wide(bf16 b) { return float_of((uint32_t)b << 16); }
/* Round to nearest even; a NaN stays a (quiet) NaN. The same rule as
 * bf16_from_float and CUDA's __float2bfloat16_rn. */
static inline bf16 round_bf16(float f) {
    uint32_t u = bits_of(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (bf16)((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

static void widen(float *restrict dst, const bf16 *restrict src, long n) {
    for (long i = 0; i < n; i++) dst[i] = wide(src[i]);
}

static void narrow(bf16 *restrict dst, const float *restrict src, long n) {
    for (long i = 0; i < n; i++) dst[i] = round_bf16(src[i]);
}

/* Widen rows [0, rows) of a matrix with leading dimension ld (cols used), packed. */
static void widen_rows(float *dst, const bf16 *src, long rows, long cols, long ld) {
    for (long r = 0; r < rows; r++) widen(dst + r * cols, src + r * ld, cols);
}
static void narrow_rows(bf16 *dst, const float *src, long rows, long cols, long ld) {
    for (long r = 0; r < rows; r++) narrow(dst + r * ld, src + r * cols, cols);
}

/* ---- scratch: a few buffers, grown as needed and kept -------------------------------- */

enum { SCRATCH_SLOTS = 10 };
static struct { float *p; size_t cap; } slot[SCRATCH_SLOTS];
static size_t held_bytes, peak_bytes;

static float *scratch(int which, long floats) {
    size_t want = (size_t)(floats > 0 ? floats : 1);
    if (slot[which].cap >= want) return slot[which].p;
    free(slot[which].p);
    held_bytes -= slot[which].cap * sizeof(float);
    slot[which].p = malloc(want * sizeof(float));
    if (!slot[which].p) die("out of host memory for %zu floats of bf16 kernel scratch", want);
    slot[which].cap = want;
    held_bytes += want * sizeof(float);
    if (held_bytes > peak_bytes) peak_bytes = held_bytes;
    return slot[which].p;
}

size_t kernels_bf16_cpu_scratch_bytes(void) { return peak_bytes; }

/* Chunks small enough that the widened operands stay in L1 (32-48 KB): the
 * extra passes of widening and rounding then cost L1 accesses only, and the
 * bf16 tensors are read and written once, at half the bytes of fp32. */
enum { ELEMS = 2048 };        /* elementwise chunks: 8 KB per operand */
enum { ROW_FLOATS = 2048 };   /* row kernels: as many rows as fit in this */
enum { GEMM_FLOATS = 1 << 18 }; /* matrix products: rows per chunk x width, 1 MB per operand */

static long min_long(long a, long b) { return a < b ? a : b; }

static long rows_per_chunk(long budget, long width) {
    long r = width > 0 ? budget / width : budget;
    return r > 0 ? r : 1;
}


/* ---- elementwise ------------------------------------------------------------------------ */

/* GELU is bound by its arithmetic (an exp per element), and the conversions
 * add to it. Built for AVX2 and AVX-512 like the fp32 kernel (WITH_AVX512),
 * with the fp32 kernel's arithmetic (gelu_value, gelu_slope:
 * kernels_cpu_math.h), so the result is the fp32 kernel's on the widened
 * values, rounded once, either way. The forward with AVX-512 converts in
 * registers (16 lanes: 0.73 against 1.37 ms for a million elements, the fp32
 * kernel 0.50); with AVX2 it runs the fp32 kernel on L1-sized chunks, widened
 * before and rounded after, which gcc vectorises better than one loop doing
 * all three (0.78 against 0.98 ms; fp32 0.59). */
static inline __attribute__((always_inline)) void gelu_forward_bf16_body(void *out, const void *inp, long N) {
    bf16 *restrict y = out;
    const bf16 *restrict x = inp;
    for (long i = 0; i < N; i++) y[i] = round_bf16(gelu_value(wide(x[i])));
}
PL_TARGET_AVX512 static void gelu_forward_bf16_avx512(void *out, const void *inp, long N) {
    gelu_forward_bf16_body(out, inp, N);
}

static void gelu_forward_bf16(void *out, const void *inp, long N) {
    if (cpu_has_avx512()) {
        gelu_forward_bf16_avx512(out, inp, N);
        return;
    }
    float *x = scratch(0, min_long(ELEMS, N)), *y = scratch(1, min_long(ELEMS, N));
    for (long i = 0; i < N; i += ELEMS) {
        long n = min_long(ELEMS, N - i);
        widen(x, (const bf16 *)inp + i, n);
        kernels_cpu.gelu_forward(y, x, n);
        narrow((bf16 *)out + i, y, n);
    }
}

/* The backward reads three tensors: there one loop that converts in
 * registers is the faster with AVX2 too (1.19 against 1.47 ms; fp32 0.79). */
WITH_AVX512(gelu_backward_bf16, (void *dinp, const void *dout, const void *inp, long N), (dinp, dout, inp, N), {
    bf16 *restrict dx = dinp;
    const bf16 *restrict dy = dout, *restrict x = inp;
    for (long i = 0; i < N; i++) dx[i] = round_bf16(wide(dx[i]) + gelu_slope(wide(x[i])) * wide(dy[i]));
})

/* The residual adds and the scale are bound by memory: they convert in
 * registers, reading and writing each bf16 tensor once. */
static void accumulate_bf16(void *dst, const void *src, long N) {
    bf16 *restrict d = dst;
    const bf16 *restrict s = src;
    for (long i = 0; i < N; i++) d[i] = round_bf16(wide(d[i]) + wide(s[i]));
}

/* out may alias a or b: those cases are an accumulate (a + b = b + a) */
static void add_bf16(void *out, const void *a, const void *b, long N) {
    if (out == a) {
        accumulate_bf16(out, b, N);
        return;
    }
    if (out == b) {
        accumulate_bf16(out, a, N);
        return;
    }
    bf16 *restrict o = out;
    const bf16 *restrict x = a, *restrict y = b;
    for (long i = 0; i < N; i++) o[i] = round_bf16(wide(x[i]) + wide(y[i]));
}

static void scale_bf16(void *x, float s, long N) {
    bf16 *restrict v = x;
    for (long i = 0; i < N; i++) v[i] = round_bf16(wide(v[i]) * s);
}

static void to_values_bf16(void *dst, const float *src, long N) { narrow(dst, src, N); }
static void to_floats_bf16(float *dst, const void *src, long N) { widen(dst, src, N); }

/* ---- encoder ------------------------------------------------------------------------------ */

static void encoder_forward_bf16(void *out, const int *tokens, const void *wte, const void *wpe, int B, int T,
                                 int C) {
    float *e = scratch(0, C), *p = scratch(1, C);
    for (long n = 0; n < (long)B * T; n++) {
        widen(e, (const bf16 *)wte + (long)tokens[n] * C, C);
        widen(p, (const bf16 *)wpe + (n % T) * C, C);
        kernels_cpu.accumulate(e, p, C);
        narrow((bf16 *)out + n * C, e, C);
    }
}

/* The fp32 kernel's order (positions in turn, each added to its token's row
 * and its position's row), on fp32 copies of the two tables, rounded once.
 * dout is widened a few sequences at a time; the rows of dwte widened are
 * those up to the largest token id present. */
static void encoder_backward_bf16(void *dwte, void *dwpe, const void *dout, const int *tokens, int B, int T, int C) {
    long rows = 0;
    for (long n = 0; n < (long)B * T; n++)
        if (tokens[n] + 1L > rows) rows = tokens[n] + 1L;
    long S = min_long(rows_per_chunk(GEMM_FLOATS, (long)T * C), B); /* sequences per chunk */
    float *te = scratch(0, rows * C), *pe = scratch(1, (long)T * C), *d = scratch(2, S * T * C);
    widen(te, dwte, rows * C);
    widen(pe, dwpe, (long)T * C);
    for (long b0 = 0; b0 < B; b0 += S) {
        long nb = min_long(S, B - b0);
        widen(d, (const bf16 *)dout + b0 * T * C, nb * T * C);
        kernels_cpu.encoder_backward(te, pe, d, tokens + b0 * T, (int)nb, T, C);
    }
    narrow(dwte, te, rows * C);
    narrow(dwpe, pe, (long)T * C);
}

/* ---- layernorm ------------------------------------------------------------------------------ */

static void layernorm_forward_bf16(void *out, float *mean, float *rstd, const void *inp, const void *w,
                                   const void *b, int N, int C) {
    long R = min_long(rows_per_chunk(ROW_FLOATS, C), N);
    float *wf = scratch(0, C), *bfl = scratch(1, C), *x = scratch(2, R * C), *y = scratch(3, R * C);
    widen(wf, w, C);
    widen(bfl, b, C);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(x, (const bf16 *)inp + n0 * C, r * C);
        kernels_cpu.layernorm_forward(y, mean + n0, rstd + n0, x, wf, bfl, (int)r, C);
        narrow((bf16 *)out + n0 * C, y, r * C);
    }
}

static void layernorm_backward_input_bf16(void *dinp, const void *dout, const void *inp, const void *w,
                                          const float *mean, const float *rstd, int N, int C) {
    long R = min_long(rows_per_chunk(ROW_FLOATS, C), N);
    float *wf = scratch(0, C), *dx = scratch(1, R * C), *dy = scratch(2, R * C), *x = scratch(3, R * C);
    widen(wf, w, C);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(dx, (const bf16 *)dinp + n0 * C, r * C);
        widen(dy, (const bf16 *)dout + n0 * C, r * C);
        widen(x, (const bf16 *)inp + n0 * C, r * C);
        kernels_cpu.layernorm_backward_input(dx, dy, x, wf, mean + n0, rstd + n0, (int)r, C);
        narrow((bf16 *)dinp + n0 * C, dx, r * C);
    }
}

static void layernorm_backward_weight_bf16(void *dw, void *db, const void *dout, const void *inp, const float *mean,
                                           const float *rstd, int N, int C) {
    long R = min_long(rows_per_chunk(ROW_FLOATS, C), N);
    float *dwf = scratch(0, C), *dbf = scratch(1, C), *dy = scratch(2, R * C), *x = scratch(3, R * C);
    widen(dwf, dw, C);
    widen(dbf, db, C);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(dy, (const bf16 *)dout + n0 * C, r * C);
        widen(x, (const bf16 *)inp + n0 * C, r * C);
        kernels_cpu.layernorm_backward_weight(dwf, dbf, dy, x, mean + n0, rstd + n0, (int)r, C);
    }
    narrow(dw, dwf, C);
    narrow(db, dbf, C);
}

static void layernorm_backward_bf16(void *dinp, void *dw, void *db, const void *dout, const void *inp, const void *w,
                                    const float *mean, const float *rstd, int N, int C) {
    if (dinp) layernorm_backward_input_bf16(dinp, dout, inp, w, mean, rstd, N, C);
    if (dw) layernorm_backward_weight_bf16(dw, db, dout, inp, mean, rstd, N, C);
}

/* ---- matrix products: oneDNN or sgemm ------------------------------------------------------- */

/* The bias gradient, fp32 column sums of dout over all N rows, rounded once. */
static void bias_backward_bf16(void *dbias, const void *dout, int N, int OC) {
    float *restrict acc = scratch(4, OC);
    widen(acc, dbias, OC);
    for (long n = 0; n < N; n++) {
        const bf16 *restrict d = (const bf16 *)dout + n * OC;
        for (long o = 0; o < OC; o++) acc[o] += wide(d[o]);
    }
    narrow(dbias, acc, OC);
}

/* out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias, on the widened operands, chunk by chunk of rows */
static void sgemm_forward(void *out, const void *inp, const void *w, const void *bias, int N, int IC, int OC) {
    long R = min_long(rows_per_chunk(GEMM_FLOATS, IC > OC ? IC : OC), N);
    float *wf = scratch(0, (long)OC * IC), *bf = bias ? scratch(1, OC) : NULL;
    float *x = scratch(2, R * IC), *y = scratch(3, R * OC);
    widen(wf, w, (long)OC * IC);
    if (bias) widen(bf, bias, OC);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(x, (const bf16 *)inp + n0 * IC, r * IC);
        kernels_cpu.matmul_forward(y, x, wf, bf, (int)r, IC, OC);
        narrow((bf16 *)out + n0 * OC, y, r * OC);
    }
}

/* dinp[N,IC] += dout[N,OC] @ w[OC,IC] */
static void sgemm_backward_input(void *dinp, const void *dout, const void *w, int N, int IC, int OC) {
    long R = min_long(rows_per_chunk(GEMM_FLOATS, IC > OC ? IC : OC), N);
    float *wf = scratch(0, (long)OC * IC), *dy = scratch(2, R * OC), *dx = scratch(3, R * IC);
    widen(wf, w, (long)OC * IC);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(dy, (const bf16 *)dout + n0 * OC, r * OC);
        widen(dx, (const bf16 *)dinp + n0 * IC, r * IC);
        kernels_cpu.matmul_backward_input(dx, dy, wf, (int)r, IC, OC);
        narrow((bf16 *)dinp + n0 * IC, dx, r * IC);
    }
}

/* dw[OC,IC] += dout^T @ inp: the sum over all N rows in an fp32 dw, rounded once */
static void sgemm_backward_weight(void *dw, const void *dout, const void *inp, int N, int IC, int OC) {
    long R = min_long(rows_per_chunk(GEMM_FLOATS, IC > OC ? IC : OC), N);
    float *dwf = scratch(0, (long)OC * IC), *dy = scratch(2, R * OC), *x = scratch(3, R * IC);
    widen(dwf, dw, (long)OC * IC);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(dy, (const bf16 *)dout + n0 * OC, r * OC);
        widen(x, (const bf16 *)inp + n0 * IC, r * IC);
        kernels_cpu.matmul_backward_weight(dwf, NULL, dy, x, (int)r, IC, OC);
    }
    narrow(dw, dwf, (long)OC * IC);
}

#ifdef PL_HAVE_ONEDNN
/* One oneDNN matmul, or a batch of them: dst[M,N] (+)= src[M,K] @ wei[K,N]
 * (+ bias[N]) for each of `batch` matrices, on bf16 operands given by their
 * strides (batch, row, column), fp32 accumulation; dst bf16 or fp32.
 * Primitives are made once per shape (making one costs far more than running
 * it) and kept. */
typedef struct {
    long batch, M, K, N, src_s[3], wei_s[3], dst_s[3];
    int dst_f32, bias, accumulate;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst, b;
} cached_matmul;

static dnnl_engine_t dnnl_cpu_engine;
static dnnl_stream_t dnnl_cpu_stream;
static cached_matmul *dnnl_cache;
static int dnnl_cached, dnnl_cache_cap;

#define DNNL_OK(call) do { dnnl_status_t s_ = (call); if (s_ != dnnl_success) die("%s: oneDNN status %d", #call, (int)s_); } while (0)

/* a [batch,] rows x cols matrix: 2 dimensions for one matrix, 3 for a batch */
static void md_init(dnnl_memory_desc_t *md, long batch, long rows, long cols, const long strides[3],
                    dnnl_data_type_t type) {
    dnnl_dims_t dims = {batch, rows, cols}, st = {strides[0], strides[1], strides[2]};
    if (batch <= 1) { /* two dimensions */
        dnnl_dims_t d2 = {rows, cols}, s2 = {strides[1], strides[2]};
        DNNL_OK(dnnl_memory_desc_init_by_strides(md, 2, d2, type, s2));
    } else
        DNNL_OK(dnnl_memory_desc_init_by_strides(md, 3, dims, type, st));
}

static cached_matmul *dnnl_find(const cached_matmul *key) {
    for (int i = 0; i < dnnl_cached; i++) {
        cached_matmul *c = &dnnl_cache[i];
        if (c->batch == key->batch && c->M == key->M && c->K == key->K && c->N == key->N &&
            !memcmp(c->src_s, key->src_s, sizeof c->src_s) && !memcmp(c->wei_s, key->wei_s, sizeof c->wei_s) &&
            !memcmp(c->dst_s, key->dst_s, sizeof c->dst_s) && c->dst_f32 == key->dst_f32 && c->bias == key->bias &&
            c->accumulate == key->accumulate)
            return c;
    }
    if (!dnnl_cpu_engine) {
        DNNL_OK(dnnl_engine_create(&dnnl_cpu_engine, dnnl_cpu, 0));
        DNNL_OK(dnnl_stream_create(&dnnl_cpu_stream, dnnl_cpu_engine, dnnl_stream_default_flags));
    }
    if (dnnl_cached == dnnl_cache_cap) {
        dnnl_cache_cap = dnnl_cache_cap ? 2 * dnnl_cache_cap : 32;
        dnnl_cache = realloc(dnnl_cache, (size_t)dnnl_cache_cap * sizeof *dnnl_cache);
        if (!dnnl_cache) die("out of host memory");
    }
    cached_matmul *c = &dnnl_cache[dnnl_cached++];
    *c = *key;
    dnnl_memory_desc_t smd, wmd, dmd, bmd;
    const long bs[3] = {0, key->N, 1};
    md_init(&smd, c->batch, c->M, c->K, c->src_s, dnnl_bf16);
    md_init(&wmd, c->batch, c->K, c->N, c->wei_s, dnnl_bf16);
    md_init(&dmd, c->batch, c->M, c->N, c->dst_s, c->dst_f32 ? dnnl_f32 : dnnl_bf16);
    if (c->bias) md_init(&bmd, 1, 1, c->N, bs, dnnl_bf16);
    dnnl_matmul_desc_t desc;
    DNNL_OK(dnnl_matmul_desc_init(&desc, &smd, &wmd, c->bias ? &bmd : NULL, &dmd));
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    if (c->accumulate) { /* dst = dst + product, added in fp32, rounded once */
        DNNL_OK(dnnl_post_ops_create(&ops));
        DNNL_OK(dnnl_post_ops_append_sum(ops, 1.0f));
        DNNL_OK(dnnl_primitive_attr_create(&attr));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, ops));
    }
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &desc, attr, dnnl_cpu_engine, NULL));
    DNNL_OK(dnnl_primitive_create(&c->prim, pd));
    DNNL_OK(dnnl_memory_create(&c->src, &smd, dnnl_cpu_engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&c->wei, &wmd, dnnl_cpu_engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&c->dst, &dmd, dnnl_cpu_engine, DNNL_MEMORY_NONE));
    if (c->bias) DNNL_OK(dnnl_memory_create(&c->b, &bmd, dnnl_cpu_engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_primitive_desc_destroy(pd));
    if (attr) DNNL_OK(dnnl_primitive_attr_destroy(attr));
    if (ops) DNNL_OK(dnnl_post_ops_destroy(ops));
    return c;
}

static void dnnl_exec(const cached_matmul *key, const void *src, const void *wei, void *dst, const void *bias) {
    if (key->batch <= 0 || key->M <= 0 || key->N <= 0 || key->K <= 0) return;
    cached_matmul *c = dnnl_find(key);
    DNNL_OK(dnnl_memory_set_data_handle(c->src, (void *)(uintptr_t)src));
    DNNL_OK(dnnl_memory_set_data_handle(c->wei, (void *)(uintptr_t)wei));
    DNNL_OK(dnnl_memory_set_data_handle(c->dst, dst));
    dnnl_exec_arg_t args[4];
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, c->src};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, c->wei};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, c->dst};
    int nargs = 3;
    if (bias) {
        DNNL_OK(dnnl_memory_set_data_handle(c->b, (void *)(uintptr_t)bias));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, c->b};
    }
    DNNL_OK(dnnl_primitive_execute(c->prim, dnnl_cpu_stream, nargs, args));
    DNNL_OK(dnnl_stream_wait(dnnl_cpu_stream));
}

/* One matrix, bf16 out: the linear layers' products */
static void dnnl_run(long M, long K, long N, const void *src, const long ss[2], const void *wei, const long ws[2],
                     void *dst, const long ds[2], const void *bias, int accumulate) {
    const cached_matmul key = {.batch = 1, .M = M, .K = K, .N = N, .src_s = {0, ss[0], ss[1]},
                               .wei_s = {0, ws[0], ws[1]}, .dst_s = {0, ds[0], ds[1]}, .bias = bias != NULL,
                               .accumulate = accumulate};
    dnnl_exec(&key, src, wei, dst, bias);
}

/* `batch` dense row-major matrices, fp32 out: dst[b] (+)= src[b] @ wei[b], where
 * src[b] is [M,K] (or its transpose stored [K,M] when src_t), wei[b] is [K,N]
 * (or the transpose, stored [N,K], when wei_t). Attention's products. */
static void dnnl_batched(long batch, long M, long K, long N, const bf16 *src, int src_t, const bf16 *wei, int wei_t,
                         float *dst, int accumulate) {
    const cached_matmul key = {.batch = batch, .M = M, .K = K, .N = N,
                               .src_s = {M * K, src_t ? 1 : K, src_t ? M : 1},
                               .wei_s = {K * N, wei_t ? 1 : N, wei_t ? K : 1},
                               .dst_s = {M * N, N, 1}, .dst_f32 = 1, .accumulate = accumulate};
    dnnl_exec(&key, src, wei, dst, NULL);
}
#endif

/* ---- which path: decided once ---------------------------------------------------------------- */

static int cpu_has_bf16_dot(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    int found = 0;
    while (!found && getline(&line, &cap, f) > 0)
        if (!strncmp(line, "flags", 5)) found = strstr(line, " avx512_bf16") || strstr(line, " amx_bf16");
    free(line);
    fclose(f);
    return found;
}

void omp_set_num_threads(int); /* libgomp, oneDNN's threading runtime */

#ifdef PL_HAVE_ONEDNN
/* Whether oneDNN makes a bf16 matmul on this CPU at all: it needs AVX-512
 * (AVX512-BF16 for the fast one), and refuses on an AVX2-only CPU. */
static int onednn_has_bf16_matmul(void) {
    dnnl_engine_t e;
    if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success) return 0;
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {2, 2};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd;
    int ok = dnnl_memory_desc_init_by_tag(&md, 2, dims, dnnl_bf16, dnnl_ab) == dnnl_success &&
             dnnl_matmul_desc_init(&desc, &md, &md, NULL, &md) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &desc, NULL, e, NULL) == dnnl_success;
    if (ok) dnnl_primitive_desc_destroy(pd);
    dnnl_engine_destroy(e);
    return ok;
}
#endif

static int gemm_path = -1; /* 1 oneDNN, 0 sgemm */
static char gemm_text[256];

static void choose_gemm_path(void) {
    if (gemm_path >= 0) return;
    const char *force = getenv("PL_BF16_GEMM");
    int has_dot = cpu_has_bf16_dot();
#ifdef PL_HAVE_ONEDNN
    const dnnl_version_t *v = dnnl_version();
    if (force && !strcmp(force, "onednn")) gemm_path = 1;
    else if (force && !strcmp(force, "sgemm")) gemm_path = 0;
    else gemm_path = has_dot;
    if (gemm_path && !onednn_has_bf16_matmul()) {
        gemm_path = 0;
        snprintf(gemm_text, sizeof gemm_text, "bf16 matmuls: widened to fp32 for OpenBLAS sgemm (oneDNN %d.%d.%d has "
                 "no bf16 matmul for this CPU: it needs AVX-512)", v->major, v->minor, v->patch);
    } else if (gemm_path) {
        /* one thread per rank, as OpenBLAS: the ranks are the parallelism */
        if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(1);
        snprintf(gemm_text, sizeof gemm_text, "bf16 matmuls: oneDNN %d.%d.%d bf16 matmul, fp32 accumulation (%s%s)",
                 v->major, v->minor, v->patch, force ? "PL_BF16_GEMM=onednn; " : "",
                 has_dot ? "this CPU has AVX512-BF16" : "this CPU has no AVX512-BF16: oneDNN converts in its kernels");
    } else if (!gemm_text[0]) {
        snprintf(gemm_text, sizeof gemm_text, "bf16 matmuls: widened to fp32 for OpenBLAS sgemm (%s)",
                 force ? "PL_BF16_GEMM=sgemm" : "this CPU has no AVX512-BF16; PL_BF16_GEMM=onednn tries oneDNN's");
    }
#else
    (void)force;
    gemm_path = 0;
    snprintf(gemm_text, sizeof gemm_text, "bf16 matmuls: widened to fp32 for OpenBLAS sgemm (built without "
             "oneDNN: libdnnl-dev was not found%s)", has_dot ? "; this CPU has AVX512-BF16, which it would use" : "");
#endif
}

int kernels_bf16_cpu_uses_onednn(void) {
    choose_gemm_path();
    return gemm_path;
}

const char *kernels_bf16_cpu_gemm_text(void) {
    choose_gemm_path();
    return gemm_text;
}

static void matmul_forward_bf16(void *out, const void *inp, const void *w, const void *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC <= 0) { /* an empty sum: the bias, or zero */
        float *b = scratch(1, OC);
        if (bias) widen(b, bias, OC);
        else memset(b, 0, (size_t)OC * sizeof *b);
        for (long n = 0; n < N; n++) narrow((bf16 *)out + n * OC, b, OC);
        return;
    }
#ifdef PL_HAVE_ONEDNN
    if (kernels_bf16_cpu_uses_onednn()) {
        /* out[N,OC] = inp[N,IC] @ w^T: weights [IC,OC] are w read with strides (1, IC) */
        const long ss[2] = {IC, 1}, ws[2] = {1, IC}, ds[2] = {OC, 1};
        dnnl_run(N, IC, OC, inp, ss, w, ws, out, ds, bias, 0);
        return;
    }
#endif
    sgemm_forward(out, inp, w, bias, N, IC, OC);
}

static void matmul_backward_input_bf16(void *dinp, const void *dout, const void *w, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0 || IC <= 0) return;
#ifdef PL_HAVE_ONEDNN
    if (kernels_bf16_cpu_uses_onednn()) { /* dinp[N,IC] += dout[N,OC] @ w[OC,IC] */
        const long ss[2] = {OC, 1}, ws[2] = {IC, 1}, ds[2] = {IC, 1};
        dnnl_run(N, OC, IC, dout, ss, w, ws, dinp, ds, NULL, 1);
        return;
    }
#endif
    sgemm_backward_input(dinp, dout, w, N, IC, OC);
}

static void matmul_backward_weight_bf16(void *dw, void *dbias, const void *dout, const void *inp, int N, int IC,
                                        int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC > 0) {
#ifdef PL_HAVE_ONEDNN
        /* oneDNN 2.6's bf16 matmul with a transposed source and a reduction of fewer than 64
         * rows executes an illegal instruction on AVX512-BF16 CPUs (seen: N = 63 tokens of an
         * expert, dw[144,36]); such small products go through sgemm (fp32 accumulation too) */
        if (kernels_bf16_cpu_uses_onednn() && N >= 64) { /* dw[OC,IC] += dout^T [OC,N] @ inp[N,IC] */
            const long ss[2] = {1, OC}, ws[2] = {IC, 1}, ds[2] = {IC, 1};
            dnnl_run(OC, N, IC, dout, ss, inp, ws, dw, ds, NULL, 1);
        } else
#endif
            sgemm_backward_weight(dw, dout, inp, N, IC, OC);
    }
    if (dbias) bias_backward_bf16(dbias, dout, N, OC);
}

static void matmul_backward_bf16(void *dinp, void *dw, void *dbias, const void *dout, const void *inp, const void *w,
                                 int N, int IC, int OC) {
    if (dinp) matmul_backward_input_bf16(dinp, dout, w, N, IC, OC);
    matmul_backward_weight_bf16(dw, dbias, dout, inp, N, IC, OC);
}

/* ---- attention: a few heads of one batch row at a time ------------------------------------------ */

enum { ATT_FLOATS = 1 << 16 }; /* widened scores and q, k, v of the heads in one group: 256 KB, in L2 */

/* Heads h0 .. h0+G-1 of batch row b: their q, k and v (inside qkv's rows of
 * 3C) widened into one [T, 3 G HS] block, the layout of a qkv with G heads,
 * so the fp32 kernel runs on it with NH = G. With all heads in the group,
 * each row is one contiguous run. */
static void widen_heads_qkv(float *qkv1, const bf16 *qkv, int b, int h0, int G, int T, int NH, int HS) {
    const long C = (long)NH * HS, C3 = 3 * C, W = (long)G * HS;
    for (long t = 0; t < T; t++)
        for (int part = 0; part < 3; part++)
            widen(qkv1 + t * 3 * W + part * W, qkv + ((long)b * T + t) * C3 + part * C + (long)h0 * HS, W);
}

static void narrow_heads_qkv(bf16 *qkv, const float *qkv1, int b, int h0, int G, int T, int NH, int HS) {
    const long C = (long)NH * HS, C3 = 3 * C, W = (long)G * HS;
    for (long t = 0; t < T; t++)
        for (int part = 0; part < 3; part++)
            narrow(qkv + ((long)b * T + t) * C3 + part * C + (long)h0 * HS, qkv1 + t * 3 * W + part * W, W);
}

static int heads_per_group(int T, int NH, int HS) {
    long g = ATT_FLOATS / (2L * T * T + 4L * T * HS); /* scores, their gradient, q k v and the output's */
    return (int)(g < 1 ? 1 : g > NH ? NH : g);
}

#ifdef PL_HAVE_ONEDNN
/* Attention's products through oneDNN's bf16 matmul, a group of heads per
 * call (a batch of dense matrices: q, k, v and dout are first copied out of
 * their rows into one [T, HS] block per head). The scores and their gradients
 * are fp32 (the products' fp32 sums, then the softmax in fp32, as in the fp32
 * kernel). The probabilities P and the score gradients dS are fp32 numbers
 * that a bf16 product must not round: each is split into two bf16 parts,
 * hi = bf16(x) and lo = bf16(x - hi), and multiplied as hi @ v + lo @ v, which
 * carries x to 2^-16 of itself (fp32's own rounding is 2^-24; the outputs
 * are then rounded to bf16's 2^-8). The kept softmax (att) is P's hi part. */

/* The heads a oneDNN call takes: whole batch rows' worth when they fit (one
 * call per product for several (batch row, head) pairs: the calls cost a
 * few microseconds each, as much as one head's product at T = 64). */
enum { ATT_DNNL_FLOATS = 1 << 18 }; /* 1 MB: scores, hi/lo parts, copies, products of a group */

static long heads_per_call(int T, int HS, long heads) {
    long g = ATT_DNNL_FLOATS / (2L * T * T + 5L * T * HS);
    return g < 1 ? 1 : g > heads ? heads : g;
}

/* The causal mask zeroes the top-right block of the T x T matrices (scores,
 * P, dS): cut rows and columns at h = T/2 and rows t < h need only columns
 * s < h, so every product runs as two calls, one on the top h rows (K or N
 * = h) and one on the bottom T - h rows: about a quarter of the
 * multiply-adds fewer. oneDNN 2.6 runs its fast kernel (brgemm) only on
 * dense matrices (a strided block of a bigger one ran through gemm:jit, and
 * the split was slower than one call on the whole block), so each half
 * has its own dense copy: the [T, HS] blocks of a group are stored as "split
 * rows" (all heads' rows t < h, [g, h, HS], then all heads' rows t >= h,
 * [g, T - h, HS]), the T x T ones as "causal blocks" (all heads' [h, h]
 * top-left blocks, then their [T - h, T] bottom rows). h is a multiple of
 * LANES, so that a top row's padded softmax (padded_length) stays inside
 * its h columns and runs in place, as the bottom rows do. Under
 * CAUSAL_SPLIT_MIN_T, h = 0: the top calls are empty and the bottom ones
 * are the whole products, as two calls cost more than the quarter saved. */
enum { CAUSAL_SPLIT_MIN_T = 32 };

static int causal_split(int T) { return T >= CAUSAL_SPLIT_MIN_T ? T / 2 / LANES * LANES : 0; }

/* row t of head j in a split-rows block of g heads, rows of `width` */
static long split_row_at(long j, long t, long h, long T, long g, long width) {
    return t < h ? (j * h + t) * width : (g * h + j * (T - h) + t - h) * width;
}

/* row t of head j in a causal-blocks matrix of g heads (its length: h or T) */
static long causal_row_at(long j, long t, long h, long T, long g) {
    return t < h ? (j * h + t) * h : g * h * h + (j * (T - h) + t - h) * T;
}

/* `parts` consecutive parts (C = NH HS apart) of the rows of src (length ld):
 * q, k, v in qkv's rows or dout's one part, of heads gh0 .. gh0+g-1,
 * numbered b NH + h over the batch, into dense blocks dst + part * g T HS,
 * each in the split-rows layout at h (h = 0: plain [g, T, HS]) */
__attribute__((optimize("no-tree-loop-distribute-patterns"))) /* rows of HS: inline copies, not memmove calls */
static void copy_heads(bf16 *restrict dst, const bf16 *restrict src, long ld, int parts, long gh0, long g, int T,
                       int h, int NH, int HS) {
    const long blk = g * T * HS, C = (long)NH * HS;
    for (long j = 0; j < g; j++) {
        const long b = (gh0 + j) / NH, head = (gh0 + j) % NH;
        for (long t = 0; t < T; t++)
            for (int part = 0; part < parts; part++) {
                const bf16 *restrict from = src + (b * T + t) * ld + part * C + head * HS;
                bf16 *restrict to = dst + part * blk + split_row_at(j, t, h, T, g, HS);
                for (int d = 0; d < HS; d++) to[d] = from[d];
            }
    }
}

/* the first h rows of each of g dense [T, HS] blocks, into dense [g, h, HS] */
static void first_rows(bf16 *restrict dst, const bf16 *restrict src, long g, int T, int h, int HS) {
    for (long j = 0; j < g; j++) memcpy(dst + j * h * HS, src + j * T * HS, (size_t)h * HS * sizeof *dst);
}

/* x[0..n) -> hi = bf16(x), lo = bf16(x - hi); zero from n to w. With kept
 * (a row of T), hi goes there too, zero from n to T. */
__attribute__((optimize("no-tree-loop-distribute-patterns"))) /* short rows: no memset calls */
static void split_row(bf16 *restrict hi, bf16 *restrict lo, bf16 *restrict kept, const float *restrict x, int n, int w,
                      int T) {
    for (int i = 0; i < n; i++) {
        hi[i] = round_bf16(x[i]);
        lo[i] = round_bf16(x[i] - wide(hi[i]));
    }
    for (int i = n; i < w; i++) hi[i] = lo[i] = 0;
    if (!kept) return;
    for (int i = 0; i < n; i++) kept[i] = hi[i];
    for (int i = n; i < T; i++) kept[i] = 0;
}

__attribute__((optimize("no-tree-loop-distribute-patterns"))) /* short rows: no memcpy calls */
static void copy_row(bf16 *restrict dst, const bf16 *restrict src, int n) {
    for (int i = 0; i < n; i++) dst[i] = src[i];
}

/* O (+)= A Z for g heads, A causal blocks [T, T], Z [T, HS] given whole (z)
 * and its first h rows (z0), O split rows */
static void causal_times(long g, int T, int h, int HS, const bf16 *A, const bf16 *z, const bf16 *z0, float *O,
                         int accumulate) {
    dnnl_batched(g, h, h, HS, A, 0, z0, 0, O, accumulate);
    dnnl_batched(g, T - h, T, HS, A + g * h * h, 0, z, 0, O + g * h * HS, accumulate);
}

/* A^T Z for g heads, A causal blocks, Z split rows: the bottom rows give
 * all T rows (into whole [g, T, HS]), the top block adds to rows t < h (into
 * top [g, h, HS]) */
static void causal_transposed_times(long g, int T, int h, int HS, const bf16 *A, const bf16 *Z, float *whole,
                                    float *top, int accumulate) {
    dnnl_batched(g, T, T - h, HS, A + g * h * h, 1, Z + g * h * HS, 0, whole, accumulate);
    dnnl_batched(g, h, h, HS, A, 1, Z, 0, top, accumulate);
}

static void attention_forward_onednn(bf16 *out, bf16 *att, const bf16 *qkv, int B, int T, int NH, int HS) {
    const long C = (long)NH * HS, TT = (long)T * T, heads = (long)B * NH;
    const long G = heads_per_call(T, HS, heads);
    const int h = causal_split(T);
    const float scale = 1.0f / sqrtf((float)HS);
    const long hh = (long)h * h, causal = hh + (long)(T - h) * T; /* a head's causal blocks */
    /* q (split rows), k, v, then the first h rows of k and v */
    bf16 *hd = (bf16 *)scratch(0, (3 * G * T * HS + 2 * G * h * HS + 1) / 2);
    bf16 *hi = (bf16 *)scratch(2, (G * causal + 1) / 2), *lo = (bf16 *)scratch(3, (G * causal + 1) / 2);
    float *S = scratch(1, G * causal), *O = scratch(4, G * T * HS);
    for (long gh0 = 0; gh0 < heads; gh0 += G) {
        const long g = G < heads - gh0 ? G : heads - gh0, blk = g * T * HS;
        const bf16 *q = hd, *k = hd + blk, *v = hd + 2 * blk;
        bf16 *k0 = hd + 3 * blk, *v0 = k0 + g * h * HS;
        copy_heads(hd, qkv, 3 * C, 1, gh0, g, T, h, NH, HS);
        copy_heads(hd + blk, qkv + C, 3 * C, 2, gh0, g, T, 0, NH, HS);
        first_rows(k0, k, g, T, h, HS);
        first_rows(v0, v, g, T, h, HS);
        dnnl_batched(g, h, HS, h, q, 0, k0, 1, S, 0); /* S = q k^T: the top-left blocks */
        dnnl_batched(g, T - h, HS, T, q + g * h * HS, 0, k, 1, S + g * hh, 0); /* the bottom rows */
        for (long r = 0; r < g * T; r++) { /* row t = r % T of head j: the causal softmax */
            const long j = r / T, at = causal_row_at(j, r % T, h, T, g);
            const int t = (int)(r % T), n = padded_length(t, T), w = t < h ? h : T; /* n <= w */
            float *x = S + at;
            for (int i = 0; i < n; i++) x[i] *= scale;
            for (int i = t + 1; i < n; i++) x[i] = -INFINITY; /* padding: out of the max, 0 from the exp on */
            const float m = row_max(x, n);
            for (int i = 0; i < n; i++) x[i] = exp_fast(x[i] - m);
            for (int i = t + 1; i < n; i++) x[i] = 0.0f;
            const float inv = 1.0f / row_sum(x, n);
            for (int i = 0; i < n; i++) x[i] *= inv;
            split_row(hi + at, lo + at, att + (gh0 + j) * TT + (long)t * T, x, n, w, T); /* att: P's hi part */
        }
        causal_times(g, T, h, HS, hi, v, v0, O, 0); /* O = P v */
        causal_times(g, T, h, HS, lo, v, v0, O, 1);
        for (long j = 0; j < g; j++) {
            const long b = (gh0 + j) / NH, head = (gh0 + j) % NH;
            for (long t = 0; t < T; t++)
                narrow(out + (b * T + t) * C + head * HS, O + split_row_at(j, t, h, T, g, HS), HS);
        }
    }
}

static void attention_backward_onednn(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *att, int B, int T,
                                      int NH, int HS) {
    const long C = (long)NH * HS, TT = (long)T * T, heads = (long)B * NH;
    const long G = heads_per_call(T, HS, heads);
    const int h = causal_split(T);
    const float scale = 1.0f / sqrtf((float)HS);
    const long hh = (long)h * h, causal = hh + (long)(T - h) * T;
    /* q (split rows), k, v, dout (split rows), then the first h rows of k and v */
    bf16 *hd = (bf16 *)scratch(0, (4 * G * T * HS + 2 * G * h * HS + 1) / 2);
    bf16 *hi = (bf16 *)scratch(2, (G * causal + 1) / 2), *lo = (bf16 *)scratch(3, (G * causal + 1) / 2);
    bf16 *P_split = h ? (bf16 *)scratch(6, (G * causal + 1) / 2) : NULL; /* att's rows in causal blocks */
    float *dP = scratch(1, G * causal), *D = scratch(4, 3 * G * T * HS + 2 * G * h * HS);
    for (long gh0 = 0; gh0 < heads; gh0 += G) {
        const long g = G < heads - gh0 ? G : heads - gh0, blk = g * T * HS;
        const bf16 *q = hd, *k = hd + blk, *v = hd + 2 * blk, *dO = hd + 3 * blk;
        const bf16 *P = h ? P_split : att + gh0 * TT; /* h = 0: att's own layout */
        bf16 *k0 = hd + 4 * blk, *v0 = k0 + g * h * HS;
        /* dq split rows; dk, dv whole from the bottom rows, plus their top rows' share */
        float *dq = D, *dk = D + blk, *dv = D + 2 * blk, *dk_top = D + 3 * blk, *dv_top = dk_top + g * h * HS;
        copy_heads(hd, qkv, 3 * C, 1, gh0, g, T, h, NH, HS);
        copy_heads(hd + blk, qkv + C, 3 * C, 2, gh0, g, T, 0, NH, HS);
        copy_heads(hd + 3 * blk, dout, C, 1, gh0, g, T, h, NH, HS);
        first_rows(k0, k, g, T, h, HS);
        first_rows(v0, v, g, T, h, HS);
        dnnl_batched(g, h, HS, h, dO, 0, v0, 1, dP, 0); /* dP = dout v^T */
        dnnl_batched(g, T - h, HS, T, dO + g * h * HS, 0, v, 1, dP + g * hh, 0);
        for (long r = 0; r < g * T; r++) { /* back through the softmax: dS = P (dP - sum P dP), scaled */
            const long j = r / T, at = causal_row_at(j, r % T, h, T, g);
            const int t = (int)(r % T), n = padded_length(t, T), w = t < h ? h : T; /* n <= w; p = 0 in the padding */
            const bf16 *p = att + (gh0 + j) * TT + (long)t * T;
            float *x = dP + at;
            float acc[LANES] = {0};
            int i = 0;
            for (; i + LANES <= n; i += LANES)
                for (int l = 0; l < LANES; l++) acc[l] += wide(p[i + l]) * x[i + l];
            float sum = hsum(acc);
            for (; i < n; i++) sum += wide(p[i]) * x[i];
            for (i = 0; i < n; i++) x[i] = wide(p[i]) * (x[i] - sum) * scale;
            split_row(hi + at, lo + at, NULL, x, n, w, T);
            if (h) copy_row(P_split + at, p, w);
        }
        causal_times(g, T, h, HS, hi, k, k0, dq, 0); /* dq = dS k */
        causal_times(g, T, h, HS, lo, k, k0, dq, 1);
        causal_transposed_times(g, T, h, HS, hi, q, dk, dk_top, 0); /* dk = dS^T q */
        causal_transposed_times(g, T, h, HS, lo, q, dk, dk_top, 1);
        causal_transposed_times(g, T, h, HS, P, dO, dv, dv_top, 0); /* dv = P^T dout */
        for (long j = 0; j < g; j++) { /* dqkv += dq | dk | dv, added in fp32, rounded once */
            const long b = (gh0 + j) / NH, head = (gh0 + j) % NH;
            for (long t = 0; t < T; t++) {
                bf16 *restrict to = dqkv + (b * T + t) * 3 * C + head * HS;
                const float *restrict from_q = dq + split_row_at(j, t, h, T, g, HS);
                const float *restrict from_k = dk + (j * T + t) * HS, *restrict from_v = dv + (j * T + t) * HS;
                for (int d = 0; d < HS; d++) to[d] = round_bf16(wide(to[d]) + from_q[d]);
                if (t < h) { /* the top rows' share of dk and dv, added before the one rounding */
                    const float *restrict top_k = dk_top + (j * h + t) * HS;
                    const float *restrict top_v = dv_top + (j * h + t) * HS;
                    for (int d = 0; d < HS; d++) to[C + d] = round_bf16(wide(to[C + d]) + (from_k[d] + top_k[d]));
                    for (int d = 0; d < HS; d++)
                        to[2 * C + d] = round_bf16(wide(to[2 * C + d]) + (from_v[d] + top_v[d]));
                } else {
                    for (int d = 0; d < HS; d++) to[C + d] = round_bf16(wide(to[C + d]) + from_k[d]);
                    for (int d = 0; d < HS; d++) to[2 * C + d] = round_bf16(wide(to[2 * C + d]) + from_v[d]);
                }
            }
        }
    }
}
#endif

static void attention_forward_bf16(void *out, void *att, const void *qkv, int B, int T, int NH, int HS) {
    if (T <= 0 || HS <= 0) return;
#ifdef PL_HAVE_ONEDNN
    if (kernels_bf16_cpu_uses_onednn()) {
        attention_forward_onednn(out, att, qkv, B, T, NH, HS);
        return;
    }
#endif
    const long C = (long)NH * HS, TT = (long)T * T;
    const int G = heads_per_group(T, NH, HS);
    float *q1 = scratch(0, (long)T * 3 * G * HS), *a1 = scratch(1, G * TT), *o1 = scratch(2, (long)T * G * HS);
    for (int b = 0; b < B; b++)
        for (int h0 = 0; h0 < NH; h0 += G) {
            const int g = G < NH - h0 ? G : NH - h0;
            widen_heads_qkv(q1, qkv, b, h0, g, T, NH, HS);
            kernels_cpu.attention_forward(o1, a1, q1, 1, T, g, HS);
            narrow((bf16 *)att + ((long)b * NH + h0) * TT, a1, g * TT);
            narrow_rows((bf16 *)out + (long)b * T * C + (long)h0 * HS, o1, T, (long)g * HS, C);
        }
}

/* datt is not needed: the fp32 kernel's scratch is the widened group's own */
static void attention_backward_bf16(void *dqkv, void *datt, const void *dout, const void *qkv, const void *att, int B,
                                    int T, int NH, int HS) {
    (void)datt;
    if (T <= 0 || HS <= 0) return;
#ifdef PL_HAVE_ONEDNN
    if (kernels_bf16_cpu_uses_onednn()) {
        attention_backward_onednn(dqkv, dout, qkv, att, B, T, NH, HS);
        return;
    }
#endif
    const long C = (long)NH * HS, TT = (long)T * T;
    const int G = heads_per_group(T, NH, HS);
    float *q1 = scratch(0, (long)T * 3 * G * HS), *a1 = scratch(1, G * TT), *dy = scratch(2, (long)T * G * HS);
    float *dq1 = scratch(3, (long)T * 3 * G * HS), *da1 = scratch(4, G * TT);
    for (int b = 0; b < B; b++)
        for (int h0 = 0; h0 < NH; h0 += G) {
            const int g = G < NH - h0 ? G : NH - h0;
            widen_heads_qkv(q1, qkv, b, h0, g, T, NH, HS);
            widen_heads_qkv(dq1, dqkv, b, h0, g, T, NH, HS);
            widen(a1, (const bf16 *)att + ((long)b * NH + h0) * TT, g * TT);
            widen_rows(dy, (const bf16 *)dout + (long)b * T * C + (long)h0 * HS, T, (long)g * HS, C);
            kernels_cpu.attention_backward(dq1, da1, dy, q1, a1, 1, T, g, HS);
            narrow_heads_qkv(dqkv, dq1, b, h0, g, T, NH, HS);
        }
}

/* ---- loss ---------------------------------------------------------------------------------------- */

static void crossentropy_forward_bf16(float *losses, void *probs, const void *logits, const int *targets, int N, int V) {
    long R = min_long(rows_per_chunk(ROW_FLOATS, V), N);
    float *x = scratch(0, R * V), *p = scratch(1, R * V);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(x, (const bf16 *)logits + n0 * V, r * V);
        kernels_cpu.crossentropy_forward(losses + n0, p, x, targets + n0, (int)r, V);
        narrow((bf16 *)probs + n0 * V, p, r * V);
    }
}

static void crossentropy_backward_bf16(void *dlogits, const void *probs, const int *targets, float dloss, int N, int V) {
    long R = min_long(rows_per_chunk(ROW_FLOATS, V), N);
    float *p = scratch(0, R * V), *d = scratch(1, R * V);
    for (long n0 = 0; n0 < N; n0 += R) {
        long r = min_long(R, N - n0);
        widen(p, (const bf16 *)probs + n0 * V, r * V);
        kernels_cpu.crossentropy_backward(d, p, targets + n0, dloss, (int)r, V);
        narrow((bf16 *)dlogits + n0 * V, d, r * V);
    }
}

/* ---- optimizer --------------------------------------------------------------------------------------- */

static double sum_squares_bf16(const void *x, long N) {
    float *f = scratch(0, min_long(ELEMS, N));
    double s = 0;
    for (long i = 0; i < N; i += ELEMS) {
        long n = min_long(ELEMS, N - i);
        widen(f, (const bf16 *)x + i, n);
        s += kernels_cpu.sum_squares(f, n);
    }
    return s;
}

static void sum_squares_add_bf16(double *acc, const void *x, long N) { *acc += sum_squares_bf16(x, N); }

/* The fp32 step on the master weights, from the bf16 gradient. */
static void adamw_bf16(float *p, const void *g, float *m, float *v, long N, float lr, float beta1, float beta2,
                       float eps, float wd, int t, float grad_scale) {
    float *gf = scratch(0, min_long(ELEMS, N));
    for (long i = 0; i < N; i += ELEMS) {
        long n = min_long(ELEMS, N - i);
        widen(gf, (const bf16 *)g + i, n);
        kernels_cpu.adamw(p + i, gf, m + i, v + i, n, lr, beta1, beta2, eps, wd, t, grad_scale);
    }
}

/* ---- attention over blocks (context parallelism): one (batch row, head) at a time ----------------
 * Widen the head's rows into one fp32 block (q [Tq,HS], k, v [Tk,HS], the
 * out and gradients alike), run the fp32 kernel with B = NH = 1, round the
 * outputs back; lse is fp32 in both precisions and goes straight through. */

static void attention_block_forward_bf16(void *out, float *lse, const void *q, const void *k, const void *v, int ldq,
                                         int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                         int HS) {
    if (Tq <= 0 || HS <= 0) return;
    const long C = (long)NH * HS, nq = (long)Tq * HS, nk = (long)Tk * HS;
    float *q1 = scratch(0, nq + 2 * nk + nq), *k1 = q1 + nq, *v1 = k1 + nk, *o1 = v1 + nk;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            widen_rows(q1, (const bf16 *)q + (long)b * Tq * ldq + (long)h * HS, Tq, HS, ldq);
            widen_rows(k1, (const bf16 *)k + (long)b * Tk * ldkv + (long)h * HS, Tk, HS, ldkv);
            widen_rows(v1, (const bf16 *)v + (long)b * Tk * ldkv + (long)h * HS, Tk, HS, ldkv);
            kernels_cpu.attention_block_forward(o1, lse + ((long)b * NH + h) * Tq, q1, k1, v1, HS, HS, q_pos, k_pos,
                                                1, Tq, Tk, 1, HS);
            narrow_rows((bf16 *)out + (long)b * Tq * C + (long)h * HS, o1, Tq, HS, C);
        }
}

static void attention_block_backward_bf16(void *dq, void *dk, void *dv, const void *dout, const void *out,
                                          const float *lse, const void *q, const void *k, const void *v, int ldq,
                                          int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                          int HS) {
    if (Tq <= 0 || Tk <= 0 || HS <= 0) return;
    const long C = (long)NH * HS, nq = (long)Tq * HS, nk = (long)Tk * HS;
    float *q1 = scratch(0, 4 * nq + 4 * nk), *dq1 = q1 + nq, *g1 = dq1 + nq, *o1 = g1 + nq;
    float *k1 = o1 + nq, *v1 = k1 + nk, *dk1 = v1 + nk, *dv1 = dk1 + nk;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const long qo = (long)b * Tq * ldq + (long)h * HS, ko = (long)b * Tk * ldkv + (long)h * HS;
            const long oo = (long)b * Tq * C + (long)h * HS;
            widen_rows(q1, (const bf16 *)q + qo, Tq, HS, ldq);
            widen_rows(dq1, (const bf16 *)dq + qo, Tq, HS, ldq);
            widen_rows(g1, (const bf16 *)dout + oo, Tq, HS, C);
            widen_rows(o1, (const bf16 *)out + oo, Tq, HS, C);
            widen_rows(k1, (const bf16 *)k + ko, Tk, HS, ldkv);
            widen_rows(v1, (const bf16 *)v + ko, Tk, HS, ldkv);
            widen_rows(dk1, (const bf16 *)dk + ko, Tk, HS, ldkv);
            widen_rows(dv1, (const bf16 *)dv + ko, Tk, HS, ldkv);
            kernels_cpu.attention_block_backward(dq1, dk1, dv1, g1, o1, lse + ((long)b * NH + h) * Tq, q1, k1, v1, HS,
                                                 HS, q_pos, k_pos, 1, Tq, Tk, 1, HS);
            narrow_rows((bf16 *)dq + qo, dq1, Tq, HS, ldq);
            narrow_rows((bf16 *)dk + ko, dk1, Tk, HS, ldkv);
            narrow_rows((bf16 *)dv + ko, dv1, Tk, HS, ldkv);
        }
}

/* a batch row at a time: its [T,C] of both outputs widened */
static void attention_merge_bf16(void *out, float *lse, const void *out2, const float *lse2, int B, int T, int NH,
                                 int HS) {
    const long TC = (long)T * NH * HS;
    float *o1 = scratch(0, 2 * TC), *o2 = o1 + TC;
    for (int b = 0; b < B; b++) {
        widen(o1, (const bf16 *)out + b * TC, TC);
        widen(o2, (const bf16 *)out2 + b * TC, TC);
        kernels_cpu.attention_merge(o1, lse + (long)b * NH * T, o2, lse2 + (long)b * NH * T, 1, T, NH, HS);
        narrow((bf16 *)out + b * TC, o1, TC);
    }
}

const value_kernels kernels_bf16_cpu = {
    .name = "bf16 cpu",
    .encoder_forward = encoder_forward_bf16,
    .encoder_backward = encoder_backward_bf16,
    .layernorm_forward = layernorm_forward_bf16,
    .layernorm_backward = layernorm_backward_bf16,
    .matmul_forward = matmul_forward_bf16,
    .matmul_backward = matmul_backward_bf16,
    .attention_forward = attention_forward_bf16,
    .attention_backward = attention_backward_bf16,
    .gelu_forward = gelu_forward_bf16,
    .gelu_backward = gelu_backward_bf16,
    .add = add_bf16,
    .accumulate = accumulate_bf16,
    .scale = scale_bf16,
    .crossentropy_forward = crossentropy_forward_bf16,
    .crossentropy_backward = crossentropy_backward_bf16,
    .sum_squares = sum_squares_bf16,
    .sum_squares_add = sum_squares_add_bf16,
    .adamw = adamw_bf16,
    .matmul_backward_input = matmul_backward_input_bf16,
    .matmul_backward_weight = matmul_backward_weight_bf16,
    .layernorm_backward_input = layernorm_backward_input_bf16,
    .layernorm_backward_weight = layernorm_backward_weight_bf16,
    .attention_block_forward = attention_block_forward_bf16,
    .attention_block_backward = attention_block_backward_bf16,
    .attention_merge = attention_merge_bf16,
    .to_values = to_values_bf16,
    .to_floats = to_floats_bf16,
};
