/* AdamW over a flat range of the parameter layout.
 *
 * The range [begin, end) can be the whole model, a pipeline stage or a ZeRO
 * shard: the step visits the tensors that overlap it and applies weight decay
 * to matrices only (biases and LayerNorm gains are not decayed). */
#ifndef PL_OPTIM_H
#define PL_OPTIM_H
#include "model.h"

typedef struct adamw_config {
    float lr, beta1, beta2, eps, weight_decay;
} adamw_config;

/* params, grads, m, v each hold end - begin elements, element 0 being `begin`:
 * params, m and v fp32 (params: the weights the optimizer updates, the fp32
 * master copy in a bf16 run, precision.h), grads the model's values. t is the
 * 1-based step count; grad_scale multiplies the gradients (clipping). */
void adamw_step(const gpt_layout *g, const adamw_config *cfg, long begin, long end,
                float *params, const void *grads, float *m, float *v, int t, float grad_scale);

/* A rank's model states of n parameters, as the labs that hold a whole
 * replica or shard allocate them: the values forward and backward use
 * (params, grads; precision.h) and AdamW's fp32 weights (master: params itself
 * in fp32, a copy in bf16) and moments. */
typedef struct model_states {
    void *params, *grads;
    float *master, *adam_m, *adam_v;
} model_states;
void model_states_alloc(model_states *s, long n);
void model_states_free(model_states *s);

/* The factor that brings a gradient of norm sqrt(sum_squares) down to max_norm
 * (1 when it is already within, or when max_norm <= 0: no clipping). */
float clip_scale(double sum_squares, float max_norm);

/* The squared norm of a gradient held in pieces, summed where the gradient
 * lives: every piece's squares go into one of `parts` device doubles
 * (K->sum_squares_add: no copy, no waiting) and the sums reach the host in one
 * copy per step. On a GPU a copy per tensor, each waiting for the GPU to drain
 * (98 a step in lab05), would cost more than the sums. On the CPU the result
 * is bit for bit that of adding the pieces' sums in order into a double. */
typedef struct grad_norm {
    double *sums; /* parts doubles on the device, workspace */
    int parts;
} grad_norm;

void grad_norm_init(grad_norm *n, int parts); /* at set-up, not during a step */
void grad_norm_free(grad_norm *n);
void grad_norm_begin(grad_norm *n);           /* sums := 0 */
void grad_norm_add(grad_norm *n, int part, const void *x, long count); /* x: values */
void grad_norm_read(const grad_norm *n, double *host); /* parts doubles; waits for the device */

#endif
