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

/* params, grads, m, v each hold end - begin floats, element 0 being `begin`.
 * t is the 1-based step count; grad_scale multiplies the gradients (clipping). */
void adamw_step(const gpt_layout *g, const adamw_config *cfg, long begin, long end,
                float *params, const float *grads, float *m, float *v, int t, float grad_scale);

/* The factor that brings a gradient of norm sqrt(sum_squares) down to max_norm
 * (1 when it is already within, or when max_norm <= 0: no clipping). */
float clip_scale(double sum_squares, float max_norm);

#endif
