/* The CPU kernels' small inline helpers, shared by the fp32 kernels
 * (kernels_cpu.c) and the bf16 ones (kernels_cpu_bf16.c), so that a bf16
 * kernel that converts its values in registers (GELU's backward, attention's
 * softmax) does the fp32 kernel's arithmetic on them. Written for gcc's
 * auto-vectoriser (kernels_cpu.c says how). */
#ifndef PL_KERNELS_CPU_MATH_H
#define PL_KERNELS_CPU_MATH_H
#include "kernels.h" /* kernels_cpu_use_avx512 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 8        /* one AVX2 register of floats */

/* ---- one kernel, two instruction sets ------------------------------------------
 * The build targets x86-64-v3 (AVX2), so the binary runs on any recent x86
 * CPU. A loop bound by its arithmetic (GELU: an exp per element) runs twice as
 * many lanes with AVX-512; such a kernel is compiled a second time for
 * AVX-512 and picked at run time when the CPU has it:
 *
 *     WITH_AVX512(gelu_forward_cpu, (float *restrict out, ...), (out, ...), { loop })
 *
 * defines gelu_forward_cpu_avx2 and gelu_forward_cpu_avx512 from one body, and
 * gelu_forward_cpu (static void) calling the one this CPU runs. Both compile
 * the same per-element arithmetic (the same FMAs: x86-64-v3 has FMA too), so
 * for an element-wise loop the two give the same bits; only the vector width
 * differs (tests/test_bf16_kernels.c compares them). A sum would keep its
 * order only through explicit LANES partial sums. */
#define PL_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
static inline int cpu_has_avx512(void) {
    return kernels_cpu_use_avx512 >= 0 ? kernels_cpu_use_avx512 : kernels_cpu_decide_avx512();
}
#define WITH_AVX512(name, params, args, ...)                                                                     \
    static inline __attribute__((always_inline)) void name##_body params __VA_ARGS__                          \
    static void name##_avx2 params { name##_body args; }                                                       \
    PL_TARGET_AVX512 static void name##_avx512 params { name##_body args; }                                    \
    static void name params {                                                                                   \
        if (cpu_has_avx512()) name##_avx512 args;                                                               \
        else name##_avx2 args;                                                                                  \
    }

/* ---- numbers ------------------------------------------------------------------ */

static inline float hsum(const float a[LANES]) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* Float bits as an integer and back. Clamps and maxima below are done on
 * these integers, which gcc vectorises as plain integer min/max: a running
 * float max is not vectorised without -ffast-math, and gcc 12 turned the
 * float clamps inside exp_fast into branches that kept its loops scalar. */
static inline uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* min(x, hi) for hi > 0, exact: non-negative floats order like their bits as
 * signed integers, and every negative float is a negative integer. */
static inline float min_positive_bound(float x, float hi) {
    uint32_t u = bits_of(x), h = bits_of(hi);
    int32_t s, hs;
    memcpy(&s, &u, sizeof s);
    memcpy(&hs, &h, sizeof hs);
    s = s < hs ? s : hs;
    memcpy(&u, &s, sizeof u);
    return float_of(u);
}

/* max(x, lo) for lo < 0, exact: negative floats order in reverse of their
 * bits as unsigned integers, and every non-negative float's bits are smaller. */
static inline float max_negative_bound(float x, float lo) {
    uint32_t u = bits_of(x), l = bits_of(lo);
    return float_of(u < l ? u : l);
}

/* An integer whose order is the order of the floats (sign-magnitude to
 * two's complement), so that a row maximum is an integer max reduction. */
static inline int32_t order_key(float x) {
    uint32_t u = bits_of(x);
    int32_t s;
    memcpy(&s, &u, sizeof s);
    return s ^ ((s >> 31) & 0x7FFFFFFF);
}
static inline float from_order_key(int32_t k) {
    int32_t s = k ^ ((k >> 31) & 0x7FFFFFFF);
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    return float_of(u);
}

/* max over x[0..n-1]; -inf for n = 0; a positive-signed NaN wins, and a NaN
 * anywhere reaches the caller's result through x - max in any case. */
static inline float row_max(const float *restrict x, int n) {
    int32_t m = order_key(-INFINITY);
    for (int i = 0; i < n; i++) {
        int32_t k = order_key(x[i]);
        m = k > m ? k : m;
    }
    return from_order_key(m);
}

/* sum of x[0..n-1] in LANES partial sums */
static inline float row_sum(const float *restrict x, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j];
    float s = hsum(acc);
    for (; i < n; i++) s += x[i];
    return s;
}

/* Columns 0..t plus the masked ones up to the next multiple of LANES, when
 * the product computed those (below ncols): rows then run in whole vectors, with
 * no scalar tail, which is most of the cost of rows this short. */
static inline int padded_length(int t, int ncols) {
    int n = (t + 1 + LANES - 1) / LANES * LANES;
    return n <= ncols ? n : t + 1;
}

/* exp(x) for float, within 1.4 ulp (Cephes expf: Cody-Waite reduction by
 * ln 2 and a degree-6 polynomial), branch-free so that loops calling it
 * vectorise.
 * The argument is clamped to [-87, 88], which keeps 2^n a normal number:
 * below -87 it returns ~1.6e-38 instead of 0, which no softmax notices.
 * NaN in gives NaN out. */
static inline float exp_fast(float x) {
    float y = min_positive_bound(max_negative_bound(x, -87.0f), 88.0f);
    /* n = round(y / ln 2): adding 1.5 * 2^23 rounds to an integer and leaves
     * that integer in the low mantissa bits, so no float -> int conversion. */
    const float magic = 12582912.0f;
    float t = y * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = y - n * 0.693359375f; /* ln 2 split in two for an exact reduction */
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    float e = p * float_of((bits_of(t) - 0x4B400000u + 127u) << 23); /* p * 2^n */
    /* a NaN argument: OR its bits in (a select here would cost the vectorising) */
    uint32_t u = bits_of(x);
    uint32_t nan_mask = 0u - (uint32_t)((u & 0x7FFFFFFFu) > 0x7F800000u);
    return float_of(bits_of(e) | (nan_mask & u));
}

/* sqrt(v) for v >= 0 to a few ulp, branch-free. sqrtf itself would keep the
 * AdamW loop scalar: under the default -fmath-errno gcc guards every call
 * for a negative argument. 1/sqrt(v) starts from a guess made of the
 * exponent bits (error < 3.5e-2), and each Newton step squares the error
 * (times 1.5): 2e-3, 5e-6, then below float's rounding. v = 0 gives 0. */
static inline float sqrt_fast(float v) {
    float r = float_of(0x5F375A86u - (bits_of(v) >> 1));
    r = r * (1.5f - 0.5f * v * r * r);
    r = r * (1.5f - 0.5f * v * r * r);
    r = r * (1.5f - 0.5f * v * r * r);
    return v * r;
}

/* ---- GELU ----------------------------------------------------------------------- */

/* 0.5 x (1 + tanh(u)) = x * sigmoid(2u): the same function, without the
 * cancellation 1 + tanh(u) suffers for large negative x. exp's argument is
 * kept <= 80 so that the sigmoid stays a normal float (no denormal slow path). */
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* x s(2u), s = sigmoid */
static inline float gelu_value(float x) {
    float u2 = -2.0f * GELU_K * (x + GELU_A * x * x * x);
    u2 = min_positive_bound(u2, 80.0f);
    return x / (1.0f + exp_fast(u2));
}

/* d/dx [x s(2u)] = s + 2 x s (1 - s) u'(x), with s = sigmoid(2u) */
static inline float gelu_slope(float x) {
    float x2 = x * x;
    float u2 = -2.0f * GELU_K * (x + GELU_A * x2 * x);
    u2 = min_positive_bound(u2, 80.0f);
    float s = 1.0f / (1.0f + exp_fast(u2));
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x2);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

#endif
