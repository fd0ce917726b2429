/* Checks of the kernel table K on the CPU.
 *
 * Forwards are compared with straightforward double-precision references.
 *
 * Every backward is checked twice against central finite differences of a
 * scalar loss L = sum(out * R), R fixed and random, so that dL/dout = R is
 * what the backward receives:
 *
 *  "fd":  L from the kernel's own float forward, summed in double. This ties
 *         each backward to the forward it belongs to. Step and tolerance:
 *         the error of an element is |num - ana| / max(|num|, |ana|, floor),
 *         floor = 1e-2 * max |ana| over the tensor, and must stay below 1e-2.
 *         Two errors compete in num. Truncation, ~h^2 |f'''| / 6, is ~1e-5
 *         relative at h = 1e-2 for O(1) inputs and smooth functions. Rounding:
 *         each float output carries ~6e-8 relative error, so L moves by noise
 *         of ~1e-7 between the two evaluations, ~1e-5 in num at h = 1e-2;
 *         against a gradient of 1e-3 that alone is 1e-2, hence the floor,
 *         which still holds small elements to 1e-4 of the largest. Measured
 *         worst errors are ~1e-3. Attention takes h = 2e-2 (a k or v element
 *         feeds every later row, so more outputs carry noise into L), and
 *         cross-entropy h = 5e-2 (losses of ~5 make L's noise larger; its
 *         derivatives obey |f'''| <= |f'|, so truncation stays < h^2/6 = 4e-4).
 *         A float forward cannot see errors much below 1e-2, hence:
 *
 *  "ref": L from the double reference forward, h = 1e-4. That difference
 *         quotient is good to ~1e-7, so the tolerance is set by the float
 *         backward alone: error as above (floor 1e-2 * max |ana|), below
 *         1e-4 (measured worst ~5e-6). A gradient off by 0.1% fails here.
 *
 * Every check prints one line with the largest error it found (and, when it
 * fails, where); the program exits non-zero if any check fails. */
#include "device.h"
#include "kernels.h"
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_H 1e-2
#define FD_FLOOR 1e-2
#define FD_TOL 1e-2
#define REF_H 1e-4
#define REF_FLOOR 1e-2
#define REF_TOL 1e-4
#define FD_SAMPLES 50 /* tensors larger than this get a random sample of elements */

static int failures = 0;
static char worst[160]; /* where the last gradient check erred most */

static void report(const char *what, double err, double tol) {
    int ok = err <= tol; /* false for NaN too */
    printf("%-66s max rel err %9.3e (tol %.0e)  %s\n", what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) {
        if (worst[0]) printf("    worst: %s\n", worst);
        failures++;
    }
    worst[0] = 0;
}

static void report_bool(const char *what, int ok) {
    printf("%-66s %s\n", what, ok ? "ok" : "FAIL");
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

/* ---- buffers -------------------------------------------------------------------- */

static void *alloc_or_die(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}
static float *alloc_f(long n) { return alloc_or_die((size_t)n * sizeof(float)); }
static double *alloc_d(long n) { return alloc_or_die((size_t)n * sizeof(double)); }
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
static double dot_f(const float *a, const float *r, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * (double)r[i];
    return s;
}
static double dot_d(const double *a, const float *r, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += a[i] * (double)r[i];
    return s;
}

/* ---- error measures ------------------------------------------------------------- */

/* Largest |a - b| / max(|b|, floor), floor = rel_floor * max|b| + abs_floor. */
static double max_rel_err(const float *a, const double *b, long n, double rel_floor,
                          double abs_floor) {
    double bmax = 0, err = 0;
    for (long i = 0; i < n; i++) bmax = fmax(bmax, fabs(b[i]));
    const double lowest = rel_floor * bmax + abs_floor;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), lowest);
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

/* The two halves of a split backward against the fused kernel: the same
 * arithmetic, so the same bits (0 or 1, as a max error for report). */
static double bits_differ(const float *a, const float *b, long n) {
    return n > 0 && memcmp(a, b, (size_t)n * sizeof *a) != 0 ? 1.0 : 0.0;
}

/* ---- gradient checks ------------------------------------------------------------ */

typedef double (*loss_fn)(void *ctx);

/* Max error between the analytic gradient ana[] of L with respect to x[] and
 * central differences with step h, over all elements or a random sample.
 * term_size: how large the terms summed into one gradient element can be,
 * when that is far above the gradient itself (0 when not). */
static double fd_error(float *x, const float *ana, long n, loss_fn loss, void *ctx, double h,
                       double floor_rel, double term_size) {
    double amax = term_size;
    for (long i = 0; i < n; i++) amax = fmax(amax, fabs(ana[i]));
    const double lowest = fmax(floor_rel * amax, 1e-6);
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
        const double d = fabs(num - ana[i]) / fmax(fmax(fabs(num), fabs(ana[i])), lowest);
        if (!(d <= err)) {
            err = d;
            snprintf(worst, sizeof worst, "element %ld: numeric %.8g, analytic %.8g, floor %.3g", i,
                     num, (double)ana[i], lowest);
        }
    }
    return err;
}

/* A kernel's pair of losses: through its float forward and through the
 * double reference forward, on the same inputs. */
typedef struct {
    loss_fn kernel_loss, ref_loss;
    void *ctx;
    double fd_h;
} loss_pair;

/* Both checks of one gradient tensor: "fd" and "ref" lines. */
static void check_grad_terms(const char *name, float *x, const float *ana, long n,
                             const loss_pair *L, double term_size) {
    char line[160];
    snprintf(line, sizeof line, "%s  fd", name);
    report(line, fd_error(x, ana, n, L->kernel_loss, L->ctx, L->fd_h, FD_FLOOR, term_size), FD_TOL);
    snprintf(line, sizeof line, "%s  ref", name);
    report(line, fd_error(x, ana, n, L->ref_loss, L->ctx, REF_H, REF_FLOOR, term_size), REF_TOL);
}
static void check_grad(const char *name, float *x, const float *ana, long n, const loss_pair *L) {
    check_grad_terms(name, x, ana, n, L, 0.0);
}

/* ---- encoder -------------------------------------------------------------------- */

static void ref_encoder(double *out, const int *tokens, const float *wte, const float *wpe, int B,
                        int T, int C) {
    for (long n = 0; n < (long)B * T; n++)
        for (int i = 0; i < C; i++)
            out[n * C + i] = (double)wte[(long)tokens[n] * C + i] + (double)wpe[(n % T) * C + i];
}

typedef struct {
    int B, T, C;
    int *tokens;
    float *wte, *wpe, *out, *R;
    double *ref;
} enc_ctx;

static double enc_loss(void *p) {
    enc_ctx *c = p;
    K->encoder_forward(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_f(c->out, c->R, (long)c->B * c->T * c->C);
}
static double enc_ref_loss(void *p) {
    enc_ctx *c = p;
    ref_encoder(c->ref, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_d(c->ref, c->R, (long)c->B * c->T * c->C);
}

static void test_encoder(int B, int T, int C, int V) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
    const long N = (long)B * T, NC = N * C, VC = (long)V * C, TC = (long)T * C;
    enc_ctx c = {B, T, C, alloc_or_die((size_t)N * sizeof(int)), rand_f(VC, -1, 1),
                 rand_f(TC, -1, 1), alloc_f(NC), rand_f(NC, -1, 1), alloc_d(NC)};
    for (long n = 0; n < N; n++) c.tokens[n] = rand_int(V); /* V small: repeats */
    loss_pair L = {enc_loss, enc_ref_loss, &c, FD_H};

    fill_nan(c.out, NC);
    K->encoder_forward(c.out, c.tokens, c.wte, c.wpe, B, T, C);
    double *ref = alloc_d(NC);
    ref_encoder(ref, c.tokens, c.wte, c.wpe, B, T, C);
    snprintf(name, sizeof name, "encoder_forward  %s", shape);
    report(name, max_rel_err(c.out, ref, NC, 0, 1e-30), 1e-7); /* one float add */

    float *dwte = alloc_f(VC), *dwpe = alloc_f(TC);
    K->encoder_backward(dwte, dwpe, c.R, c.tokens, B, T, C);
    float *dwte1 = copy_f(dwte, VC), *dwpe1 = copy_f(dwpe, TC);
    snprintf(name, sizeof name, "encoder_backward %s  dwte", shape);
    check_grad(name, c.wte, dwte1, VC, &L);
    snprintf(name, sizeof name, "encoder_backward %s  dwpe", shape);
    check_grad(name, c.wpe, dwpe1, TC, &L);
    K->encoder_backward(dwte, dwpe, c.R, c.tokens, B, T, C);
    snprintf(name, sizeof name, "encoder_backward %s  accumulates", shape);
    report(name, fmax(twice_err(dwte1, dwte, VC), twice_err(dwpe1, dwpe, TC)), TWICE_TOL);

    free(c.tokens), free(c.wte), free(c.wpe), free(c.out), free(c.R), free(c.ref), free(ref);
    free(dwte), free(dwpe), free(dwte1), free(dwpe1);
}

/* ---- layernorm ------------------------------------------------------------------ */

/* scale (may be NULL): the size of the terms of each output, for rounding */
static void ref_layernorm(double *out, double *mean, double *rstd, double *scale, const float *inp,
                          const float *w, const float *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (long)n * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        const double r = 1.0 / sqrt(v + 1e-5);
        if (mean) mean[n] = m, rstd[n] = r;
        for (int i = 0; i < C; i++) {
            out[(long)n * C + i] = (x[i] - m) * r * w[i] + b[i];
            if (scale)
                scale[(long)n * C + i] = (fabs(x[i]) + fabs(m)) * r * fabs(w[i]) + fabs(b[i]);
        }
    }
}

typedef struct {
    int N, C;
    float *inp, *w, *b, *out, *mean, *rstd, *R;
    double *ref;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    K->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot_f(c->out, c->R, (long)c->N * c->C);
}
static double ln_ref_loss(void *p) {
    ln_ctx *c = p;
    ref_layernorm(c->ref, NULL, NULL, NULL, c->inp, c->w, c->b, c->N, c->C);
    return dot_d(c->ref, c->R, (long)c->N * c->C);
}

static void test_layernorm(int N, int C) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    const long NC = (long)N * C;
    ln_ctx c = {N, C, rand_f(NC, -1, 1), rand_f(C, 0.5f, 1.5f), rand_f(C, -0.5f, 0.5f),
                alloc_f(NC), alloc_f(N), alloc_f(N), rand_f(NC, -1, 1), alloc_d(NC)};
    for (long i = 0; i < NC; i++) c.inp[i] += 0.3f; /* a non-zero mean */
    loss_pair L = {ln_loss, ln_ref_loss, &c, FD_H};

    fill_nan(c.out, NC);
    K->layernorm_forward(c.out, c.mean, c.rstd, c.inp, c.w, c.b, N, C);
    double *ref = alloc_d(NC), *refm = alloc_d(N), *refr = alloc_d(N), *scale = alloc_d(NC);
    ref_layernorm(ref, refm, refr, scale, c.inp, c.w, c.b, N, C);
    snprintf(name, sizeof name, "layernorm_forward  %s  out", shape);
    report(name, max_scaled_err(c.out, ref, scale, NC), 1e-5);
    snprintf(name, sizeof name, "layernorm_forward  %s  mean, rstd", shape);
    report(name,
           fmax(max_rel_err(c.mean, refm, N, 1e-2, 1e-30), max_rel_err(c.rstd, refr, N, 0, 1e-30)),
           1e-5);

    float *dinp = alloc_f(NC), *dw = alloc_f(C), *db = alloc_f(C);
    K->layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    float *dinp1 = copy_f(dinp, NC), *dw1 = copy_f(dw, C), *db1 = copy_f(db, C);
    /* dinp sums terms of size |dout w rstd|; with C = 1 they cancel to an
     * exact 0, which the float kernel meets only to within their rounding
     * (rstd = 1/sqrt(1e-5) there) */
    double terms = 0;
    for (long i = 0; i < NC; i++)
        terms = fmax(terms, fabs(c.R[i]) * fabs(c.w[i % C]) * c.rstd[i / C]);
    snprintf(name, sizeof name, "layernorm_backward %s  dinp", shape);
    check_grad_terms(name, c.inp, dinp1, NC, &L, terms);
    snprintf(name, sizeof name, "layernorm_backward %s  dw", shape);
    check_grad(name, c.w, dw1, C, &L);
    snprintf(name, sizeof name, "layernorm_backward %s  db", shape);
    check_grad(name, c.b, db1, C, &L);
    ln_loss(&c); /* mean and rstd of the unperturbed input again */
    K->layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    snprintf(name, sizeof name, "layernorm_backward %s  accumulates", shape);
    report(name,
           fmax(twice_err(dinp1, dinp, NC), fmax(twice_err(dw1, dw, C), twice_err(db1, db, C))),
           TWICE_TOL);

    /* the split halves: each its own finite-difference check, and together
     * the fused kernel's bits */
    float *sdinp = alloc_f(NC), *sdw = alloc_f(C), *sdb = alloc_f(C);
    K->layernorm_backward_input(sdinp, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    snprintf(name, sizeof name, "layernorm_backward_input  %s  dinp", shape);
    check_grad_terms(name, c.inp, sdinp, NC, &L, terms);
    ln_loss(&c);
    K->layernorm_backward_weight(sdw, sdb, c.R, c.inp, c.mean, c.rstd, N, C);
    snprintf(name, sizeof name, "layernorm_backward_weight %s  dw", shape);
    check_grad(name, c.w, sdw, C, &L);
    snprintf(name, sizeof name, "layernorm_backward_weight %s  db", shape);
    check_grad(name, c.b, sdb, C, &L);
    snprintf(name, sizeof name, "layernorm_backward halves %s  = fused, bit for bit", shape);
    report(name, fmax(bits_differ(sdinp, dinp1, NC), fmax(bits_differ(sdw, dw1, C), bits_differ(sdb, db1, C))), 0);
    free(sdinp), free(sdw), free(sdb);

    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
    free(c.ref);
    free(ref), free(refm), free(refr), free(scale);
    free(dinp), free(dw), free(db), free(dinp1), free(dw1), free(db1);
}

/* ---- matmul --------------------------------------------------------------------- */

static void ref_matmul(double *out, double *scale, const float *inp, const float *w,
                       const float *bias, int N, int IC, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0, a = fabs(s);
            for (int i = 0; i < IC; i++) {
                double t = (double)inp[(long)n * IC + i] * w[(long)o * IC + i];
                s += t, a += fabs(t);
            }
            out[(long)n * OC + o] = s;
            if (scale) scale[(long)n * OC + o] = a;
        }
}

typedef struct {
    int N, IC, OC;
    float *inp, *w, *bias, *out, *R; /* bias may be NULL */
    double *ref;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    K->matmul_forward(c->out, c->inp, c->w, c->bias, c->N, c->IC, c->OC);
    return dot_f(c->out, c->R, (long)c->N * c->OC);
}
static double mm_ref_loss(void *p) {
    mm_ctx *c = p;
    ref_matmul(c->ref, NULL, c->inp, c->w, c->bias, c->N, c->IC, c->OC);
    return dot_d(c->ref, c->R, (long)c->N * c->OC);
}

static void test_matmul(int N, int IC, int OC, int with_bias, int with_dinp) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d%s%s", N, IC, OC, with_bias ? "" : " nobias",
             with_dinp ? "" : " dinp=NULL");
    const long NI = (long)N * IC, NO = (long)N * OC, WO = (long)OC * IC;
    mm_ctx c = {N, IC, OC, rand_f(NI, -1, 1), rand_f(WO, -1, 1),
                with_bias ? rand_f(OC, -1, 1) : NULL, alloc_f(NO), rand_f(NO, -1, 1), alloc_d(NO)};
    loss_pair L = {mm_loss, mm_ref_loss, &c, FD_H};

    fill_nan(c.out, NO); /* a forward overwrites, whatever was there */
    K->matmul_forward(c.out, c.inp, c.w, c.bias, N, IC, OC);
    double *ref = alloc_d(NO), *scale = alloc_d(NO);
    ref_matmul(ref, scale, c.inp, c.w, c.bias, N, IC, OC);
    snprintf(name, sizeof name, "matmul_forward  %s", shape);
    report(name, max_scaled_err(c.out, ref, scale, NO), 1e-5);

    float *dinp = with_dinp ? alloc_f(NI) : NULL, *dw = alloc_f(WO);
    float *db = with_bias ? alloc_f(OC) : NULL;
    K->matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, IC, OC);
    float *dinp1 = dinp ? copy_f(dinp, NI) : NULL, *dw1 = copy_f(dw, WO);
    float *db1 = db ? copy_f(db, OC) : NULL;
    if (dinp) {
        snprintf(name, sizeof name, "matmul_backward %s  dinp", shape);
        check_grad(name, c.inp, dinp1, NI, &L);
    }
    snprintf(name, sizeof name, "matmul_backward %s  dw", shape);
    check_grad(name, c.w, dw1, WO, &L);
    if (db) {
        snprintf(name, sizeof name, "matmul_backward %s  dbias", shape);
        check_grad(name, c.bias, db1, OC, &L);
    }
    K->matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, IC, OC);
    double e = twice_err(dw1, dw, WO);
    if (dinp) e = fmax(e, twice_err(dinp1, dinp, NI));
    if (db) e = fmax(e, twice_err(db1, db, OC));
    snprintf(name, sizeof name, "matmul_backward %s  accumulates", shape);
    report(name, e, TWICE_TOL);

    /* the split halves, as for layernorm */
    float *sdinp = alloc_f(NI), *sdw = alloc_f(WO), *sdb = with_bias ? alloc_f(OC) : NULL;
    K->matmul_backward_input(sdinp, c.R, c.w, N, IC, OC);
    K->matmul_backward_weight(sdw, sdb, c.R, c.inp, N, IC, OC);
    snprintf(name, sizeof name, "matmul_backward_input  %s  dinp", shape);
    check_grad(name, c.inp, sdinp, NI, &L);
    snprintf(name, sizeof name, "matmul_backward_weight %s  dw", shape);
    check_grad(name, c.w, sdw, WO, &L);
    e = bits_differ(sdw, dw1, WO);
    if (dinp) e = fmax(e, bits_differ(sdinp, dinp1, NI));
    if (db) {
        snprintf(name, sizeof name, "matmul_backward_weight %s  dbias", shape);
        check_grad(name, c.bias, sdb, OC, &L);
        e = fmax(e, bits_differ(sdb, db1, OC));
    }
    snprintf(name, sizeof name, "matmul_backward halves %s  = fused, bit for bit", shape);
    report(name, e, 0);
    free(sdinp), free(sdw), free(sdb);

    free(c.inp), free(c.w), free(c.bias), free(c.out), free(c.R), free(c.ref);
    free(ref), free(scale);
    free(dinp), free(dw), free(db), free(dinp1), free(dw1), free(db1);
}

/* ---- attention ------------------------------------------------------------------ */

/* softmax(q k^T / sqrt(HS), causal) v per head; att and scale may be NULL */
static void ref_attention(double *out, double *att, double *scale, const float *qkv, int B, int T,
                          int NH, int HS) {
    const int C = NH * HS;
    double *row = alloc_d(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((long)b * T + t) * 3 * C + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const float *k = qkv + ((long)b * T + j) * 3 * C + C + h * HS;
                    double s = 0;
                    for (int i = 0; i < HS; i++) s += (double)q[i] * k[i];
                    row[j] = s / sqrt((double)HS);
                    mx = fmax(mx, row[j]);
                }
                for (int j = 0; j <= t; j++) sum += (row[j] = exp(row[j] - mx));
                for (int j = 0; j <= t; j++) row[j] /= sum;
                if (att)
                    for (int j = 0; j < T; j++)
                        att[(((long)b * NH + h) * T + t) * T + j] = j <= t ? row[j] : 0.0;
                for (int i = 0; i < HS; i++) {
                    double o = 0, a = 0;
                    for (int j = 0; j <= t; j++) {
                        double term = row[j] * qkv[((long)b * T + j) * 3 * C + 2 * C + h * HS + i];
                        o += term, a += fabs(term);
                    }
                    out[((long)b * T + t) * C + h * HS + i] = o;
                    if (scale) scale[((long)b * T + t) * C + h * HS + i] = a;
                }
            }
    free(row);
}

typedef struct {
    int B, T, NH, HS;
    float *qkv, *out, *att, *R;
    double *ref;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    K->attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->NH, c->HS);
    return dot_f(c->out, c->R, (long)c->B * c->T * c->NH * c->HS);
}
static double att_ref_loss(void *p) {
    att_ctx *c = p;
    ref_attention(c->ref, NULL, NULL, c->qkv, c->B, c->T, c->NH, c->HS);
    return dot_d(c->ref, c->R, (long)c->B * c->T * c->NH * c->HS);
}

/* q, k, v uniform in +-qk_range: a larger range gives a peaked softmax */
static void test_attention(int B, int T, int NH, int HS, float qk_range) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
    const int C = NH * HS;
    const long NQ = (long)B * T * 3 * C, NO = (long)B * T * C, NA = (long)B * NH * T * T;
    att_ctx c = {B, T, NH, HS, rand_f(NQ, -qk_range, qk_range),
                 alloc_f(NO), alloc_f(NA), rand_f(NO, -1, 1), alloc_d(NO)};
    loss_pair L = {att_loss, att_ref_loss, &c, 2e-2};

    fill_nan(c.out, NO);
    fill_nan(c.att, NA);
    K->attention_forward(c.out, c.att, c.qkv, B, T, NH, HS);
    double *ref = alloc_d(NO), *refa = alloc_d(NA), *scale = alloc_d(NO);
    ref_attention(ref, refa, scale, c.qkv, B, T, NH, HS);
    snprintf(name, sizeof name, "attention_forward  %s  out", shape);
    report(name, max_scaled_err(c.out, ref, scale, NO), 1e-5);
    snprintf(name, sizeof name, "attention_forward  %s  att", shape);
    report(name, max_rel_err(c.att, refa, NA, 0, 1e-30), 1e-5);

    /* causal structure: exact (+)zeros above the diagonal, rows summing to 1 */
    int upper_zero = 1;
    double row_err = 0;
    for (long r = 0; r < (long)B * NH * T; r++) {
        const int t = (int)(r % T);
        double s = 0;
        for (int j = 0; j < T; j++) {
            const float a = c.att[r * T + j];
            if (j > t && !(a == 0.0f && !signbit(a))) upper_zero = 0;
            if (j <= t) s += a;
        }
        if (!(fabs(s - 1.0) <= row_err)) row_err = fabs(s - 1.0);
    }
    snprintf(name, sizeof name, "attention_forward  %s  upper triangle is 0", shape);
    report_bool(name, upper_zero);
    snprintf(name, sizeof name, "attention_forward  %s  rows sum to 1", shape);
    report(name, row_err, 1e-5);

    float *dqkv = alloc_f(NQ), *datt = alloc_f(NA);
    fill_nan(datt, NA); /* scratch: its contents on entry must not matter */
    K->attention_backward(dqkv, datt, c.R, c.qkv, c.att, B, T, NH, HS);
    float *dqkv1 = copy_f(dqkv, NQ);
    snprintf(name, sizeof name, "attention_backward %s  dqkv", shape);
    check_grad(name, c.qkv, dqkv1, NQ, &L);
    att_loss(&c); /* att of the unperturbed input again */
    fill_nan(datt, NA);
    K->attention_backward(dqkv, datt, c.R, c.qkv, c.att, B, T, NH, HS);
    snprintf(name, sizeof name, "attention_backward %s  accumulates", shape);
    report(name, twice_err(dqkv1, dqkv, NQ), TWICE_TOL);

    free(c.qkv), free(c.out), free(c.att), free(c.R), free(c.ref);
    free(ref), free(refa), free(scale);
    free(dqkv), free(datt), free(dqkv1);
}

/* The mask must hold even when masked (future) keys score far above every
 * allowed one: their scores may not enter the row's max, or the allowed
 * ones underflow. Here score(t, j) = 20 (j - t): the row peaks at j = t
 * and the next masked keys score 20, 40, ... 140 higher. */
static void test_attention_future_dominates(void) {
    const int B = 1, T = 24, NH = 1, HS = 2, C = NH * HS;
    const float a = 20.0f * sqrtf((float)HS); /* undoes the 1/sqrt(HS) */
    float *qkv = alloc_f((long)T * 3 * C), *out = alloc_f((long)T * C), *att = alloc_f((long)T * T);
    for (int t = 0; t < T; t++) {
        float *row = qkv + (long)t * 3 * C;
        row[0] = a, row[1] = -a * (float)t; /* q */
        row[C] = (float)t, row[C + 1] = 1.0f; /* k */
        row[2 * C] = rand_uniform(-1, 1), row[2 * C + 1] = rand_uniform(-1, 1); /* v */
    }
    K->attention_forward(out, att, qkv, B, T, NH, HS);
    double *ref = alloc_d((long)T * C), *refa = alloc_d((long)T * T), *scale = alloc_d((long)T * C);
    ref_attention(ref, refa, scale, qkv, B, T, NH, HS);
    /* absolute floor 1e-6: probabilities of e^-20 and below are ~0 either
     * way; without the mask the row is garbage (uniform, or NaN) */
    report("attention_forward  masked keys score far higher  att",
           max_rel_err(att, refa, (long)T * T, 0, 1e-6), 1e-5);
    report("attention_forward  masked keys score far higher  out",
           max_scaled_err(out, ref, scale, (long)T * C), 1e-5);
    free(qkv), free(out), free(att), free(ref), free(refa), free(scale);
}

/* ---- attention over blocks (context parallelism) -------------------------------- */

/* Double reference of attention_block_forward: out, lse and (scale) the sum of
 * |terms| of each out element. */
static void ref_block_attention(double *out, double *lse, double *scale, const float *q, const float *k,
                                const float *v, int ldq, int ldkv, const int *q_pos, const int *k_pos, int B,
                                int Tq, int Tk, int NH, int HS) {
    const int C = NH * HS;
    double *row = alloc_d(Tk > 0 ? Tk : 1);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tq; t++) {
                const float *qr = q + ((long)b * Tq + t) * ldq + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < Tk; j++) {
                    row[j] = -INFINITY;
                    if (q_pos && k_pos[j] > q_pos[t]) continue;
                    const float *kr = k + ((long)b * Tk + j) * ldkv + h * HS;
                    double s = 0;
                    for (int i = 0; i < HS; i++) s += (double)qr[i] * kr[i];
                    row[j] = s / sqrt((double)HS);
                    mx = fmax(mx, row[j]);
                }
                for (int j = 0; j < Tk; j++) sum += (row[j] = row[j] == -INFINITY ? 0.0 : exp(row[j] - mx));
                lse[((long)b * NH + h) * Tq + t] = sum > 0 ? mx + log(sum) : -INFINITY;
                for (int i = 0; i < HS; i++) {
                    double o = 0, a = 0;
                    for (int j = 0; j < Tk; j++) {
                        double term = sum > 0 ? row[j] / sum * v[((long)b * Tk + j) * ldkv + h * HS + i] : 0.0;
                        o += term, a += fabs(term);
                    }
                    out[((long)b * Tq + t) * C + h * HS + i] = o;
                    if (scale) scale[((long)b * Tq + t) * C + h * HS + i] = a;
                }
            }
    free(row);
}

/* Largest |a - b| over finite b, and whether a is -inf exactly where b is. */
static double lse_err(const float *a, const double *b, long n) {
    double err = 0;
    for (long i = 0; i < n; i++) {
        double d = isinf(b[i]) ? (isinf(a[i]) && a[i] < 0 ? 0 : 1) : fabs((double)a[i] - b[i]);
        if (!(d <= err)) err = d;
    }
    return err;
}

/* The global positions a context-parallel rank holds, T split over N ranks:
 * contiguous, rank r holds [r T/N, (r+1) T/N); zig-zag, T cut into 2N chunks
 * and rank r holds chunks r and 2N-1-r (each then sees as many unmasked
 * causal scores as every other rank). */
static void cp_positions(int *pos, int T, int N, int r, int zigzag) {
    if (!zigzag) {
        for (int i = 0; i < T / N; i++) pos[i] = r * (T / N) + i;
        return;
    }
    const int s = T / (2 * N);
    for (int i = 0; i < s; i++) {
        pos[i] = r * s + i;
        pos[s + i] = (2 * N - 1 - r) * s + i;
    }
}

/* Rows `pos` of a [B,T,W] tensor, packed into [B,n,W] (a rank's share). */
static float *gather_rows(const float *x, int B, int T, int W, const int *pos, int n) {
    float *y = alloc_f((long)B * n * W);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n; i++) memcpy(y + ((long)b * n + i) * W, x + ((long)b * T + pos[i]) * W, sizeof(float) * (size_t)W);
    return y;
}

typedef struct {
    int B, Tq, Tk, NH, HS;
    const int *q_pos, *k_pos;
    float *q, *kv, *out, *lse, *R; /* q [B,Tq,C]; kv [B,Tk,2C]: k | v */
    double *ref, *ref_lse;
} block_ctx;

static double block_loss(void *p) {
    block_ctx *c = p;
    const int C = c->NH * c->HS;
    K->attention_block_forward(c->out, c->lse, c->q, c->kv, c->kv + C, C, 2 * C, c->q_pos, c->k_pos, c->B, c->Tq,
                               c->Tk, c->NH, c->HS);
    return dot_f(c->out, c->R, (long)c->B * c->Tq * C);
}
static double block_ref_loss(void *p) {
    block_ctx *c = p;
    const int C = c->NH * c->HS;
    ref_block_attention(c->ref, c->ref_lse, NULL, c->q, c->kv, c->kv + C, C, 2 * C, c->q_pos, c->k_pos, c->B, c->Tq,
                        c->Tk, c->NH, c->HS);
    return dot_d(c->ref, c->R, (long)c->B * c->Tq * C);
}

/* One block against the reference, and its backward against finite
 * differences: q and a packed k | v buffer (ld C and 2C, not qkv's 3C), with
 * the mask of the given positions (NULL: none). */
static void test_attention_block(const char *what, int B, int Tq, int Tk, int NH, int HS, const int *q_pos,
                                 const int *k_pos) {
    char name[160], shape[96];
    snprintf(shape, sizeof shape, "%s B=%d Tq=%d Tk=%d NH=%d HS=%d", what, B, Tq, Tk, NH, HS);
    const int C = NH * HS;
    const long NQ = (long)B * Tq * C, NKV = (long)B * Tk * 2 * C, NL = (long)B * NH * Tq;
    block_ctx c = {B, Tq, Tk, NH, HS, q_pos, k_pos, rand_f(NQ, -1, 1), rand_f(NKV, -1, 1), alloc_f(NQ), alloc_f(NL),
                   rand_f(NQ, -1, 1), alloc_d(NQ), alloc_d(NL)};
    loss_pair L = {block_loss, block_ref_loss, &c, 2e-2};
    fill_nan(c.out, NQ);
    fill_nan(c.lse, NL);
    block_loss(&c);
    double *scale = alloc_d(NQ);
    ref_block_attention(c.ref, c.ref_lse, scale, c.q, c.kv, c.kv + C, C, 2 * C, q_pos, k_pos, B, Tq, Tk, NH, HS);
    snprintf(name, sizeof name, "attention_block_forward  %s  out", shape);
    report(name, max_scaled_err(c.out, c.ref, scale, NQ), 1e-5);
    snprintf(name, sizeof name, "attention_block_forward  %s  lse", shape);
    report(name, lse_err(c.lse, c.ref_lse, NL), 1e-5);

    float *dq = alloc_f(NQ), *dkv = alloc_f(NKV);
    K->attention_block_backward(dq, dkv, dkv + C, c.R, c.out, c.lse, c.q, c.kv, c.kv + C, C, 2 * C, q_pos, k_pos, B,
                                Tq, Tk, NH, HS);
    float *dq1 = copy_f(dq, NQ), *dkv1 = copy_f(dkv, NKV);
    snprintf(name, sizeof name, "attention_block_backward %s  dq", shape);
    check_grad(name, c.q, dq1, NQ, &L);
    snprintf(name, sizeof name, "attention_block_backward %s  dk dv", shape);
    check_grad(name, c.kv, dkv1, NKV, &L);
    block_loss(&c); /* out and lse of the unperturbed inputs again */
    K->attention_block_backward(dq, dkv, dkv + C, c.R, c.out, c.lse, c.q, c.kv, c.kv + C, C, 2 * C, q_pos, k_pos, B,
                                Tq, Tk, NH, HS);
    snprintf(name, sizeof name, "attention_block_backward %s  accumulates", shape);
    report(name, fmax(twice_err(dq1, dq, NQ), twice_err(dkv1, dkv, NKV)), TWICE_TOL);
    free(c.q), free(c.kv), free(c.out), free(c.lse), free(c.R), free(c.ref), free(c.ref_lse);
    free(scale), free(dq), free(dkv), free(dq1), free(dkv1);
}

/* max |a - b| / max |b|: gradients summed in another order */
static double max_norm_err(const float *a, const float *b, long n) {
    double m = 0, err = 0;
    for (long i = 0; i < n; i++) m = fmax(m, fabs((double)b[i]));
    if (m == 0) m = 1;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / m;
        if (!(d <= err)) err = d;
    }
    return err;
}

/* Ring attention on one process: the causal attention of a whole sequence,
 * its T positions held by N ranks (contiguous or zig-zag). Rank r's queries
 * meet every rank's keys and values as one block each, in the ring's order
 * (r, r-1, ...), folded in by attention_merge; the backward runs every block
 * again against the merged out and lse, dq adding up at rank r and dk, dv at
 * the block's owner. Both must equal attention_forward and _backward of the
 * whole sequence, every rank's rows. The block over the whole sequence at
 * N = 1 is the plain kernel's attention; the merges are also checked in a
 * second order (the blocks reversed, and pairwise as a tree). */
static void test_attention_ring(int B, int T, int NH, int HS, int N, int zigzag) {
    char name[160], shape[96];
    snprintf(shape, sizeof shape, "%s B=%d T=%d NH=%d HS=%d N=%d", zigzag ? "zig-zag" : "contiguous", B, T, NH, HS, N);
    const int C = NH * HS, n = T / N;
    const long NQKV = (long)B * T * 3 * C, NO = (long)B * T * C, NA = (long)B * NH * T * T;
    float *qkv = rand_f(NQKV, -1.5f, 1.5f), *out = alloc_f(NO), *att = alloc_f(NA), *R = rand_f(NO, -1, 1);
    K->attention_forward(out, att, qkv, B, T, NH, HS);
    float *dqkv = alloc_f(NQKV), *datt = alloc_f(NA);
    K->attention_backward(dqkv, datt, R, qkv, att, B, T, NH, HS);

    int *pos = malloc(sizeof(int) * (size_t)T);
    float *ring_out = alloc_f(NO), *ring_out2 = alloc_f(NO), *ring_dqkv = alloc_f(NQKV);
    double out_err = 0, order_err = 0, grad_err = 0;
    float **rank_qkv = malloc(sizeof(float *) * (size_t)N), **rank_dqkv = malloc(sizeof(float *) * (size_t)N);
    for (int r = 0; r < N; r++) {
        cp_positions(pos + r * n, T, N, r, zigzag);
        rank_qkv[r] = gather_rows(qkv, B, T, 3 * C, pos + r * n, n);
        rank_dqkv[r] = alloc_f((long)B * n * 3 * C);
    }
    const long nO = (long)B * n * C, nL = (long)B * NH * n;
    float *o = alloc_f(nO), *lse = alloc_f(nL), *o2 = alloc_f(nO), *lse2 = alloc_f(nL);
    float *bo = alloc_f((long)N * nO), *bl = alloc_f((long)N * nL); /* each block's own, for other orders */
    for (int r = 0; r < N; r++) {
        const float *q = rank_qkv[r];
        for (int step = 0; step < N; step++) {
            const int s = (r - step + N) % N; /* the ring brings rank s's K, V */
            float *ob = bo + (long)s * nO, *lb = bl + (long)s * nL;
            K->attention_block_forward(ob, lb, q, rank_qkv[s] + C, rank_qkv[s] + 2 * C, 3 * C, 3 * C, pos + r * n,
                                       pos + s * n, B, n, n, NH, HS);
            if (step == 0) {
                memcpy(o, ob, sizeof(float) * (size_t)nO);
                memcpy(lse, lb, sizeof(float) * (size_t)nL);
            } else {
                K->attention_merge(o, lse, ob, lb, B, n, NH, HS);
            }
        }
        /* another order: the blocks pairwise, as a tree (0+1, 2+3, ...), then those */
        for (int width = 1; width < N; width *= 2)
            for (int s = 0; s + width < N; s += 2 * width)
                K->attention_merge(bo + (long)s * nO, bl + (long)s * nL, bo + (long)(s + width) * nO,
                                   bl + (long)(s + width) * nL, B, n, NH, HS);
        memcpy(o2, bo, sizeof(float) * (size_t)nO);
        memcpy(lse2, bl, sizeof(float) * (size_t)nL);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < n; i++) {
                memcpy(ring_out + ((long)b * T + pos[r * n + i]) * C, o + ((long)b * n + i) * C, sizeof(float) * (size_t)C);
                memcpy(ring_out2 + ((long)b * T + pos[r * n + i]) * C, o2 + ((long)b * n + i) * C, sizeof(float) * (size_t)C);
            }
        for (long i = 0; i < nL; i++) order_err = fmax(order_err, fabs((double)lse[i] - lse2[i]));
        /* the backward: rank r's dout and merged (out, lse) against every block */
        float *g = gather_rows(R, B, T, C, pos + r * n, n);
        for (int step = 0; step < N; step++) {
            const int s = (r - step + N) % N;
            K->attention_block_backward(rank_dqkv[r], rank_dqkv[s] + C, rank_dqkv[s] + 2 * C, g, o, lse, q,
                                        rank_qkv[s] + C, rank_qkv[s] + 2 * C, 3 * C, 3 * C, pos + r * n, pos + s * n, B,
                                        n, n, NH, HS);
        }
        free(g);
    }
    for (int r = 0; r < N; r++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < n; i++)
                memcpy(ring_dqkv + ((long)b * T + pos[r * n + i]) * 3 * C, rank_dqkv[r] + ((long)b * n + i) * 3 * C,
                       sizeof(float) * 3 * (size_t)C);
    out_err = max_norm_err(ring_out, out, NO);
    order_err = fmax(order_err, max_norm_err(ring_out2, ring_out, NO));
    grad_err = max_norm_err(ring_dqkv, dqkv, NQKV);
    snprintf(name, sizeof name, "ring of blocks %s  out = attention_forward", shape);
    report(name, out_err, 1e-5);
    snprintf(name, sizeof name, "ring of blocks %s  merged as a tree = in ring order", shape);
    report(name, order_err, 1e-5);
    snprintf(name, sizeof name, "ring of blocks %s  dqkv = attention_backward", shape);
    report(name, grad_err, 1e-5);
    for (int r = 0; r < N; r++) free(rank_qkv[r]), free(rank_dqkv[r]);
    free(rank_qkv), free(rank_dqkv), free(pos), free(o), free(lse), free(o2), free(lse2), free(bo), free(bl);
    free(qkv), free(out), free(att), free(R), free(dqkv), free(datt), free(ring_out), free(ring_out2), free(ring_dqkv);
}

/* The keys of a whole causal sequence split into uneven blocks (sizes, some
 * of a single key), each block attended on its own and the partial results
 * merged in the order `order`: the whole sequence's attention. Keys are
 * packed per block ([B, size, 2C], k | v), the queries read in place. */
static void test_attention_split(int B, int T, int NH, int HS, const int *sizes, const int *order, int nb) {
    char list[64];
    const int C = NH * HS;
    const long NQKV = (long)B * T * 3 * C, NO = (long)B * T * C, NL = (long)B * NH * T;
    float *qkv = rand_f(NQKV, -1.5f, 1.5f), *out = alloc_f(NO), *att = alloc_f((long)B * NH * T * T);
    K->attention_forward(out, att, qkv, B, T, NH, HS);
    int *pos = malloc(sizeof(int) * (size_t)T), *first = malloc(sizeof(int) * (size_t)nb);
    for (int t = 0; t < T; t++) pos[t] = t;
    for (int i = 0, f = 0; i < nb; f += sizes[i], i++) first[i] = f;
    float *o = alloc_f(NO), *lse = alloc_f(NL), *ob = alloc_f(NO), *lb = alloc_f(NL);
    int len = 0;
    for (int i = 0; i < nb; i++) {
        const int blk = order[i], n = sizes[blk];
        float *kv = alloc_f((long)B * n * 2 * C);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < n; j++)
                memcpy(kv + ((long)b * n + j) * 2 * C, qkv + ((long)b * T + first[blk] + j) * 3 * C + C,
                       sizeof(float) * 2 * (size_t)C);
        K->attention_block_forward(i ? ob : o, i ? lb : lse, qkv, kv, kv + C, 3 * C, 2 * C, pos, pos + first[blk], B,
                                   T, n, NH, HS);
        if (i) K->attention_merge(o, lse, ob, lb, B, T, NH, HS);
        len += snprintf(list + len, sizeof list - (size_t)len, "%s%d", i ? "," : "", n);
        free(kv);
    }
    char what[256];
    snprintf(what, sizeof what, "blocks of keys %s merged  B=%d T=%d NH=%d HS=%d  = attention_forward", list, B, T, NH, HS);
    report(what, max_norm_err(o, out, NO), 1e-5);
    free(qkv), free(out), free(att), free(pos), free(first), free(o), free(lse), free(ob), free(lb);
}

/* The mask must hold when masked keys score far above the visible ones, in a
 * tile where the row's max so far came from them: score(t, j) = 20 (j - t), as
 * test_attention_future_dominates, over 3 key tiles. */
static void test_attention_block_future_dominates(void) {
    const int T = 300, HS = 2;
    const float a = 20.0f * sqrtf((float)HS);
    float *qkv = alloc_f((long)T * 3 * HS), *out = alloc_f((long)T * HS), *lse = alloc_f(T);
    int *pos = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) {
        float *row = qkv + (long)t * 3 * HS;
        row[0] = a, row[1] = -a * (float)t;
        row[HS] = (float)t, row[HS + 1] = 1.0f;
        row[2 * HS] = rand_uniform(-1, 1), row[2 * HS + 1] = rand_uniform(-1, 1);
        pos[t] = t;
    }
    K->attention_block_forward(out, lse, qkv, qkv + HS, qkv + 2 * HS, 3 * HS, 3 * HS, pos, pos, 1, T, T, 1, HS);
    double *ref = alloc_d((long)T * HS), *rl = alloc_d(T), *scale = alloc_d((long)T * HS);
    ref_block_attention(ref, rl, scale, qkv, qkv + HS, qkv + 2 * HS, 3 * HS, 3 * HS, pos, pos, 1, T, T, 1, HS);
    report("attention_block_forward  masked keys score far higher  out", max_scaled_err(out, ref, scale, (long)T * HS),
           1e-5);
    /* lse ~ 0 here, but each score is the difference of terms up to 20 T,
     * rounded in float (6e-8 of them): 1e-6 of 20 T is ~16 such roundings */
    report("attention_block_forward  masked keys score far higher  lse", lse_err(lse, rl, T), 1e-6 * 20 * T);
    free(qkv), free(out), free(lse), free(pos), free(ref), free(rl), free(scale);
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
    return 1.0 / (1.0 + exp(-2.0 * u)) +
           0.5 * x / (ch * ch) * GELU_K * (1.0 + 3 * 0.044715 * x * x);
}

typedef struct {
    long N;
    float *inp, *out, *R;
} gelu_ctx;

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    K->gelu_forward(c->out, c->inp, c->N);
    return dot_f(c->out, c->R, c->N);
}
static double gelu_ref_loss(void *p) {
    gelu_ctx *c = p;
    double s = 0;
    for (long i = 0; i < c->N; i++) s += gelu_ref(c->inp[i]) * c->R[i];
    return s;
}

static void test_gelu(long N) {
    char name[128];
    gelu_ctx c = {N, rand_f(N, -4, 4), alloc_f(N), rand_f(N, -1, 1)};
    loss_pair L = {gelu_loss, gelu_ref_loss, &c, FD_H};
    fill_nan(c.out, N);
    K->gelu_forward(c.out, c.inp, N);
    double *ref = alloc_d(N);
    for (long i = 0; i < N; i++) ref[i] = gelu_ref(c.inp[i]);
    snprintf(name, sizeof name, "gelu_forward  N=%ld", N);
    report(name, max_rel_err(c.out, ref, N, 0, 1e-30), 1e-5);

    float *dinp = alloc_f(N);
    K->gelu_backward(dinp, c.R, c.inp, N);
    float *dinp1 = copy_f(dinp, N);
    snprintf(name, sizeof name, "gelu_backward N=%ld  dinp", N);
    check_grad(name, c.inp, dinp1, N, &L);
    K->gelu_backward(dinp, c.R, c.inp, N);
    snprintf(name, sizeof name, "gelu_backward N=%ld  accumulates", N);
    report(name, twice_err(dinp1, dinp, N), TWICE_TOL);
    free(c.inp), free(c.out), free(c.R), free(ref), free(dinp), free(dinp1);
}

/* Far out in the tails the exp inside GELU overflows or underflows; the
 * values must stay finite and right, and a NaN must come out as a NaN. */
static void test_gelu_extremes(void) {
    enum { n = 19 };
    const float xs[n] = {-1000.0f, -100.0f, -20.0f, -10.3f, -9.0f, -5.0f, -1.0f,
                         -1e-3f,   -1e-30f, 0.0f,   1e-30f, 1e-3f, 1.0f,  5.0f,
                         9.0f,     10.3f,   20.0f,  100.0f, 1000.0f};
    float out[n], din[n], ones[n];
    double ref[n], dref[n];
    for (int i = 0; i < n; i++) {
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
    report_bool("gelu NaN in -> NaN out", isnan(nan_out[0]) && isnan(nan_out[2]) &&
                                              !isnan(nan_out[1]) && isnan(nan_d[0]) &&
                                              isnan(nan_d[2]) && !isnan(nan_d[1]));
}

/* ---- cross-entropy -------------------------------------------------------------- */

static void ref_crossentropy(double *losses_out, double *probs, const float *logits,
                             const int *targets, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *x = logits + (long)n * V;
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, x[v]);
        for (int v = 0; v < V; v++) s += exp(x[v] - mx);
        if (probs)
            for (int v = 0; v < V; v++) probs[(long)n * V + v] = exp(x[v] - mx) / s;
        losses_out[n] = log(s) - (x[targets[n]] - mx);
    }
}

typedef struct {
    int N, V;
    float dloss;
    int *targets;
    float *logits, *probs, *losses;
    double *ref;
} ce_ctx;

/* the loss whose gradient crossentropy_backward gives: dloss * sum of losses */
static double ce_loss(void *p) {
    ce_ctx *c = p;
    K->crossentropy_forward(c->losses, c->probs, c->logits, c->targets, c->N, c->V);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += c->losses[n];
    return c->dloss * s;
}
static double ce_ref_loss(void *p) {
    ce_ctx *c = p;
    ref_crossentropy(c->ref, NULL, c->logits, c->targets, c->N, c->V);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += c->ref[n];
    return c->dloss * s;
}

/* logits uniform in offset +- range; with_fd: check the backward by finite
 * differences (not with a huge range: losses of ~100 make the float loss's
 * rounding noise larger than the tolerance allows), else by its formula */
static void test_crossentropy(int N, int V, float offset, float range, int with_fd) {
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "N=%d V=%d logits %g+-%g", N, V, (double)offset, (double)range);
    const long NV = (long)N * V;
    ce_ctx c = {N, V, 1.0f / (float)N + 0.37f, alloc_or_die((size_t)N * sizeof(int)),
                rand_f(NV, offset - range, offset + range), alloc_f(NV), alloc_f(N), alloc_d(N)};
    for (int n = 0; n < N; n++) c.targets[n] = rand_int(V);
    loss_pair L = {ce_loss, ce_ref_loss, &c, 5e-2};
    fill_nan(c.probs, NV);
    K->crossentropy_forward(c.losses, c.probs, c.logits, c.targets, N, V);

    double *refp = alloc_d(NV), *refl = alloc_d(N);
    ref_crossentropy(refl, refp, c.logits, c.targets, N, V);
    snprintf(name, sizeof name, "crossentropy_forward  %s  probs", shape);
    report(name, max_rel_err(c.probs, refp, NV, 0, 1e-30), 1e-5);
    snprintf(name, sizeof name, "crossentropy_forward  %s  losses", shape);
    report(name, max_rel_err(c.losses, refl, N, 0, 1e-6), 1e-5);

    float *dlogits = alloc_f(NV);
    fill_nan(dlogits, NV); /* the backward overwrites */
    K->crossentropy_backward(dlogits, c.probs, c.targets, c.dloss, N, V);
    snprintf(name, sizeof name, "crossentropy_backward %s  dlogits", shape);
    if (with_fd) {
        check_grad(name, c.logits, dlogits, NV, &L);
    } else { /* (probs - onehot) * dloss */
        double *refd = alloc_d(NV);
        for (long i = 0; i < NV; i++) refd[i] = (double)c.probs[i] * c.dloss;
        for (int n = 0; n < N; n++) refd[(long)n * V + c.targets[n]] -= c.dloss;
        report(name, max_rel_err(dlogits, refd, NV, 0, 1e-30), 1e-6);
        free(refd);
    }
    free(c.targets), free(c.logits), free(c.probs), free(c.losses), free(c.ref);
    free(refp), free(refl), free(dlogits);
}

/* A NaN (a diverged run) must show in the results, not be smoothed away by
 * a softmax: the row it is in comes out NaN, the other rows stay finite. */
static void test_nan_propagation(void) {
    const int N = 2, V = 5;
    float logits[2 * 5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.1f, 0.2f, NAN, 0.4f, 0.5f};
    int targets[2] = {1, 3};
    float probs[2 * 5], losses[2];
    K->crossentropy_forward(losses, probs, logits, targets, N, V);
    int ok = !isnan(losses[0]) && isnan(losses[1]);
    for (int v = 0; v < V; v++) ok = ok && !isnan(probs[v]) && isnan(probs[V + v]);
    logits[7] = -NAN; /* either sign */
    K->crossentropy_forward(losses, probs, logits, targets, N, V);
    ok = ok && !isnan(losses[0]) && isnan(losses[1]);
    report_bool("crossentropy_forward  NaN logit -> NaN row", ok);

    const int T = 4, HS = 2, C = HS; /* B = 1, NH = 1 */
    float qkv[4 * 3 * 2], out[4 * 2], att[4 * 4];
    for (int i = 0; i < T * 3 * C; i++) qkv[i] = rand_uniform(-1, 1);
    qkv[2 * 3 * C] = NAN; /* q of position 2 */
    K->attention_forward(out, att, qkv, 1, T, 1, HS);
    ok = 1;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C; i++) ok = ok && (isnan(out[t * C + i]) == (t == 2));
    report_bool("attention_forward  NaN query -> NaN row", ok);
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
    err = 0; /* against the exact product: one rounding, at most half an ulp */
    for (long i = 0; i < N; i++) {
        const double exact = (double)a[i] * (double)-0.37f;
        err = fmax(err, fabs(o[i] - exact) / fabs(exact));
    }
    snprintf(name, sizeof name, "scale  N=%ld", N);
    report(name, err, FLT_EPSILON / 2);
    free(a), free(b), free(o), free(a2), free(b2);
}

static void test_sum_squares(long N) {
    char name[128];
    float *x = rand_f(N, -3, 3);
    double ref = 0;
    for (long i = 0; i < N; i++) ref += (double)x[i] * (double)x[i];
    double got = K->sum_squares(x, N);
    /* double sums in another order differ by ~1e-13 here; a float
     * accumulator would be off by 1e-7 or more */
    snprintf(name, sizeof name, "sum_squares  N=%ld", N);
    report(name, N ? fabs(got - ref) / ref : fabs(got), 1e-10);
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
        /* compare the step, not p: p is ~1 and the step ~1e-2; storing p
         * in float rounds the step by up to ulp(p) / 2, which is allowed */
        double got_step = (double)p0[i] - (double)p[i];
        double slack = FLT_EPSILON * fabs(p0[i]);
        double size = lr * (fabs(adam) + fabs(decay)) + 1e-30;
        ep = fmax(ep, fmax(0.0, fabs(got_step - step) - slack) / size);
        em = fmax(em, fabs(m[i] - mi) / (b1 * fabs(m0[i]) + (1.0 - b1) * fabs(gi) + 1e-30));
        ev = fmax(ev, fabs(v[i] - vi) / (vi + 1e-30));
    }
    snprintf(name, sizeof name, "adamw  N=%ld t=%d  step", N, t);
    report(name, ep, 1e-6);
    snprintf(name, sizeof name, "adamw  N=%ld t=%d  m, v", N, t);
    report(name, fmax(em, ev), 1e-6);
    free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0);
}

/* OpenBLAS's own call, declared here so that this test needs no BLAS
 * header: ctest runs it without OPENBLAS_NUM_THREADS=1 */
void openblas_set_num_threads(int num_threads);

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
    test_attention(1, 64, 2, 32, 1.0f); /* the labs' head size */
    test_attention(1, 70, 2, 4, 1.0f);  /* row blocks, a short last one, T % 8 != 0 */
    test_attention(1, 130, 1, 3, 1.0f); /* longer: most of the triangle skipped */
    test_attention_future_dominates();

    {   /* attention over blocks: a block alone, unmasked and causal (zig-zag
         * positions: rank 0 of 2 holds chunks 0 and 3, against rank 1's 1 and 2,
         * so some rows see no key at all), then whole rings */
        int zq[8] = {0, 1, 2, 3, 12, 13, 14, 15}, zk[8] = {4, 5, 6, 7, 8, 9, 10, 11};
        int lq[40], lk[150];
        for (int i = 0; i < 40; i++) lq[i] = 110 + 3 * i; /* a long key block: two tiles, one partly masked */
        for (int j = 0; j < 150; j++) lk[j] = j;
        test_attention_block("no mask", 2, 5, 7, 2, 3, NULL, NULL);
        test_attention_block("zig-zag", 2, 8, 8, 2, 4, zq, zk);
        test_attention_block("zig-zag", 1, 8, 8, 1, 5, zk, zq);
        test_attention_block("causal", 1, 40, 150, 2, 4, lq, lk);
        test_attention_block_future_dominates();
        test_attention_ring(1, 16, 1, 4, 1, 0);   /* one block: the whole sequence */
        test_attention_ring(2, 16, 2, 3, 2, 1);
        test_attention_ring(2, 24, 2, 4, 3, 1);   /* N not a power of two */
        test_attention_ring(1, 64, 2, 8, 4, 1);
        test_attention_ring(1, 64, 2, 8, 4, 0);
        test_attention_ring(1, 256, 1, 4, 2, 1);  /* blocks of 128: several row blocks and key tiles */
        const int sizes[] = {5, 1, 17, 9, 1, 7}, backwards[] = {5, 4, 3, 2, 1, 0}, shuffled[] = {2, 5, 0, 3, 1, 4};
        test_attention_split(2, 40, 2, 3, sizes, backwards, 6);
        test_attention_split(2, 40, 2, 3, sizes, shuffled, 6);
        const int halves[] = {150, 150}, swapped[] = {1, 0};
        test_attention_split(1, 300, 1, 8, halves, swapped, 2); /* tiles of 128 inside each block */
    }

    test_gelu(1);
    test_gelu(7);
    test_gelu(1001);
    test_gelu_extremes();

    test_crossentropy(1, 1, 0.0f, 1.0f, 1);
    test_crossentropy(5, 7, 0.0f, 2.0f, 1);
    test_crossentropy(9, 256, 0.0f, 3.0f, 1);
    test_crossentropy(6, 13, 1000.0f, 3.0f, 1); /* exp(1000) overflows without the max */
    test_crossentropy(4, 37, 0.0f, 50.0f, 0);   /* probabilities below float's range */
    test_nan_propagation();

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
