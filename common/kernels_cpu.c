/* The CPU kernels: OpenBLAS sgemm for every matrix product (attention's
 * too, reading q, k and v in place through the leading dimension), plain C
 * loops for the rest.
 *
 * One thread per MPI rank, so nothing here spawns threads. The loops are
 * written for gcc's auto-vectoriser at -O3 -march=x86-64-v3 without
 * -ffast-math: contiguous inner loops over restrict pointers; float sums
 * kept in LANES independent partial sums, because the compiler may not
 * reorder a single float sum by itself; each row touched in one or two
 * sweeps while it sits in L1. exp (softmax, GELU) and sqrt (AdamW) are small
 * inline branch-free versions, accurate to 1-2 ulp, because libm's expf and
 * sqrtf keep a loop scalar under the default -fmath-errno.
 *
 * Buffers passed to one call must not overlap, except add's out with a or b. */
#include "kernels.h"
#include "kernels_cpu_math.h" /* LANES, exp_fast, row sums and maxima */
#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int kernels_cpu_use_avx512 = -1;

int kernels_cpu_decide_avx512(void) {
#ifdef __SANITIZE_ADDRESS__
    /* The sanitizers' checks split the loops' blocks differently in the two
     * builds, so gcc fuses a different set of multiply-adds and their bits can
     * differ: an instrumented run keeps to the AVX2 build, so its results do
     * not depend on the CPU (the Release build checks that both agree). */
    return kernels_cpu_use_avx512 = 0;
#endif
    const char *isa = getenv("PL_CPU_ISA");
    kernels_cpu_use_avx512 = !(isa && !strcmp(isa, "avx2")) && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512dq");
    return kernels_cpu_use_avx512;
}

#define ATT_BLOCK 32   /* rows of the causal score matrix per sgemm (multiple of LANES) */

/* ---- encoder -------------------------------------------------------------------- */

static void encoder_forward_cpu(float *restrict out, const int *restrict tokens,
                                const float *restrict wte, const float *restrict wpe,
                                int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *restrict o = out + ((size_t)b * T + t) * C;
            const float *restrict e = wte + (size_t)tokens[b * T + t] * C;
            const float *restrict p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}

/* dwte and dwpe are distinct buffers (two parameter tensors). */
static void encoder_backward_cpu(float *restrict dwte, float *restrict dwpe,
                                 const float *restrict dout, const int *restrict tokens,
                                 int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *restrict d = dout + ((size_t)b * T + t) * C;
            float *restrict de = dwte + (size_t)tokens[b * T + t] * C;
            float *restrict dp = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                de[i] += d[i];
                dp[i] += d[i];
            }
        }
}

/* ---- layernorm ------------------------------------------------------------------ */

static void layernorm_forward_cpu(float *restrict out, float *restrict mean,
                                  float *restrict rstd, const float *restrict inp,
                                  const float *restrict w, const float *restrict b,
                                  int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        /* Two passes over a row that sits in L1: the mean first, then the
         * variance around it (no cancellation, unlike E[x^2] - E[x]^2). */
        const float m = row_sum(x, C) / (float)C;
        float vacc[LANES] = {0};
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int j = 0; j < LANES; j++) {
                float d = x[i + j] - m;
                vacc[j] += d * d;
            }
        float v = hsum(vacc);
        for (; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        const float r = 1.0f / sqrtf(v / (float)C + 1e-5f);

        for (i = 0; i < C; i++) o[i] = (x[i] - m) * r * w[i] + b[i];
        mean[n] = m;
        rstd[n] = r;
    }
}

/* The input gradient, row by row: dx = rstd (g - mean(g) - xhat mean(g xhat))
 * with g = dout * w. */
static void layernorm_backward_input_cpu(float *restrict dinp, const float *restrict dout,
                                         const float *restrict inp, const float *restrict w,
                                         const float *restrict mean, const float *restrict rstd,
                                         int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        const float *restrict d = dout + (size_t)n * C;
        float *restrict dx = dinp + (size_t)n * C;
        const float m = mean[n], r = rstd[n];

        /* The two row means the input gradient needs, of g = dout * w and of
         * g * xhat. (Two loops: gcc vectorises one lane array per loop well,
         * two in one loop poorly.) */
        float acc[LANES] = {0};
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += d[i + j] * w[i + j];
        float sg = hsum(acc);
        for (; i < C; i++) sg += d[i] * w[i];
        float acc_x[LANES] = {0};
        i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int j = 0; j < LANES; j++) acc_x[j] += d[i + j] * w[i + j] * ((x[i + j] - m) * r);
        float sgx = hsum(acc_x);
        for (; i < C; i++) sgx += d[i] * w[i] * ((x[i] - m) * r);
        const float mg = sg / (float)C, mgx = sgx / (float)C;

        for (i = 0; i < C; i++) {
            float xh = (x[i] - m) * r;
            dx[i] += (d[i] * w[i] - mg - xh * mgx) * r;
        }
    }
}

/* The parameter gradients, summed over the rows in row order. */
static void layernorm_backward_weight_cpu(float *restrict dw, float *restrict db,
                                          const float *restrict dout, const float *restrict inp,
                                          const float *restrict mean, const float *restrict rstd,
                                          int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        const float *restrict d = dout + (size_t)n * C;
        const float m = mean[n], r = rstd[n];
        for (int i = 0; i < C; i++) {
            float xh = (x[i] - m) * r;
            db[i] += d[i];
            dw[i] += xh * d[i];
        }
    }
}

static void layernorm_backward_cpu(float *restrict dinp, float *restrict dw,
                                   float *restrict db, const float *restrict dout,
                                   const float *restrict inp, const float *restrict w,
                                   const float *restrict mean, const float *restrict rstd,
                                   int N, int C) {
    layernorm_backward_input_cpu(dinp, dout, inp, w, mean, rstd, N, C);
    layernorm_backward_weight_cpu(dw, db, dout, inp, mean, rstd, N, C);
}

/* ---- matmul --------------------------------------------------------------------- */

static void matmul_forward_cpu(float *restrict out, const float *restrict inp,
                               const float *restrict w, const float *restrict bias,
                               int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    float beta = 0.0f;
    if (bias) { /* start from the bias and let sgemm add the product onto it */
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof *out);
        beta = 1.0f;
    }
    if (IC <= 0) {
        if (!bias) memset(out, 0, (size_t)N * OC * sizeof *out);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC,
                beta, out, OC);
}

/* dinp[N,IC] += dout[N,OC] @ w[OC,IC] */
static void matmul_backward_input_cpu(float *restrict dinp, const float *restrict dout,
                                      const float *restrict w, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f,
                dinp, IC);
}

/* dw[OC,IC] += dout^T @ inp; dbias += column sums of dout */
static void matmul_backward_weight_cpu(float *restrict dw, float *restrict dbias,
                                       const float *restrict dout, const float *restrict inp,
                                       int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC > 0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                    1.0f, dw, IC);
    if (dbias)
        for (int n = 0; n < N; n++) {
            const float *restrict d = dout + (size_t)n * OC;
            for (int o = 0; o < OC; o++) dbias[o] += d[o];
        }
}

static void matmul_backward_cpu(float *restrict dinp, float *restrict dw,
                                float *restrict dbias, const float *restrict dout,
                                const float *restrict inp, const float *restrict w,
                                int N, int IC, int OC) {
    if (dinp) matmul_backward_input_cpu(dinp, dout, w, N, IC, OC);
    matmul_backward_weight_cpu(dw, dbias, dout, inp, N, IC, OC);
}

/* ---- attention ------------------------------------------------------------------ */

/* Row t of the scores, computed in columns 0..ncols-1, becomes the causal
 * softmax: columns 0..t normalised, columns t+1..T-1 zero. The padding
 * columns are -inf for the max and zero from the exp on. (Not left at
 * exp_fast(-inf) ~ 1e-38: scaled, that is a denormal, slow on x86.) */
static inline void softmax_causal_row(float *restrict a, int t, int ncols, int T) {
    const int n = padded_length(t, ncols);
    for (int i = t + 1; i < n; i++) a[i] = -INFINITY;
    const float m = row_max(a, n);
    for (int i = 0; i < n; i++) a[i] = exp_fast(a[i] - m);
    for (int i = t + 1; i < T; i++) a[i] = 0.0f;
    const float inv = 1.0f / row_sum(a, n);
    for (int i = 0; i < n; i++) a[i] *= inv;
}

/* Per (batch, head), q, k and v are read in place from qkv rows (leading
 * dimension 3C). Rows are processed in blocks of ATT_BLOCK; block [r0, r1)
 * needs only the key columns 0..r1-1, so long sequences skip most of the
 * masked upper triangle. */
static void attention_forward_cpu(float *restrict out, float *restrict att,
                                  const float *restrict qkv, int B, int T, int NH, int HS) {
    const int C = NH * HS, C3 = 3 * C;
    if (T <= 0 || HS <= 0) return;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + (size_t)h * HS;
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                const int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, nr = r1 - r0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, HS, scale,
                            q + (size_t)r0 * C3, C3, k, C3, 0.0f, a + (size_t)r0 * T, T);
                for (int t = r0; t < r1; t++) softmax_causal_row(a + (size_t)t * T, t, r1, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, HS, r1, 1.0f,
                            a + (size_t)r0 * T, T, v, C3, 0.0f, o + (size_t)r0 * C, C);
            }
        }
}

/* Row t of datt holds dP (gradient w.r.t. the probabilities) in columns
 * 0..r1-1 on entry, and the gradient w.r.t. the softmax's input (the scaled
 * scores) on exit, zero from t+1 to r1-1. p is zero above the diagonal, so
 * the padding columns drop out of the sum and come out zero by themselves. */
static inline void softmax_causal_row_backward(float *restrict da, const float *restrict p,
                                               int t, int r1) {
    const int n = padded_length(t, r1);
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += p[i + j] * da[i + j];
    float s = hsum(acc);
    for (; i < n; i++) s += p[i] * da[i];
    for (i = 0; i < n; i++) da[i] = p[i] * (da[i] - s);
    for (; i < r1; i++) da[i] = 0.0f;
}

static void attention_backward_cpu(float *restrict dqkv, float *restrict datt,
                                   const float *restrict dout, const float *restrict qkv,
                                   const float *restrict att, int B, int T, int NH, int HS) {
    const int C = NH * HS, C3 = 3 * C;
    if (T <= 0 || HS <= 0) return;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t qoff = (size_t)b * T * C3 + (size_t)h * HS;
            const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            float *da = datt + ((size_t)b * NH + h) * T * T;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * HS;

            /* Row blocks: dP = dO v^T, back through the softmax to dS, then
             * dq += scale * dS k. */
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                const int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, nr = r1 - r0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, HS, 1.0f,
                            dO + (size_t)r0 * C, C, v, C3, 0.0f, da + (size_t)r0 * T, T);
                for (int t = r0; t < r1; t++)
                    softmax_causal_row_backward(da + (size_t)t * T, a + (size_t)t * T, t, r1);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, HS, r1, scale,
                            da + (size_t)r0 * T, T, k, C3, 1.0f, dq + (size_t)r0 * C3, C3);
            }
            /* Column blocks: key/value j only receives from queries t >= j,
             * so block [c0, c1) reads rows c0..T-1 of dS and P. */
            for (int c0 = 0; c0 < T; c0 += ATT_BLOCK) {
                const int c1 = c0 + ATT_BLOCK < T ? c0 + ATT_BLOCK : T, nc = c1 - c0;
                const int nt = T - c0;
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, HS, nt, scale,
                            da + (size_t)c0 * T + c0, T, q + (size_t)c0 * C3, C3, 1.0f,
                            dk + (size_t)c0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, HS, nt, 1.0f,
                            a + (size_t)c0 * T + c0, T, dO + (size_t)c0 * C, C, 1.0f,
                            dv + (size_t)c0 * C3, C3);
            }
        }
}

/* ---- attention over blocks (kernels.h: context parallelism) ------------------- */

#define KEY_TILE 128 /* keys per tile: a 32 x 128 score tile (16 KB) lives on the stack */

long attention_unmasked_scores(const int *q_pos, int Tq, const int *k_pos, int Tk) {
    long n = 0;
    for (int i = 0; i < Tq; i++)
        for (int j = 0; j < Tk; j++) n += k_pos[j] <= q_pos[i];
    return n;
}

/* Whether every key of the tile is masked from every query of the rows. */
static int tile_masked(const int *q_pos, int nr, const int *k_pos, int nc) {
    int qmax = q_pos[0], kmin = k_pos[0];
    for (int i = 1; i < nr; i++) qmax = q_pos[i] > qmax ? q_pos[i] : qmax;
    for (int j = 1; j < nc; j++) kmin = k_pos[j] < kmin ? k_pos[j] : kmin;
    return kmin > qmax;
}

/* Per (batch row, head) and block of ATT_BLOCK query rows, the key tiles in
 * order, each folded into the rows by the online softmax (Milakov and
 * Gimelshein 2018): m the running max, l the running sum of exp(s - m), and
 * the out rows themselves the running sum of exp(s - m) v, rescaled by
 * exp(m_old - m) whenever m grows; at the end out /= l, lse = m + log l. */
static void attention_block_forward_cpu(float *restrict out, float *restrict lse, const float *restrict q,
                                        const float *restrict k, const float *restrict v, int ldq, int ldkv,
                                        const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                        int HS) {
    if (Tq <= 0 || HS <= 0) return;
    const int C = NH * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    float s[ATT_BLOCK * KEY_TILE], m[ATT_BLOCK], l[ATT_BLOCK];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *qh = q + (size_t)b * Tq * ldq + (size_t)h * HS;
            const float *kh = k + (size_t)b * Tk * ldkv + (size_t)h * HS;
            const float *vh = v + (size_t)b * Tk * ldkv + (size_t)h * HS;
            float *oh = out + (size_t)b * Tq * C + (size_t)h * HS;
            float *lh = lse + ((size_t)b * NH + h) * Tq;
            for (int r0 = 0; r0 < Tq; r0 += ATT_BLOCK) {
                const int nr = r0 + ATT_BLOCK < Tq ? ATT_BLOCK : Tq - r0;
                for (int i = 0; i < nr; i++) {
                    m[i] = -INFINITY;
                    l[i] = 0.0f;
                    memset(oh + (size_t)(r0 + i) * C, 0, sizeof(float) * (size_t)HS);
                }
                for (int c0 = 0; c0 < Tk; c0 += KEY_TILE) {
                    const int nc = c0 + KEY_TILE < Tk ? KEY_TILE : Tk - c0;
                    if (q_pos && tile_masked(q_pos + r0, nr, k_pos + c0, nc)) continue;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, HS, scale, qh + (size_t)r0 * ldq,
                                ldq, kh + (size_t)c0 * ldkv, ldkv, 0.0f, s, nc);
                    for (int i = 0; i < nr; i++) {
                        float *row = s + (size_t)i * nc;
                        if (q_pos)
                            for (int j = 0; j < nc; j++)
                                if (k_pos[c0 + j] > q_pos[r0 + i]) row[j] = -INFINITY;
                        const float mnew = fmaxf(m[i], row_max(row, nc));
                        if (mnew == -INFINITY) { /* nothing visible yet: p = 0 */
                            memset(row, 0, sizeof(float) * (size_t)nc);
                            continue;
                        }
                        for (int j = 0; j < nc; j++) row[j] = exp_fast(row[j] - mnew);
                        if (q_pos) /* exp_fast(-inf) is ~1e-38, not 0 */
                            for (int j = 0; j < nc; j++)
                                if (k_pos[c0 + j] > q_pos[r0 + i]) row[j] = 0.0f;
                        const float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - mnew);
                        l[i] = l[i] * corr + row_sum(row, nc);
                        m[i] = mnew;
                        if (corr != 1.0f) {
                            float *o = oh + (size_t)(r0 + i) * C;
                            for (int d = 0; d < HS; d++) o[d] *= corr;
                        }
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, HS, nc, 1.0f, s, nc,
                                vh + (size_t)c0 * ldkv, ldkv, 1.0f, oh + (size_t)r0 * C, C);
                }
                for (int i = 0; i < nr; i++) {
                    float *o = oh + (size_t)(r0 + i) * C;
                    if (l[i] > 0.0f) {
                        const float inv = 1.0f / l[i];
                        for (int d = 0; d < HS; d++) o[d] *= inv;
                        lh[r0 + i] = m[i] + logf(l[i]);
                    } else {
                        lh[r0 + i] = -INFINITY; /* out stays 0 */
                    }
                }
            }
        }
}

/* The same tiles: P recomputed from the saved lse, then dP = dout v^T,
 * dS = P (dP - D) and the three products, each tile's share added at once. */
static void attention_block_backward_cpu(float *restrict dq, float *restrict dk, float *restrict dv,
                                         const float *restrict dout, const float *restrict out,
                                         const float *restrict lse, const float *restrict q, const float *restrict k,
                                         const float *restrict v, int ldq, int ldkv, const int *q_pos,
                                         const int *k_pos, int B, int Tq, int Tk, int NH, int HS) {
    if (Tq <= 0 || Tk <= 0 || HS <= 0) return;
    const int C = NH * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    float p[ATT_BLOCK * KEY_TILE], dp[ATT_BLOCK * KEY_TILE], D[ATT_BLOCK];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t qoff = (size_t)b * Tq * ldq + (size_t)h * HS, koff = (size_t)b * Tk * ldkv + (size_t)h * HS;
            const size_t ooff = (size_t)b * Tq * C + (size_t)h * HS;
            const float *lh = lse + ((size_t)b * NH + h) * Tq;
            for (int r0 = 0; r0 < Tq; r0 += ATT_BLOCK) {
                const int nr = r0 + ATT_BLOCK < Tq ? ATT_BLOCK : Tq - r0;
                for (int i = 0; i < nr; i++) {
                    const float *g = dout + ooff + (size_t)(r0 + i) * C, *o = out + ooff + (size_t)(r0 + i) * C;
                    float acc = 0.0f;
                    for (int d = 0; d < HS; d++) acc += g[d] * o[d];
                    D[i] = acc;
                }
                for (int c0 = 0; c0 < Tk; c0 += KEY_TILE) {
                    const int nc = c0 + KEY_TILE < Tk ? KEY_TILE : Tk - c0;
                    if (q_pos && tile_masked(q_pos + r0, nr, k_pos + c0, nc)) continue;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, HS, scale,
                                q + qoff + (size_t)r0 * ldq, ldq, k + koff + (size_t)c0 * ldkv, ldkv, 0.0f, p, nc);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, HS, 1.0f,
                                dout + ooff + (size_t)r0 * C, C, v + koff + (size_t)c0 * ldkv, ldkv, 0.0f, dp, nc);
                    for (int i = 0; i < nr; i++) {
                        float *pr = p + (size_t)i * nc, *dr = dp + (size_t)i * nc;
                        const float li = lh[r0 + i];
                        if (li == -INFINITY) { /* the query sees no key at all */
                            memset(pr, 0, sizeof(float) * (size_t)nc);
                            memset(dr, 0, sizeof(float) * (size_t)nc);
                            continue;
                        }
                        for (int j = 0; j < nc; j++) pr[j] = exp_fast(pr[j] - li);
                        if (q_pos)
                            for (int j = 0; j < nc; j++)
                                if (k_pos[c0 + j] > q_pos[r0 + i]) pr[j] = 0.0f;
                        for (int j = 0; j < nc; j++) dr[j] = pr[j] * (dr[j] - D[i]); /* dS */
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, HS, nc, scale, dp, nc,
                                k + koff + (size_t)c0 * ldkv, ldkv, 1.0f, dq + qoff + (size_t)r0 * ldq, ldq);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, HS, nr, scale, dp, nc,
                                q + qoff + (size_t)r0 * ldq, ldq, 1.0f, dk + koff + (size_t)c0 * ldkv, ldkv);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, HS, nr, 1.0f, p, nc,
                                dout + ooff + (size_t)r0 * C, C, 1.0f, dv + koff + (size_t)c0 * ldkv, ldkv);
                }
            }
        }
}

static void attention_merge_cpu(float *restrict out, float *restrict lse, const float *restrict out2,
                                const float *restrict lse2, int B, int T, int NH, int HS) {
    const int C = NH * HS;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t li = ((size_t)b * NH + h) * T + t, oi = ((size_t)b * T + t) * C + (size_t)h * HS;
                const float a = lse[li], c = lse2[li];
                if (c == -INFINITY) continue;
                float wa = 0.0f, wc = 1.0f;
                if (a == -INFINITY) {
                    lse[li] = c;
                } else {
                    const float mx = fmaxf(a, c), ea = expf(a - mx), ec = expf(c - mx), sum = ea + ec;
                    wa = ea / sum;
                    wc = ec / sum;
                    lse[li] = mx + logf(sum);
                }
                for (int d = 0; d < HS; d++) out[oi + d] = wa * out[oi + d] + wc * out2[oi + d];
            }
}

/* ---- GELU ----------------------------------------------------------------------- */

/* GELU_K, GELU_A and why x * sigmoid(2u): kernels_cpu_math.h */

/* Bound by the exp: built for AVX2 and AVX-512 (WITH_AVX512, the same bits) */
WITH_AVX512(gelu_forward_cpu, (float *restrict out, const float *restrict inp, long N), (out, inp, N), {
    for (long i = 0; i < N; i++) out[i] = gelu_value(inp[i]);
})

WITH_AVX512(gelu_backward_cpu, (float *restrict dinp, const float *restrict dout, const float *restrict inp, long N),
            (dinp, dout, inp, N), {
    for (long i = 0; i < N; i++) dinp[i] += gelu_slope(inp[i]) * dout[i];
})

/* ---- elementwise ---------------------------------------------------------------- */

static void accumulate_cpu(float *restrict dst, const float *restrict src, long N) {
    for (long i = 0; i < N; i++) dst[i] += src[i];
}

static void add_cpu(float *out, const float *a, const float *b, long N) {
    /* out may alias a or b: those cases are an accumulate, so the loop below
     * can promise the compiler that nothing overlaps. */
    if (out == a) {
        accumulate_cpu(out, b, N);
        return;
    }
    if (out == b) {
        accumulate_cpu(out, a, N);
        return;
    }
    float *restrict o = out;
    const float *restrict x = a, *restrict y = b;
    for (long i = 0; i < N; i++) o[i] = x[i] + y[i];
}

static void scale_cpu(float *restrict x, float s, long N) {
    for (long i = 0; i < N; i++) x[i] *= s;
}

/* ---- loss ----------------------------------------------------------------------- */

static void crossentropy_forward_cpu(float *restrict losses, float *restrict probs,
                                     const float *restrict logits, const int *restrict targets,
                                     int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *restrict x = logits + (size_t)n * V;
        float *restrict p = probs + (size_t)n * V;
        const float m = row_max(x, V);
        for (int i = 0; i < V; i++) p[i] = exp_fast(x[i] - m);
        const float s = row_sum(p, V), inv = 1.0f / s;
        for (int i = 0; i < V; i++) p[i] *= inv;
        /* -log p[target] as log-sum-exp, which stays finite when p underflows */
        losses[n] = logf(s) - (x[targets[n]] - m);
    }
}

static void crossentropy_backward_cpu(float *restrict dlogits, const float *restrict probs,
                                      const int *restrict targets, float dloss, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *restrict p = probs + (size_t)n * V;
        float *restrict d = dlogits + (size_t)n * V;
        for (int i = 0; i < V; i++) d[i] = p[i] * dloss;
        d[targets[n]] = (p[targets[n]] - 1.0f) * dloss;
    }
}

/* ---- optimizer helpers ---------------------------------------------------------- */

static double sum_squares_cpu(const float *restrict x, long N) {
    double acc[LANES] = {0};
    long i = 0;
    for (; i + LANES <= N; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    double s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < N; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static void sum_squares_add_cpu(double *restrict acc, const float *restrict x, long N) {
    *acc += sum_squares_cpu(x, N);
}

static void adamw_cpu(float *restrict p, const float *restrict g, float *restrict m,
                      float *restrict v, long N, float lr, float beta1, float beta2, float eps,
                      float wd, int t, float grad_scale) {
    const float bc1 = 1.0f - powf(beta1, (float)t);
    const float bc2 = 1.0f - powf(beta2, (float)t);
    const float ibc1 = 1.0f / bc1, ibc2 = 1.0f / bc2;
    for (long i = 0; i < N; i++) {
        float gi = g[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float den = sqrt_fast(vi * ibc2) + eps;
        p[i] -= lr * ((mi * ibc1) / den + wd * p[i]);
    }
}

const kernels kernels_cpu = {
    .name = "cpu",
    .encoder_forward = encoder_forward_cpu,
    .encoder_backward = encoder_backward_cpu,
    .layernorm_forward = layernorm_forward_cpu,
    .layernorm_backward = layernorm_backward_cpu,
    .matmul_forward = matmul_forward_cpu,
    .matmul_backward = matmul_backward_cpu,
    .attention_forward = attention_forward_cpu,
    .attention_backward = attention_backward_cpu,
    .gelu_forward = gelu_forward_cpu,
    .gelu_backward = gelu_backward_cpu,
    .add = add_cpu,
    .accumulate = accumulate_cpu,
    .scale = scale_cpu,
    .crossentropy_forward = crossentropy_forward_cpu,
    .crossentropy_backward = crossentropy_backward_cpu,
    .sum_squares = sum_squares_cpu,
    .adamw = adamw_cpu,
    .sum_squares_add = sum_squares_add_cpu,
    .matmul_backward_input = matmul_backward_input_cpu,
    .matmul_backward_weight = matmul_backward_weight_cpu,
    .layernorm_backward_input = layernorm_backward_input_cpu,
    .layernorm_backward_weight = layernorm_backward_weight_cpu,
    .attention_block_forward = attention_block_forward_cpu,
    .attention_block_backward = attention_block_backward_cpu,
    .attention_merge = attention_merge_cpu,
};
