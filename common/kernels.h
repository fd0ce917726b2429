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
} kernels;

extern const kernels *K; /* the table in use; set by device_use() */
extern const kernels kernels_cpu;
#ifdef PL_HAVE_CUDA
extern const kernels kernels_cuda;
/* Allocates the CUDA kernels' fixed scratch (reduction partials) on the current
 * GPU, as workspace, once: device_use calls it when it selects CUDA, so no
 * kernel allocates during a step. */
void kernels_cuda_init(void);
#endif

#endif
