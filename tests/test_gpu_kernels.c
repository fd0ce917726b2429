/* Every CUDA kernel against its CPU twin.
 *
 * For each kernel of the table and several shapes (odd ones on purpose: sizes
 * that are not multiples of a warp, a block or a vector width), random inputs
 * go through kernels_cpu on host buffers and through kernels_cuda on device
 * buffers, and every output is compared. The error of a buffer is
 *     max_i |gpu_i - cpu_i| / max_i |cpu_i|
 * i.e. relative to the buffer's scale, so that entries near zero (where the two
 * sides legitimately differ by rounding) do not dominate. Tolerances: 1e-5 for
 * elementwise kernels, 1e-4 where a kernel sums many products (matmul,
 * attention, reductions over rows), 1e-9 for sum_squares (double sums).
 *
 * Backward kernels add into their gradients, so both sides start from the same
 * nonzero gradient values; outputs that a kernel overwrites start as garbage on
 * the GPU side, which catches a kernel that adds where it should write.
 *
 * The bf16 tables (--precision bf16) the same way: kernels_bf16_cuda against
 * kernels_bf16_cpu on the same bf16 inputs. Both compute in fp32 and round
 * each output to bf16 once, so they differ by the order of their fp32 sums
 * and by which way a value near a rounding tie goes: one bf16 step, 2^-8 of
 * the value (TOL_BF16 = 1e-2 of the buffer's scale). The CUDA attention also
 * rounds its scores and its datt to bf16 between the products (cuBLAS writes
 * bf16) where the CPU keeps them fp32: a second rounding, TOL_BF16_ATT.
 * Conversions and the fp32 outputs computed from bf16 inputs (LayerNorm's
 * statistics, the losses, AdamW on the fp32 master) keep the fp32 tolerances.
 *
 * `test_gpu_kernels --small` leaves out the shapes of a million elements or more
 * (for compute-sanitizer, which checks every access).
 *
 * Exit status: 0 all passed, 1 a check failed, 77 no GPU or no CUDA build
 * (CTest reports 77 as skipped), 1 instead of 77 when PL_REQUIRE_GPU=1 (the
 * device check sets it: there, finding no GPU is a failure, not a skip). */
#include "device.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PL_HAVE_CUDA
#include "kernels.h"
#include "mem.h"
#include "precision.h"
#include <math.h>
#include <stdint.h>

#define TOL_ELEMENTWISE 1e-5
#define TOL_SUMS 1e-4
#define GARBAGE 12345.0f /* fill of buffers a kernel must overwrite */

static int failures, checks;
static char shape[160]; /* the current test's shape, printed with each check */

/* ---- random inputs (xorshift64*, a fixed seed: failures reproduce) ---------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float uniform(void) { /* in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of host memory");
    return p;
}

static float *host_random(long n, float scale) {
    float *p = xmalloc((size_t)n * sizeof *p);
    for (long i = 0; i < n; i++) p[i] = scale * uniform();
    return p;
}

static float *host_copy(const float *x, long n) {
    float *p = xmalloc((size_t)n * sizeof *p);
    memcpy(p, x, (size_t)n * sizeof *p);
    return p;
}

static int *host_tokens(long n, int V) {
    int *p = xmalloc((size_t)n * sizeof *p);
    for (long i = 0; i < n; i++) {
        int t = (int)((uniform() + 1.0f) * 0.5f * (float)V);
        p[i] = t < 0 ? 0 : t >= V ? V - 1 : t;
    }
    return p;
}

/* ---- device buffers (g_device is CUDA for the whole test) ------------------- */

/* mem_alloc zeroes the buffer on the compute stream, ahead of any copy. */
static void *dev_alloc(size_t bytes) { return mem_alloc(bytes, MEM_WORKSPACE); }

static float *dev_floats(const float *host, long n) {
    float *d = dev_alloc((size_t)n * sizeof *d);
    if (n > 0) mem_to_device(d, host, (size_t)n * sizeof *d);
    return d;
}

static int *dev_ints(const int *host, long n) {
    int *d = dev_alloc((size_t)n * sizeof *d);
    if (n > 0) mem_to_device(d, host, (size_t)n * sizeof *d);
    return d;
}

static float *dev_garbage(long n) {
    float *h = xmalloc((size_t)n * sizeof *h);
    for (long i = 0; i < n; i++) h[i] = GARBAGE;
    float *d = dev_floats(h, n);
    free(h);
    return d;
}

/* ---- comparison ------------------------------------------------------------- */

static void report(const char *what, double err, double tol) {
    int ok = err <= tol; /* false for NaN too */
    checks++;
    if (!ok) failures++;
    printf("%-4s %-26s %-34s err %.2e (tol %.0e)\n", ok ? "ok" : "FAIL", what, shape, err, tol);
}

/* Compares cpu - base with dev - base (base NULL: zero). A base shows the
 * change a kernel made, where that change is small beside the values (AdamW). */
static void compare(const char *what, const float *cpu, const float *base, const float *gpu, long n,
                    double tol) {
    double worst = 0.0, scale = 0.0;
    for (long i = 0; i < n; i++) {
        double b = base ? (double)base[i] : 0.0;
        double ref = (double)cpu[i] - b, d = fabs((double)gpu[i] - b - ref);
        if (isnan(d) || d > worst) worst = d; /* a NaN stays and fails the check */
        if (fabs(ref) > scale) scale = fabs(ref);
    }
    /* an all-zero reference (a loss of exactly 0) is compared absolutely */
    report(what, worst / (scale > 0.0 ? scale : 1.0), tol);
}

static void check_change(const char *what, const float *cpu, const float *base, const float *dev,
                         long n, double tol) {
    float *gpu = xmalloc((size_t)n * sizeof *gpu);
    if (n > 0) mem_to_host(gpu, dev, (size_t)n * sizeof *gpu);
    compare(what, cpu, base, gpu, n, tol);
    free(gpu);
}

static void check(const char *what, const float *cpu, const float *dev, long n, double tol) {
    check_change(what, cpu, NULL, dev, n, tol);
}

static float *dev_to_host(const float *dev, long n) {
    float *h = xmalloc((size_t)n * sizeof *h);
    if (n > 0) mem_to_host(h, dev, (size_t)n * sizeof *h);
    return h;
}

/* A kernel run again from the same start must give the same bits (no atomics,
 * a split of the work fixed by the shape): `first` is the first run's result. */
static void check_same_bits(const char *what, const float *first, const float *dev, long n) {
    float *again = dev_to_host(dev, n);
    report(what, memcmp(first, again, (size_t)n * sizeof *again) ? 1.0 : 0.0, 0.0);
    free(again);
}

/* ---- one test per kernel (or forward/backward pair) ------------------------- */

static void test_encoder(int B, int T, int C, int V) {
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
    long N = (long)B * T;
    int *tokens = host_tokens(N, V);
    float *wte = host_random((long)V * C, 1.0f), *wpe = host_random((long)T * C, 1.0f);
    float *out = host_random(N * C, 1.0f), *dout = host_random(N * C, 1.0f);
    float *dwte = host_random((long)V * C, 1.0f), *dwpe = host_random((long)T * C, 1.0f);
    int *d_tokens = dev_ints(tokens, N);
    float *d_wte = dev_floats(wte, (long)V * C), *d_wpe = dev_floats(wpe, (long)T * C);
    float *d_out = dev_garbage(N * C), *d_dout = dev_floats(dout, N * C);
    float *d_dwte = dev_floats(dwte, (long)V * C), *d_dwpe = dev_floats(dwpe, (long)T * C);

    kernels_cpu.encoder_forward(out, tokens, wte, wpe, B, T, C);
    kernels_cuda.encoder_forward(d_out, d_tokens, d_wte, d_wpe, B, T, C);
    check("encoder_forward out", out, d_out, N * C, TOL_ELEMENTWISE);

    kernels_cpu.encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    kernels_cuda.encoder_backward(d_dwte, d_dwpe, d_dout, d_tokens, B, T, C);
    /* each token's positions summed in increasing order on both sides: the same bits */
    check("encoder_backward dwte (exact)", dwte, d_dwte, (long)V * C, 0.0);
    check("encoder_backward dwpe", dwpe, d_dwpe, (long)T * C, TOL_ELEMENTWISE);

    free(tokens); free(wte); free(wpe); free(out); free(dout); free(dwte); free(dwpe);
    mem_free(d_tokens); mem_free(d_wte); mem_free(d_wpe); mem_free(d_out); mem_free(d_dout);
    mem_free(d_dwte); mem_free(d_dwpe);
}

static void test_layernorm(int N, int C) {
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    long NC = (long)N * C;
    float *inp = host_random(NC, 2.0f), *w = host_random(C, 1.0f), *b = host_random(C, 1.0f);
    for (long i = 0; i < NC; i++) inp[i] += 0.5f; /* a nonzero mean */
    float *out = host_random(NC, 1.0f), *mean = host_random(N, 1.0f), *rstd = host_random(N, 1.0f);
    float *dout = host_random(NC, 1.0f), *dinp = host_random(NC, 1.0f);
    float *dw = host_random(C, 1.0f), *db = host_random(C, 1.0f);
    float *dw0 = host_copy(dw, C), *db0 = host_copy(db, C);
    float *d_inp = dev_floats(inp, NC), *d_w = dev_floats(w, C), *d_b = dev_floats(b, C);
    float *d_out = dev_garbage(NC), *d_mean = dev_garbage(N), *d_rstd = dev_garbage(N);
    float *d_dout = dev_floats(dout, NC), *d_dinp = dev_floats(dinp, NC);
    float *d_dw = dev_floats(dw, C), *d_db = dev_floats(db, C);

    kernels_cpu.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    kernels_cuda.layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    check("layernorm_forward out", out, d_out, NC, TOL_ELEMENTWISE);
    check("layernorm_forward mean", mean, d_mean, N, TOL_ELEMENTWISE);
    check("layernorm_forward rstd", rstd, d_rstd, N, TOL_ELEMENTWISE);

    /* The backward reads the CPU's mean and rstd on both sides: it is tested
     * on its own, not through the forward. */
    mem_to_device(d_mean, mean, (size_t)N * sizeof *mean);
    mem_to_device(d_rstd, rstd, (size_t)N * sizeof *rstd);
    kernels_cpu.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    kernels_cuda.layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    check("layernorm_backward dinp", dinp, d_dinp, NC, TOL_SUMS);
    check("layernorm_backward dw", dw, d_dw, C, TOL_SUMS);
    check("layernorm_backward db", db, d_db, C, TOL_SUMS);
    /* The same call again from the same dw, db: the same bits (the column sums'
     * fixed order). dinp accumulates a second time, so it is put back after. */
    float *first_dw = dev_to_host(d_dw, C), *first_db = dev_to_host(d_db, C), *first_dinp = dev_to_host(d_dinp, NC);
    mem_to_device(d_dw, dw0, (size_t)C * sizeof *dw0);
    mem_to_device(d_db, db0, (size_t)C * sizeof *db0);
    kernels_cuda.layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    check_same_bits("layernorm_backward dw again", first_dw, d_dw, C);
    check_same_bits("layernorm_backward db again", first_db, d_db, C);
    mem_to_device(d_dinp, first_dinp, (size_t)NC * sizeof *first_dinp);
    free(first_dinp);

    /* The split halves, accumulating onto what the fused call left. */
    kernels_cpu.layernorm_backward_input(dinp, dout, inp, w, mean, rstd, N, C);
    kernels_cuda.layernorm_backward_input(d_dinp, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    check("layernorm_backward_input dinp", dinp, d_dinp, NC, TOL_SUMS);
    kernels_cpu.layernorm_backward_weight(dw, db, dout, inp, mean, rstd, N, C);
    kernels_cuda.layernorm_backward_weight(d_dw, d_db, d_dout, d_inp, d_mean, d_rstd, N, C);
    check("layernorm_backward_weight dw", dw, d_dw, C, TOL_SUMS);
    check("layernorm_backward_weight db", db, d_db, C, TOL_SUMS);

    free(inp); free(w); free(b); free(out); free(mean); free(rstd); free(dout); free(dinp);
    free(dw); free(db); free(dw0); free(db0); free(first_dw); free(first_db);
    mem_free(d_inp); mem_free(d_w); mem_free(d_b); mem_free(d_out); mem_free(d_mean);
    mem_free(d_rstd); mem_free(d_dout); mem_free(d_dinp); mem_free(d_dw); mem_free(d_db);
}

/* with_bias: bias in the forward and dbias in the backward; with_dinp: whether the
 * backward asks for the input gradient (it may pass NULL). */
static void test_matmul(int N, int IC, int OC, int with_bias, int with_dinp) {
    snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d%s%s", N, IC, OC, with_bias ? " bias" : "",
             with_dinp ? "" : " dinp=NULL");
    long NI = (long)N * IC, NO = (long)N * OC, OI = (long)OC * IC;
    float *inp = host_random(NI, 1.0f), *w = host_random(OI, 0.5f), *bias = host_random(OC, 1.0f);
    float *out = host_random(NO, 1.0f), *dout = host_random(NO, 1.0f);
    float *dinp = host_random(NI, 1.0f), *dw = host_random(OI, 1.0f), *dbias = host_random(OC, 1.0f);
    float *dbias0 = host_copy(dbias, OC);
    float *d_inp = dev_floats(inp, NI), *d_w = dev_floats(w, OI), *d_bias = dev_floats(bias, OC);
    float *d_out = dev_garbage(NO), *d_dout = dev_floats(dout, NO);
    float *d_dinp = dev_floats(dinp, NI), *d_dw = dev_floats(dw, OI);
    float *d_dbias = dev_floats(dbias, OC);

    kernels_cpu.matmul_forward(out, inp, w, with_bias ? bias : NULL, N, IC, OC);
    kernels_cuda.matmul_forward(d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, IC, OC);
    check("matmul_forward out", out, d_out, NO, TOL_SUMS);

    kernels_cpu.matmul_backward(with_dinp ? dinp : NULL, dw, with_bias ? dbias : NULL, dout, inp,
                                w, N, IC, OC);
    kernels_cuda.matmul_backward(with_dinp ? d_dinp : NULL, d_dw, with_bias ? d_dbias : NULL,
                                 d_dout, d_inp, d_w, N, IC, OC);
    /* Where a gradient is not asked for, both sides must have left it alone. */
    check("matmul_backward dinp", dinp, d_dinp, NI, TOL_SUMS);
    check("matmul_backward dw", dw, d_dw, OI, TOL_SUMS);
    check("matmul_backward dbias", dbias, d_dbias, OC, TOL_SUMS);
    if (with_bias) { /* dbias again from the same start: the same bits; dw accumulates twice, so it is put back */
        float *first = dev_to_host(d_dbias, OC), *first_dw = dev_to_host(d_dw, OI);
        mem_to_device(d_dbias, dbias0, (size_t)OC * sizeof *dbias0);
        kernels_cuda.matmul_backward(NULL, d_dw, d_dbias, d_dout, d_inp, d_w, N, IC, OC);
        check_same_bits("matmul_backward dbias again", first, d_dbias, OC);
        mem_to_device(d_dw, first_dw, (size_t)OI * sizeof *first_dw);
        free(first);
        free(first_dw);
    }

    /* The split halves (zero-bubble schedules), accumulating onto what the
     * fused call left, each side onto its own. */
    kernels_cpu.matmul_backward_input(dinp, dout, w, N, IC, OC);
    kernels_cuda.matmul_backward_input(d_dinp, d_dout, d_w, N, IC, OC);
    check("matmul_backward_input dinp", dinp, d_dinp, NI, TOL_SUMS);
    kernels_cpu.matmul_backward_weight(dw, with_bias ? dbias : NULL, dout, inp, N, IC, OC);
    kernels_cuda.matmul_backward_weight(d_dw, with_bias ? d_dbias : NULL, d_dout, d_inp, N, IC, OC);
    check("matmul_backward_weight dw", dw, d_dw, OI, TOL_SUMS);
    check("matmul_backward_weight dbias", dbias, d_dbias, OC, TOL_SUMS);

    free(inp); free(w); free(bias); free(out); free(dout); free(dinp); free(dw); free(dbias); free(dbias0);
    mem_free(d_inp); mem_free(d_w); mem_free(d_bias); mem_free(d_out); mem_free(d_dout);
    mem_free(d_dinp); mem_free(d_dw); mem_free(d_dbias);
}

static void test_attention(int B, int T, int NH, int HS) {
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
    int C = NH * HS;
    long nqkv = (long)B * T * 3 * C, nout = (long)B * T * C, natt = (long)B * NH * T * T;
    float *qkv = host_random(nqkv, 1.0f), *out = host_random(nout, 1.0f);
    float *att = host_random(natt, 1.0f), *datt = host_random(natt, 1.0f);
    float *dout = host_random(nout, 1.0f), *dqkv = host_random(nqkv, 1.0f);
    float *d_qkv = dev_floats(qkv, nqkv), *d_out = dev_garbage(nout), *d_att = dev_garbage(natt);
    float *d_datt = dev_garbage(natt), *d_dout = dev_floats(dout, nout);
    float *d_dqkv = dev_floats(dqkv, nqkv);

    kernels_cpu.attention_forward(out, att, qkv, B, T, NH, HS);
    kernels_cuda.attention_forward(d_out, d_att, d_qkv, B, T, NH, HS);
    check("attention_forward out", out, d_out, nout, TOL_SUMS);
    check("attention_forward att", att, d_att, natt, TOL_SUMS); /* incl. the zero triangle */

    /* The backward reads the CPU's att on both sides; datt is scratch. */
    mem_to_device(d_att, att, (size_t)natt * sizeof *att);
    kernels_cpu.attention_backward(dqkv, datt, dout, qkv, att, B, T, NH, HS);
    kernels_cuda.attention_backward(d_dqkv, d_datt, d_dout, d_qkv, d_att, B, T, NH, HS);
    check("attention_backward dqkv", dqkv, d_dqkv, nqkv, TOL_SUMS);

    free(qkv); free(out); free(att); free(datt); free(dout); free(dqkv);
    mem_free(d_qkv); mem_free(d_out); mem_free(d_att); mem_free(d_datt); mem_free(d_dout);
    mem_free(d_dqkv);
}

/* Attention over blocks (context parallelism): q, k and v read in place from
 * two qkv buffers (ld 3C), as a ring step reads its own queries against a
 * received block. masked: rank 0's zig-zag queries (chunks 0 and 3 of 4,
 * chunk s positions) against rank 1's keys (chunks 1 and 2), so some rows
 * see no key (lse -inf on both sides); else no mask. */
static void check_lse(const char *what, const float *cpu, const float *dev, long n) {
    float *gpu = dev_to_host(dev, n), *c = host_copy(cpu, n);
    for (long i = 0; i < n; i++)
        if (isinf(c[i]) || isinf(gpu[i])) {
            gpu[i] = c[i] == gpu[i] ? 0.0f : NAN; /* -inf on one side only fails */
            c[i] = 0.0f;
        }
    compare(what, c, NULL, gpu, n, TOL_SUMS);
    free(gpu); free(c);
}

static int *block_positions(int s, int keys) {
    int *p = xmalloc(sizeof(int) * 2 * (size_t)s);
    for (int i = 0; i < s; i++) {
        p[i] = keys ? s + i : i;
        p[s + i] = keys ? 2 * s + i : 3 * s + i;
    }
    return p;
}

static void test_attention_block(int B, int s, int NH, int HS, int masked) {
    const int n = 2 * s, C = NH * HS;
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d HS=%d %s", B, n, NH, HS, masked ? "zig-zag" : "no mask");
    long nqkv = (long)B * n * 3 * C, nout = (long)B * n * C, nl = (long)B * NH * n;
    int *qp = block_positions(s, 0), *kp = block_positions(s, 1);
    int *d_qp = dev_ints(qp, n), *d_kp = dev_ints(kp, n);
    const int *cq = masked ? qp : NULL, *ck = masked ? kp : NULL, *gq = masked ? d_qp : NULL, *gk = masked ? d_kp : NULL;
    float *qkv = host_random(nqkv, 1.5f), *kv = host_random(nqkv, 1.5f), *out = host_random(nout, 1.0f);
    float *lse = host_random(nl, 1.0f), *dout = host_random(nout, 1.0f);
    float *dq = host_random(nqkv, 1.0f), *dkv = host_random(nqkv, 1.0f);
    float *d_qkv = dev_floats(qkv, nqkv), *d_kv = dev_floats(kv, nqkv), *d_out = dev_garbage(nout);
    float *d_lse = dev_garbage(nl), *d_dout = dev_floats(dout, nout), *d_dq = dev_floats(dq, nqkv);
    float *d_dkv = dev_floats(dkv, nqkv);
    kernels_cpu.attention_block_forward(out, lse, qkv, kv + C, kv + 2 * C, 3 * C, 3 * C, cq, ck, B, n, n, NH, HS);
    kernels_cuda.attention_block_forward(d_out, d_lse, d_qkv, d_kv + C, d_kv + 2 * C, 3 * C, 3 * C, gq, gk, B, n, n,
                                         NH, HS);
    check("attention_block_forward out", out, d_out, nout, TOL_SUMS);
    check_lse("attention_block_forward lse", lse, d_lse, nl);
    /* the backward on the CPU's out and lse, both sides */
    mem_to_device(d_out, out, (size_t)nout * sizeof *out);
    mem_to_device(d_lse, lse, (size_t)nl * sizeof *lse);
    kernels_cpu.attention_block_backward(dq, dkv + C, dkv + 2 * C, dout, out, lse, qkv, kv + C, kv + 2 * C, 3 * C,
                                         3 * C, cq, ck, B, n, n, NH, HS);
    kernels_cuda.attention_block_backward(d_dq, d_dkv + C, d_dkv + 2 * C, d_dout, d_out, d_lse, d_qkv, d_kv + C,
                                          d_kv + 2 * C, 3 * C, 3 * C, gq, gk, B, n, n, NH, HS);
    check("attention_block_backward dq", dq, d_dq, nqkv, TOL_SUMS);
    check("attention_block_backward dk dv", dkv, d_dkv, nqkv, TOL_SUMS);
    /* merge a second block (the keys and values of qkv itself) into it */
    float *out2 = host_random(nout, 1.0f), *lse2 = host_random(nl, 1.0f);
    kernels_cpu.attention_block_forward(out2, lse2, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, cq, cq, B, n, n, NH, HS);
    float *d_out2 = dev_floats(out2, nout), *d_lse2 = dev_floats(lse2, nl);
    kernels_cpu.attention_merge(out, lse, out2, lse2, B, n, NH, HS);
    kernels_cuda.attention_merge(d_out, d_lse, d_out2, d_lse2, B, n, NH, HS);
    check("attention_merge out", out, d_out, nout, TOL_SUMS);
    check_lse("attention_merge lse", lse, d_lse, nl);
    free(qp); free(kp); free(qkv); free(kv); free(out); free(lse); free(dout); free(dq); free(dkv); free(out2);
    free(lse2);
    mem_free(d_qp); mem_free(d_kp); mem_free(d_qkv); mem_free(d_kv); mem_free(d_out); mem_free(d_lse);
    mem_free(d_dout); mem_free(d_dq); mem_free(d_dkv); mem_free(d_out2); mem_free(d_lse2);
}

static void test_gelu(long N) {
    snprintf(shape, sizeof shape, "N=%ld", N);
    float *inp = host_random(N, 5.0f), *out = host_random(N, 1.0f);
    float *dout = host_random(N, 1.0f), *dinp = host_random(N, 1.0f);
    float *d_inp = dev_floats(inp, N), *d_out = dev_garbage(N);
    float *d_dout = dev_floats(dout, N), *d_dinp = dev_floats(dinp, N);

    kernels_cpu.gelu_forward(out, inp, N);
    kernels_cuda.gelu_forward(d_out, d_inp, N);
    check("gelu_forward out", out, d_out, N, TOL_ELEMENTWISE);

    kernels_cpu.gelu_backward(dinp, dout, inp, N);
    kernels_cuda.gelu_backward(d_dinp, d_dout, d_inp, N);
    check("gelu_backward dinp", dinp, d_dinp, N, TOL_ELEMENTWISE);

    free(inp); free(out); free(dout); free(dinp);
    mem_free(d_inp); mem_free(d_out); mem_free(d_dout); mem_free(d_dinp);
}

/* add (separate output and aliased with an input), accumulate, scale */
static void test_elementwise(long N) {
    snprintf(shape, sizeof shape, "N=%ld", N);
    float *a = host_random(N, 1.0f), *b = host_random(N, 1.0f), *out = host_random(N, 1.0f);
    float *d_a = dev_floats(a, N), *d_b = dev_floats(b, N), *d_out = dev_garbage(N);

    kernels_cpu.add(out, a, b, N);
    kernels_cuda.add(d_out, d_a, d_b, N);
    check("add out", out, d_out, N, TOL_ELEMENTWISE);

    kernels_cpu.add(a, a, b, N); /* out aliases a: the residual stream in place */
    kernels_cuda.add(d_a, d_a, d_b, N);
    check("add out=a", a, d_a, N, TOL_ELEMENTWISE);

    kernels_cpu.add(b, out, b, N); /* out aliases b */
    kernels_cuda.add(d_b, d_out, d_b, N);
    check("add out=b", b, d_b, N, TOL_ELEMENTWISE);

    kernels_cpu.accumulate(a, out, N);
    kernels_cuda.accumulate(d_a, d_out, N);
    check("accumulate dst", a, d_a, N, TOL_ELEMENTWISE);

    kernels_cpu.scale(b, -0.37f, N);
    kernels_cuda.scale(d_b, -0.37f, N);
    check("scale x", b, d_b, N, TOL_ELEMENTWISE);

    free(a); free(b); free(out);
    mem_free(d_a); mem_free(d_b); mem_free(d_out);
}

static void test_crossentropy(int N, int V) {
    snprintf(shape, sizeof shape, "N=%d V=%d", N, V);
    long NV = (long)N * V;
    float *logits = host_random(NV, 4.0f), *probs = host_random(NV, 1.0f);
    float *losses = host_random(N, 1.0f), *dlogits = host_random(NV, 1.0f);
    int *targets = host_tokens(N, V);
    float dloss = 1.0f / (float)N;
    float *d_logits = dev_floats(logits, NV), *d_probs = dev_garbage(NV);
    float *d_losses = dev_garbage(N), *d_dlogits = dev_garbage(NV);
    int *d_targets = dev_ints(targets, N);

    kernels_cpu.crossentropy_forward(losses, probs, logits, targets, N, V);
    kernels_cuda.crossentropy_forward(d_losses, d_probs, d_logits, d_targets, N, V);
    check("crossentropy_forward loss", losses, d_losses, N, TOL_ELEMENTWISE);
    check("crossentropy_forward prob", probs, d_probs, NV, TOL_ELEMENTWISE);

    /* The backward reads the CPU's probs on both sides and must overwrite. */
    mem_to_device(d_probs, probs, (size_t)NV * sizeof *probs);
    kernels_cpu.crossentropy_backward(dlogits, probs, targets, dloss, N, V);
    kernels_cuda.crossentropy_backward(d_dlogits, d_probs, d_targets, dloss, N, V);
    check("crossentropy_backward dlogit", dlogits, d_dlogits, NV, TOL_ELEMENTWISE);

    free(logits); free(probs); free(losses); free(dlogits); free(targets);
    mem_free(d_logits); mem_free(d_probs); mem_free(d_losses); mem_free(d_dlogits);
    mem_free(d_targets);
}

static void test_sum_squares(long N) {
    snprintf(shape, sizeof shape, "N=%ld", N);
    float *x = host_random(N, 3.0f);
    float *d_x = dev_floats(x, N);
    double cpu = kernels_cpu.sum_squares(x, N), gpu = kernels_cuda.sum_squares(d_x, N);
    double err = fabs(gpu - cpu) / (cpu > 0.0 ? cpu : 1.0);
    if (isnan(gpu)) err = gpu;
    report("sum_squares", err, 1e-9);
    free(x);
    mem_free(d_x);
}

/* Three tensors' squares added on the device into one double: the CPU's sum of
 * the three sums (1e-9), and on the GPU exactly its own sum_squares results
 * added in order (the contract that keeps one step's norm the same bits). */
static void test_sum_squares_add(long n1, long n2, long n3) {
    snprintf(shape, sizeof shape, "N=%ld+%ld+%ld", n1, n2, n3);
    long ns[3] = {n1, n2, n3};
    double cpu = 0.0, gpu_each = 0.0, acc = 0.0;
    double *d_acc = dev_alloc(sizeof(double));
    for (int i = 0; i < 3; i++) {
        float *x = host_random(ns[i], 2.0f), *d_x = dev_floats(x, ns[i]);
        kernels_cpu.sum_squares_add(&cpu, x, ns[i]);
        gpu_each += kernels_cuda.sum_squares(d_x, ns[i]);
        kernels_cuda.sum_squares_add(d_acc, d_x, ns[i]);
        free(x);
        mem_free(d_x);
    }
    mem_to_host(&acc, d_acc, sizeof acc);
    mem_free(d_acc);
    double err = fabs(acc - cpu) / (cpu > 0.0 ? cpu : 1.0);
    if (isnan(acc)) err = acc;
    report("sum_squares_add vs cpu", err, 1e-9);
    report("sum_squares_add = sum_squares+", acc == gpu_each ? 0.0 : 1.0, 0.0);
}

static void test_adamw(long N, int t) {
    snprintf(shape, sizeof shape, "N=%ld t=%d", N, t);
    /* lr large enough that the update stands well above the rounding of p */
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    float *p = host_random(N, 1.0f), *g = host_random(N, 1.0f);
    float *m = host_random(N, 0.1f), *v = host_random(N, 0.01f);
    for (long i = 0; i < N; i++) v[i] = fabsf(v[i]); /* a second moment is never negative */
    float *d_p = dev_floats(p, N), *d_g = dev_floats(g, N);
    float *d_m = dev_floats(m, N), *d_v = dev_floats(v, N);
    float *p0 = host_copy(p, N);

    kernels_cpu.adamw(p, g, m, v, N, lr, beta1, beta2, eps, wd, t, gs);
    kernels_cuda.adamw(d_p, d_g, d_m, d_v, N, lr, beta1, beta2, eps, wd, t, gs);
    check("adamw p", p, d_p, N, TOL_ELEMENTWISE);
    /* the update alone: p's own rounding is ~1e-5 of it, hence the wider tolerance */
    check_change("adamw p - p0", p, p0, d_p, N, TOL_SUMS);
    check("adamw m", m, d_m, N, TOL_ELEMENTWISE);
    check("adamw v", v, d_v, N, TOL_ELEMENTWISE);

    free(p); free(p0); free(g); free(m); free(v);
    mem_free(d_p); mem_free(d_g); mem_free(d_m); mem_free(d_v);
}

/* ---- the bf16 tables: kernels_bf16_cuda against kernels_bf16_cpu ------------ */

#define TOL_BF16 1e-2
#define TOL_BF16_ATT 3e-2

/* One bf16 tensor on both sides: the CPU's host copy and the GPU's. */
typedef struct {
    long n;
    uint16_t *host;
    void *dev;
} bf16_pair;

static bf16_pair bf16_new(long n, float scale, int garbage_on_gpu) {
    bf16_pair t = {n, xmalloc((size_t)n * sizeof(uint16_t)), dev_alloc((size_t)n * sizeof(uint16_t))};
    for (long i = 0; i < n; i++) t.host[i] = bf16_from_float(scale * uniform());
    uint16_t *start = garbage_on_gpu ? xmalloc((size_t)n * sizeof(uint16_t)) : t.host;
    for (long i = 0; garbage_on_gpu && i < n; i++) start[i] = bf16_from_float(GARBAGE);
    if (n > 0) mem_to_device(t.dev, start, (size_t)n * sizeof(uint16_t));
    if (start != t.host) free(start);
    return t;
}

static float *bf16_widened(const uint16_t *x, long n) {
    float *f = xmalloc((size_t)n * sizeof *f);
    for (long i = 0; i < n; i++) f[i] = float_from_bf16(x[i]);
    return f;
}

static void check_bf16(const char *what, bf16_pair t, double tol) {
    uint16_t *got = xmalloc((size_t)t.n * sizeof(uint16_t));
    if (t.n > 0) mem_to_host(got, t.dev, (size_t)t.n * sizeof(uint16_t));
    float *cpu = bf16_widened(t.host, t.n), *gpu = bf16_widened(got, t.n);
    compare(what, cpu, NULL, gpu, t.n, tol);
    free(got); free(cpu); free(gpu);
}

static void bf16_free(bf16_pair t) {
    free(t.host);
    mem_free(t.dev);
}

#define CPU16 kernels_bf16_cpu
#define GPU16 kernels_bf16_cuda

static void test_bf16_matmul(int N, int IC, int OC) {
    snprintf(shape, sizeof shape, "bf16 N=%d IC=%d OC=%d", N, IC, OC);
    long NI = (long)N * IC, NO = (long)N * OC, OI = (long)OC * IC;
    bf16_pair inp = bf16_new(NI, 1.0f, 0), w = bf16_new(OI, 0.5f, 0), bias = bf16_new(OC, 1.0f, 0);
    bf16_pair out = bf16_new(NO, 1.0f, 1), dout = bf16_new(NO, 1.0f, 0), dinp = bf16_new(NI, 1.0f, 0);
    bf16_pair dw = bf16_new(OI, 1.0f, 0), dbias = bf16_new(OC, 1.0f, 0);
    CPU16.matmul_forward(out.host, inp.host, w.host, bias.host, N, IC, OC);
    GPU16.matmul_forward(out.dev, inp.dev, w.dev, bias.dev, N, IC, OC);
    check_bf16("bf16 matmul_forward out", out, TOL_BF16);
    CPU16.matmul_backward(dinp.host, dw.host, dbias.host, dout.host, inp.host, w.host, N, IC, OC);
    GPU16.matmul_backward(dinp.dev, dw.dev, dbias.dev, dout.dev, inp.dev, w.dev, N, IC, OC);
    check_bf16("bf16 matmul_backward dinp", dinp, TOL_BF16);
    check_bf16("bf16 matmul_backward dw", dw, TOL_BF16);
    check_bf16("bf16 matmul_backward dbias", dbias, TOL_BF16);
    bf16_free(inp); bf16_free(w); bf16_free(bias); bf16_free(out); bf16_free(dout);
    bf16_free(dinp); bf16_free(dw); bf16_free(dbias);
}

static void test_bf16_layernorm(int N, int C) {
    snprintf(shape, sizeof shape, "bf16 N=%d C=%d", N, C);
    long NC = (long)N * C;
    bf16_pair inp = bf16_new(NC, 2.0f, 0), w = bf16_new(C, 1.0f, 0), b = bf16_new(C, 1.0f, 0);
    bf16_pair out = bf16_new(NC, 1.0f, 1), dout = bf16_new(NC, 1.0f, 0), dinp = bf16_new(NC, 1.0f, 0);
    bf16_pair dw = bf16_new(C, 1.0f, 0), db = bf16_new(C, 1.0f, 0);
    float *mean = host_random(N, 1.0f), *rstd = host_random(N, 1.0f);
    float *d_mean = dev_garbage(N), *d_rstd = dev_garbage(N);
    CPU16.layernorm_forward(out.host, mean, rstd, inp.host, w.host, b.host, N, C);
    GPU16.layernorm_forward(out.dev, d_mean, d_rstd, inp.dev, w.dev, b.dev, N, C);
    check_bf16("bf16 layernorm_forward out", out, TOL_BF16);
    check("bf16 layernorm_forward mean", mean, d_mean, N, TOL_ELEMENTWISE);
    check("bf16 layernorm_forward rstd", rstd, d_rstd, N, TOL_ELEMENTWISE);
    mem_to_device(d_mean, mean, (size_t)N * sizeof *mean); /* the backward on the CPU's statistics */
    mem_to_device(d_rstd, rstd, (size_t)N * sizeof *rstd);
    CPU16.layernorm_backward(dinp.host, dw.host, db.host, dout.host, inp.host, w.host, mean, rstd, N, C);
    GPU16.layernorm_backward(dinp.dev, dw.dev, db.dev, dout.dev, inp.dev, w.dev, d_mean, d_rstd, N, C);
    check_bf16("bf16 layernorm_backward dinp", dinp, TOL_BF16);
    check_bf16("bf16 layernorm_backward dw", dw, TOL_BF16);
    check_bf16("bf16 layernorm_backward db", db, TOL_BF16);
    bf16_free(inp); bf16_free(w); bf16_free(b); bf16_free(out); bf16_free(dout);
    bf16_free(dinp); bf16_free(dw); bf16_free(db);
    free(mean); free(rstd); mem_free(d_mean); mem_free(d_rstd);
}

static void test_bf16_attention(int B, int T, int NH, int HS) {
    snprintf(shape, sizeof shape, "bf16 B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
    int C = NH * HS;
    long nqkv = (long)B * T * 3 * C, nout = (long)B * T * C, natt = (long)B * NH * T * T;
    bf16_pair qkv = bf16_new(nqkv, 1.0f, 0), out = bf16_new(nout, 1.0f, 1), att = bf16_new(natt, 1.0f, 1);
    bf16_pair datt = bf16_new(natt, 1.0f, 1), dout = bf16_new(nout, 1.0f, 0), dqkv = bf16_new(nqkv, 1.0f, 0);
    CPU16.attention_forward(out.host, att.host, qkv.host, B, T, NH, HS);
    GPU16.attention_forward(out.dev, att.dev, qkv.dev, B, T, NH, HS);
    check_bf16("bf16 attention_forward out", out, TOL_BF16_ATT);
    check_bf16("bf16 attention_forward att", att, TOL_BF16_ATT);
    mem_to_device(att.dev, att.host, (size_t)natt * sizeof(uint16_t)); /* the backward on the CPU's att */
    CPU16.attention_backward(dqkv.host, datt.host, dout.host, qkv.host, att.host, B, T, NH, HS);
    GPU16.attention_backward(dqkv.dev, datt.dev, dout.dev, qkv.dev, att.dev, B, T, NH, HS);
    check_bf16("bf16 attention_backward dqkv", dqkv, TOL_BF16_ATT);
    bf16_free(qkv); bf16_free(out); bf16_free(att); bf16_free(datt); bf16_free(dout); bf16_free(dqkv);
}

static void test_bf16_attention_block(int B, int s, int NH, int HS) {
    const int n = 2 * s, C = NH * HS;
    snprintf(shape, sizeof shape, "bf16 B=%d T=%d NH=%d HS=%d zig-zag", B, n, NH, HS);
    long nqkv = (long)B * n * 3 * C, nout = (long)B * n * C, nl = (long)B * NH * n;
    int *qp = block_positions(s, 0), *kp = block_positions(s, 1);
    int *d_qp = dev_ints(qp, n), *d_kp = dev_ints(kp, n);
    bf16_pair qkv = bf16_new(nqkv, 1.5f, 0), kv = bf16_new(nqkv, 1.5f, 0), out = bf16_new(nout, 1.0f, 1);
    bf16_pair dout = bf16_new(nout, 1.0f, 0), dq = bf16_new(nqkv, 1.0f, 0), dkv = bf16_new(nqkv, 1.0f, 0);
    float *lse = host_random(nl, 1.0f), *d_lse = dev_garbage(nl);
    CPU16.attention_block_forward(out.host, lse, qkv.host, (uint16_t *)kv.host + C, (uint16_t *)kv.host + 2 * C, 3 * C,
                                  3 * C, qp, kp, B, n, n, NH, HS);
    GPU16.attention_block_forward(out.dev, d_lse, qkv.dev, (uint16_t *)kv.dev + C, (uint16_t *)kv.dev + 2 * C, 3 * C,
                                  3 * C, d_qp, d_kp, B, n, n, NH, HS);
    check_bf16("bf16 attention_block_forward out", out, TOL_BF16);
    check_lse("bf16 attention_block_forward lse", lse, d_lse, nl);
    mem_to_device(out.dev, out.host, (size_t)nout * sizeof(uint16_t));
    mem_to_device(d_lse, lse, (size_t)nl * sizeof *lse);
    CPU16.attention_block_backward(dq.host, (uint16_t *)dkv.host + C, (uint16_t *)dkv.host + 2 * C, dout.host, out.host,
                                   lse, qkv.host, (uint16_t *)kv.host + C, (uint16_t *)kv.host + 2 * C, 3 * C, 3 * C, qp,
                                   kp, B, n, n, NH, HS);
    GPU16.attention_block_backward(dq.dev, (uint16_t *)dkv.dev + C, (uint16_t *)dkv.dev + 2 * C, dout.dev, out.dev,
                                   d_lse, qkv.dev, (uint16_t *)kv.dev + C, (uint16_t *)kv.dev + 2 * C, 3 * C, 3 * C,
                                   d_qp, d_kp, B, n, n, NH, HS);
    check_bf16("bf16 attention_block_backward dq", dq, TOL_BF16);
    check_bf16("bf16 attention_block_backward dk dv", dkv, TOL_BF16);
    free(qp); free(kp); free(lse); mem_free(d_qp); mem_free(d_kp); mem_free(d_lse);
    bf16_free(qkv); bf16_free(kv); bf16_free(out); bf16_free(dout); bf16_free(dq); bf16_free(dkv);
}

/* encoder, gelu, add, accumulate, scale and the two conversions */
static void test_bf16_elementwise(int B, int T, int C, int Vocab) {
    long N = (long)B * T * C;
    snprintf(shape, sizeof shape, "bf16 B=%d T=%d C=%d V=%d", B, T, C, Vocab);
    int *tokens = host_tokens((long)B * T, Vocab), *d_tokens = dev_ints(tokens, (long)B * T);
    bf16_pair wte = bf16_new((long)Vocab * C, 1.0f, 0), wpe = bf16_new((long)T * C, 1.0f, 0);
    bf16_pair x = bf16_new(N, 1.0f, 1), dx = bf16_new(N, 1.0f, 0), y = bf16_new(N, 1.0f, 1);
    bf16_pair dy = bf16_new(N, 1.0f, 0);
    CPU16.encoder_forward(x.host, tokens, wte.host, wpe.host, B, T, C);
    GPU16.encoder_forward(x.dev, d_tokens, wte.dev, wpe.dev, B, T, C);
    check_bf16("bf16 encoder_forward out (exact)", x, 0.0); /* one fp32 add, one rounding */
    CPU16.encoder_backward(wte.host, wpe.host, dx.host, tokens, B, T, C);
    GPU16.encoder_backward(wte.dev, wpe.dev, dx.dev, d_tokens, B, T, C);
    check_bf16("bf16 encoder_backward dwte", wte, TOL_BF16);
    check_bf16("bf16 encoder_backward dwpe", wpe, TOL_BF16);
    CPU16.gelu_forward(y.host, x.host, N);
    GPU16.gelu_forward(y.dev, x.dev, N);
    check_bf16("bf16 gelu_forward out", y, TOL_BF16);
    CPU16.gelu_backward(dx.host, dy.host, x.host, N);
    GPU16.gelu_backward(dx.dev, dy.dev, x.dev, N);
    check_bf16("bf16 gelu_backward dinp", dx, TOL_BF16);
    CPU16.add(x.host, x.host, dy.host, N);
    GPU16.add(x.dev, x.dev, dy.dev, N);
    check_bf16("bf16 add out=a", x, TOL_BF16);
    CPU16.accumulate(dy.host, dx.host, N);
    GPU16.accumulate(dy.dev, dx.dev, N);
    check_bf16("bf16 accumulate dst", dy, TOL_BF16);
    CPU16.scale(dy.host, -0.37f, N);
    GPU16.scale(dy.dev, -0.37f, N);
    check_bf16("bf16 scale x", dy, TOL_BF16);
    float *f = host_random(N, 3.0f), *d_f = dev_floats(f, N), *back = host_random(N, 1.0f), *d_back = dev_garbage(N);
    CPU16.to_values(y.host, f, N); /* the same rounding rule on both sides: the same bits */
    GPU16.to_values(y.dev, d_f, N);
    check_bf16("bf16 to_values (exact)", y, 0.0);
    CPU16.to_floats(back, y.host, N);
    GPU16.to_floats(d_back, y.dev, N);
    check("bf16 to_floats (exact)", back, d_back, N, 0.0);
    bf16_free(wte); bf16_free(wpe); bf16_free(x); bf16_free(dx); bf16_free(y); bf16_free(dy);
    free(tokens); free(f); free(back); mem_free(d_tokens); mem_free(d_f); mem_free(d_back);
}

/* crossentropy, the squares of the gradient norm, AdamW on the fp32 master */
static void test_bf16_loss_and_step(int N, int V) {
    snprintf(shape, sizeof shape, "bf16 N=%d V=%d", N, V);
    long NV = (long)N * V;
    int *targets = host_tokens(N, V), *d_targets = dev_ints(targets, N);
    bf16_pair logits = bf16_new(NV, 4.0f, 0), probs = bf16_new(NV, 1.0f, 1), dlogits = bf16_new(NV, 1.0f, 1);
    float *losses = host_random(N, 1.0f), *d_losses = dev_garbage(N);
    CPU16.crossentropy_forward(losses, probs.host, logits.host, targets, N, V);
    GPU16.crossentropy_forward(d_losses, probs.dev, logits.dev, d_targets, N, V);
    check("bf16 crossentropy_forward loss", losses, d_losses, N, TOL_ELEMENTWISE);
    check_bf16("bf16 crossentropy_forward prob", probs, TOL_BF16);
    mem_to_device(probs.dev, probs.host, (size_t)NV * sizeof(uint16_t));
    CPU16.crossentropy_backward(dlogits.host, probs.host, targets, 1.0f / (float)N, N, V);
    GPU16.crossentropy_backward(dlogits.dev, probs.dev, d_targets, 1.0f / (float)N, N, V);
    check_bf16("bf16 crossentropy_backward dlogit", dlogits, TOL_BF16);
    double cpu = CPU16.sum_squares(logits.host, NV), gpu = GPU16.sum_squares(logits.dev, NV);
    report("bf16 sum_squares", isnan(gpu) ? gpu : fabs(gpu - cpu) / (cpu > 0.0 ? cpu : 1.0), 1e-9);
    float *p = host_random(NV, 1.0f), *m = host_random(NV, 0.1f), *v = host_random(NV, 0.01f);
    for (long i = 0; i < NV; i++) v[i] = fabsf(v[i]);
    float *p0 = host_copy(p, NV), *d_p = dev_floats(p, NV), *d_m = dev_floats(m, NV), *d_v = dev_floats(v, NV);
    CPU16.adamw(p, dlogits.host, m, v, NV, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7f);
    GPU16.adamw(d_p, dlogits.dev, d_m, d_v, NV, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7f);
    check_change("bf16 adamw p - p0", p, p0, d_p, NV, TOL_SUMS);
    check("bf16 adamw m", m, d_m, NV, TOL_ELEMENTWISE);
    check("bf16 adamw v", v, d_v, NV, TOL_ELEMENTWISE);
    bf16_free(logits); bf16_free(probs); bf16_free(dlogits);
    free(targets); free(losses); free(p); free(m); free(v); free(p0);
    mem_free(d_targets); mem_free(d_losses); mem_free(d_p); mem_free(d_m); mem_free(d_v);
}

/* --small: no shape over a million elements, for compute-sanitizer's tools
 * (tests/gpu/device-check.sh), under which every access is checked. */
static int small;

static int run_all(void) {
    device_use(DEVICE_CUDA, 0);
    printf("kernels_cuda vs kernels_cpu; err = max|gpu-cpu| / max|cpu| per buffer\n");

    test_encoder(2, 5, 7, 13);
    test_encoder(3, 7, 33, 256);
    test_encoder(4, 64, 128, 256);
    test_encoder(8, 1024, 64, 256); /* gpt2-small's batch x seq: long runs of each token */
    if (!small) test_encoder(80, 1024, 4, 256); /* more positions than the sort's first scratch */

    test_layernorm(10, 7);
    test_layernorm(37, 33);
    test_layernorm(256, 128);
    test_layernorm(3, 1000);
    /* enough rows to cut the column sums into chunks (C not a multiple of 32 too) */
    test_layernorm(300, 33);
    test_layernorm(1000, 768);
    test_layernorm(4096, 128);

    test_matmul(10, 7, 13, 1, 1);
    test_matmul(10, 7, 13, 0, 0);
    test_matmul(5, 1, 3, 1, 1);
    test_matmul(37, 33, 65, 1, 0);
    test_matmul(256, 128, 384, 1, 1);
    test_matmul(256, 512, 128, 0, 1);
    test_matmul(4096, 64, 96, 1, 1);  /* dbias in row chunks */
    test_matmul(2048, 32, 3072, 1, 0);

    test_attention(3, 7, 3, 5);
    test_attention(1, 1, 1, 1);
    test_attention(2, 33, 2, 7);
    test_attention(2, 64, 4, 32);
    test_attention(2, 100, 2, 8); /* T > 64: past the CPU twin's row blocks and a warp */
    if (!small) test_attention(1, 1024, 2, 64); /* gpt2-small's T and head size */
    test_attention_block(2, 4, 2, 5, 0);
    test_attention_block(2, 4, 2, 5, 1);
    test_attention_block(1, 70, 3, 40, 1); /* past the CPU's tiles; HS past a warp */

    test_gelu(1);
    test_gelu(7);
    if (!small) test_gelu(1000003);

    test_elementwise(1);
    test_elementwise(7);
    if (!small) test_elementwise(1000003);

    test_crossentropy(1, 1);
    test_crossentropy(10, 13);
    test_crossentropy(256, 256);
    test_crossentropy(3, 1000);

    test_sum_squares(1);
    test_sum_squares(7);
    test_sum_squares(256);
    test_sum_squares(300007);
    if (!small) test_sum_squares(5000011); /* more elements than the kernel's fixed grid covers at once */
    test_sum_squares_add(7, 300007, 1000);

    test_adamw(7, 1);
    if (!small) test_adamw(1000003, 10);

    printf("kernels_bf16_cuda vs kernels_bf16_cpu (the same bf16 inputs)\n");
    test_bf16_matmul(10, 7, 13);
    test_bf16_matmul(256, 128, 384);
    test_bf16_matmul(4096, 64, 96); /* dbias in row chunks */
    test_bf16_layernorm(37, 33);
    test_bf16_layernorm(1000, 768);
    test_bf16_attention(2, 33, 2, 7);
    test_bf16_attention(2, 100, 2, 8);
    test_bf16_attention_block(2, 20, 2, 16);
    test_bf16_elementwise(2, 5, 7, 13);
    test_bf16_elementwise(4, 64, 128, 256);
    test_bf16_loss_and_step(10, 13);
    test_bf16_loss_and_step(256, 256);

    device_synchronize(); /* surfaces an asynchronous CUDA error, if any */
    printf("%d of %d checks passed\n", checks - failures, checks);
    return failures ? 1 : 0;
}
#endif /* PL_HAVE_CUDA */

int main(int argc, char **argv) {
    if (device_gpu_count() == 0) {
        const char *require = getenv("PL_REQUIRE_GPU");
        if (require && require[0] && strcmp(require, "0") != 0) {
            printf("no GPU, and PL_REQUIRE_GPU=%s: failed\n", require);
            return 1;
        }
        printf("no GPU: skipped\n");
        return 77;
    }
#ifdef PL_HAVE_CUDA
    small = argc > 1 && strcmp(argv[1], "--small") == 0;
    return run_all();
#else
    (void)argc;
    (void)argv;
    return 77; /* not reached: a build without CUDA sees no GPU */
#endif
}
