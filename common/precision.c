/* The run's precision (precision.h) and the fp32 kernel table on values. */
#include "precision.h"
#include "device.h"
#include "kernels.h"
#include "kernel_times.h"
#include "mem.h"
#include <string.h>

precision g_precision = PREC_FP32;
const value_kernels *KP = &kernels_values_fp32;

void precision_use(precision p) {
    g_precision = p;
    const value_kernels *table = &kernels_bf16_cpu;
    if (p == PREC_FP32) table = &kernels_values_fp32;
#ifdef PL_HAVE_CUDA
    else if (g_device == DEVICE_CUDA) table = &kernels_bf16_cuda;
#endif
    KP = kernel_times_wrap(table); /* table itself unless PL_KERNEL_TIMES is set */
}

const char *precision_name(precision p) { return p == PREC_BF16 ? "bf16" : "fp32"; }

int precision_parse(const char *name, precision *p) {
    if (!strcmp(name, "fp32")) *p = PREC_FP32;
    else if (!strcmp(name, "bf16")) *p = PREC_BF16;
    else return -1;
    return 0;
}

float *master_alloc(void *params, long n) {
    if (g_precision == PREC_FP32) return params;
    return mem_alloc((size_t)n * sizeof(float), MEM_OPTIM);
}

void master_free(float *master, void *params) {
    if ((void *)master != params) mem_free(master);
}

void params_from_master(void *params, const float *master, long n) { KP->to_values(params, master, n); }

/* ---- fp32: K's kernels, every call passed on as it is ------------------------------
 * The value table takes void * (a value is a float or a bf16), the fp32 table
 * float *; calling one through a pointer of the other's type is undefined in
 * C, so each entry is a one-line wrapper. K is read at each call, not copied:
 * it is the device's table (CPU or CUDA), chosen at run time. */

static void f32_encoder_forward(void *out, const int *tokens, const void *wte, const void *wpe, int B, int T, int C) {
    K->encoder_forward(out, tokens, wte, wpe, B, T, C);
}
static void f32_encoder_backward(void *dwte, void *dwpe, const void *dout, const int *tokens, int B, int T, int C) {
    K->encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
}
static void f32_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w, const void *b,
                                  int N, int C) {
    K->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}
static void f32_layernorm_backward(void *dinp, void *dw, void *db, const void *dout, const void *inp, const void *w,
                                   const float *mean, const float *rstd, int N, int C) {
    K->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
static void f32_matmul_forward(void *out, const void *inp, const void *w, const void *bias, int N, int IC, int OC) {
    K->matmul_forward(out, inp, w, bias, N, IC, OC);
}
static void f32_matmul_backward(void *dinp, void *dw, void *dbias, const void *dout, const void *inp, const void *w,
                                int N, int IC, int OC) {
    K->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC);
}
static void f32_attention_forward(void *out, void *att, const void *qkv, int B, int T, int NH, int HS) {
    K->attention_forward(out, att, qkv, B, T, NH, HS);
}
static void f32_attention_backward(void *dqkv, void *datt, const void *dout, const void *qkv, const void *att, int B,
                                   int T, int NH, int HS) {
    K->attention_backward(dqkv, datt, dout, qkv, att, B, T, NH, HS);
}
static void f32_gelu_forward(void *out, const void *inp, long N) { K->gelu_forward(out, inp, N); }
static void f32_gelu_backward(void *dinp, const void *dout, const void *inp, long N) {
    K->gelu_backward(dinp, dout, inp, N);
}
static void f32_add(void *out, const void *a, const void *b, long N) { K->add(out, a, b, N); }
static void f32_accumulate(void *dst, const void *src, long N) { K->accumulate(dst, src, N); }
static void f32_scale(void *x, float s, long N) { K->scale(x, s, N); }
static void f32_crossentropy_forward(float *losses, void *probs, const void *logits, const int *targets, int N, int V) {
    K->crossentropy_forward(losses, probs, logits, targets, N, V);
}
static void f32_crossentropy_backward(void *dlogits, const void *probs, const int *targets, float dloss, int N, int V) {
    K->crossentropy_backward(dlogits, probs, targets, dloss, N, V);
}
static double f32_sum_squares(const void *x, long N) { return K->sum_squares(x, N); }
static void f32_sum_squares_add(double *acc, const void *x, long N) { K->sum_squares_add(acc, x, N); }
static void f32_adamw(float *p, const void *g, float *m, float *v, long N, float lr, float beta1, float beta2,
                      float eps, float wd, int t, float grad_scale) {
    K->adamw(p, g, m, v, N, lr, beta1, beta2, eps, wd, t, grad_scale);
}
static void f32_matmul_backward_input(void *dinp, const void *dout, const void *w, int N, int IC, int OC) {
    K->matmul_backward_input(dinp, dout, w, N, IC, OC);
}
static void f32_matmul_backward_weight(void *dw, void *dbias, const void *dout, const void *inp, int N, int IC,
                                       int OC) {
    K->matmul_backward_weight(dw, dbias, dout, inp, N, IC, OC);
}
static void f32_layernorm_backward_input(void *dinp, const void *dout, const void *inp, const void *w,
                                         const float *mean, const float *rstd, int N, int C) {
    K->layernorm_backward_input(dinp, dout, inp, w, mean, rstd, N, C);
}
static void f32_layernorm_backward_weight(void *dw, void *db, const void *dout, const void *inp, const float *mean,
                                          const float *rstd, int N, int C) {
    K->layernorm_backward_weight(dw, db, dout, inp, mean, rstd, N, C);
}
static void f32_copy(void *dst, const float *src, long N) {
    if (dst != (const void *)src) mem_copy(dst, src, (size_t)N * sizeof(float));
}
static void f32_copy_back(float *dst, const void *src, long N) {
    if ((void *)dst != src) mem_copy(dst, src, (size_t)N * sizeof(float));
}

/* attention over blocks (context parallelism) */
static void f32_attention_block_forward(void *out, float *lse, const void *q, const void *k, const void *v, int ldq,
                                        int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                        int HS) {
    K->attention_block_forward(out, lse, q, k, v, ldq, ldkv, q_pos, k_pos, B, Tq, Tk, NH, HS);
}
static void f32_attention_block_backward(void *dq, void *dk, void *dv, const void *dout, const void *out,
                                         const float *lse, const void *q, const void *k, const void *v, int ldq,
                                         int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                         int HS) {
    K->attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, ldq, ldkv, q_pos, k_pos, B, Tq, Tk, NH, HS);
}
static void f32_attention_merge(void *out, float *lse, const void *out2, const float *lse2, int B, int T, int NH,
                                int HS) {
    K->attention_merge(out, lse, out2, lse2, B, T, NH, HS);
}

const value_kernels kernels_values_fp32 = {
    .name = "fp32",
    .encoder_forward = f32_encoder_forward,
    .encoder_backward = f32_encoder_backward,
    .layernorm_forward = f32_layernorm_forward,
    .layernorm_backward = f32_layernorm_backward,
    .matmul_forward = f32_matmul_forward,
    .matmul_backward = f32_matmul_backward,
    .attention_forward = f32_attention_forward,
    .attention_backward = f32_attention_backward,
    .gelu_forward = f32_gelu_forward,
    .gelu_backward = f32_gelu_backward,
    .add = f32_add,
    .accumulate = f32_accumulate,
    .scale = f32_scale,
    .crossentropy_forward = f32_crossentropy_forward,
    .crossentropy_backward = f32_crossentropy_backward,
    .sum_squares = f32_sum_squares,
    .sum_squares_add = f32_sum_squares_add,
    .adamw = f32_adamw,
    .matmul_backward_input = f32_matmul_backward_input,
    .matmul_backward_weight = f32_matmul_backward_weight,
    .layernorm_backward_input = f32_layernorm_backward_input,
    .layernorm_backward_weight = f32_layernorm_backward_weight,
    .to_values = f32_copy,
    .to_floats = f32_copy_back,
    .attention_block_forward = f32_attention_block_forward,
    .attention_block_backward = f32_attention_block_backward,
    .attention_merge = f32_attention_merge,
};
