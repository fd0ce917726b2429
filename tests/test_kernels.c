/* Checks of the kernel table K on the CPU.
 *
 * Forwards are compared with straightforward double-precision references.
 * Backwards are compared with central finite differences of a scalar loss
 * L = sum(out * R) for a fixed random R, so dL/dout = R is what the backward
 * receives. L is summed in double over the outputs of the float forward.
 *
 * Choice of step and tolerance. The error of an element is
 * |num - ana| / max(|num|, |ana|, floor), floor = 1e-2 * max |ana| over the
 * tensor, and must stay below 1e-2. Two errors compete in num:
 *  - truncation, ~ h^2 |f'''| / 6: with O(1) inputs and smooth functions,
 *    ~1e-5 relative at h = 1e-2;
 *  - rounding: each float output carries ~6e-8 relative error, so L moves by
 *    noise of ~1e-7 between the two evaluations, i.e. ~1e-5 absolute in num
 *    at h = 1e-2. Relative to a gradient of 1e-3 that alone is 1e-2: hence the
 *    floor, which keeps near-zero elements from failing on noise while still
 *    holding them to an absolute error of 1e-4 of the largest element.
 * Measured worst errors are ~1e-3 or less, ten times under the tolerance; a
 * real mistake (a missing term, a wrong index, a wrong factor) gives errors
 * of order 1. Attention uses h = 2e-2: one k or v element feeds every later
 * row, so more outputs carry rounding noise into L. Cross-entropy uses
 * h = 5e-2: its losses are ~5, so L's rounding noise is larger, and the
 * loss's derivatives obey |f'''| <= |f'| (softmax), so truncation stays
 * below h^2 / 6 = 4e-4 relative.
 *
 * Every check prints one line with the largest error it found (and, when it
 * fails, where); the program exits non-zero if any check fails. */
#include "device.h"
#include "kernels.h"
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_H 1e-2
#define FD_TOL 1e-2
#define FD_FLOOR 1e-2
#define FD_SAMPLES 50 /* tensors larger than this get a random sample of elements */

static int failures = 0;
static char worst[160]; /* where the last finite-difference check erred most */

static void report(const char *what, double err, double tol) {
    int ok = err <= tol; /* false for NaN too */
    printf("%-62s max rel err %9.3e (tol %.0e)  %s\n", what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) {
        if (worst[0]) printf("    worst: %s\n", worst);
        failures++;
    }
    worst[0] = 0;
}

static void report_bool(const char *what, int ok, const char *detail) {
    printf("%-62s %s%s%s\n", what, ok ? "ok" : "FAIL", detail ? "  " : "", detail ? detail : "");
    if (!ok) failures++;
}

/* ---- random numbers (xorshift64*, fixed seed: runs are reproducible) ---------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rand_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float rand_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rand_u32() >> 8) * (1.0 / 16777216.0));
}
static int rand_int(int n) { return (int)(rand_u32() % (uint32_t)n); }

static float *alloc_f(long n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}
static float *rand_f(long n, float lo, float hi) {
    float *p = alloc_f(n);
    for (long i = 0; i < n; i++) p[i] = rand_uniform(lo, hi);
    return p;
}
static float *copy_f(const float *x, long n) {
    float *p = alloc_f(n);
    memcpy(p, x, (size_t)n * sizeof *p);
    return p;
}
static void fill_nan(float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = NAN;
}
static double dot_d(const float *a, const float *b, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* Largest |a - b| / max(|b|, floor) where floor = rel_floor * max|b| + abs_floor. */
static double max_rel_err(const float *a, const double *b, long n, double rel_floor,
                          double abs_floor) {
    double bmax = 0, err = 0;
    for (long i = 0; i < n; i++) bmax = fmax(bmax, fabs(b[i]));
    double floor = rel_floor * bmax + abs_floor;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), floor);
        if (!(d <= err)) err = d; /* NaN sticks */
    }
    return err;
}

/* Largest |a - b| / scale where scale is the sum of the magnitudes of the
 * terms that made b: the rounding a float computation may do is relative to
 * that, not to b, which can cancel to near zero. */
static double max_scaled_err(const float *a, const double *b, const double *scale, long n) {
    double err = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (scale[i] > 0 ? scale[i] : 1e-30);
        if (!(d <= err)) err = d;
    }
    return err;
}

/* ---- finite differences --------------------------------------------------------- */

typedef double (*loss_fn)(void *ctx);

/* Max error between the analytic gradient ana[] of L with respect to x[] and
 * central differences with step h, over all elements or a random sample. */
static double fd_check_h(float *x, const float *ana, long n, loss_fn loss, void *ctx,
                         double h) {
    double amax = 0;
    for (long i = 0; i < n; i++) amax = fmax(amax, fabs(ana[i]));
    const double floor = fmax(FD_FLOOR * amax, 1e-6);
    const long count = n <= FD_SAMPLES ? n : FD_SAMPLES;
    double err = 0;
    for (long s = 0; s < count; s++) {
        long i = n <= FD_SAMPLES ? s : (s == 0 ? 0 : s == 1 ? n - 1 : rand_int((int)n));
        const float x0 = x[i];
        const float xp = (float)(x0 + h), xm = (float)(x0 - h);
        x[i] = xp;
        const double lp = loss(ctx);
        x[i] = xm;
        const double lm = loss(ctx);
        x[i] = x0;
        /* divide by the step actually taken, after rounding to float */
        const double num = (lp - lm) / ((double)xp - (double)xm);
        const double d = fabs(num - ana[i]) / fmax(fmax(fabs(num), fabs(ana[i])), floor);
        if (!(d <= err)) {
            err = d;
            snprintf(worst, sizeof worst, "element %ld: numeric %.6g, analytic %.6g, floor %.3g", i,
                     num, (double)ana[i], floor);
        }
    }
    return err;
}

static double fd_check(float *x, const float *ana, long n, loss_fn loss, void *ctx) {
    return fd_check_h(x, ana, n, loss, ctx, FD_H);
}

/* The accumulation rule: a second call adds the same gradient again. Not
 * compared bit for bit: a kernel that sums over rows into its output (dw of
 * layernorm, dbias, dwpe) rounds (G + g1) + g2 + ... differently from
 * 2 (g1 + g2 + ...). 1e-5 of the largest element still fails a kernel that
 * overwrites (1x) or zeroes first. */
static double twice_err(const float *once, const float *twice, long n) {
    double m = 0, err = 0;
    for (long i = 0; i < n; i++) m = fmax(m, fabs(2.0 * once[i]));
    if (m == 0) m = 1;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)twice[i] - 2.0 * once[i]) / m;
        if (!(d <= err)) err = d;
    }
    return err;
}
#define TWICE_TOL 1e-5

/* ---- encoder -------------------------------------------------------------------- */

typedef struct {
    int B, T, C, V;
    int *tokens;
    float *wte, *wpe, *out, *R;
} enc_ctx;

static double enc_loss(void *p) {
    enc_ctx *c = p;
    K->encoder_forward(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_d(c->out, c->R, (long)c->B * c->T * c->C);
}

static void test_encoder(int B, int T, int C, int V) {
    char name[128];
    enc_ctx c = {B, T, C, V, NULL, NULL, NULL, NULL, NULL};
    const long N = (long)B * T, NC = N * C;
    c.tokens = malloc((size_t)N * sizeof(int));
    for (long n = 0; n < N; n++) c.tokens[n] = rand_int(V); /* V small: repeats */
    c.wte = rand_f((long)V * C, -1, 1);
    c.wpe = rand_f((long)T * C, -1, 1);
    c.out = alloc_f(NC);
    c.R = rand_f(NC, -1, 1);

    fill_nan(c.out, NC);
    K->encoder_forward(c.out, c.tokens, c.wte, c.wpe, B, T, C);
    double *ref = malloc((size_t)NC * sizeof(double));
    for (long n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            ref[n * C + i] = (double)(c.wte[(long)c.tokens[n] * C + i] + c.wpe[(n % T) * C + i]);
    snprintf(name, sizeof name, "encoder_forward  B=%d T=%d C=%d V=%d", B, T, C, V);
    report(name, max_rel_err(c.out, ref, NC, 0, 1e-30), 0);

    float *dwte = alloc_f((long)V * C), *dwpe = alloc_f((long)T * C);
    K->encoder_backward(dwte, dwpe, c.R, c.tokens, B, T, C);
    float *dwte1 = copy_f(dwte, (long)V * C), *dwpe1 = copy_f(dwpe, (long)T * C);
    snprintf(name, sizeof name, "encoder_backward B=%d T=%d C=%d V=%d  dwte", B, T, C, V);
    report(name, fd_check(c.wte, dwte1, (long)V * C, enc_loss, &c), FD_TOL);
    snprintf(name, sizeof name, "encoder_backward B=%d T=%d C=%d V=%d  dwpe", B, T, C, V);
    report(name, fd_check(c.wpe, dwpe1, (long)T * C, enc_loss, &c), FD_TOL);
    K->encoder_backward(dwte, dwpe, c.R, c.tokens, B, T, C);
    snprintf(name, sizeof name, "encoder_backward B=%d T=%d C=%d  accumulates", B, T, C);
    report(name, fmax(twice_err(dwte1, dwte, (long)V * C), twice_err(dwpe1, dwpe, (long)T * C)),
           TWICE_TOL);

    free(c.tokens), free(c.wte), free(c.wpe), free(c.out), free(c.R), free(ref);
    free(dwte), free(dwpe), free(dwte1), free(dwpe1);
}

/* ---- layernorm ------------------------------------------------------------------ */

typedef struct {
    int N, C;
    float *inp, *w, *b, *out, *mean, *rstd, *R;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    K->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot_d(c->out, c->R, (long)c->N * c->C);
}

static void test_layernorm(int N, int C) {
    char name[128];
    const long NC = (long)N * C;
    ln_ctx c = {N, C, rand_f(NC, -1, 1), rand_f(C, 0.5f, 1.5f), rand_f(C, -0.5f, 0.5f),
                alloc_f(NC), alloc_f(N), alloc_f(N), rand_f(NC, -1, 1)};
    for (long i = 0; i < NC; i++) c.inp[i] += 0.3f; /* a non-zero mean */

    fill_nan(c.out, NC);
    K->layernorm_forward(c.out, c.mean, c.rstd, c.inp, c.w, c.b, N, C);
    double *ref = malloc((size_t)NC * sizeof(double)), *refm = malloc((size_t)N * sizeof(double)),
           *refr = malloc((size_t)N * sizeof(double)), *scale = malloc((size_t)NC * sizeof(double));
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += c.inp[(long)n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (c.inp[(long)n * C + i] - m) * (c.inp[(long)n * C + i] - m);
        v /= C;
        double r = 1.0 / sqrt(v + 1e-5);
        refm[n] = m, refr[n] = r;
        for (int i = 0; i < C; i++) {
            const double x = c.inp[(long)n * C + i];
            ref[(long)n * C + i] = (x - m) * r * c.w[i] + c.b[i];
            scale[(long)n * C + i] = (fabs(x) + fabs(m)) * r * fabs(c.w[i]) + fabs(c.b[i]);
        }
    }
    snprintf(name, sizeof name, "layernorm_forward  N=%d C=%d  out", N, C);
    report(name, max_scaled_err(c.out, ref, scale, NC), 1e-5);
    snprintf(name, sizeof name, "layernorm_forward  N=%d C=%d  mean, rstd", N, C);
    report(name, fmax(max_rel_err(c.mean, refm, N, 1e-2, 1e-30), max_rel_err(c.rstd, refr, N, 0, 1e-30)),
           1e-5);

    float *dinp = alloc_f(NC), *dw = alloc_f(C), *db = alloc_f(C);
    K->layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    float *dinp1 = copy_f(dinp, NC), *dw1 = copy_f(dw, C), *db1 = copy_f(db, C);
    snprintf(name, sizeof name, "layernorm_backward N=%d C=%d  dinp", N, C);
    report(name, fd_check(c.inp, dinp1, NC, ln_loss, &c), FD_TOL);
    snprintf(name, sizeof name, "layernorm_backward N=%d C=%d  dw", N, C);
    report(name, fd_check(c.w, dw1, C, ln_loss, &c), FD_TOL);
    snprintf(name, sizeof name, "layernorm_backward N=%d C=%d  db", N, C);
    report(name, fd_check(c.b, db1, C, ln_loss, &c), FD_TOL);
    ln_loss(&c); /* mean and rstd of the unperturbed input again */
    K->layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    snprintf(name, sizeof name, "layernorm_backward N=%d C=%d  accumulates", N, C);
    report(name, fmax(twice_err(dinp1, dinp, NC), fmax(twice_err(dw1, dw, C), twice_err(db1, db, C))),
           TWICE_TOL);

    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
    free(ref), free(refm), free(refr), free(scale), free(dinp), free(dw), free(db), free(dinp1), free(dw1), free(db1);
}

/* ---- matmul --------------------------------------------------------------------- */

typedef struct {
    int N, IC, OC;
    float *inp, *w, *bias, *out, *R; /* bias may be NULL */
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    K->matmul_forward(c->out, c->inp, c->w, c->bias, c->N, c->IC, c->OC);
    return dot_d(c->out, c->R, (long)c->N * c->OC);
}

static void test_matmul(int N, int IC, int OC, int with_bias, int with_dinp) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d%s%s", N, IC, OC, with_bias ? "" : " nobias",
             with_dinp ? "" : " dinp=NULL");
    const long NI = (long)N * IC, NO = (long)N * OC, WO = (long)OC * IC;
    mm_ctx c = {N, IC, OC, rand_f(NI, -1, 1), rand_f(WO, -1, 1), with_bias ? rand_f(OC, -1, 1) : NULL,
                alloc_f(NO), rand_f(NO, -1, 1)};

    fill_nan(c.out, NO); /* a forward overwrites, whatever was there */
    K->matmul_forward(c.out, c.inp, c.w, c.bias, N, IC, OC);
    double *ref = malloc((size_t)NO * sizeof(double)), *scale = malloc((size_t)NO * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = c.bias ? c.bias[o] : 0.0, a = fabs(s);
            for (int i = 0; i < IC; i++) {
                double t = (double)c.inp[(long)n * IC + i] * c.w[(long)o * IC + i];
                s += t, a += fabs(t);
            }
            ref[(long)n * OC + o] = s;
            scale[(long)n * OC + o] = a;
        }
    snprintf(name, sizeof name, "matmul_forward  %s", shape);
    report(name, max_scaled_err(c.out, ref, scale, NO), 1e-5);

    float *dinp = with_dinp ? alloc_f(NI) : NULL, *dw = alloc_f(WO), *db = with_bias ? alloc_f(OC) : NULL;
    K->matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, IC, OC);
    float *dinp1 = dinp ? copy_f(dinp, NI) : NULL, *dw1 = copy_f(dw, WO), *db1 = db ? copy_f(db, OC) : NULL;
    if (dinp) {
        snprintf(name, sizeof name, "matmul_backward %s  dinp", shape);
        report(name, fd_check(c.inp, dinp1, NI, mm_loss, &c), FD_TOL);
    }
    snprintf(name, sizeof name, "matmul_backward %s  dw", shape);
    report(name, fd_check(c.w, dw1, WO, mm_loss, &c), FD_TOL);
    if (db) {
        snprintf(name, sizeof name, "matmul_backward %s  dbias", shape);
        report(name, fd_check(c.bias, db1, OC, mm_loss, &c), FD_TOL);
    }
    K->matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, IC, OC);
    double e = twice_err(dw1, dw, WO);
    if (dinp) e = fmax(e, twice_err(dinp1, dinp, NI));
    if (db) e = fmax(e, twice_err(db1, db, OC));
    snprintf(name, sizeof name, "matmul_backward %s  accumulates", shape);
    report(name, e, TWICE_TOL);

    free(c.inp), free(c.w), free(c.bias), free(c.out), free(c.R), free(ref), free(scale);
    free(dinp), free(dw), free(db), free(dinp1), free(dw1), free(db1);
}

/* ---- attention ------------------------------------------------------------------ */

typedef struct {
    int B, T, NH, HS;
    float *qkv, *out, *att, *R;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    K->attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->NH, c->HS);
    return dot_d(c->out, c->R, (long)c->B * c->T * c->NH * c->HS);
}

static void test_attention(int B, int T, int NH, int HS, float qk_range) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
    const int C = NH * HS;
    const long NQ = (long)B * T * 3 * C, NO = (long)B * T * C, NA = (long)B * NH * T * T;
    att_ctx c = {B, T, NH, HS, rand_f(NQ, -qk_range, qk_range), alloc_f(NO), alloc_f(NA),
                 rand_f(NO, -1, 1)};

    fill_nan(c.out, NO);
    fill_nan(c.att, NA);
    K->attention_forward(c.out, c.att, c.qkv, B, T, NH, HS);

    /* reference: softmax(q k^T / sqrt(HS)) v per head, in double */
    double *ref = malloc((size_t)NO * sizeof(double)), *refa = malloc((size_t)NA * sizeof(double));
    double *scale = malloc((size_t)NO * sizeof(double));
    double *row = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = c.qkv + ((long)b * T + t) * 3 * C + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const float *k = c.qkv + ((long)b * T + j) * 3 * C + C + h * HS;
                    double s = 0;
                    for (int i = 0; i < HS; i++) s += (double)q[i] * k[i];
                    row[j] = s / sqrt((double)HS);
                    mx = fmax(mx, row[j]);
                }
                for (int j = 0; j <= t; j++) sum += (row[j] = exp(row[j] - mx));
                double *ra = refa + (((long)b * NH + h) * T + t) * T;
                for (int j = 0; j < T; j++) ra[j] = j <= t ? row[j] / sum : 0.0;
                for (int i = 0; i < HS; i++) {
                    double o = 0, a = 0;
                    for (int j = 0; j <= t; j++) {
                        double term = ra[j] * c.qkv[((long)b * T + j) * 3 * C + 2 * C + h * HS + i];
                        o += term, a += fabs(term);
                    }
                    ref[((long)b * T + t) * C + h * HS + i] = o;
                    scale[((long)b * T + t) * C + h * HS + i] = a;
                }
            }
    snprintf(name, sizeof name, "attention_forward  %s  out", shape);
    report(name, max_scaled_err(c.out, ref, scale, NO), 1e-5);
    snprintf(name, sizeof name, "attention_forward  %s  att", shape);
    report(name, max_rel_err(c.att, refa, NA, 0, 1e-30), 1e-5);

    /* causal structure: exact zeros above the diagonal, rows summing to 1 */
    int upper_zero = 1;
    double row_err = 0;
    for (long r = 0; r < (long)B * NH * T; r++) {
        const int t = (int)(r % T);
        double s = 0;
        for (int j = 0; j < T; j++) {
            float a = c.att[r * T + j];
            if (j > t && !(a == 0.0f && !signbit(a))) upper_zero = 0;
            if (j <= t) s += a;
        }
        if (!(fabs(s - 1.0) <= row_err)) row_err = fabs(s - 1.0);
    }
    snprintf(name, sizeof name, "attention_forward  %s  upper triangle == +0", shape);
    report_bool(name, upper_zero, NULL);
    snprintf(name, sizeof name, "attention_forward  %s  rows sum to 1", shape);
    report(name, row_err, 1e-5);

    float *dqkv = alloc_f(NQ), *datt = alloc_f(NA);
    fill_nan(datt, NA); /* scratch: its contents on entry must not matter */
    K->attention_backward(dqkv, datt, c.R, c.qkv, c.att, B, T, NH, HS);
    float *dqkv1 = copy_f(dqkv, NQ);
    snprintf(name, sizeof name, "attention_backward %s  dqkv", shape);
    report(name, fd_check_h(c.qkv, dqkv1, NQ, att_loss, &c, 2e-2), FD_TOL);
    att_loss(&c);
    fill_nan(datt, NA);
    K->attention_backward(dqkv, datt, c.R, c.qkv, c.att, B, T, NH, HS);
    snprintf(name, sizeof name, "attention_backward %s  accumulates", shape);
    report(name, twice_err(dqkv1, dqkv, NQ), TWICE_TOL);

    free(c.qkv), free(c.out), free(c.att), free(c.R), free(ref), free(refa), free(scale), free(row);
    free(dqkv), free(datt), free(dqkv1);
}

/* ---- GELU ----------------------------------------------------------------------- */

/* The header's formula in double. 0.5 (1 + tanh(u)) is written as
 * 1 / (1 + exp(-2u)), its equal: in the tanh form 1 + tanh(u) cancels to 0
 * for x below about -9 even in double, where GELU is still ~1e-28. */
static const double GELU_K = 0.79788456080286535588; /* sqrt(2/pi) */
static double gelu_ref(double x) {
    double u = GELU_K * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}
static double gelu_grad_ref(double x) { /* 0.5 (1 + tanh u) + 0.5 x sech^2(u) u' */
    double u = GELU_K * (x + 0.044715 * x * x * x), ch = cosh(u);
    return 1.0 / (1.0 + exp(-2.0 * u)) + 0.5 * x / (ch * ch) * GELU_K * (1.0 + 3 * 0.044715 * x * x);
}

typedef struct {
    long N;
    float *inp, *out, *R;
} gelu_ctx;

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    K->gelu_forward(c->out, c->inp, c->N);
    return dot_d(c->out, c->R, c->N);
}

static void test_gelu(long N) {
    char name[128];
    gelu_ctx c = {N, rand_f(N, -4, 4), alloc_f(N), rand_f(N, -1, 1)};
    fill_nan(c.out, N);
    K->gelu_forward(c.out, c.inp, N);
    double *ref = malloc((size_t)N * sizeof(double));
    for (long i = 0; i < N; i++) ref[i] = gelu_ref(c.inp[i]);
    snprintf(name, sizeof name, "gelu_forward  N=%ld", N);
    report(name, max_rel_err(c.out, ref, N, 0, 1e-30), 1e-5);

    float *dinp = alloc_f(N);
    K->gelu_backward(dinp, c.R, c.inp, N);
    float *dinp1 = copy_f(dinp, N);
    snprintf(name, sizeof name, "gelu_backward N=%ld  dinp", N);
    report(name, fd_check(c.inp, dinp1, N, gelu_loss, &c), FD_TOL);
    K->gelu_backward(dinp, c.R, c.inp, N);
    snprintf(name, sizeof name, "gelu_backward N=%ld  accumulates", N);
    report(name, twice_err(dinp1, dinp, N), TWICE_TOL);
    free(c.inp), free(c.out), free(c.R), free(ref), free(dinp), free(dinp1);
}

/* Far out in the tails the exp inside GELU overflows or underflows; the
 * values must stay finite and right, and a NaN must come out as a NaN. */
static void test_gelu_extremes(void) {
    const float xs[] = {-1000.0f, -100.0f, -20.0f, -10.3f, -9.0f, -5.0f, -1.0f, -1e-3f, -1e-30f,
                        0.0f, 1e-30f, 1e-3f, 1.0f, 5.0f, 9.0f, 10.3f, 20.0f, 100.0f, 1000.0f};
    const long n = (long)(sizeof xs / sizeof xs[0]);
    float out[sizeof xs / sizeof xs[0]], din[sizeof xs / sizeof xs[0]], ones[sizeof xs / sizeof xs[0]];
    double ref[sizeof xs / sizeof xs[0]], dref[sizeof xs / sizeof xs[0]];
    for (long i = 0; i < n; i++) {
        ones[i] = 1.0f, din[i] = 0.0f;
        ref[i] = gelu_ref(xs[i]);
        dref[i] = gelu_grad_ref(xs[i]);
    }
    K->gelu_forward(out, xs, n);
    K->gelu_backward(din, ones, xs, n);
    /* absolute floor 1e-20: far left, 0 and ~1e-32 are both right; near
     * x = -9 (GELU ~1e-28) the relative error is ~2e-6, the float rounding
     * of exp's argument (~66) */
    report("gelu_forward  tails (|x| up to 1000)", max_rel_err(out, ref, n, 0, 1e-20), 1e-5);
    report("gelu_backward tails (|x| up to 1000)", max_rel_err(din, dref, n, 0, 1e-6), 1e-5);
    float nan_in[3] = {NAN, 1.0f, -NAN}, nan_out[3], nan_d[3] = {0, 0, 0};
    K->gelu_forward(nan_out, nan_in, 3);
    K->gelu_backward(nan_d, ones, nan_in, 3);
    report_bool("gelu NaN in -> NaN out", isnan(nan_out[0]) && isnan(nan_out[2]) && !isnan(nan_out[1]) &&
                                               isnan(nan_d[0]) && isnan(nan_d[2]) && !isnan(nan_d[1]),
                NULL);
}

/* ---- cross-entropy -------------------------------------------------------------- */

typedef struct {
    int N, V;
    float dloss;
    int *targets;
    float *logits, *probs, *losses;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    K->crossentropy_forward(c->losses, c->probs, c->logits, c->targets, c->N, c->V);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += c->losses[n];
    return c->dloss * s;
}

/* logits uniform in offset +- range; with_fd: check the backward by finite
 * differences (not with a huge range: losses of ~100 make L's rounding noise
 * larger than the tolerance allows), else against the formula directly */
static void test_crossentropy(int N, int V, float offset, float range, int with_fd) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "N=%d V=%d logits %g+-%g", N, V, (double)offset, (double)range);
    const long NV = (long)N * V;
    ce_ctx c = {N, V, 1.0f / (float)N + 0.37f, malloc((size_t)N * sizeof(int)),
                rand_f(NV, offset - range, offset + range), alloc_f(NV), alloc_f(N)};
    for (int n = 0; n < N; n++) c.targets[n] = rand_int(V);
    fill_nan(c.probs, NV);
    K->crossentropy_forward(c.losses, c.probs, c.logits, c.targets, N, V);

    double *refp = malloc((size_t)NV * sizeof(double)), *refl = malloc((size_t)N * sizeof(double));
    for (int n = 0; n < N; n++) {
        const float *x = c.logits + (long)n * V;
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, x[v]);
        for (int v = 0; v < V; v++) s += exp(x[v] - mx);
        for (int v = 0; v < V; v++) refp[(long)n * V + v] = exp(x[v] - mx) / s;
        refl[n] = log(s) - (x[c.targets[n]] - mx);
    }
    snprintf(name, sizeof name, "crossentropy_forward  %s  probs", shape);
    report(name, max_rel_err(c.probs, refp, NV, 0, 1e-30), 1e-5);
    snprintf(name, sizeof name, "crossentropy_forward  %s  losses", shape);
    report(name, max_rel_err(c.losses, refl, N, 0, 1e-6), 1e-5);

    float *dlogits = alloc_f(NV);
    fill_nan(dlogits, NV); /* the backward overwrites */
    K->crossentropy_backward(dlogits, c.probs, c.targets, c.dloss, N, V);
    snprintf(name, sizeof name, "crossentropy_backward %s  dlogits", shape);
    if (with_fd) {
        report(name, fd_check_h(c.logits, dlogits, NV, ce_loss, &c, 5e-2), FD_TOL);
    } else { /* (probs - onehot) * dloss */
        double *refd = malloc((size_t)NV * sizeof(double));
        for (long i = 0; i < NV; i++) refd[i] = (double)c.probs[i] * c.dloss;
        for (int n = 0; n < N; n++) refd[(long)n * V + c.targets[n]] -= c.dloss;
        report(name, max_rel_err(dlogits, refd, NV, 0, 1e-30), 1e-6);
        free(refd);
    }
    free(c.targets), free(c.logits), free(c.probs), free(c.losses), free(refp), free(refl), free(dlogits);
}

/* ---- elementwise, sum of squares, AdamW ------------------------------------------ */

static void test_elementwise(long N) {
    char name[128];
    float *a = rand_f(N, -1, 1), *b = rand_f(N, -1, 1), *o = alloc_f(N);
    float *a2 = copy_f(a, N), *b2 = copy_f(b, N);
    double err = 0;
    K->add(o, a, b, N);
    for (long i = 0; i < N; i++) err = fmax(err, fabs(o[i] - (a[i] + b[i])));
    K->add(a2, a2, b, N); /* out aliases a */
    for (long i = 0; i < N; i++) err = fmax(err, fabs(a2[i] - (a[i] + b[i])));
    K->add(b2, a, b2, N); /* out aliases b */
    for (long i = 0; i < N; i++) err = fmax(err, fabs(b2[i] - (a[i] + b[i])));
    snprintf(name, sizeof name, "add (also out == a, out == b)  N=%ld", N);
    report(name, err, 0);

    memcpy(o, a, (size_t)N * sizeof *o);
    K->accumulate(o, b, N);
    err = 0;
    for (long i = 0; i < N; i++) err = fmax(err, fabs(o[i] - (a[i] + b[i])));
    snprintf(name, sizeof name, "accumulate  N=%ld", N);
    report(name, err, 0);

    memcpy(o, a, (size_t)N * sizeof *o);
    K->scale(o, -0.37f, N);
    err = 0;
    for (long i = 0; i < N; i++) err = fmax(err, fabs(o[i] - a[i] * -0.37f));
    snprintf(name, sizeof name, "scale  N=%ld", N);
    report(name, err, 0);
    free(a), free(b), free(o), free(a2), free(b2);
}

static void test_sum_squares(long N) {
    char name[128];
    float *x = rand_f(N, -3, 3);
    double ref = 0;
    for (long i = 0; i < N; i++) ref += (double)x[i] * (double)x[i];
    double got = K->sum_squares(x, N);
    /* a float accumulator would be off by ~1e-7 relative or more */
    snprintf(name, sizeof name, "sum_squares  N=%ld", N);
    report(name, N ? fabs(got - ref) / ref : fabs(got), 1e-12);
    free(x);
}

static void test_adamw(long N, int t) {
    char name[128];
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    float *p = rand_f(N, -1, 1), *g = rand_f(N, -2, 2), *m = rand_f(N, -0.1f, 0.1f),
          *v = rand_f(N, 0, 0.05f);
    if (N > 3) g[3] = 0.0f, m[3] = 0.0f, v[3] = 0.0f; /* the eps path */
    float *p0 = copy_f(p, N), *m0 = copy_f(m, N), *v0 = copy_f(v, N);
    K->adamw(p, g, m, v, N, lr, b1, b2, eps, wd, t, gs);
    /* Errors relative to the sum of the magnitudes of each result's terms:
     * m and the step are differences that can cancel to near zero. */
    double ep = 0, em = 0, ev = 0;
    for (long i = 0; i < N; i++) {
        double gi = (double)g[i] * gs;
        double mi = b1 * (double)m0[i] + (1.0 - b1) * gi;
        double vi = b2 * (double)v0[i] + (1.0 - b2) * gi * gi;
        double mh = mi / (1.0 - pow(b1, t)), vh = vi / (1.0 - pow(b2, t));
        double adam = mh / (sqrt(vh) + eps), decay = wd * (double)p0[i];
        double step = lr * (adam + decay);
        /* compare the step, not p: p is ~1 and the step ~1e-2, which the
         * float p rounds by up to ulp(p) / 2 ~ 6e-8 */
        double got_step = (double)p0[i] - (double)p[i];
        ep = fmax(ep, fabs(got_step - step) / (lr * (fabs(adam) + fabs(decay)) + 1e-30));
        em = fmax(em, fabs(m[i] - mi) / (b1 * fabs(m0[i]) + (1.0 - b1) * fabs(gi) + 1e-30));
        ev = fmax(ev, fabs(v[i] - vi) / (vi + 1e-30));
    }
    snprintf(name, sizeof name, "adamw  N=%ld t=%d  step", N, t);
    report(name, ep, 1e-4);
    snprintf(name, sizeof name, "adamw  N=%ld t=%d  m, v", N, t);
    report(name, fmax(em, ev), 1e-5);
    free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0);
}

int main(void) {
    device_use(DEVICE_CPU, 0);
    openblas_set_num_threads(1); /* one thread per rank, as in the labs */
    printf("kernels: %s\n", K->name);

    test_encoder(1, 1, 1, 1);
    test_encoder(2, 5, 7, 11);
    test_encoder(3, 4, 16, 3);

    test_layernorm(1, 1);
    test_layernorm(10, 7);
    test_layernorm(6, 33);
    test_layernorm(4, 128);

    test_matmul(1, 1, 1, 1, 1);
    test_matmul(10, 7, 5, 1, 1);
    test_matmul(13, 17, 9, 0, 1);
    test_matmul(13, 17, 9, 1, 0);
    test_matmul(64, 32, 48, 1, 1);

    test_attention(1, 1, 1, 1, 1.0f);
    test_attention(2, 5, 2, 3, 1.0f);
    test_attention(3, 7, 3, 5, 1.0f);
    test_attention(2, 9, 2, 4, 3.0f);   /* peaked softmax */
    test_attention(1, 70, 2, 4, 1.0f);  /* crosses the 64-row block */
    test_attention(1, 130, 1, 3, 1.0f); /* three blocks, a short last one */

    test_gelu(1);
    test_gelu(7);
    test_gelu(1001);
    test_gelu_extremes();

    test_crossentropy(1, 1, 0.0f, 1.0f, 1);
    test_crossentropy(5, 7, 0.0f, 2.0f, 1);
    test_crossentropy(9, 256, 0.0f, 3.0f, 1);
    test_crossentropy(6, 13, 1000.0f, 3.0f, 1); /* exp(1000) overflows without the max */
    test_crossentropy(4, 37, 0.0f, 50.0f, 0);   /* probabilities below float's range */

    test_elementwise(1);
    test_elementwise(1003);
    test_sum_squares(0);
    test_sum_squares(13);
    test_sum_squares(1000003);
    test_adamw(1, 1);
    test_adamw(1003, 1);
    test_adamw(1003, 7);

    if (failures) {
        printf("FAILED: %d check(s)\n", failures);
        return 1;
    }
    printf("all kernel checks passed\n");
    return 0;
}
