/* The CPU's bf16 kernels (kernels_bf16_cpu) against their fp32 twins.
 *
 * Twin: every bf16 kernel runs on bf16 inputs; the fp32 kernel (kernels_cpu)
 * runs on the same values as floats (the bf16 inputs widened, exactly). A bf16
 * kernel computes in fp32 and rounds each output once, so each output must lie
 * within one rounding of the fp32 twin's: |bf16 - fp32| <= 2^-8 |fp32| (half a
 * bf16 ulp is at most 2^-9 of the value; the rest covers fp32 sums added in
 * another order, as oneDNN's matmul does). The error is printed in units of
 * 2^-8 |fp32| (tolerance 1), with a floor of 1e-3 of the tensor's largest
 * value for elements that are sums cancelling to near 0. Outputs that stay
 * fp32 (LayerNorm's mean and rstd, the losses, AdamW's master weights and
 * moments, the sum of squares) must equal the twin's bit for bit or to double
 * rounding.
 *
 * Gradients: each backward's bf16 result against central differences of the
 * fp32 twin's forward at the bf16 inputs (L = sum(out R), in double), step
 * 1e-2: the fp32 forward resolves them to ~1e-3, and the bf16 backward rounds
 * its inputs and outputs (~0.4 % each), so the tolerance is 3e-2 of
 * max(|numeric|, |analytic|, 1e-2 x the largest).
 *
 * Run twice by CTest, with PL_BF16_GEMM=sgemm and =onednn (when built with
 * oneDNN; skipped where oneDNN has no bf16 matmul for the CPU), so both
 * matrix-product paths, and both attention paths, are held to this. */
#include "kernels.h"
#include "precision.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;
static int failures;

static void report(const char *what, double err, double tol) {
    int ok = err <= tol;
    printf("%-62s err %9.3e (tol %.0e)  %s\n", what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

/* ---- random values, bf16 buffers ------------------------------------------------ */

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float uniform(float lo, float hi) {
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return lo + (hi - lo) * (float)(((rng * 0x2545F4914F6CDD1Dull) >> 40) * (1.0 / 16777216.0));
}
static void *xalloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}
/* n random bf16 values in [lo, hi), and the same as floats */
typedef struct { bf16 *b; float *f; long n; } pair;
static pair rand_pair(long n, float lo, float hi) {
    pair p = {xalloc((size_t)n * 2), xalloc((size_t)n * 4), n};
    for (long i = 0; i < n; i++) {
        p.b[i] = bf16_from_float(uniform(lo, hi));
        p.f[i] = float_from_bf16(p.b[i]);
    }
    return p;
}
static pair copy_pair(pair x) {
    pair p = {xalloc((size_t)x.n * 2), xalloc((size_t)x.n * 4), x.n};
    memcpy(p.b, x.b, (size_t)x.n * 2);
    memcpy(p.f, x.f, (size_t)x.n * 4);
    return p;
}
static void free_pair(pair p) { free(p.b); free(p.f); }

/* The bf16 output against the twin's fp32 output, in units of 2^-8 |twin|. */
static double rounding_err(const bf16 *got, const float *twin, long n) {
    double amax = 0, err = 0;
    for (long i = 0; i < n; i++) amax = fmax(amax, fabs(twin[i]));
    const double floor = fmax(1e-3 * amax, 1e-30);
    for (long i = 0; i < n; i++) {
        double d = fabs((double)float_from_bf16(got[i]) - twin[i]) / (fmax(fabs(twin[i]), floor) * 0x1p-8);
        if (!(d <= err)) err = d; /* NaN wins */
    }
    return err;
}
static void check_out(const char *what, const bf16 *got, const float *twin, long n) {
    report(what, rounding_err(got, twin, n), 1.0);
}
static double max_abs_diff(const float *a, const float *b, long n) {
    double e = 0;
    for (long i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i]));
    return e;
}

/* ---- gradients: the bf16 backward against differences of the fp32 forward ------- */

typedef double (*loss_fn)(void *ctx); /* L at the current float inputs */

/* x: the float input the loss reads (perturbed in place), ana: the bf16 gradient */
static void check_grad(const char *what, float *x, const bf16 *ana, long n, loss_fn loss, void *ctx) {
    double amax = 0, err = 0;
    for (long i = 0; i < n; i++) amax = fmax(amax, fabs(float_from_bf16(ana[i])));
    const double floor = fmax(1e-2 * amax, 1e-6), h = 1e-2;
    long samples = n < 40 ? n : 40;
    for (long s = 0; s < samples; s++) {
        long i = n < 40 ? s : (long)(uniform(0, 1) * (float)n) % n;
        float x0 = x[i], xp = (float)(x0 + h), xm = (float)(x0 - h);
        x[i] = xp;
        double lp = loss(ctx);
        x[i] = xm;
        double lm = loss(ctx);
        x[i] = x0;
        double num = (lp - lm) / ((double)xp - xm), a = float_from_bf16(ana[i]);
        double d = fabs(num - a) / fmax(fmax(fabs(num), fabs(a)), floor);
        if (!(d <= err)) err = d;
    }
    char line[128];
    snprintf(line, sizeof line, "%s  vs fp32 differences", what);
    report(line, err, 3e-2);
}

static double dot(const float *a, const float *r, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * r[i];
    return s;
}

/* ---- the kernels --------------------------------------------------------------------- */

typedef struct { int N, IC, OC; const float *inp, *w, *bias; const float *R; float *out; } mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    kernels_cpu.matmul_forward(c->out, c->inp, c->w, c->bias, c->N, c->IC, c->OC);
    return dot(c->out, c->R, (long)c->N * c->OC);
}

static void test_matmul(int N, int IC, int OC) {
    char name[96];
    pair inp = rand_pair((long)N * IC, -1, 1), w = rand_pair((long)OC * IC, -0.5f, 0.5f), b = rand_pair(OC, -1, 1);
    pair out = rand_pair((long)N * OC, 0, 0);
    KP->matmul_forward(out.b, inp.b, w.b, b.b, N, IC, OC);
    kernels_cpu.matmul_forward(out.f, inp.f, w.f, b.f, N, IC, OC);
    snprintf(name, sizeof name, "matmul_forward N%d IC%d OC%d + bias", N, IC, OC);
    check_out(name, out.b, out.f, out.n);
    KP->matmul_forward(out.b, inp.b, w.b, NULL, N, IC, OC);
    kernels_cpu.matmul_forward(out.f, inp.f, w.f, NULL, N, IC, OC);
    snprintf(name, sizeof name, "matmul_forward N%d IC%d OC%d", N, IC, OC);
    check_out(name, out.b, out.f, out.n);

    /* backward, accumulating into nonzero gradients */
    pair dout = rand_pair((long)N * OC, -1, 1), dinp = rand_pair((long)N * IC, -1, 1);
    pair dw = rand_pair((long)OC * IC, -1, 1), db = rand_pair(OC, -1, 1);
    pair dinp0 = copy_pair(dinp), dw0 = copy_pair(dw), db0 = copy_pair(db);
    KP->matmul_backward(dinp.b, dw.b, db.b, dout.b, inp.b, w.b, N, IC, OC);
    kernels_cpu.matmul_backward(dinp.f, dw.f, db.f, dout.f, inp.f, w.f, N, IC, OC);
    snprintf(name, sizeof name, "matmul_backward N%d IC%d OC%d dinp", N, IC, OC);
    check_out(name, dinp.b, dinp.f, dinp.n);
    snprintf(name, sizeof name, "matmul_backward N%d IC%d OC%d dw", N, IC, OC);
    check_out(name, dw.b, dw.f, dw.n);
    snprintf(name, sizeof name, "matmul_backward N%d IC%d OC%d dbias", N, IC, OC);
    check_out(name, db.b, db.f, db.n);
    /* the halves: the same bits as the fused kernel */
    KP->matmul_backward_input(dinp0.b, dout.b, w.b, N, IC, OC);
    KP->matmul_backward_weight(dw0.b, db0.b, dout.b, inp.b, N, IC, OC);
    snprintf(name, sizeof name, "matmul_backward halves N%d IC%d OC%d = fused (bits)", N, IC, OC);
    report(name, memcmp(dinp0.b, dinp.b, (size_t)dinp.n * 2) || memcmp(dw0.b, dw.b, (size_t)dw.n * 2) ||
                 memcmp(db0.b, db.b, (size_t)db.n * 2), 0);

    /* gradients from zero against differences of the fp32 forward */
    if ((long)N * IC <= 20000) {
        memset(dinp.b, 0, (size_t)dinp.n * 2);
        memset(dw.b, 0, (size_t)dw.n * 2);
        float *R = xalloc((size_t)out.n * 4), *o = xalloc((size_t)out.n * 4);
        for (long i = 0; i < out.n; i++) R[i] = float_from_bf16(dout.b[i]);
        KP->matmul_backward(dinp.b, dw.b, NULL, dout.b, inp.b, w.b, N, IC, OC);
        mm_ctx c = {N, IC, OC, inp.f, w.f, b.f, R, o};
        snprintf(name, sizeof name, "matmul dinp N%d IC%d OC%d", N, IC, OC);
        check_grad(name, inp.f, dinp.b, inp.n, mm_loss, &c);
        snprintf(name, sizeof name, "matmul dw N%d IC%d OC%d", N, IC, OC);
        check_grad(name, w.f, dw.b, w.n, mm_loss, &c);
        free(R);
        free(o);
    }
    free_pair(inp); free_pair(w); free_pair(b); free_pair(out); free_pair(dout); free_pair(dinp);
    free_pair(dw); free_pair(db); free_pair(dinp0); free_pair(dw0); free_pair(db0);
}

typedef struct { int N, C; const float *inp, *w, *b, *R; float *out, *mean, *rstd; } ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    kernels_cpu.layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->R, (long)c->N * c->C);
}

static void test_layernorm(int N, int C) {
    char name[96];
    pair inp = rand_pair((long)N * C, -2, 3), w = rand_pair(C, 0.5f, 1.5f), b = rand_pair(C, -0.5f, 0.5f);
    pair out = rand_pair((long)N * C, 0, 0);
    float *mean = xalloc((size_t)N * 4), *rstd = xalloc((size_t)N * 4), *mean_f = xalloc((size_t)N * 4),
          *rstd_f = xalloc((size_t)N * 4);
    KP->layernorm_forward(out.b, mean, rstd, inp.b, w.b, b.b, N, C);
    kernels_cpu.layernorm_forward(out.f, mean_f, rstd_f, inp.f, w.f, b.f, N, C);
    snprintf(name, sizeof name, "layernorm_forward N%d C%d out", N, C);
    check_out(name, out.b, out.f, out.n);
    snprintf(name, sizeof name, "layernorm_forward N%d C%d mean, rstd fp32 (bits)", N, C);
    report(name, max_abs_diff(mean, mean_f, N) + max_abs_diff(rstd, rstd_f, N), 0);

    pair dout = rand_pair((long)N * C, -1, 1), dinp = rand_pair((long)N * C, -1, 1);
    pair dw = rand_pair(C, -1, 1), db = rand_pair(C, -1, 1);
    pair dinp0 = copy_pair(dinp), dw0 = copy_pair(dw), db0 = copy_pair(db);
    KP->layernorm_backward(dinp.b, dw.b, db.b, dout.b, inp.b, w.b, mean, rstd, N, C);
    kernels_cpu.layernorm_backward(dinp.f, dw.f, db.f, dout.f, inp.f, w.f, mean_f, rstd_f, N, C);
    snprintf(name, sizeof name, "layernorm_backward N%d C%d dinp", N, C);
    check_out(name, dinp.b, dinp.f, dinp.n);
    snprintf(name, sizeof name, "layernorm_backward N%d C%d dw", N, C);
    check_out(name, dw.b, dw.f, C);
    snprintf(name, sizeof name, "layernorm_backward N%d C%d db", N, C);
    check_out(name, db.b, db.f, C);
    KP->layernorm_backward_input(dinp0.b, dout.b, inp.b, w.b, mean, rstd, N, C);
    KP->layernorm_backward_weight(dw0.b, db0.b, dout.b, inp.b, mean, rstd, N, C);
    snprintf(name, sizeof name, "layernorm_backward halves N%d C%d = fused (bits)", N, C);
    report(name, memcmp(dinp0.b, dinp.b, (size_t)dinp.n * 2) || memcmp(dw0.b, dw.b, (size_t)C * 2) ||
                 memcmp(db0.b, db.b, (size_t)C * 2), 0);

    if ((long)N * C <= 20000) {
        memset(dinp.b, 0, (size_t)dinp.n * 2);
        memset(dw.b, 0, (size_t)C * 2);
        memset(db.b, 0, (size_t)C * 2);
        KP->layernorm_backward(dinp.b, dw.b, db.b, dout.b, inp.b, w.b, mean, rstd, N, C);
        float *o = xalloc((size_t)out.n * 4);
        ln_ctx c = {N, C, inp.f, w.f, b.f, dout.f, o, mean_f, rstd_f};
        snprintf(name, sizeof name, "layernorm dinp N%d C%d", N, C);
        check_grad(name, inp.f, dinp.b, inp.n, ln_loss, &c);
        snprintf(name, sizeof name, "layernorm dw N%d C%d", N, C);
        check_grad(name, w.f, dw.b, C, ln_loss, &c);
        snprintf(name, sizeof name, "layernorm db N%d C%d", N, C);
        check_grad(name, b.f, db.b, C, ln_loss, &c);
        free(o);
    }
    free(mean); free(rstd); free(mean_f); free(rstd_f);
    free_pair(inp); free_pair(w); free_pair(b); free_pair(out); free_pair(dout); free_pair(dinp);
    free_pair(dw); free_pair(db); free_pair(dinp0); free_pair(dw0); free_pair(db0);
}

typedef struct { int B, T, NH, HS; const float *qkv, *R; float *out, *att; } att_ctx;
static double att_loss(void *p) {
    att_ctx *c = p;
    kernels_cpu.attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->NH, c->HS);
    return dot(c->out, c->R, (long)c->B * c->T * c->NH * c->HS);
}

static void test_attention(int B, int T, int NH, int HS) {
    char name[96];
    const long C = (long)NH * HS, NQ = (long)B * T * 3 * C, NO = (long)B * T * C, NA = (long)B * NH * T * T;
    pair qkv = rand_pair(NQ, -1.5f, 1.5f), out = rand_pair(NO, 0, 0), att = rand_pair(NA, 0, 0);
    KP->attention_forward(out.b, att.b, qkv.b, B, T, NH, HS);
    kernels_cpu.attention_forward(out.f, att.f, qkv.f, B, T, NH, HS);
    snprintf(name, sizeof name, "attention_forward B%d T%d NH%d HS%d out", B, T, NH, HS);
    check_out(name, out.b, out.f, NO);
    snprintf(name, sizeof name, "attention_forward B%d T%d NH%d HS%d att (softmax)", B, T, NH, HS);
    check_out(name, att.b, att.f, NA);
    /* the backward reads the kept bf16 softmax; the twin reads it widened */
    for (long i = 0; i < NA; i++) att.f[i] = float_from_bf16(att.b[i]);
    pair dout = rand_pair(NO, -1, 1), dqkv = rand_pair(NQ, -1, 1);
    bf16 *datt = xalloc((size_t)NA * 2);
    float *datt_f = xalloc((size_t)NA * 4);
    KP->attention_backward(dqkv.b, datt, dout.b, qkv.b, att.b, B, T, NH, HS);
    kernels_cpu.attention_backward(dqkv.f, datt_f, dout.f, qkv.f, att.f, B, T, NH, HS);
    snprintf(name, sizeof name, "attention_backward B%d T%d NH%d HS%d dqkv", B, T, NH, HS);
    check_out(name, dqkv.b, dqkv.f, NQ);
    if (NQ <= 20000) {
        memset(dqkv.b, 0, (size_t)NQ * 2);
        KP->attention_backward(dqkv.b, datt, dout.b, qkv.b, att.b, B, T, NH, HS);
        float *o = xalloc((size_t)NO * 4), *a = xalloc((size_t)NA * 4);
        att_ctx c = {B, T, NH, HS, qkv.f, dout.f, o, a};
        snprintf(name, sizeof name, "attention dqkv B%d T%d NH%d HS%d", B, T, NH, HS);
        check_grad(name, qkv.f, dqkv.b, NQ, att_loss, &c);
        free(o);
        free(a);
    }
    free(datt); free(datt_f);
    free_pair(qkv); free_pair(out); free_pair(att); free_pair(dout); free_pair(dqkv);
}

typedef struct { long N; const float *inp, *R; float *out; } gelu_ctx;
static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    kernels_cpu.gelu_forward(c->out, c->inp, c->N);
    return dot(c->out, c->R, c->N);
}

static void test_elementwise(long N) {
    char name[96];
    pair x = rand_pair(N, -4, 4), y = rand_pair(N, -4, 4), out = rand_pair(N, 0, 0);
    KP->gelu_forward(out.b, x.b, N);
    kernels_cpu.gelu_forward(out.f, x.f, N);
    snprintf(name, sizeof name, "gelu_forward N%ld", N);
    check_out(name, out.b, out.f, N);
    pair dinp = rand_pair(N, -1, 1);
    KP->gelu_backward(dinp.b, y.b, x.b, N);
    kernels_cpu.gelu_backward(dinp.f, y.f, x.f, N);
    snprintf(name, sizeof name, "gelu_backward N%ld (accumulating)", N);
    check_out(name, dinp.b, dinp.f, N);
    if (N <= 20000) {
        memset(dinp.b, 0, (size_t)N * 2);
        KP->gelu_backward(dinp.b, y.b, x.b, N);
        float *o = xalloc((size_t)N * 4);
        gelu_ctx c = {N, x.f, y.f, o};
        snprintf(name, sizeof name, "gelu dinp N%ld", N);
        check_grad(name, x.f, dinp.b, N, gelu_loss, &c);
        free(o);
    }
    KP->add(out.b, x.b, y.b, N);
    kernels_cpu.add(out.f, x.f, y.f, N);
    snprintf(name, sizeof name, "add N%ld", N);
    check_out(name, out.b, out.f, N);
    pair acc = copy_pair(x);
    KP->add(acc.b, acc.b, y.b, N); /* out aliasing a */
    kernels_cpu.add(acc.f, acc.f, y.f, N);
    snprintf(name, sizeof name, "add N%ld, out = a", N);
    check_out(name, acc.b, acc.f, N);
    KP->accumulate(acc.b, x.b, N);
    for (long i = 0; i < N; i++) acc.f[i] = float_from_bf16(acc.b[i]); /* from here, the twin starts from bf16 */
    pair twin = copy_pair(acc);
    KP->scale(acc.b, 0.37f, N);
    kernels_cpu.scale(twin.f, 0.37f, N);
    snprintf(name, sizeof name, "scale N%ld", N);
    check_out(name, acc.b, twin.f, N);
    free_pair(x); free_pair(y); free_pair(out); free_pair(dinp); free_pair(acc); free_pair(twin);
}

/* The kernels built for AVX2 and AVX-512 (GELU, kernels_cpu_math.h's
 * WITH_AVX512) give the same bits under both, fp32 and bf16, on ordinary
 * values and on the edges (signed zeros, subnormals, infinities, NaN, GELU's
 * clamps); and the bf16 GELU, which converts in registers, is exactly the fp32
 * kernel on the widened values, rounded once. */
static void test_isa_builds(long N) {
    if (!kernels_cpu_decide_avx512()) {
        printf("%-62s skipped: no AVX-512 here (the CPU, PL_CPU_ISA=avx2, or a sanitizer build)\n", "AVX2 and AVX-512 builds: the same bits");
        return;
    }
    static const float edges[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-30f, -3.0f, 3.0f, 40.0f, -40.0f, 1e30f, -1e30f,
                                  INFINITY, -INFINITY, NAN, -NAN, 88.7f, -88.7f, 9.5f, -9.5f};
    const long E = (long)(sizeof edges / sizeof edges[0]);
    pair x = rand_pair(N, -12, 12), dy = rand_pair(N, -2, 2), d0 = rand_pair(N, -1, 1);
    for (long i = 0; i < E && i < N; i++) x.b[i] = bf16_from_float(edges[i]), x.f[i] = float_from_bf16(x.b[i]);
    float *f[2][2];
    bf16 *b[2][2];
    for (int isa = 0; isa < 2; isa++) {
        kernels_cpu_use_avx512 = isa;
        for (int k = 0; k < 2; k++) {
            f[isa][k] = xalloc((size_t)N * 4);
            b[isa][k] = xalloc((size_t)N * 2);
        }
        kernels_cpu.gelu_forward(f[isa][0], x.f, N);
        memcpy(f[isa][1], d0.f, (size_t)N * 4);
        kernels_cpu.gelu_backward(f[isa][1], dy.f, x.f, N);
        KP->gelu_forward(b[isa][0], x.b, N);
        memcpy(b[isa][1], d0.b, (size_t)N * 2);
        KP->gelu_backward(b[isa][1], dy.b, x.b, N);
    }
    kernels_cpu_use_avx512 = -1;
    const char *what[2] = {"gelu_forward", "gelu_backward"};
    char name[96];
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%s N%ld fp32, AVX2 vs AVX-512: bits differ", what[k], N);
        report(name, memcmp(f[0][k], f[1][k], (size_t)N * 4) != 0, 0);
        snprintf(name, sizeof name, "%s N%ld bf16, AVX2 vs AVX-512: bits differ", what[k], N);
        report(name, memcmp(b[0][k], b[1][k], (size_t)N * 2) != 0, 0);
        /* bf16 = the fp32 kernel on the widened values, rounded once (NaN: any NaN) */
        long off = 0;
        for (long i = 0; i < N; i++) {
            bf16 want = bf16_from_float(f[1][k][i]);
            if (b[1][k][i] != want && !(isnan(f[1][k][i]) && isnan(float_from_bf16(b[1][k][i])))) off++;
        }
        snprintf(name, sizeof name, "%s N%ld bf16 != round(fp32 kernel): elements", what[k], N);
        report(name, (double)off, 0);
    }
    for (int isa = 0; isa < 2; isa++)
        for (int k = 0; k < 2; k++) free(f[isa][k]), free(b[isa][k]);
    free_pair(x); free_pair(dy); free_pair(d0);
}

typedef struct { int N, V; const float *logits, *R; float *losses, *probs; const int *targets; } ce_ctx;
static double ce_loss(void *p) {
    ce_ctx *c = p;
    kernels_cpu.crossentropy_forward(c->losses, c->probs, c->logits, c->targets, c->N, c->V);
    return dot(c->losses, c->R, c->N);
}

static void test_crossentropy(int N, int V) {
    char name[96];
    pair logits = rand_pair((long)N * V, -3, 3), probs = rand_pair((long)N * V, 0, 0);
    int *targets = xalloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++) targets[n] = (int)(uniform(0, 1) * (float)V) % V;
    float *losses = xalloc((size_t)N * 4), *losses_f = xalloc((size_t)N * 4);
    KP->crossentropy_forward(losses, probs.b, logits.b, targets, N, V);
    kernels_cpu.crossentropy_forward(losses_f, probs.f, logits.f, targets, N, V);
    snprintf(name, sizeof name, "crossentropy_forward N%d V%d probs", N, V);
    check_out(name, probs.b, probs.f, probs.n);
    snprintf(name, sizeof name, "crossentropy_forward N%d V%d losses fp32 (bits)", N, V);
    report(name, max_abs_diff(losses, losses_f, N), 0);
    for (long i = 0; i < probs.n; i++) probs.f[i] = float_from_bf16(probs.b[i]);
    pair dlogits = rand_pair((long)N * V, 0, 0);
    KP->crossentropy_backward(dlogits.b, probs.b, targets, 1.0f / N, N, V);
    kernels_cpu.crossentropy_backward(dlogits.f, probs.f, targets, 1.0f / N, N, V);
    snprintf(name, sizeof name, "crossentropy_backward N%d V%d", N, V);
    check_out(name, dlogits.b, dlogits.f, dlogits.n);
    if ((long)N * V <= 20000) {
        float *R = xalloc((size_t)N * 4), *p = xalloc((size_t)probs.n * 4), *l = xalloc((size_t)N * 4);
        for (int n = 0; n < N; n++) R[n] = 1.0f / N;
        ce_ctx c = {N, V, logits.f, R, l, p, targets};
        snprintf(name, sizeof name, "crossentropy dlogits N%d V%d", N, V);
        check_grad(name, logits.f, dlogits.b, logits.n, ce_loss, &c);
        free(R); free(p); free(l);
    }
    free(targets); free(losses); free(losses_f);
    free_pair(logits); free_pair(probs); free_pair(dlogits);
}

typedef struct { int B, T, C; const int *tokens; const float *wte, *wpe, *R; float *out; } enc_ctx;
static double enc_loss(void *p) {
    enc_ctx *c = p;
    kernels_cpu.encoder_forward(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->R, (long)c->B * c->T * c->C);
}

static void test_encoder(int B, int T, int C, int V) {
    char name[96];
    int *tokens = xalloc((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(uniform(0, 1) * (float)V) % V;
    pair wte = rand_pair((long)V * C, -1, 1), wpe = rand_pair((long)T * C, -1, 1), out = rand_pair((long)B * T * C, 0, 0);
    KP->encoder_forward(out.b, tokens, wte.b, wpe.b, B, T, C);
    kernels_cpu.encoder_forward(out.f, tokens, wte.f, wpe.f, B, T, C);
    snprintf(name, sizeof name, "encoder_forward B%d T%d C%d", B, T, C);
    check_out(name, out.b, out.f, out.n);
    pair dout = rand_pair(out.n, -1, 1), dwte = rand_pair(wte.n, -1, 1), dwpe = rand_pair(wpe.n, -1, 1);
    KP->encoder_backward(dwte.b, dwpe.b, dout.b, tokens, B, T, C);
    kernels_cpu.encoder_backward(dwte.f, dwpe.f, dout.f, tokens, B, T, C);
    snprintf(name, sizeof name, "encoder_backward B%d T%d C%d dwte", B, T, C);
    check_out(name, dwte.b, dwte.f, dwte.n);
    snprintf(name, sizeof name, "encoder_backward B%d T%d C%d dwpe", B, T, C);
    check_out(name, dwpe.b, dwpe.f, dwpe.n);
    memset(dwte.b, 0, (size_t)dwte.n * 2);
    memset(dwpe.b, 0, (size_t)dwpe.n * 2);
    KP->encoder_backward(dwte.b, dwpe.b, dout.b, tokens, B, T, C);
    float *o = xalloc((size_t)out.n * 4);
    enc_ctx c = {B, T, C, tokens, wte.f, wpe.f, dout.f, o};
    snprintf(name, sizeof name, "encoder dwpe B%d T%d C%d", B, T, C);
    check_grad(name, wpe.f, dwpe.b, wpe.n, enc_loss, &c);
    free(o); free(tokens);
    free_pair(wte); free_pair(wpe); free_pair(out); free_pair(dout); free_pair(dwte); free_pair(dwpe);
}

/* The optimizer's pieces: fp32 results from bf16 gradients, exactly the twin's. */
static void test_optimizer(long N) {
    char name[96];
    pair g = rand_pair(N, -0.1f, 0.1f);
    snprintf(name, sizeof name, "sum_squares N%ld (relative to the twin's)", N);
    double a = KP->sum_squares(g.b, N), b = kernels_cpu.sum_squares(g.f, N), acc = 0.5;
    report(name, fabs(a - b) / b, 1e-12);
    KP->sum_squares_add(&acc, g.b, N);
    snprintf(name, sizeof name, "sum_squares_add N%ld = 0.5 + sum_squares (bits)", N);
    report(name, acc != 0.5 + a, 0);
    float *p = xalloc((size_t)N * 4), *m = xalloc((size_t)N * 4), *v = xalloc((size_t)N * 4);
    float *p2 = xalloc((size_t)N * 4), *m2 = xalloc((size_t)N * 4), *v2 = xalloc((size_t)N * 4);
    for (long i = 0; i < N; i++) {
        p[i] = p2[i] = uniform(-1, 1);
        m[i] = m2[i] = uniform(-0.01f, 0.01f);
        v[i] = v2[i] = uniform(0, 1e-4f);
    }
    KP->adamw(p, g.b, m, v, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7f);
    kernels_cpu.adamw(p2, g.f, m2, v2, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7f);
    snprintf(name, sizeof name, "adamw N%ld: fp32 master and moments (bits)", N);
    report(name, memcmp(p, p2, (size_t)N * 4) || memcmp(m, m2, (size_t)N * 4) || memcmp(v, v2, (size_t)N * 4), 0);
    bf16 *values = xalloc((size_t)N * 2);
    float *back = xalloc((size_t)N * 4);
    KP->to_values(values, p, N);
    KP->to_floats(back, values, N);
    int exact = 1;
    for (long i = 0; i < N; i++) exact &= values[i] == bf16_from_float(p[i]) && back[i] == float_from_bf16(values[i]);
    snprintf(name, sizeof name, "to_values / to_floats N%ld = bf16_from_float / float_from_bf16", N);
    report(name, !exact, 0);
    free(p); free(m); free(v); free(p2); free(m2); free(v2); free(values); free(back);
    free_pair(g);
}

/* Round to nearest even, and the special values. */
static void test_rounding(void) {
    struct { float f; uint16_t want; } cases[] = {
        {1.0f, 0x3F80}, {1.0f + 0x1p-8f, 0x3F80},            /* a tie: to even (down) */
        {1.0f + 3 * 0x1p-8f, 0x3F82},                         /* a tie: to even (up) */
        {1.0f + 0x1p-8f + 0x1p-20f, 0x3F81},                  /* above the tie: up */
        {-2.5f, 0xC020}, {0.0f, 0x0000}, {-0.0f, 0x8000},
        {INFINITY, 0x7F80}, {-INFINITY, 0xFF80},
        {3.4e38f, 0x7F80},                                    /* rounds beyond the largest bf16: inf */
        {1e-40f, 0x0001},                                     /* a subnormal stays one */
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bf16 got;
        KP->to_values(&got, &cases[i].f, 1);
        if (got != cases[i].want) {
            printf("    %g -> %04x, want %04x\n", cases[i].f, got, cases[i].want);
            ok = 0;
        }
    }
    float nan = NAN;
    bf16 got;
    KP->to_values(&got, &nan, 1);
    ok &= isnan(float_from_bf16(got));
    report("rounding: to nearest even, inf, overflow, subnormal, NaN stays NaN", !ok, 0);
}

/* ---- attention over blocks (context parallelism) --------------------------------------
 * Rank 0's zig-zag queries (chunks 0 and 3 of 4) against rank 1's keys and
 * values (chunks 1 and 2), read in place from two qkv buffers (ld 3C): some
 * rows see no key (lse -inf, out 0). lse stays fp32: equal to the twin's. */
static double lse_diff(const float *a, const float *b, long n) {
    double e = 0;
    for (long i = 0; i < n; i++) {
        double d = isinf(a[i]) || isinf(b[i]) ? (a[i] == b[i] ? 0 : 1) : fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
    }
    return e;
}

static void test_attention_block(int B, int s, int NH, int HS) {
    char name[96];
    const int n = 2 * s;
    const long C = (long)NH * HS, NQ = (long)B * n * 3 * C, NO = (long)B * n * C, NL = (long)B * NH * n;
    int *qp = xalloc(sizeof(int) * (size_t)n), *kp = xalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < s; i++) qp[i] = i, qp[s + i] = 3 * s + i, kp[i] = s + i, kp[s + i] = 2 * s + i;
    pair qkv = rand_pair(NQ, -1.5f, 1.5f), kv = rand_pair(NQ, -1.5f, 1.5f), out = rand_pair(NO, 0, 0);
    float *lse = xalloc(sizeof(float) * (size_t)NL), *lse_f = xalloc(sizeof(float) * (size_t)NL);
    for (int dir = 0; dir < 2; dir++) { /* then the other way round: every row sees every key */
        const int *q_pos = dir ? kp : qp, *k_pos = dir ? qp : kp;
        KP->attention_block_forward(out.b, lse, qkv.b, kv.b + C, kv.b + 2 * C, 3 * C, 3 * C, q_pos, k_pos, B, n, n, NH, HS);
        kernels_cpu.attention_block_forward(out.f, lse_f, qkv.f, kv.f + C, kv.f + 2 * C, 3 * C, 3 * C, q_pos, k_pos, B, n,
                                            n, NH, HS);
        snprintf(name, sizeof name, "attention_block_forward B%d T%d NH%d HS%d %s out", B, n, NH, HS, dir ? "2>1" : "1>2");
        check_out(name, out.b, out.f, NO);
        snprintf(name, sizeof name, "attention_block_forward B%d T%d NH%d HS%d %s lse (fp32)", B, n, NH, HS, dir ? "2>1" : "1>2");
        report(name, lse_diff(lse, lse_f, NL), 1e-6);
        for (long i = 0; i < NO; i++) out.f[i] = float_from_bf16(out.b[i]); /* the backward reads the kept bf16 out */
        pair dout = rand_pair(NO, -1, 1), dq = rand_pair(NQ, -1, 1), dkv = rand_pair(NQ, -1, 1);
        KP->attention_block_backward(dq.b, dkv.b + C, dkv.b + 2 * C, dout.b, out.b, lse, qkv.b, kv.b + C, kv.b + 2 * C,
                                     3 * C, 3 * C, q_pos, k_pos, B, n, n, NH, HS);
        kernels_cpu.attention_block_backward(dq.f, dkv.f + C, dkv.f + 2 * C, dout.f, out.f, lse, qkv.f, kv.f + C,
                                             kv.f + 2 * C, 3 * C, 3 * C, q_pos, k_pos, B, n, n, NH, HS);
        snprintf(name, sizeof name, "attention_block_backward B%d T%d NH%d HS%d %s dq", B, n, NH, HS, dir ? "2>1" : "1>2");
        check_out(name, dq.b, dq.f, NQ);
        snprintf(name, sizeof name, "attention_block_backward B%d T%d NH%d HS%d %s dk dv", B, n, NH, HS, dir ? "2>1" : "1>2");
        check_out(name, dkv.b, dkv.f, NQ);
        free_pair(dout); free_pair(dq); free_pair(dkv);
    }
    /* merge the last block into a random partial */
    pair o2 = rand_pair(NO, -1, 1);
    float *l2 = xalloc(sizeof(float) * (size_t)NL);
    for (long i = 0; i < NL; i++) l2[i] = i % 5 == 0 ? -INFINITY : uniform(-3, 3);
    memcpy(lse_f, lse, sizeof(float) * (size_t)NL);
    KP->attention_merge(out.b, lse, o2.b, l2, B, n, NH, HS);
    kernels_cpu.attention_merge(out.f, lse_f, o2.f, l2, B, n, NH, HS);
    snprintf(name, sizeof name, "attention_merge B%d T%d NH%d HS%d out", B, n, NH, HS);
    check_out(name, out.b, out.f, NO);
    snprintf(name, sizeof name, "attention_merge B%d T%d NH%d HS%d lse (fp32)", B, n, NH, HS);
    report(name, lse_diff(lse, lse_f, NL), 0);
    free(qp); free(kp); free(lse); free(lse_f); free(l2);
    free_pair(qkv); free_pair(kv); free_pair(out); free_pair(o2);
}

int main(void) {
    precision_use(PREC_BF16);
    printf("%s: %s\n", KP->name, kernels_bf16_cpu_gemm_text());
    const char *want = getenv("PL_BF16_GEMM");
    if (want && !strcmp(want, "onednn") && !kernels_bf16_cpu_uses_onednn()) {
        printf("skipped: PL_BF16_GEMM=onednn, but this build or CPU has no oneDNN bf16 matmul\n");
        return 77; /* CTest's SKIP_RETURN_CODE (tests/CMakeLists.txt) */
    }
    test_rounding();
    test_matmul(7, 5, 3);
    test_matmul(64, 32, 96);
    test_matmul(700, 768, 97); /* several row chunks of the sgemm path */
    test_layernorm(5, 7);
    test_layernorm(300, 128); /* several row chunks */
    test_attention(1, 5, 1, 4);
    test_attention(2, 37, 3, 16);
    test_attention(1, 100, 3, 16); /* heads in groups of 2 and 1 (kernels_cpu_bf16.c, heads_per_group) */
    test_attention(3, 200, 2, 8);  /* oneDNN: 2 heads per call, calls spanning batch rows (heads_per_call) */
    test_attention_block(1, 3, 1, 4);
    test_attention_block(2, 20, 3, 16);
    test_elementwise(1000);
    test_elementwise(40000); /* several chunks */
    test_isa_builds(40007);  /* an odd length: the loops' scalar tails too */
    test_crossentropy(9, 17);
    test_crossentropy(300, 256);
    test_encoder(2, 5, 6, 11);
    test_encoder(3, 64, 32, 256);
    test_optimizer(1000);
    test_optimizer(50001);
    printf("%s\n", failures ? "FAILED" : "all bf16 kernel checks passed");
    return failures ? 1 : 0;
}
