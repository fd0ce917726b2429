#include "optim.h"
#include "kernels.h"
#include <math.h>

typedef struct {
    const adamw_config *cfg;
    long begin, end;
    float *params, *m, *v;
    const float *grads;
    int t;
    float grad_scale;
} step_ctx;

static void step_tensor(void *vctx, const tensor_info *t, long offset, int layer) {
    (void)layer;
    step_ctx *c = vctx;
    long lo = offset > c->begin ? offset : c->begin;
    long hi = offset + t->rows * t->cols;
    if (hi > c->end) hi = c->end;
    long i = lo - c->begin;
    K->adamw(c->params + i, c->grads + i, c->m + i, c->v + i, hi - lo, c->cfg->lr, c->cfg->beta1,
             c->cfg->beta2, c->cfg->eps, t->decay ? c->cfg->weight_decay : 0.0f, c->t, c->grad_scale);
}

void adamw_step(const gpt_layout *g, const adamw_config *cfg, long begin, long end,
                float *params, const float *grads, float *m, float *v, int t, float grad_scale) {
    step_ctx c = {cfg, begin, end, params, m, v, grads, t, grad_scale};
    gpt_for_each_tensor(g, begin, end, step_tensor, &c);
}

float clip_scale(double sum_squares, float max_norm) {
    double norm = sqrt(sum_squares);
    if (max_norm <= 0 || norm <= max_norm) return 1.0f;
    return (float)(max_norm / (norm + 1e-6));
}
