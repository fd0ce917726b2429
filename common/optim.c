#include "optim.h"
#include "kernels.h"
#include "mem.h"
#include "precision.h"
#include <math.h>

void model_states_alloc(model_states *s, long n) {
    s->params = mem_alloc((size_t)n * value_bytes(), MEM_PARAMS);
    s->grads = mem_alloc((size_t)n * value_bytes(), MEM_GRADS);
    s->master = master_alloc(s->params, n);
    s->adam_m = mem_alloc((size_t)n * sizeof(float), MEM_OPTIM);
    s->adam_v = mem_alloc((size_t)n * sizeof(float), MEM_OPTIM);
}

void model_states_free(model_states *s) {
    master_free(s->master, s->params);
    mem_free(s->params);
    mem_free(s->grads);
    mem_free(s->adam_m);
    mem_free(s->adam_v);
}

typedef struct {
    const adamw_config *cfg;
    long begin, end;
    float *params, *m, *v;
    const void *grads;
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
    KP->adamw(c->params + i, value_at(c->grads, i), c->m + i, c->v + i, hi - lo, c->cfg->lr, c->cfg->beta1,
              c->cfg->beta2, c->cfg->eps, t->decay ? c->cfg->weight_decay : 0.0f, c->t, c->grad_scale);
}

void adamw_step(const gpt_layout *g, const adamw_config *cfg, long begin, long end,
                float *params, const void *grads, float *m, float *v, int t, float grad_scale) {
    step_ctx c = {cfg, begin, end, params, m, v, grads, t, grad_scale};
    gpt_for_each_tensor(g, begin, end, step_tensor, &c);
}

float clip_scale(double sum_squares, float max_norm) {
    double norm = sqrt(sum_squares);
    if (max_norm <= 0 || norm <= max_norm) return 1.0f;
    return (float)(max_norm / (norm + 1e-6));
}

void grad_norm_init(grad_norm *n, int parts) {
    n->parts = parts;
    n->sums = mem_alloc((size_t)parts * sizeof(double), MEM_WORKSPACE);
}

void grad_norm_free(grad_norm *n) {
    mem_free(n->sums);
    n->sums = NULL;
}

void grad_norm_begin(grad_norm *n) { mem_zero(n->sums, (size_t)n->parts * sizeof(double)); }

void grad_norm_add(grad_norm *n, int part, const void *x, long count) {
    KP->sum_squares_add(n->sums + part, x, count);
}

void grad_norm_read(const grad_norm *n, double *host) {
    mem_to_host(host, n->sums, (size_t)n->parts * sizeof(double));
}
