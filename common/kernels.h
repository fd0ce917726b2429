/* The kernels of a GPT, with one API and two implementations.
 *
 * K points at kernels_cpu (C + OpenBLAS) or kernels_cuda (cuBLAS + own
 * kernels); device_use() picks one at run time. All pointers are device
 * pointers of the current device; integers are element counts.
 *
 * Shapes (row-major, like llm.c):
 *   B batch rows, T sequence length, C channels, V vocabulary,
 *   NH heads, HS head size; attention's C is NH*HS (a tensor-parallel rank
 *   passes its local heads), N = B*T token positions.
 *
 * Accumulation rule: every backward ADDS into its gradient outputs (dinp, dw,
 * dbias, dwte, ...). Gradients then accumulate over micro-batches and over the
 * two branches of a residual without extra copies; the caller zeroes them at
 * the start of a step. Outputs of forwards are overwritten.
 *
 * Buffers passed to one call do not overlap, except where a comment allows it
 * (add's out may be a or b). Token ids and targets are in [0, V). */
#ifndef PL_KERNELS_H
#define PL_KERNELS_H
#include <stddef.h>

typedef struct kernels {
    const char *name; /* "cpu" or "cuda" */

    /* out[N,C] = wte[tokens[n]] + wpe[n % T] */
    void (*encoder_forward)(float *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
    /* dwte[tokens[n]] += dout[n]; dwpe[t] += sum over b of dout[b,t] */
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *tokens,
                             int B, int T, int C);

    /* out = (inp - mean) * rstd * w + b per row of C; saves mean[N], rstd[N]. eps 1e-5 */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);

    /* out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias[OC]; bias may be NULL */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           int N, int IC, int OC);
    /* dinp += dout @ w; dw += dout^T @ inp; dbias += column sums of dout.
     * dinp may be NULL (no input gradient wanted); dbias NULL when no bias. */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC);

    /* Causal self-attention. qkv[B,T,3C] holds q | k | v, each C = NH*HS wide, head h at
     * columns h*HS. att[B,NH,T,T] keeps the softmax (upper triangle zero) for backward.
     * out[B,T,C] = softmax(q k^T / sqrt(HS), causal) v, heads side by side. */
    void (*attention_forward)(float *out, float *att, const float *qkv,
                              int B, int T, int NH, int HS);
    /* dqkv += gradient; datt[B,NH,T,T] is scratch (its contents on entry are ignored). */
    void (*attention_backward)(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int NH, int HS);

    /* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    void (*gelu_forward)(float *out, const float *inp, long N);
    void (*gelu_backward)(float *dinp, const float *dout, const float *inp, long N);

    /* out = a + b (the residual connection); out may alias a or b */
    void (*add)(float *out, const float *a, const float *b, long N);
    /* dst += src */
    void (*accumulate)(float *dst, const float *src, long N);
    /* x *= s */
    void (*scale)(float *x, float s, long N);

    /* probs[N,V] = softmax(logits); losses[n] = -log probs[n, targets[n]] */
    void (*crossentropy_forward)(float *losses, float *probs, const float *logits,
                                 const int *targets, int N, int V);
    /* dlogits = (probs - onehot(targets)) * dloss  (overwrites dlogits; dloss is the
     * weight of each position in the mean loss, 1 / tokens in the global batch) */
    void (*crossentropy_backward)(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V);

    /* sum of x[i]^2, accumulated in double, returned to the host */
    double (*sum_squares)(const float *x, long N);

    /* One AdamW step (decoupled weight decay, bias correction with step t >= 1) on
     * N elements; g is multiplied by grad_scale first (gradient clipping):
     *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
     *   p -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd p ) */
    void (*adamw)(float *p, const float *g, float *m, float *v, long N, float lr,
                  float beta1, float beta2, float eps, float wd, int t, float grad_scale);

    /* acc[0] += sum of x[i]^2 in double, where acc is a device double: no copy to
     * the host and no waiting, so a step adds all its tensors' squares on the
     * device and copies the sums once (optim.h, grad_norm). One call adds exactly
     * what sum_squares returns, so calls in the same order give the same bits. */
    void (*sum_squares_add)(double *acc, const float *x, long N);
    /* The backward split in its two halves, for the zero-bubble pipeline
     * schedules (lab04): the input gradient ("B", which the previous pipeline
     * stage waits for) and the weight gradient ("W", which may run later).
     * Each half does exactly its part of the fused kernel above, with the same
     * arithmetic, so the two halves together give the fused kernel's bits.
     *   dinp += dout @ w */
    void (*matmul_backward_input)(float *dinp, const float *dout, const float *w, int N, int IC,
                                  int OC);
    /*   dw += dout^T @ inp; dbias += column sums of dout (dbias NULL: no bias) */
    void (*matmul_backward_weight)(float *dw, float *dbias, const float *dout, const float *inp,
                                   int N, int IC, int OC);
    /* layernorm_backward's dinp alone, and its dw and db alone */
    void (*layernorm_backward_input)(float *dinp, const float *dout, const float *inp,
                                     const float *w, const float *mean, const float *rstd, int N,
                                     int C);
    void (*layernorm_backward_weight)(float *dw, float *db, const float *dout, const float *inp,
                                      const float *mean, const float *rstd, int N, int C);

    /* ---- attention over blocks of the sequence (context parallelism, lab07) ----
     * FlashAttention's tile and ring attention's step: the queries of one block
     * of positions against the keys and values of another, keeping no score
     * matrix (the CPU works in 32 x 128 tiles on the stack). The result of each
     * block is normalised over its own keys and comes with its log-sum-exp, so
     * attention_merge can combine blocks in any order into the softmax over all
     * of them (the online softmax). Layout: row (b, t) of q starts at
     * q + (b Tq + t) ldq, of k and v at k + (b Tk + t) ldkv (so q, k and v may
     * be read in place from a qkv buffer, ld 3C, or from a received block);
     * head h at column h HS; out[B,Tq,C] and dout row stride C = NH HS;
     * lse[B,NH,Tq] fp32 in both precisions.
     * Causal mask by global positions (so zig-zag chunks work): key j is
     * visible to query i when k_pos[j] <= q_pos[i] (device int arrays of Tq and
     * Tk, the same for every batch row); both NULL: no mask. A row that sees
     * no key of the block gets out 0 and lse -inf.
     *   out = softmax(q k^T / sqrt(HS), masked) v;  lse = log sum_j exp(s_ij) */
    void (*attention_block_forward)(float *out, float *lse, const float *q, const float *k, const float *v,
                                    int ldq, int ldkv, const int *q_pos, const int *k_pos, int B, int Tq,
                                    int Tk, int NH, int HS);
    /* The block's share of the gradient, given the FINAL (merged over all key
     * blocks) out and lse of the queries: P = exp(s - lse), D = rowsum(dout *
     * out), dS = P (dP - D) with dP = dout v^T; dq += dS k / sqrt(HS), dk +=
     * dS^T q / sqrt(HS), dv += P^T dout. dq is laid out like q (ldq), dk and dv
     * like k and v (ldkv). */
    void (*attention_block_backward)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                     const float *lse, const float *q, const float *k, const float *v, int ldq,
                                     int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                     int HS);
    /* (out, lse) = the merge of (out, lse) and (out2, lse2), the same queries
     * against two disjoint sets of keys: lse' = log(e^lse + e^lse2), out' =
     * e^(lse - lse') out + e^(lse2 - lse') out2 (a side with lse -inf counts
     * for nothing). out, out2 [B,T,C]; lse, lse2 [B,NH,T]. */
    void (*attention_merge)(float *out, float *lse, const float *out2, const float *lse2, int B, int T, int NH,
                            int HS);
} kernels;

/* Unmasked causal scores of a block (host arrays of global positions): the
 * pairs with k_pos[j] <= q_pos[i], per batch row and head. theory.h's
 * th_cp_causal_scores gives the sum over a rank's blocks in closed form. */
long attention_unmasked_scores(const int *q_pos, int Tq, const int *k_pos, int Tk);

extern const kernels *K; /* the table in use; set by device_use() */
extern const kernels kernels_cpu;
/* The CPU kernels bound by their arithmetic (GELU, fp32 and bf16) are built
 * for AVX2 and for AVX-512 and give the same bits (kernels_cpu_math.h,
 * WITH_AVX512). 1: the AVX-512 builds run; 0: the AVX2 ones; -1 (the start):
 * decided at the first call from the CPU, PL_CPU_ISA=avx2 forcing AVX2.
 * Tests set it to compare the two. */
extern int kernels_cpu_use_avx512;
int kernels_cpu_decide_avx512(void); /* sets and returns it */
#ifdef PL_HAVE_CUDA
extern const kernels kernels_cuda;
/* Allocates the CUDA kernels' fixed scratch (reduction partials) on the current
 * GPU, as workspace, once: device_use calls it when it selects CUDA, so no
 * kernel allocates during a step. */
void kernels_cuda_init(void);
#endif

/* ---- the same kernels on the model's values, in the run's precision ----------------
 * precision.h says what values are. value_kernels has the entries above (and
 * two conversions) with `void *` for every value tensor: a buffer of fp32 in an
 * fp32 run, of bf16 in a bf16 run. What is fp32 in both keeps its float *:
 * LayerNorm's mean and rstd, the losses, AdamW's weights (the fp32 master copy
 * in a bf16 run) and moments. The model (model.c) and the tensor-parallel
 * layers (lab05) call these, through KP, so the same code runs either way.
 *
 * bf16 kernels read bf16, compute in fp32 (matrix products accumulate in
 * fp32) and round each output once to bf16 (round to nearest even); an
 * accumulating output (the rule above) adds in fp32 and rounds once per call.
 * Their results are therefore the fp32 kernel's on the bf16 inputs, rounded,
 * up to the order of the fp32 sums. In an fp32 run KP's entries are K's
 * (kernels_values_fp32 passes every call on unchanged, so fp32 results are
 * exactly K's). */
/* Every kernel on values, listed once: X(name, kind, ret, params, args), the
 * kind the time goes to (PL_KERNEL_TIMES=1: kernel_times.h), the return type
 * (void or double), the parameters and the arguments that pass them on. From
 * this list come value_kernels' entries, the timing wrapper of each
 * (kernel_times.c) and, but for the two conversions, fp32's forward to K
 * (precision.c), so a new kernel on values is one line here and its
 * implementations (kernels_cpu.c for fp32 K, kernels_cpu_bf16.c,
 * kernels_cuda.cu for both precisions): timed without a line of its own. */
enum {
    KERNEL_GEMM,        /* matmul_* (the linear layers and the LM head) */
    KERNEL_ATTENTION,   /* attention_* (its score and value products included) */
    KERNEL_LAYERNORM,
    KERNEL_GELU,
    KERNEL_LOSS,        /* crossentropy_*: the softmax over the vocabulary and the loss */
    KERNEL_OPTIMIZER,   /* adamw and the gradient norm's sums of squares */
    KERNEL_CONVERT,     /* to_values / to_floats: fp32 <-> the run's values (bf16 weights from the master) */
    KERNEL_RESIDUAL,    /* add, accumulate, scale */
    KERNEL_EMBEDDING,   /* encoder_* */
    KERNEL_NKINDS
};
/* the kernels K (the fp32 device table above) has under the same name */
#define VALUE_KERNELS_OF_K(X) \
    X(encoder_forward, KERNEL_EMBEDDING, void, \
      (void *out, const int *tokens, const void *wte, const void *wpe, int B, int T, int C), \
      (out, tokens, wte, wpe, B, T, C)) \
    X(encoder_backward, KERNEL_EMBEDDING, void, \
      (void *dwte, void *dwpe, const void *dout, const int *tokens, int B, int T, int C), \
      (dwte, dwpe, dout, tokens, B, T, C)) \
    X(layernorm_forward, KERNEL_LAYERNORM, void, \
      (void *out, float *mean, float *rstd, const void *inp, const void *w, const void *b, int N, int C), \
      (out, mean, rstd, inp, w, b, N, C)) \
    X(layernorm_backward, KERNEL_LAYERNORM, void, \
      (void *dinp, void *dw, void *db, const void *dout, const void *inp, const void *w, const float *mean, \
       const float *rstd, int N, int C), \
      (dinp, dw, db, dout, inp, w, mean, rstd, N, C)) \
    X(matmul_forward, KERNEL_GEMM, void, \
      (void *out, const void *inp, const void *w, const void *bias, int N, int IC, int OC), \
      (out, inp, w, bias, N, IC, OC)) \
    X(matmul_backward, KERNEL_GEMM, void, \
      (void *dinp, void *dw, void *dbias, const void *dout, const void *inp, const void *w, int N, int IC, int OC), \
      (dinp, dw, dbias, dout, inp, w, N, IC, OC)) \
    X(attention_forward, KERNEL_ATTENTION, void, \
      (void *out, void *att, const void *qkv, int B, int T, int NH, int HS), (out, att, qkv, B, T, NH, HS)) \
    X(attention_backward, KERNEL_ATTENTION, void, \
      (void *dqkv, void *datt, const void *dout, const void *qkv, const void *att, int B, int T, int NH, int HS), \
      (dqkv, datt, dout, qkv, att, B, T, NH, HS)) \
    X(gelu_forward, KERNEL_GELU, void, (void *out, const void *inp, long N), (out, inp, N)) \
    X(gelu_backward, KERNEL_GELU, void, (void *dinp, const void *dout, const void *inp, long N), (dinp, dout, inp, N)) \
    X(add, KERNEL_RESIDUAL, void, (void *out, const void *a, const void *b, long N), (out, a, b, N)) \
    X(accumulate, KERNEL_RESIDUAL, void, (void *dst, const void *src, long N), (dst, src, N)) \
    X(scale, KERNEL_RESIDUAL, void, (void *x, float s, long N), (x, s, N)) \
    X(crossentropy_forward, KERNEL_LOSS, void, \
      (float *losses, void *probs, const void *logits, const int *targets, int N, int V), \
      (losses, probs, logits, targets, N, V)) \
    X(crossentropy_backward, KERNEL_LOSS, void, \
      (void *dlogits, const void *probs, const int *targets, float dloss, int N, int V), \
      (dlogits, probs, targets, dloss, N, V)) \
    X(sum_squares, KERNEL_OPTIMIZER, double, (const void *x, long N), (x, N)) \
    X(sum_squares_add, KERNEL_OPTIMIZER, void, (double *acc, const void *x, long N), (acc, x, N)) \
    /* p: the fp32 weights the optimizer updates (the master copy in bf16); g: values */ \
    X(adamw, KERNEL_OPTIMIZER, void, \
      (float *p, const void *g, float *m, float *v, long N, float lr, float beta1, float beta2, float eps, float wd, \
       int t, float grad_scale), \
      (p, g, m, v, N, lr, beta1, beta2, eps, wd, t, grad_scale)) \
    X(matmul_backward_input, KERNEL_GEMM, void, \
      (void *dinp, const void *dout, const void *w, int N, int IC, int OC), (dinp, dout, w, N, IC, OC)) \
    X(matmul_backward_weight, KERNEL_GEMM, void, \
      (void *dw, void *dbias, const void *dout, const void *inp, int N, int IC, int OC), \
      (dw, dbias, dout, inp, N, IC, OC)) \
    X(layernorm_backward_input, KERNEL_LAYERNORM, void, \
      (void *dinp, const void *dout, const void *inp, const void *w, const float *mean, const float *rstd, int N, \
       int C), \
      (dinp, dout, inp, w, mean, rstd, N, C)) \
    X(layernorm_backward_weight, KERNEL_LAYERNORM, void, \
      (void *dw, void *db, const void *dout, const void *inp, const float *mean, const float *rstd, int N, int C), \
      (dw, db, dout, inp, mean, rstd, N, C)) \
    /* the attention over blocks above; lse fp32 in both precisions */ \
    X(attention_block_forward, KERNEL_ATTENTION, void, \
      (void *out, float *lse, const void *q, const void *k, const void *v, int ldq, int ldkv, const int *q_pos, \
       const int *k_pos, int B, int Tq, int Tk, int NH, int HS), \
      (out, lse, q, k, v, ldq, ldkv, q_pos, k_pos, B, Tq, Tk, NH, HS)) \
    X(attention_block_backward, KERNEL_ATTENTION, void, \
      (void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse, const void *q, \
       const void *k, const void *v, int ldq, int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, \
       int NH, int HS), \
      (dq, dk, dv, dout, out, lse, q, k, v, ldq, ldkv, q_pos, k_pos, B, Tq, Tk, NH, HS)) \
    X(attention_merge, KERNEL_ATTENTION, void, \
      (void *out, float *lse, const void *out2, const float *lse2, int B, int T, int NH, int HS), \
      (out, lse, out2, lse2, B, T, NH, HS))
/* dst = src rounded to values (a copy in fp32; nothing when dst == src), and back */
#define VALUE_KERNELS_CONVERSIONS(X) \
    X(to_values, KERNEL_CONVERT, void, (void *dst, const float *src, long N), (dst, src, N)) \
    X(to_floats, KERNEL_CONVERT, void, (float *dst, const void *src, long N), (dst, src, N))
#define VALUE_KERNELS(X) VALUE_KERNELS_OF_K(X) VALUE_KERNELS_CONVERSIONS(X)
/* a generated body's `return` before a call that returns a value: KERNEL_RETURN_##ret */
#define KERNEL_RETURN_void
#define KERNEL_RETURN_double return

typedef struct value_kernels {
    const char *name; /* "fp32", "bf16 cpu", "bf16 cuda" */
#define VALUE_KERNEL_ENTRY(name, kind, ret, params, args) ret(*name) params;
    VALUE_KERNELS(VALUE_KERNEL_ENTRY)
#undef VALUE_KERNEL_ENTRY
} value_kernels;

extern const value_kernels *KP; /* the table for the run's precision; set by precision_use() */
extern const value_kernels kernels_values_fp32; /* K's kernels, whatever the device */
extern const value_kernels kernels_bf16_cpu;
#ifdef PL_HAVE_CUDA
extern const value_kernels kernels_bf16_cuda;
#endif
/* The CPU bf16 kernels' matrix products: 1 through oneDNN's bf16 matmul (fp32
 * accumulation), 0 by widening to fp32 for OpenBLAS's sgemm; and a line
 * saying which and why, for the start-up. Decided once, at the first call. */
int kernels_bf16_cpu_uses_onednn(void);
const char *kernels_bf16_cpu_gemm_text(void);
/* Host bytes of fp32 scratch the CPU bf16 kernels hold (their widened
 * operands, a few rows at a time), outside mem.h's categories like
 * OpenBLAS's own buffers: the peak so far. */
size_t kernels_bf16_cpu_scratch_bytes(void);

#endif
